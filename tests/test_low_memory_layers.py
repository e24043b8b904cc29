"""Lean layer norm and MLP tail: the plain functions' values and gradients, fewer residuals."""

import contextlib
import io
import re

import jax
import jax.numpy as jnp
from jax import ad_checkpoint
import numpy as np
import pytest
from flax import nnx

from wnscale.model import low_memory_layers

EPSILON = low_memory_layers.LAYER_NORM_EPSILON


def plain_layer_norm(x, scale, bias):
  """Flax's LayerNorm with GraphCast's settings, differentiated the plain way."""
  norm = nnx.LayerNorm(x.shape[-1], epsilon=EPSILON, use_fast_variance=False,
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
  lean_fn = lambda x, s, b: low_memory_layers.layer_norm(x, s, b, EPSILON)
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
  lean_fn = lambda x, s, b: low_memory_layers.layer_norm(x, s, b, 1e-5)
  for got, want in zip(jax.vjp(lean_fn, x, scale, bias)[1](cotangent),
                       jax.vjp(plain, x, scale, bias)[1](cotangent), strict=True):
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def plain_mlp_tail(hidden, kernel, bias, scale=None, offset=None):
  """Swish, a linear layer and (with a scale) Flax's layer norm, differentiated the plain way."""
  y = jax.nn.swish(hidden) @ kernel + bias
  return y if scale is None else plain_layer_norm(y, scale, offset)


def tail_inputs(dtype, rows=300, width=64, seed=2):
  rng = np.random.default_rng(seed)
  hidden = jnp.asarray(rng.normal(0.0, 2.0, (rows, width)), dtype)
  kernel = jnp.asarray(rng.normal(0.0, width ** -0.5, (width, width)), dtype)
  bias = jnp.asarray(rng.normal(3.0, 1.0, width), dtype)  # |mean| > std for the norm
  return hidden, kernel, bias


def assert_same_values_and_gradients(lean_fn, plain_fn, args, cotangent):
  """Equal values in the inputs' dtype; gradients to float rounding (bfloat16's is coarse)."""
  lean_y, lean_vjp = jax.vjp(lean_fn, *args)
  plain_y, plain_vjp = jax.vjp(plain_fn, *args)
  assert lean_y.dtype == plain_y.dtype == args[0].dtype
  np.testing.assert_array_equal(np.asarray(lean_y, np.float32), np.asarray(plain_y, np.float32))
  tolerance = 1e-5 if args[0].dtype == jnp.float32 else 3e-2
  for got, want in zip(lean_vjp(cotangent), plain_vjp(cotangent), strict=True):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=tolerance, atol=tolerance * float(np.abs(want).max()))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("with_norm", [True, False])
def test_mlp_tail_matches_plain_values_and_gradients(dtype, with_norm):
  hidden, kernel, bias = tail_inputs(dtype)
  _, scale, offset, cotangent = inputs(dtype)
  args = (hidden, kernel, bias) + ((scale, offset) if with_norm else ())
  assert_same_values_and_gradients(
      lambda *a: low_memory_layers.mlp_tail(*a, epsilon=EPSILON), plain_mlp_tail, args,
      cotangent)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_matches_plain_values_and_gradients_per_example(dtype, with_bias):
  """Under the batch `vmap`, as the model calls it: a kernel shared by the examples."""
  hidden, kernel, bias = tail_inputs(dtype)
  x = hidden.reshape(3, 100, 64)  # 3 examples
  cotangent = inputs(dtype)[3].reshape(3, 100, 64)
  args = (x, kernel) + ((bias,) if with_bias else ())
  lean_fn = jax.vmap(lambda x, k, *b: low_memory_layers.linear(x, k, *b), in_axes=(0,) + (None,) * (
      len(args) - 1))
  plain_fn = lambda x, k, *b: x @ k + (b[0] if b else 0)
  assert_same_values_and_gradients(lean_fn, plain_fn, args, cotangent)


def test_mlp_tail_under_jit_recomputes_rather_than_keeps_the_forward_pass():
  """Compiled, the gradient's temporaries hold no more than a few `[rows, width]` arrays.

  Without the optimization barrier XLA merges the backward pass's recomputation
  with the forward pass's and keeps the forward's intermediates; it would still
  be correct, but no smaller.
  """
  hidden, kernel, bias = tail_inputs(jnp.float32, rows=20_000)
  _, scale, offset, _ = inputs(jnp.float32)
  loss = lambda fn: jax.jit(jax.grad(lambda h: jnp.sum(jnp.sin(fn(h, kernel, bias, scale,
                                                                   offset)))))
  lean_tail = lambda *a: low_memory_layers.mlp_tail(*a, epsilon=EPSILON)
  temps = {name: loss(fn).lower(hidden).compile().memory_analysis().temp_size_in_bytes
           for name, fn in (("lean", lean_tail), ("plain", plain_mlp_tail))}
  assert temps["lean"] < 0.7 * temps["plain"], temps


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
  kernel = jnp.eye(64, dtype=x.dtype)
  row = 64 * 2  # one bfloat16 row
  lean_tail = lambda x, k, s, b: low_memory_layers.mlp_tail(x, k, b.astype(x.dtype), s, b)
  plain_tail = lambda x, k, s, b: plain_mlp_tail(x, k, b.astype(x.dtype), s, b)
  lean_bytes = residual_bytes(lean_tail, x, kernel, scale, bias)
  plain_bytes = residual_bytes(plain_tail, x, kernel, scale, bias)
  # Lean: the hidden pre-activation (an argument), the norm's mean and 1/std, the
  # bias as cast.
  assert lean_bytes <= 1000 * 2 * 4 + 1024, lean_bytes
  assert plain_bytes > 1000 * 3 * row, plain_bytes
  # The layer norm alone keeps its input (an argument here) and the statistics.
  lean_norm = lambda x, s, b: low_memory_layers.layer_norm(x, s, b, 1e-5)
  assert residual_bytes(lean_norm, x, scale, bias) <= 1000 * 2 * 4 + 1024
  assert residual_bytes(plain_layer_norm, x, scale, bias) > 1000 * 2 * row
