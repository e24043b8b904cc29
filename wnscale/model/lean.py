"""Layer norm, swish and a linear layer whose gradients keep only their inputs and sum
columns by matrix product.

Differentiated the plain way, a bfloat16 layer norm keeps three float32 copies
of its `[rows, features]` input for the backward pass (the input cast up, the
centred input, the normalized input) and swish keeps its input and two
intermediates. On GraphCast's edge sets (millions of rows) those residuals
are most of a training step's memory: for each edge MLP, 22 bytes per latent
element against the 6 these versions keep (the input of swish, of the layer
norm, and the edge latent).

Both are `jax.custom_vjp` functions that compute exactly what the plain
versions compute in the forward pass and recompute the intermediates in the
backward pass, from the input (plus the per-row mean and reciprocal standard
deviation, `[rows, 1]` float32, for the layer norm). Gradients equal plain
autodiff's to float rounding (tests/test_lean.py).

The layer norm is GraphCast's (Haiku's defaults): epsilon 1e-5 and the two-pass
variance, statistics in float32 whatever the activation dtype:

  y = (x - mean(x)) * rsqrt(mean((x - mean(x))^2) + epsilon) * scale + bias

The gradients of the layer norm's scale and bias and of a linear layer's bias are
column sums, `[rows, features] -> [features]`. Per example (under `vmap`) XLA sees
them as the sum over the middle axis of `[batch, rows, features]`, which XLA:CPU's
YNNPACK reduction ran 10-30x slower than the same sum as a matrix product with a
vector of ones (`column_sum`: 0.26 s against 0.024 s at 195,480 x 128; in the mid
problem's step, about half of the op time). `column_sum` is that product, in full
float32 precision on every backend.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from wnscale.model.varying import vary_like

LAYER_NORM_EPSILON = 1e-5


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, epsilon: float) -> jax.Array:
  """Normalizes the last axis of `x`; `scale`, `bias` broadcast against `x`; result in x's dtype.

  Scale and bias enter rounded to x's dtype, as Flax's and Haiku's layer norms
  use them in bfloat16; the statistics and arithmetic are float32.
  """
  # Under shard_map, replicated parameters meet sharded rows outside the custom
  # gradient, where JAX reduces their gradient over the shards itself; so do rows
  # shared by the examples (graph constants) and a noise-conditioned scale per example.
  x = vary_like(x, scale, bias)
  return _layer_norm(x, vary_like(scale, x), vary_like(bias, x), epsilon)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _layer_norm(x, scale, bias, epsilon):
  return _layer_norm_forward(x, scale, bias, epsilon)[0]


def _statistics(x, epsilon):
  """`(x as float32, mean, 1 / std)`, the statistics `[..., 1]` float32."""
  x32 = x.astype(jnp.promote_types(x.dtype, jnp.float32))
  mean = jnp.mean(x32, axis=-1, keepdims=True)
  variance = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
  return x32, mean, jax.lax.rsqrt(variance + epsilon)


def _layer_norm_forward(x, scale, bias, epsilon):
  x32, mean, inverse_std = _statistics(x, epsilon)
  y = (x32 - mean) * (inverse_std * scale.astype(x.dtype)) + bias.astype(x.dtype)
  return y.astype(x.dtype), (x, mean, inverse_std, scale, bias)


def _layer_norm_backward(epsilon, residuals, grad):
  del epsilon
  x, mean, inverse_std, scale, bias = residuals
  grad = grad.astype(mean.dtype)
  normalized = (x.astype(mean.dtype) - mean) * inverse_std
  grad_normalized = grad * scale.astype(x.dtype)
  grad_x = inverse_std * (grad_normalized - jnp.mean(grad_normalized, -1, keepdims=True)
                          - normalized * jnp.mean(grad_normalized * normalized, -1, keepdims=True))
  return (grad_x.astype(x.dtype), _sum_to(grad * normalized, scale),
          _sum_to(grad, bias))


def column_sum(value: jax.Array) -> jax.Array:
  """`value [..., C]` summed over every axis but the last: `[C]`, as `ones @ value`."""
  rows = value.reshape(-1, value.shape[-1])
  return jnp.dot(jnp.ones((rows.shape[0],), rows.dtype), rows,
                 precision=jax.lax.Precision.HIGHEST,
                 preferred_element_type=jnp.promote_types(rows.dtype, jnp.float32))


def _sum_to(value, like):
  """`value` summed over the axes that `like` was broadcast along, in like's shape and dtype."""
  extra = value.ndim - like.ndim
  axes = tuple(range(extra)) + tuple(
      extra + i for i, size in enumerate(like.shape) if size == 1 and value.shape[extra + i] != 1)
  if axes == tuple(range(value.ndim - 1)) and like.shape[-1:] == value.shape[-1:]:
    return column_sum(value).reshape(like.shape).astype(like.dtype)  # the usual case
  return jnp.sum(value, axis=axes).reshape(like.shape).astype(like.dtype)


_layer_norm.defvjp(_layer_norm_forward, _layer_norm_backward)


@jax.custom_vjp
def swish(x: jax.Array) -> jax.Array:
  """`x * sigmoid(x)` (jax.nn.swish), keeping only `x` for its gradient."""
  return x * jax.nn.sigmoid(x)


def _swish_forward(x):
  return swish(x), x


def _swish_backward(x, grad):
  sigmoid = jax.nn.sigmoid(x)
  return (grad * sigmoid + grad * x * (sigmoid * (1 - sigmoid)),)


swish.defvjp(_swish_forward, _swish_backward)


def add_bias(x: jax.Array, bias: jax.Array) -> jax.Array:
  """`x [..., C] + bias [C]`; the bias's gradient is a `column_sum`."""
  x = vary_like(x, bias)  # as in `layer_norm`: JAX sums a replicated bias over shards
  return _add_bias(x, vary_like(bias, x))


@jax.custom_vjp
def _add_bias(x, bias):
  return x + bias


def _add_bias_forward(x, bias):
  return x + bias, bias


def _add_bias_backward(bias, grad):
  return grad, _sum_to(grad, bias)


_add_bias.defvjp(_add_bias_forward, _add_bias_backward)


class Linear(nnx.Linear):
  """`nnx.Linear` (the same parameters, initialization and product) adding its bias by
  `add_bias`."""

  def __call__(self, inputs: jax.Array) -> jax.Array:
    dtype = self.dtype or jnp.result_type(inputs, self.kernel[...])
    y = jax.lax.dot_general(inputs.astype(dtype), self.kernel[...].astype(dtype),
                            (((inputs.ndim - 1,), (0,)), ((), ())), precision=self.precision)
    return y if self.bias is None else add_bias(y, self.bias[...].astype(dtype))


class LayerNorm(nnx.Module):
  """`layer_norm` over the last axis with learned `scale` and `bias` (float32 parameters)."""

  def __init__(self, size: int, *, epsilon: float = LAYER_NORM_EPSILON):
    self.scale = nnx.Param(jnp.ones((size,), jnp.float32))
    self.bias = nnx.Param(jnp.zeros((size,), jnp.float32))
    self.epsilon = epsilon

  def __call__(self, x: jax.Array) -> jax.Array:
    return layer_norm(x, self.scale[...], self.bias[...], self.epsilon)
