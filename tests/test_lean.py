"""Lean layer norm and swish: the plain functions' values and gradients, fewer residuals."""

import contextlib
import io
import re

import jax
import jax.numpy as jnp
from jax import ad_checkpoint
import numpy as np
import pytest
from flax import nnx

from wnscale.model import lean


def plain_layer_norm(x, scale, bias):
  """Flax's LayerNorm with GraphCast's settings, differentiated the plain way."""
  norm = nnx.LayerNorm(x.shape[-1], epsilon=lean.LAYER_NORM_EPSILON, use_fast_variance=False,
                       dtype=x.dtype, rngs=nnx.Rngs(0))
  norm.scale[...], norm.bias[...] = scale, bias
  return norm(x)


def inputs(dtype, rows=300, features=64, seed=0):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.normal(3.0, 2.0, (rows, features)), dtype)  # |mean| > std
  scale = jnp.asarray(rng.normal(1.0, 0.3, features), jnp.float32)
  bias = jnp.asarray(rng.normal(0.0, 0.3, features), jnp.float32)
  cotangent = jnp.asarray(rng.normal(size=(rows, features)), dtype)
  return x, scale, bias, cotangent


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_layer_norm_matches_flax_values_and_gradients(dtype):
  x, scale, bias, cotangent = inputs(dtype)
  lean_fn = lambda x, s, b: lean.layer_norm(x, s, b, lean.LAYER_NORM_EPSILON)
  lean_y, lean_vjp = jax.vjp(lean_fn, x, scale, bias)
  plain_y, plain_vjp = jax.vjp(plain_layer_norm, x, scale, bias)
  assert lean_y.dtype == plain_y.dtype == dtype
  np.testing.assert_array_equal(np.asarray(lean_y, np.float32), np.asarray(plain_y, np.float32))
  tolerance = 1e-5 if dtype == jnp.float32 else 2e-2
  for got, want in zip(lean_vjp(cotangent), plain_vjp(cotangent), strict=True):
    assert got.dtype == want.dtype
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=tolerance, atol=tolerance * float(np.abs(want).max()))


def test_layer_norm_broadcasts_scale_and_bias():
  """Scale and offset per example (as noise-conditioned norms give): [B, 1, D]."""
  x, _, _, cotangent = inputs(jnp.float32)
  x, cotangent = x.reshape(3, 100, 64), cotangent.reshape(3, 100, 64)
  rng = np.random.default_rng(1)
  scale = jnp.asarray(rng.normal(1, 0.3, (3, 1, 64)), jnp.float32)
  bias = jnp.asarray(rng.normal(0, 0.3, (3, 1, 64)), jnp.float32)
  plain = lambda x, s, b: ((x - x.mean(-1, keepdims=True))
                           * jax.lax.rsqrt(x.var(-1, keepdims=True) + 1e-5) * s + b)
  lean_fn = lambda x, s, b: lean.layer_norm(x, s, b, 1e-5)
  for got, want in zip(jax.vjp(lean_fn, x, scale, bias)[1](cotangent),
                       jax.vjp(plain, x, scale, bias)[1](cotangent), strict=True):
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_swish_matches_jax_values_and_gradients(dtype):
  x, _, _, cotangent = inputs(dtype)
  x = x - 3.0
  lean_y, lean_vjp = jax.vjp(lean.swish, x)
  plain_y, plain_vjp = jax.vjp(jax.nn.swish, x)
  np.testing.assert_array_equal(np.asarray(lean_y, np.float32), np.asarray(plain_y, np.float32))
  tolerance = 1e-6 if dtype == jnp.float32 else 1e-2
  np.testing.assert_allclose(np.asarray(lean_vjp(cotangent)[0], np.float32),
                             np.asarray(plain_vjp(cotangent)[0], np.float32),
                             rtol=tolerance, atol=tolerance)


def residual_bytes(fn, *args) -> int:
  """Bytes of the values `fn`'s gradient keeps, arguments aside (from JAX's own listing)."""
  listing = io.StringIO()
  with contextlib.redirect_stdout(listing):
    ad_checkpoint.print_saved_residuals(fn, *args)
  total = 0
  for line in listing.getvalue().splitlines():
    dtype, shape = re.match(r"(\w+)\[([\d,]*)\]", line).groups()
    if "from the argument" not in line:
      itemsize = int(re.search(r"\d+", dtype).group()) // 8  # f32 -> 4, bf16 -> 2, i32 -> 4
      total += np.prod([int(n) for n in shape.split(",") if n]) * itemsize
  return total


def test_lean_versions_keep_only_their_inputs():
  x, scale, bias, _ = inputs(jnp.bfloat16, rows=1000, features=64)
  row = 64 * 2  # one bfloat16 row
  mlp_tail = lambda f, norm: lambda x, s, b: norm(f(x) @ jnp.eye(64, dtype=x.dtype), s, b)
  lean_norm = lambda y, s, b: lean.layer_norm(y, s, b, 1e-5)
  lean_bytes = residual_bytes(mlp_tail(lean.swish, lean_norm), x, scale, bias)
  plain_bytes = residual_bytes(mlp_tail(jax.nn.swish, plain_layer_norm), x, scale, bias)
  # Lean: the swish output and the norm's input (bfloat16 rows), mean and 1/std.
  assert lean_bytes <= 1000 * (2 * row + 2 * 4) + 1024, lean_bytes
  assert plain_bytes > 3 * lean_bytes, (plain_bytes, lean_bytes)
