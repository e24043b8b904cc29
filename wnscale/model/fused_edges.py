"""A processor layer's edge work as one Pallas kernel per receiver block (`aggregation="fused"`).

Computed by XLA, an interaction network's edge step on the multi-mesh writes and
reads several `[num_edges, latent]` arrays in the accelerator's memory (the
hidden layer, its activation, the second layer's output, the layer norm's, the
messages, the new edge latents), and the backward pass as many again; at the
paper model's width (512) each product is as much memory traffic as
arithmetic. Here, per block of `slots` edges of the receiver-block layout
(`wnscale.graphs.receiver_blocks`) and its window of `width` receivers, one
kernel keeps them all on the chip:

  hidden   = e @ W_h + b_h + s + onehot^T @ window    e: edge latents [slots, D]
                                                      s: each edge's sender row of the
                                                         projected senders (gathered by XLA)
                                                      window: the projected receivers'
                                                         rows of the block [width, D]
  message  = layer_norm(swish(hidden) @ W_o + b_o) * scale + offset
  e'       = e + message                              the new edge latents
  partial  = onehot @ message                         [width, D] float32, each receiver's sum
                                                      of the block's messages

(`onehot` `[width, slots]`: 1 where an edge goes to a row of the window; padding
edges go to none.) Its reads: `e` and `s` once; its writes: `e'` and the partial
sums. The backward kernel recomputes a block's forward pass from the same inputs
and writes the gradients of `e`, `s` and the window, accumulating the weights'
across blocks. What lies outside the kernels is XLA's: the sender rows' gather
and its transpose (a scatter, by sender), the receiver windows, and the
partial sums' assembly (`wnscale.model.aggregation`).

The arithmetic is `InteractionNetwork.messages` plus the sum to the receivers:
products of the activation dtype accumulated in float32, everything else in
float32 (XLA's version rounds the hidden layer and the second layer's output
to the activation dtype in between; in float32 the two agree to rounding).
On a CPU the kernels run in Pallas's interpreter (for tests; slow).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from wnscale.graphs.receiver_blocks import ReceiverBlocks
from wnscale.model import aggregation
from wnscale.model.varying import vary_like

_VMEM_LIMIT = 100 * 2**20  # a v5e TensorCore has 128 MiB of VMEM


def edge_step(params: tuple, edges, sender_table, senders, receiver_table,
              blocks: ReceiverBlocks, epsilon: float):
  """`(sums [num_receivers, D] float32, new edge latents [num_edges, D])` of one layer.

  Args:
    params: `(W_h [D, D], b_h [D], W_o [D, D], b_o [D], scale [D], offset [D])`, the edge
      MLP's layers and its layer norm's scale and offset, in the activation dtype.
    edges: `[num_edges, D]` edge latents, in the blocks' layout (`num_blocks * slots` rows).
    sender_table: `[num_senders, D]` the projected senders; `senders`: `[num_edges]` rows.
    receiver_table: `[num_receivers, D]` the projected receivers.
    epsilon: the layer norm's.
  """
  params = tuple(vary_like(p, edges) for p in params)  # as `lean.layer_norm` says why
  return _edge_step(params, edges, sender_table, senders, receiver_table, blocks, epsilon)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _edge_step(params, edges, sender_table, senders, receiver_table, blocks, epsilon):
  return _edge_step_forward(params, edges, sender_table, senders, receiver_table, blocks,
                            epsilon)[0]


def _edge_step_forward(params, edges, sender_table, senders, receiver_table, blocks, epsilon):
  new_edges, partials = _forward(params, edges, sender_table[senders],
                                 aggregation.windows(receiver_table, blocks), blocks, epsilon)
  sums = aggregation.assemble(partials, blocks)
  return (sums, new_edges), (params, edges, sender_table, senders, receiver_table, blocks)


def _edge_step_backward(epsilon, residuals, cotangents):
  params, edges, sender_table, senders, receiver_table, blocks = residuals
  grad_sums, grad_new_edges = cotangents
  grad_edges, grad_senders, grad_windows, *grad_params = _backward(
      params, edges, sender_table[senders], aggregation.windows(receiver_table, blocks),
      blocks, epsilon, aggregation.windows(grad_sums.astype(jnp.float32), blocks),
      grad_new_edges)
  grad_sender_table = jax.ops.segment_sum(grad_senders.astype(jnp.float32), senders,
                                          num_segments=sender_table.shape[0])
  grad_receiver_table = aggregation.assemble(grad_windows, blocks)
  grad_params = tuple(g.reshape(p.shape).astype(p.dtype) for g, p in zip(grad_params, params))
  return (grad_params, grad_edges, grad_sender_table.astype(sender_table.dtype), None,
          grad_receiver_table.astype(receiver_table.dtype), None)


_edge_step.defvjp(_edge_step_forward, _edge_step_backward)


def _precision(dtype):
  """Exact products for float32 (a TPU's default rounds them to bfloat16 first)."""
  return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def _dot(a, b, contract=((1,), (0,)), precision=None):
  return jax.lax.dot_general(a, b, (contract, ((), ())), precision=precision,
                             preferred_element_type=jnp.float32)


def _block_forward(e, s, window, rows_of_edges, edges_of_rows, w_h, b_h, w_o, b_o, scale,
                   offset, epsilon):
  """One block's forward pass, float32: `(onehot^T [slots, width], onehot [width, slots],
  hidden, swish(hidden), normalized, 1/std, message)`."""
  dtype = e.dtype
  width = window.shape[0]
  # [slots, width] and [width, slots] one-hot matrices of the edges' window rows.
  to_rows = (rows_of_edges == jax.lax.broadcasted_iota(jnp.int32, (e.shape[0], width), 1))
  from_rows = (edges_of_rows == jax.lax.broadcasted_iota(jnp.int32, (width, e.shape[0]), 0))
  to_rows, from_rows = to_rows.astype(dtype), from_rows.astype(dtype)
  hidden = (_dot(e, w_h) + b_h.astype(jnp.float32) + s.astype(jnp.float32)
            + _dot(to_rows, window, precision=_precision(dtype)))
  activated = hidden * jax.nn.sigmoid(hidden)
  out = _dot(activated.astype(dtype), w_o) + b_o.astype(jnp.float32)
  mean = jnp.mean(out, axis=-1, keepdims=True)
  centred = out - mean
  inverse_std = jax.lax.rsqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + epsilon)
  normalized = centred * inverse_std
  message = normalized * scale.astype(jnp.float32) + offset.astype(jnp.float32)
  return to_rows, from_rows, hidden, activated, normalized, inverse_std, message


def _forward_kernel(e_ref, s_ref, window_ref, rows_of_edges_ref, edges_of_rows_ref, w_h_ref,
                    b_h_ref, w_o_ref, b_o_ref, scale_ref, offset_ref, new_edges_ref,
                    partial_ref, *, epsilon):
  e = e_ref[...]
  _, from_rows, *_, message = _block_forward(
      e, s_ref[...], window_ref[0], rows_of_edges_ref[0], edges_of_rows_ref[0], w_h_ref[...],
      b_h_ref[...], w_o_ref[...], b_o_ref[...], scale_ref[...], offset_ref[...], epsilon)
  message = message.astype(e.dtype)
  new_edges_ref[...] = (e + message).astype(new_edges_ref.dtype)
  partial_ref[0] = _dot(from_rows, message, precision=_precision(e.dtype))


def _backward_kernel(e_ref, s_ref, window_ref, rows_of_edges_ref, edges_of_rows_ref, w_h_ref,
                     b_h_ref, w_o_ref, b_o_ref, scale_ref, offset_ref, grad_partial_ref,
                     grad_new_edges_ref, grad_e_ref, grad_s_ref, grad_window_ref,
                     grad_w_h_ref, grad_b_h_ref, grad_w_o_ref, grad_b_o_ref, grad_scale_ref,
                     grad_offset_ref, *, epsilon):
  @pl.when(pl.program_id(0) == 0)
  def _():
    for ref in (grad_w_h_ref, grad_b_h_ref, grad_w_o_ref, grad_b_o_ref, grad_scale_ref,
                grad_offset_ref):
      ref[...] = jnp.zeros_like(ref)

  e = e_ref[...]
  dtype = e.dtype
  w_h, w_o, scale = w_h_ref[...], w_o_ref[...], scale_ref[...]
  to_rows, from_rows, hidden, activated, normalized, inverse_std, _ = _block_forward(
      e, s_ref[...], window_ref[0], rows_of_edges_ref[0], edges_of_rows_ref[0], w_h,
      b_h_ref[...], w_o, b_o_ref[...], scale, offset_ref[...], epsilon)
  grad_new_edges = grad_new_edges_ref[...].astype(jnp.float32)
  # The message reaches the new edge latents and, by the window rows, the sums.
  grad_message = grad_new_edges + _dot(to_rows.astype(jnp.float32), grad_partial_ref[0],
                                       precision=jax.lax.Precision.HIGHEST)
  column_sum = lambda x: jnp.sum(x, axis=0, keepdims=True)
  grad_scale_ref[...] += column_sum(grad_message * normalized)
  grad_offset_ref[...] += column_sum(grad_message)
  grad_normalized = grad_message * scale.astype(jnp.float32)
  grad_out = inverse_std * (
      grad_normalized - jnp.mean(grad_normalized, axis=-1, keepdims=True)
      - normalized * jnp.mean(grad_normalized * normalized, axis=-1, keepdims=True))
  grad_out_d = grad_out.astype(dtype)
  grad_w_o_ref[...] += _dot(activated.astype(dtype), grad_out_d, contract=((0,), (0,)))
  grad_b_o_ref[...] += column_sum(grad_out)
  sigmoid = jax.nn.sigmoid(hidden)
  grad_hidden = (_dot(grad_out_d, w_o, contract=((1,), (1,)))
                 * (sigmoid + hidden * sigmoid * (1 - sigmoid)))
  grad_hidden_d = grad_hidden.astype(dtype)
  grad_w_h_ref[...] += _dot(e, grad_hidden_d, contract=((0,), (0,)))
  grad_b_h_ref[...] += column_sum(grad_hidden)
  grad_e_ref[...] = (grad_new_edges + _dot(grad_hidden_d, w_h, contract=((1,), (1,)))
                     ).astype(grad_e_ref.dtype)
  grad_s_ref[...] = grad_hidden_d
  grad_window_ref[0] = _dot(from_rows, grad_hidden_d, precision=_precision(dtype))


def _specs(blocks: ReceiverBlocks, latent: int):
  """`(BlockSpecs of the edge-row inputs and of the weights, grid)`."""
  num_blocks, slots = blocks.local.shape
  width = blocks.width
  rows = pl.BlockSpec((slots, latent), lambda k: (k, 0))
  window = pl.BlockSpec((1, width, latent), lambda k: (k, 0, 0))
  rows_of_edges = pl.BlockSpec((1, slots, 1), lambda k: (k, 0, 0))
  edges_of_rows = pl.BlockSpec((1, 1, slots), lambda k: (k, 0, 0))
  matrix = pl.BlockSpec((latent, latent), lambda k: (0, 0))
  vector = pl.BlockSpec((1, latent), lambda k: (0, 0))
  return (rows, window, rows_of_edges, edges_of_rows, matrix, vector), (num_blocks,)


def _index_inputs(blocks: ReceiverBlocks):
  """The edges' window rows as a column per block and as a row per block."""
  return blocks.local[:, :, None], blocks.local[:, None, :]


def _params_2d(params):
  w_h, b_h, w_o, b_o, scale, offset = params
  return (w_h, b_h.reshape(1, -1), w_o, b_o.reshape(1, -1), scale.reshape(1, -1),
          offset.reshape(1, -1))


def _call(kernel, semantics: str, **call):
  """`pallas_call(kernel, **call)`: compiled for a TPU, interpreted elsewhere (a CPU, for
  tests).

  Inside `shard_map` its mesh says the platform (an ahead-of-time compile for a TPU on a
  CPU host gets the compiled kernel), and a CPU's is the TPU interpreter (Pallas's
  generic one does not run there). Outside, the lowering decides
  (`lax.platform_dependent`), with the generic interpreter (the TPU one's effects cannot
  be inside that choice, nor under remat).
  """
  compiled = pl.pallas_call(kernel, compiler_params=pltpu.CompilerParams(
      dimension_semantics=(semantics,), vmem_limit_bytes=_VMEM_LIMIT), **call)
  platform = aggregation.target_platform()
  if platform == "tpu":
    return compiled
  if platform is not None:
    return pl.pallas_call(kernel, interpret=pltpu.InterpretParams(), **call)
  interpreted = pl.pallas_call(kernel, interpret=True, **call)
  return lambda *inputs: jax.lax.platform_dependent(*inputs, tpu=compiled,
                                                    default=interpreted)


def _out(shape, dtype, like) -> jax.ShapeDtypeStruct:
  """A kernel output's shape, varying over the manual mesh axes `like` varies over (inside
  `shard_map` the kernel's outputs must say)."""
  return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=jax.typeof(like).manual_axis_type)


def _forward(params, edges, senders_rows, windows, blocks, epsilon):
  """`(new edges [E, D], partial sums [num_blocks, width, D] float32)`."""
  latent = edges.shape[-1]
  (rows, window, rows_of_edges, edges_of_rows, matrix, vector), grid = _specs(blocks, latent)
  return _call(
      functools.partial(_forward_kernel, epsilon=epsilon), "parallel",
      out_shape=(_out(edges.shape, edges.dtype, edges),
                 _out(windows.shape, jnp.float32, edges)),
      grid=grid,
      in_specs=[rows, rows, window, rows_of_edges, edges_of_rows, matrix, vector, matrix,
                vector, vector, vector],
      out_specs=(rows, window),
  )(edges, senders_rows, windows, *_index_inputs(blocks), *_params_2d(params))


def _backward(params, edges, senders_rows, windows, blocks, epsilon, grad_windows,
              grad_new_edges):
  """`(grad edges, grad sender rows, grad window partials [num_blocks, width, D] float32,
  grad W_h, b_h, W_o, b_o, scale, offset (float32))`."""
  latent = edges.shape[-1]
  (rows, window, rows_of_edges, edges_of_rows, matrix, vector), grid = _specs(blocks, latent)
  vector_out = _out((1, latent), jnp.float32, edges)
  matrix_out = _out((latent, latent), jnp.float32, edges)
  # "arbitrary": the weights' gradients add up over the blocks, in order.
  return _call(
      functools.partial(_backward_kernel, epsilon=epsilon), "arbitrary",
      out_shape=(_out(edges.shape, edges.dtype, edges), _out(edges.shape, edges.dtype, edges),
                 _out(windows.shape, jnp.float32, edges),
                 matrix_out, vector_out, matrix_out, vector_out, vector_out, vector_out),
      grid=grid,
      in_specs=[rows, rows, window, rows_of_edges, edges_of_rows, matrix, vector, matrix,
                vector, vector, vector, window, rows],
      out_specs=(rows, rows, window, matrix, vector, matrix, vector, vector, vector),
  )(edges, senders_rows, windows, *_index_inputs(blocks), *_params_2d(params), grad_windows,
    grad_new_edges)
