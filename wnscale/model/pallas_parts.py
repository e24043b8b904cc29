"""Pieces the Pallas kernels share (`fused_edges`, `fused_encoder_decoder`): how they are
called on a TPU and elsewhere, their products, and their 0/1 matrices."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from wnscale.graphs import receiver_blocks
from wnscale.model import aggregation

VMEM_LIMIT = 100 * 2**20  # a v5e TensorCore has 128 MiB of VMEM


def dot(a, b, contract=((1,), (0,)), precision=None):
  return jax.lax.dot_general(a, b, (contract, ((), ())), precision=precision,
                             preferred_element_type=jnp.float32)


def mlp_dot(a, b, products: str, contract=((1,), (0,))):
  """An MLP product `a @ b` (`contract` as `dot`'s), float32, made as
  `aggregation.float32_products` says; bfloat16 operands in one pass either way. (Mosaic's
  default for float32 operands need not be XLA's, so the kernels say which.)"""
  if a.dtype != jnp.float32:  # one pass, whatever jax_default_matmul_precision says
    return dot(a, b, contract, precision=jax.lax.Precision.DEFAULT)
  if products == "bfloat16":
    return dot(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), contract,
               precision=jax.lax.Precision.DEFAULT)
  return dot(a, b, contract, precision=jax.lax.Precision.HIGHEST)


def one_hot_dot(one_hot, values, products: str, contract=((1,), (0,))):
  """`one_hot` (0/1, bfloat16) times `values`, float32: exact for float32 values too where
  `products` (`aggregation.float32_products`) is "float32", one pass of them rounded to
  bfloat16 where it is "bfloat16".

  A float32 value is the sum of three bfloat16 pieces (8 significant bits each: its
  rounding, the rounding of what is left, and the rest), so three bfloat16 products
  accumulated in float32 reproduce a gather exactly and a sum to float32 rounding: half
  the matrix-unit passes of `Precision.HIGHEST` (six), whose other three products multiply
  the 0/1 matrix's own (zero) low pieces.
  """
  # One pass each, whatever `jax_default_matmul_precision` says (a float32 precision
  # for bfloat16 operands does not compile in a TPU kernel).
  one_pass = functools.partial(dot, contract=contract, precision=jax.lax.Precision.DEFAULT)
  if values.dtype != jnp.float32:
    return one_pass(one_hot, values)
  piece = values.astype(jnp.bfloat16)
  if products == "bfloat16":
    return one_pass(one_hot, piece)
  rest = values - piece.astype(jnp.float32)
  total = one_pass(one_hot, piece)
  piece = rest.astype(jnp.bfloat16)
  total += one_pass(one_hot, piece)
  return total + one_pass(one_hot, (rest - piece.astype(jnp.float32)).astype(jnp.bfloat16))


def one_hots(index_column, index_row, width: int):
  """`([slots, width], [width, slots])` 0/1 bfloat16 matrices of each slot's row of a window,
  from the slots' rows as a column `[slots, 1]` and as a row `[1, slots]` (`width`: none)."""
  slots = index_column.shape[0]
  to_rows = index_column == jax.lax.broadcasted_iota(jnp.int32, (slots, width), 1)
  return to_rows.astype(jnp.bfloat16), one_hot_rows(index_row, width)


def one_hot_rows(index_row, width: int):
  """`[width, slots]` 0/1 bfloat16: each slot's row of a window, from the slots' rows as a
  row `[1, slots]` (`width`: none). Its transpose picks the slots' rows (`one_hot_dot`
  contracting `((0,), (0,))`)."""
  from_rows = index_row == jax.lax.broadcasted_iota(jnp.int32, (width, index_row.shape[1]), 0)
  return from_rows.astype(jnp.bfloat16)


def as_kernel_params(params) -> list:
  """MLP parameters as the kernels take them: vectors (biases, scales, offsets) as rows
  `[1, .]`, matrices as they are."""
  return [p.reshape(1, -1) if p.ndim == 1 else p for p in params]


def zero_in_first_block(refs):
  """Zeroes `refs`, gradients a kernel accumulates across its blocks (run in order:
  "arbitrary"), in its first block."""

  @pl.when(pl.program_id(0) == 0)
  def _():
    for ref in refs:
      ref[...] = jnp.zeros_like(ref)


def window_spec(width: int, latent: int, which: int) -> pl.BlockSpec:
  """Block `k` reads rows `first[k] .. first[k] + width` of a table (`which`: 0, the
  sender windows' `first`, 1 the receiver windows'), a multiple of `ALIGN` rows in."""
  return pl.BlockSpec((pl.Element(width), pl.Element(latent)), lambda k, *first: (
      pl.multiple_of(first[which][k], receiver_blocks.ALIGN), 0))


def call(kernel, semantics: str, **call):
  """`pallas_call(kernel, **call)`: compiled for a TPU, interpreted elsewhere (a CPU, for
  tests); `kernel` takes its `products` (`aggregation.float32_products`) from the platform.

  Inside `shard_map` its mesh says the platform (an ahead-of-time compile for a TPU on a
  CPU host gets the compiled kernel), and a CPU's is the TPU interpreter (Pallas's
  generic one does not run there). Outside, the lowering decides
  (`lax.platform_dependent`), with the generic interpreter (the TPU one's effects cannot
  be inside that choice, nor under remat).
  """
  on = lambda platform: functools.partial(
      kernel, products=aggregation.float32_products(platform))
  compiled = pl.pallas_call(on("tpu"), compiler_params=pltpu.CompilerParams(
      dimension_semantics=(semantics,), vmem_limit_bytes=VMEM_LIMIT), **call)
  platform = aggregation.target_platform()
  if platform == "tpu":
    return compiled
  if platform is not None:
    return pl.pallas_call(on(platform), interpret=pltpu.InterpretParams(), **call)
  interpreted = pl.pallas_call(on(None), interpret=True, **call)
  return lambda *inputs: jax.lax.platform_dependent(*inputs, tpu=compiled,
                                                    default=interpreted)


def out_shape(shape, dtype, like) -> jax.ShapeDtypeStruct:
  """A kernel output's shape, varying over the manual mesh axes `like` varies over (inside
  `shard_map` the kernel's outputs must say)."""
  return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=jax.typeof(like).manual_axis_type)


def mlp_forward(x, added, params, epsilon, products, transposed: bool = False):
  """An MLP with a layer norm on `x [n, I]` (activation dtype; `[I, n]` if `transposed`),
  float32: `(hidden, swish(hidden), normalized, 1/std [n, 1], output)`; `added` (float32,
  or 0) joins the first layer's output, as the interaction network's projected node rows
  do."""
  w1, b1, w2, b2, scale, offset = params
  hidden = (mlp_dot(x, w1, products, contract=((0,), (0,)) if transposed else ((1,), (0,)))
            + b1.astype(jnp.float32) + added)
  activated = hidden * jax.nn.sigmoid(hidden)
  out = mlp_dot(activated.astype(x.dtype), w2, products) + b2.astype(jnp.float32)
  centred = out - jnp.mean(out, axis=-1, keepdims=True)
  inverse_std = jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + epsilon)
  normalized = centred * inverse_std
  output = normalized * scale.astype(jnp.float32) + offset.astype(jnp.float32)
  return hidden, activated, normalized, inverse_std, output


def mlp_backward(x, params, forward, grad_output, products, transposed: bool = False):
  """`(grad hidden [n, H] float32, the six parameters' gradients float32, vectors [1, .])`
  of `mlp_forward`'s output given its gradient `grad_output [n, O]` float32 (`x`,
  `transposed`: as `mlp_forward` took them)."""
  w1, _, w2, _, scale, _ = params
  hidden, activated, normalized, inverse_std, _ = forward
  dtype = x.dtype
  product = functools.partial(mlp_dot, products=products)
  column_sum = lambda value: jnp.sum(value, axis=0, keepdims=True)
  grad_normalized = grad_output * scale.astype(jnp.float32)
  grad_out = inverse_std * (
      grad_normalized - jnp.mean(grad_normalized, axis=-1, keepdims=True)
      - normalized * jnp.mean(grad_normalized * normalized, axis=-1, keepdims=True))
  grad_out_d = grad_out.astype(dtype)
  sigmoid = jax.nn.sigmoid(hidden)
  grad_hidden = (product(grad_out_d, w2, contract=((1,), (1,)))
                 * (sigmoid + hidden * sigmoid * (1 - sigmoid)))
  return grad_hidden, (
      product(x, grad_hidden.astype(dtype), contract=((1,), (0,)) if transposed else ((0,), (0,))),
      column_sum(grad_hidden),
      product(activated.astype(dtype), grad_out_d, contract=((0,), (0,))),
      column_sum(grad_out), column_sum(grad_output * normalized), column_sum(grad_output))
