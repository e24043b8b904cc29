"""Layer norm, an MLP's tail and a linear layer whose gradients keep little and sum
columns by matrix product.

Differentiated the plain way, a bfloat16 layer norm keeps three float32 copies
of its `[rows, features]` input for the backward pass (the input cast up, the
centred input, the normalized input) and swish keeps its input and two
intermediates. On GraphCast's edge sets (millions of rows) those residuals
are most of a training step's memory.

`layer_norm` and `mlp_tail` (swish, linear layer, layer norm: every MLP of the
model after its first layer) are `jax.custom_vjp` functions that compute
exactly what the plain versions compute in the forward pass and recompute the
intermediates in the backward pass: the layer norm from its input plus the
per-row mean and reciprocal standard deviation (`[rows, 1]` float32), the tail
from the hidden layer's pre-activation alone (one matrix product more).
For each edge MLP that is one `[rows, latent]` array kept (besides its input)
against the four or five of plain autodiff. Gradients equal plain autodiff's
to float rounding (tests/test_low_memory_layers.py).

The layer norm is GraphCast's (Haiku's defaults): epsilon 1e-5 and the two-pass
variance, statistics in float32 whatever the activation dtype:

  y = (x - mean(x)) * rsqrt(mean((x - mean(x))^2) + epsilon) * scale + bias

The gradients of the layer norm's scale and bias and of a linear layer's bias are
column sums, `[rows, features] -> [features]`. Per example (under `vmap`) XLA sees
them as the sum over the middle axis of `[batch, rows, features]`, which XLA:CPU's
YNNPACK reduction runs many times slower than the same sum as a matrix product with a
vector of ones (docs/benchmarks.md, "Figures behind the code"). `column_sum` is that
product, in full float32 precision on every backend.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from wnscale.model.manual_axis_types import vary_like

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


@jax.named_scope("layer_norm")  # labels its ops in profiles (bench/op_profile.py)
def _layer_norm_forward(x, scale, bias, epsilon):
  x32, mean, inverse_std = _statistics(x, epsilon)
  y = (x32 - mean) * (inverse_std * scale.astype(x.dtype)) + bias.astype(x.dtype)
  return y.astype(x.dtype), (x, mean, inverse_std, scale, bias)


@jax.named_scope("layer_norm")
def _layer_norm_backward(epsilon, residuals, grad):
  del epsilon
  # The barrier keeps XLA from merging the recomputation below with the forward
  # pass's identical one (common subexpressions), which would keep the forward's
  # intermediates alive until now: what recomputing is meant to avoid. With the
  # incoming gradient inside it, the recomputation cannot start before it is needed.
  (x, mean, inverse_std, scale, bias), grad = jax.lax.optimization_barrier((residuals, grad))
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


def mlp_tail(hidden: jax.Array, kernel: jax.Array, bias: jax.Array,
             norm_scale: jax.Array | None = None, norm_offset: jax.Array | None = None, *,
             epsilon: float = LAYER_NORM_EPSILON, precision=None) -> jax.Array:
  """An MLP after its first layer: `layer_norm(swish(hidden) @ kernel + bias)`, keeping `hidden`.

  `hidden [..., H]`, `kernel [H, D]`, `bias [D]`, all in the activation dtype;
  `norm_scale`, `norm_offset` broadcast against `[..., D]` (None: no layer norm).
  Result `[..., D]` in the activation dtype.

  Its gradient keeps only `hidden` and the norm's per-row statistics: the
  swish output and the norm's input are recomputed in the backward pass, the
  latter by the one matrix product `swish(hidden) @ kernel` more. On an edge set
  that is one `[rows, D]` array kept per MLP in place of three.
  """
  params = (kernel, bias, norm_scale, norm_offset)
  hidden = vary_like(hidden, *jax.tree.leaves(params))  # as in `layer_norm`
  params = jax.tree.map(lambda p: vary_like(p, hidden), params)
  return _mlp_tail(hidden, *params, epsilon, precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _mlp_tail(hidden, kernel, bias, scale, offset, epsilon, precision):
  return _mlp_tail_forward(hidden, kernel, bias, scale, offset, epsilon, precision)[0]


def _swish_linear(hidden, kernel, bias, precision):
  """`(swish(hidden), swish(hidden) @ kernel + bias)`."""
  activated = hidden * jax.nn.sigmoid(hidden)
  product = jax.lax.dot_general(activated, kernel, (((hidden.ndim - 1,), (0,)), ((), ())),
                                precision=precision)
  return activated, product + bias


def _mlp_tail_forward(hidden, kernel, bias, scale, offset, epsilon, precision):
  _, y = _swish_linear(hidden, kernel, bias, precision)
  if scale is None:
    return y, (hidden, kernel, bias, None, None, None, None)
  normalized, (_, mean, inverse_std, _, _) = _layer_norm_forward(y, scale, offset, epsilon)
  return normalized, (hidden, kernel, bias, scale, offset, mean, inverse_std)


def _mlp_tail_backward(epsilon, precision, residuals, grad):
  # A barrier as in `_layer_norm_backward`: recomputed, not kept from the forward pass.
  (hidden, kernel, bias, scale, offset, mean, inverse_std), grad = (
      jax.lax.optimization_barrier((residuals, grad)))
  activated, y = _swish_linear(hidden, kernel, bias, precision)
  grad_scale = grad_offset = None
  if scale is not None:
    grad, grad_scale, grad_offset = _layer_norm_backward(
        epsilon, (y, mean, inverse_std, scale, offset), grad)
  sigmoid = jax.nn.sigmoid(hidden)
  grad_hidden = (_input_gradient(grad, kernel, precision)
                 * (sigmoid + hidden * (sigmoid * (1 - sigmoid))))
  return (grad_hidden, _kernel_gradient(activated, grad, kernel, precision),
          _sum_to(grad, bias), grad_scale, grad_offset)


_mlp_tail.defvjp(_mlp_tail_forward, _mlp_tail_backward)


def linear(x: jax.Array, kernel: jax.Array, bias: jax.Array | None = None,
           precision=None) -> jax.Array:
  """`x [..., I] @ kernel [I, O] + bias [O]` (no bias if None), keeping `x` for its gradient.

  Plain autodiff under the batch `vmap` contracts the kernel's gradient over two
  axes, `[batch, rows]`, which XLA:CPU feeds to its matrix product through an
  elementwise fusion writing `[O, batch * rows]` transposed (a large share of the mid
  problem's step: docs/benchmarks.md). Here the gradient is a product over the rows of
  each example (`_kernel_gradient`), which needs no transposed copy; the bias's a
  `column_sum`.
  """
  params = (kernel, bias)
  x = vary_like(x, *jax.tree.leaves(params))  # as in `layer_norm`
  return _linear(x, *jax.tree.map(lambda p: vary_like(p, x), params), precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _linear(x, kernel, bias, precision):
  y = jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())), precision=precision)
  return y if bias is None else y + bias


def _linear_forward(x, kernel, bias, precision):
  return _linear(x, kernel, bias, precision), (x, kernel, bias)


def _linear_backward(precision, residuals, grad):
  x, kernel, bias = residuals
  return (_input_gradient(grad, kernel, precision), _kernel_gradient(x, grad, kernel, precision),
          None if bias is None else _sum_to(grad, bias))


_linear.defvjp(_linear_forward, _linear_backward)


def _input_gradient(grad, kernel, precision):
  """`grad [..., O] @ kernel.T`: `[..., I]`."""
  return jax.lax.dot_general(grad, kernel, (((grad.ndim - 1,), (1,)), ((), ())),
                             precision=precision)


def _kernel_gradient(x, grad, kernel, precision):
  """`x.T @ grad` over all rows, `[I, O]` in kernel's dtype (accumulated in float32)."""
  rows = lambda a: a.reshape(-1, a.shape[-1])
  return jax.lax.dot_general(rows(x), rows(grad), (((0,), (0,)), ((), ())),
                             precision=precision,
                             preferred_element_type=jnp.float32).astype(kernel.dtype)


class Linear(nnx.Linear):
  """`nnx.Linear` (the same parameters, initialization and product) computed by `linear`."""

  def __call__(self, inputs: jax.Array) -> jax.Array:
    dtype = self.dtype or jnp.result_type(inputs, self.kernel[...])
    return linear(inputs.astype(dtype), self.kernel[...].astype(dtype),
                  None if self.bias is None else self.bias[...].astype(dtype), self.precision)


class LayerNorm(nnx.Module):
  """`layer_norm` over the last axis with learned `scale` and `bias` (float32 parameters)."""

  def __init__(self, size: int, *, epsilon: float = LAYER_NORM_EPSILON):
    self.scale = nnx.Param(jnp.ones((size,), jnp.float32))
    self.bias = nnx.Param(jnp.zeros((size,), jnp.float32))
    self.epsilon = epsilon

  def scale_and_offset(self) -> tuple[jax.Array, jax.Array]:
    """The `[size]` scale and offset the normalized rows are multiplied by and shifted by."""
    return self.scale[...], self.bias[...]

  def __call__(self, x: jax.Array) -> jax.Array:
    return layer_norm(x, *self.scale_and_offset(), self.epsilon)
