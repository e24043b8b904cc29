"""A processor layer's edge work as one Pallas kernel per receiver block (`aggregation="fused"`).

Computed by XLA, an interaction network's edge step on the multi-mesh writes and
reads several `[num_edges, latent]` arrays in the accelerator's memory (the
hidden layer, its activation, the second layer's output, the layer norm's, the
messages, the new edge latents), and the backward pass as many again; at the
paper model's width (512) each product is as much memory traffic as
arithmetic. Here, per block of `slots` edges of the receiver-block layout
(`wnscale.graphs.receiver_blocks`) and its window of `width` receivers, one
kernel keeps them all on the chip:

  hidden   = e @ W_h + b_h + senders + onehot^T @ window     e: edge latents [slots, D]
                                                      window: the projected receivers'
                                                         rows of the block [width, D]
  senders  = sender_onehot^T @ sender_window + far_onehot @ far_rows
                                                      the edges' rows of the projected
                                                      senders: the near ones from the block's
                                                      sender window, the far ones placed
                                                      (`receiver_blocks.SenderWindows`)
  message  = layer_norm(swish(hidden) @ W_o + b_o) * scale + offset
  e'       = e + message                              the new edge latents
  partial  = onehot @ message                         [width, D] float32, each receiver's sum
                                                      of the block's messages

(`onehot` `[width, slots]`: 1 where an edge goes to a row of the window; padding
edges go to none.) Its reads: `e` once, the windows and the far rows; its writes:
`e'` and the partial sums. The backward kernel recomputes a block's forward pass
from the same inputs and writes the gradients of `e`, of both windows and of the
far rows, accumulating the weights' across blocks. What lies outside the kernels
is XLA's: the far rows gathered, the partial sums assembled
(`wnscale.model.aggregation`), and the far rows' gradient summed onto their
senders (permuted into sender order and summed by blocks, as the sums are).

The arithmetic is `InteractionNetwork.messages` plus the sum to the receivers:
products of the activation dtype accumulated in float32, everything else in
float32 (XLA's version rounds the hidden layer and the second layer's output
to the activation dtype in between; in float32 the two agree to rounding). Products
of float32 operands, the MLPs' and the 0/1 matrices' alike, are made as XLA makes a
float32 product on the same chip (`aggregation.float32_products`): on a TPU at its
default matmul precision one bfloat16 pass (the gathered rows and the summed messages
rounded to bfloat16, as an MLP's inputs are; sums accumulated in float32), else in
float32, the 0/1 products then gathering exactly and summing in float32
(`pallas_parts.one_hot_dot`).
On a CPU the kernels run in Pallas's interpreter (for tests; slow).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from wnscale.graphs.receiver_blocks import ReceiverBlocks, SenderWindows
from wnscale.model import aggregation, pallas_parts
from wnscale.model.manual_axis_types import vary_like


def edge_step(params: tuple, edges, sender_table, senders: SenderWindows, receiver_table,
              blocks: ReceiverBlocks, epsilon: float, write_over_edges: bool = True):
  """`(sums [num_receivers, D] float32, new edge latents [num_edges, D])` of one layer.

  Args:
    params: `(W_h [D, D], b_h [D], W_o [D, D], b_o [D], scale [D], offset [D])`, the edge
      MLP's layers and its layer norm's scale and offset, in the activation dtype.
    edges: `[num_edges, D]` edge latents, in the blocks' layout (`num_blocks * slots` rows).
    sender_table: `[num_senders, D]` the projected senders; `senders`: the edges' windows
      of it.
    receiver_table: `[num_receivers, D]` the projected receivers.
    epsilon: the layer norm's.
    write_over_edges: whether the new edge latents are written over `edges` when a
      gradient is to come (without one, always). The backward pass needs the old ones:
      written over, XLA copies them first. In a `jax.lax.scan` over the layers that copy
      is made anyway (into the stacked residuals), and writing over them keeps the loop's
      carry in place; in a Python loop, not writing over them saves the copy.
  """
  params = tuple(vary_like(p, edges) for p in params)  # as `low_memory_layers.layer_norm` says why
  return _edge_step(params, edges, sender_table, senders, receiver_table, blocks, epsilon,
                    write_over_edges)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _edge_step(params, edges, sender_table, senders, receiver_table, blocks, epsilon,
               write_over_edges):
  del write_over_edges  # no gradient to come: the old edges are not needed after
  return _edge_step_forward(params, edges, sender_table, senders, receiver_table, blocks,
                            epsilon, True)[0]


def _tables(sender_table, senders, receiver_table, blocks):
  """The kernels' table inputs: the sender table `[sender rows, D]` and the receiver table
  `[receiver rows, D]`, each padded to whole windows (`aggregation.padded_table`; the
  kernels read each block's window from them), and the far rows `[num_blocks, far, D]`."""
  return (aggregation.padded_table(sender_table, senders.width),
          sender_table[senders.far_senders],
          aggregation.padded_table(receiver_table, blocks.width))


def _edge_step_forward(params, edges, sender_table, senders, receiver_table, blocks, epsilon,
                       write_over_edges):
  new_edges, partials = _forward(
      params, edges, _tables(sender_table, senders, receiver_table, blocks), senders, blocks,
      epsilon, write_over_edges)
  sums = aggregation.assemble(partials, blocks)
  return (sums, new_edges), (params, edges, sender_table, senders, receiver_table, blocks)


def _edge_step_backward(epsilon, write_over_edges, residuals, cotangents):
  del write_over_edges
  params, edges, sender_table, senders, receiver_table, blocks = residuals
  grad_sums, grad_new_edges = cotangents
  grad_edges, grad_sender_windows, grad_far, grad_windows, *grad_params = _backward(
      params, edges, _tables(sender_table, senders, receiver_table, blocks), senders, blocks,
      epsilon, aggregation.padded_table(grad_sums.astype(jnp.float32), blocks.width),
      grad_new_edges)
  grad_sender_table = aggregation.assemble(grad_sender_windows, senders) + (
      aggregation.sum_far_rows(grad_far, senders, sender_table.shape[0]))
  grad_receiver_table = aggregation.assemble(grad_windows, blocks)
  grad_params = tuple(g.reshape(p.shape).astype(p.dtype) for g, p in zip(grad_params, params))
  return (grad_params, grad_edges, grad_sender_table.astype(sender_table.dtype), None,
          grad_receiver_table.astype(receiver_table.dtype), None)


_edge_step.defvjp(_edge_step_forward, _edge_step_backward)


def _block_forward(e, refs, epsilon, products):
  """One block's forward pass: `(the three one-hot pairs, the edge MLP's six parameters,
  its pallas_parts.mlp_forward (float32; the message last))`. `refs`: the kernel's block
  inputs after `e` (the sender and receiver windows `[width, D]`, the far rows `[1, far,
  D]`, ...)."""
  (sender_window, far_rows, window, sender_column, sender_row, far_column, far_row,
   receiver_column, receiver_row, *param_refs) = refs
  senders = pallas_parts.one_hots(sender_column[0], sender_row[0], sender_window.shape[0])
  far = pallas_parts.one_hots(far_column[0], far_row[0], far_rows.shape[1])
  receivers = pallas_parts.one_hots(receiver_column[0], receiver_row[0], window.shape[0])
  node_rows = (pallas_parts.one_hot_dot(senders[0], sender_window[...], products)
               + pallas_parts.one_hot_dot(far[0], far_rows[0], products)
               + pallas_parts.one_hot_dot(receivers[0], window[...], products))
  params = [ref[...] for ref in param_refs]
  return ((senders, far, receivers), params,
          pallas_parts.mlp_forward(e, node_rows, params, epsilon, products))


_INPUTS = 16  # e, the sender table, the far rows, the receiver table, 6 indices, 6 parameters


_PREFETCHED = 2  # the windows' first rows, sender and receiver: read by the index maps


def _forward_kernel(*refs, epsilon, products):
  refs = refs[_PREFETCHED:]
  e_ref, inputs, (new_edges_ref, partial_ref) = refs[0], refs[1:_INPUTS], refs[_INPUTS:]
  e = e_ref[...]
  (_, _, receivers), _, (*_, message) = _block_forward(e, inputs, epsilon, products)
  message = message.astype(e.dtype)
  new_edges_ref[...] = (e + message).astype(new_edges_ref.dtype)
  partial_ref[0] = pallas_parts.one_hot_dot(receivers[1], message, products)


def _backward_kernel(*refs, epsilon, products):
  refs = refs[_PREFETCHED:]
  e_ref, inputs = refs[0], refs[1:_INPUTS]
  grad_partial_ref, grad_new_edges_ref = refs[_INPUTS:_INPUTS + 2]
  grad_e_ref, grad_sender_window_ref, grad_far_ref, grad_window_ref = refs[_INPUTS + 2:
                                                                           _INPUTS + 6]
  grad_param_refs = refs[_INPUTS + 6:]  # W_h, b_h, W_o, b_o, scale, offset

  pallas_parts.zero_in_first_block(grad_param_refs)
  e = e_ref[...]
  dtype = e.dtype
  (senders, far, receivers), params, forward = _block_forward(e, inputs, epsilon, products)
  grad_new_edges = grad_new_edges_ref[...].astype(jnp.float32)
  # The message reaches the new edge latents and, by the window rows, the sums.
  grad_message = grad_new_edges + pallas_parts.one_hot_dot(receivers[0],
                                                           grad_partial_ref[...], products)
  grad_hidden, grads = pallas_parts.mlp_backward(e, params, forward, grad_message, products)
  for ref, grad in zip(grad_param_refs, grads):
    ref[...] += grad
  grad_hidden_d = grad_hidden.astype(dtype)  # as the window products take it
  grad_e_ref[...] = (grad_new_edges + pallas_parts.mlp_dot(
      grad_hidden_d, params[0], products, contract=((1,), (1,)))).astype(grad_e_ref.dtype)
  grad_sender_window_ref[0] = pallas_parts.one_hot_dot(senders[1], grad_hidden_d, products)
  grad_far_ref[0] = pallas_parts.one_hot_dot(far[1], grad_hidden_d, products)
  grad_window_ref[0] = pallas_parts.one_hot_dot(receivers[1], grad_hidden_d, products)


def _inputs(params, edges, tables, senders: SenderWindows, blocks: ReceiverBlocks):
  """`(the kernels' inputs, their BlockSpecs, the grid spec's arguments)`: the windows' first
  rows (prefetched: the index maps read them), per block its edges' rows, its sender window,
  far rows and receiver window, each one-hot's indices as a column and as a row, and the
  parameters whole."""
  num_blocks, slots = blocks.local.shape
  latent = edges.shape[-1]
  by_block = lambda table: pl.BlockSpec((1,) + table.shape[1:], lambda k, *_: (k, 0, 0))
  whole = lambda array: pl.BlockSpec(array.shape, lambda k, *_: (0,) * array.ndim)
  indices = [index for local in (senders.local, senders.far_local, blocks.local)
             for index in (local[:, :, None], local[:, None, :])]
  parameters = pallas_parts.as_kernel_params(params)
  sender_table, far_rows, receiver_table = tables
  inputs = [senders.first, blocks.first, edges, *tables, *indices, *parameters]
  specs = ([pl.BlockSpec((slots, latent), lambda k, *_: (k, 0)),
            pallas_parts.window_spec(senders.width, latent, 0), by_block(far_rows),
            pallas_parts.window_spec(blocks.width, latent, 1)]
           + [by_block(i) for i in indices] + [whole(p) for p in parameters])
  return inputs, specs, dict(num_scalar_prefetch=_PREFETCHED, grid=(num_blocks,))


def _forward(params, edges, tables, senders, blocks, epsilon, write_over_edges):
  """`(new edges [E, D] (written over `edges` if `write_over_edges`), partial sums
  [num_blocks, width, D] float32)`."""
  inputs, specs, grid = _inputs(params, edges, tables, senders, blocks)
  num_blocks, width, latent = blocks.local.shape[0], blocks.width, edges.shape[-1]
  partials = pl.BlockSpec((1, width, latent), lambda k, *_: (k, 0, 0))
  return pallas_parts.call(
      functools.partial(_forward_kernel, epsilon=epsilon), "parallel",
      out_shape=(pallas_parts.out_shape(edges.shape, edges.dtype, edges),
                 pallas_parts.out_shape((num_blocks, width, latent), jnp.float32, edges)),
      grid_spec=pltpu.PrefetchScalarGridSpec(**grid, in_specs=specs,
                                             out_specs=(specs[0], partials)),
      input_output_aliases={_PREFETCHED: 0} if write_over_edges else {},
  )(*inputs)


def _backward(params, edges, tables, senders, blocks, epsilon, grad_sums, grad_new_edges):
  """`(grad edges (written over grad_new_edges), grad sender windows, grad far rows, grad
  receiver windows (float32, per block), grad W_h, b_h, W_o, b_o, scale, offset
  (float32))`. `grad_sums`: `[receiver rows, D]` float32, padded as the receiver table."""
  inputs, specs, grid = _inputs(params, edges, tables, senders, blocks)
  num_blocks, latent = blocks.local.shape[0], edges.shape[-1]
  f32 = lambda shape: pallas_parts.out_shape(shape, jnp.float32, edges)
  per_block = lambda width: pl.BlockSpec((1, width, latent), lambda k, *_: (k, 0, 0))
  window_shapes = [(num_blocks, senders.width, latent), tables[1].shape,
                   (num_blocks, blocks.width, latent)]
  vector, matrix = specs[-3], specs[-6]  # b_o's and W_o's: [1, D] and [D, D] whole
  # "arbitrary": the weights' gradients add up over the blocks, in order.
  return pallas_parts.call(
      functools.partial(_backward_kernel, epsilon=epsilon), "arbitrary",
      out_shape=(pallas_parts.out_shape(edges.shape, edges.dtype, edges),
                 *(f32(s) for s in window_shapes),
                 f32((latent, latent)), f32((1, latent)), f32((latent, latent)),
                 f32((1, latent)), f32((1, latent)), f32((1, latent))),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          **grid, in_specs=specs + [specs[3], specs[0]],
          out_specs=(specs[0], per_block(senders.width), specs[2], per_block(blocks.width),
                     matrix, vector, matrix, vector, vector, vector)),
      input_output_aliases={len(inputs) + 1: 0},
  )(*inputs, grad_sums, grad_new_edges)
