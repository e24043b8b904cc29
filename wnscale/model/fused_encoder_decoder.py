"""The encoder's and decoder's edge steps as one Pallas kernel per block of receivers
(`model.aggregation="fused"`, as the processor's: `wnscale.model.fused_edges`).

An encoder or decoder edge set is read once a step: per edge XLA computes the embedding of
its static features, the interaction network's message and the sum over each receiver's
messages, writing and reading several `[num_edges, D]` arrays (3.1M decoder and 1.6M
encoder edges at 0.25 deg), which is why the XLA path cuts them into `edge_chunks` and
`grid_blocks` to fit. Here, per block of edges, one kernel keeps them on the chip:

  e        = mlp(features; W1, b1, W2, b2, scale1, offset1)  the edge latents [n, H]
                                                      (the embedder, with its layer norm)
  hidden   = e @ W_h + b_h + sender_rows + receiver_rows      [n, D]
  message  = layer_norm(swish(hidden) @ W_o + b_o) * scale + offset
  sums     = each receiver's sum of its edges' messages       float32

The receivers' and the senders' sides differ:

- the decoder (`decoder_edge_sums`, mesh -> grid): exactly `k` edges per grid node
  (GraphCast's graphs: 3), slot-major (`aggregation.FixedInDegree`: edge `j` of receiver
  `r` at row `j * R + r`), so a block of `n` grid rows owns the `k` blocks of `n` edges at
  the same rows of each slot: its receiver rows are the block's rows of the table and
  the sum over the slots is an addition; no two blocks share a receiver. Its senders
  come as `receiver_blocks.KernelSenders`: a block of grid rows is a small region, whose
  `k n` edges read a few dozen mesh rows; those are gathered once per block (`[U, D]`)
  and each edge picks its own by a 0/1 product, and the backward kernel sums the edges'
  gradient onto them the same way, so no edge-sized array of sender rows or of their
  gradient is ever written (at 0.25 deg they were 3.2 GB each, their gather and the
  permutation of their gradient 63 ms of a step on a TPU v5e).
- the encoder (`encoder_edge_sums`, grid -> mesh): a mesh node's edges vary in number;
  the edges sorted by receiver are cut into `receiver_blocks.ReceiverBlocks`, each
  block's receiver rows read from its window of the receiver table and its messages
  summed onto the window by 0/1 products (as `fused_edges` does), the partial sums
  assembled by XLA. Its sender rows (the projected grid senders; a block's 768 edges
  read about 500 grid rows, too many to pick by products) are gathered by XLA outside
  the kernel, an edge-shaped input in the activation dtype; their gradient goes back
  through that gather (`aggregation.gather_senders`: by blocks in sender order where
  the edges have `SortedSenders`).

The backward kernels recompute a block's forward pass and write the gradients of the
sender rows and of the receiver rows (the decoder's per block, the encoder's per window,
assembled), accumulating the two MLPs' twelve parameters' gradients across blocks. The
arithmetic is `fused_edges`': products of the activation dtype accumulated in float32,
float32 products made as `aggregation.float32_products` says, everything else in
float32; on a CPU the kernels run in Pallas's interpreter (tests; slow).

Not yet done: the encoder's sender rows read by the kernel (its three gathers of the
1.6M edges' rows from the 1 GiB grid table and the assembly of their gradient are ~90 ms of
the 0.25 deg step on a TPU v5e); laid out by sender (grid) blocks instead, its senders would
be windows and its receivers (the mesh, a small table) the gathered side.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from wnscale.graphs import receiver_blocks
from wnscale.graphs.receiver_blocks import KernelSenders, ReceiverBlocks
from wnscale.model import aggregation, pallas_parts
from wnscale.model.manual_axis_types import vary_like

_PARAMS = 12  # the embedder's six parameters, then the edge MLP's six


def decoder_edge_sums(embed_params: tuple, edge_params: tuple, features,
                      senders: KernelSenders, sender_table, receiver_table, epsilon: float):
  """`[R, D]` float32: each receiver's sum of its `k` edges' messages, as
  `EncoderDecoderEdges` and `aggregation.sum_to_receivers` compute them.

  Args:
    embed_params: the embedder MLP's `MLP.kernel_params`, `(W1 [F, H], b1, W2 [H, H], b2,
      scale1, offset1)`; `edge_params`: the interaction network's edge MLP's, `(W_h
      [H, D], b_h, W_o [D, D], b_o, scale, offset)`; all in the activation dtype.
    features: `[k, R, F]` the edges' static features, slot-major (no gradient).
    senders: the edges' `KernelSenders` (`kernel_senders_of` makes them from indices),
      whose `block_rows` receivers make a kernel block (a multiple of 16 on a TPU). Where
      it does not divide `R`, the last block runs past the arrays' ends (no padded
      copies); the kernels compute its rows past `R` from zeros and with a zero gradient,
      and Pallas drops their outputs.
    sender_table: `[num_senders, D]` the projected senders.
    receiver_table: `[R, D]` the projected receivers.
    epsilon: the layer norms'.
  """
  params, features, sender_table, receiver_table = _varying_alike(
      (*embed_params, *edge_params), features.astype(sender_table.dtype), sender_table,
      receiver_table)
  return _decoder_sums(params, features, sender_table, receiver_table, senders, epsilon)


def kernel_senders_of(indices) -> KernelSenders:
  """`KernelSenders` of `[k, R]` sender indices made on the device, each edge its own entry
  of its block's list (`k * block_rows` long): where the layout has none for these blocks
  (the planner compiles other `grid_blocks` on one layout). The same sums, with 0/1
  products as wide as the block's edges."""
  k, num_rows = indices.shape
  block_rows = min(receiver_blocks.DECODER_KERNEL_ROWS,
                   -(-num_rows // receiver_blocks.KERNEL_SENDERS_ALIGN)
                   * receiver_blocks.KERNEL_SENDERS_ALIGN)
  num_blocks = -(-num_rows // block_rows)
  padded = jnp.pad(indices, [(0, 0), (0, num_blocks * block_rows - num_rows)])
  rows = jnp.swapaxes(padded.reshape(k, num_blocks, block_rows), 0, 1).reshape(num_blocks, -1)
  entry = jnp.arange(k * block_rows, dtype=jnp.int32).reshape(1, k, block_rows)
  return KernelSenders(rows.astype(jnp.int32),
                       jnp.broadcast_to(entry, (num_blocks, k, block_rows)))


def _varying_alike(params, *arrays):
  """`(params, *arrays)`, each marked as varying over every manual mesh axis any of the
  arrays varies over: the kernels' outputs, gradients included, carry one type (inside
  `shard_map` a receiver table made of graph constants alone varies over fewer axes than
  the latents; the cast's gradient sums over the others)."""
  return (tuple(vary_like(p, *arrays) for p in params),
          *(vary_like(x, *arrays) for x in arrays))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _decoder_sums(params, features, sender_table, receiver_table, senders, epsilon):
  return _decoder_forward(params, features, sender_table[senders.rows], receiver_table,
                          senders.local, epsilon)


def _decoder_sums_forward(params, features, sender_table, receiver_table, senders, epsilon):
  return (_decoder_sums(params, features, sender_table, receiver_table, senders, epsilon),
          (params, features, sender_table, receiver_table, senders))


def _decoder_sums_backward(epsilon, residuals, grad_sums):
  params, features, sender_table, receiver_table, senders = residuals
  grad_sender_lists, grad_receiver_table, *grad_params = _decoder_backward(
      params, features, sender_table[senders.rows], receiver_table, senders.local,
      grad_sums.astype(jnp.float32), epsilon)
  # Each block's list rows' gradient (summed over its edges in the kernel) onto the table:
  # a few rows a block, added in float32.
  grad_sender_table = jnp.zeros(sender_table.shape, jnp.float32).at[
      senders.rows.reshape(-1)].add(grad_sender_lists.reshape(-1, sender_table.shape[-1]))
  grad_params = tuple(g.reshape(p.shape).astype(p.dtype) for g, p in zip(grad_params, params))
  return (grad_params, None, grad_sender_table.astype(sender_table.dtype), grad_receiver_table,
          None)


_decoder_sums.defvjp(_decoder_sums_forward, _decoder_sums_backward)


def _slot_forward(features, sender_rows, receiver_rows, params, epsilon, products):
  """One slot of a block: `(the embedder's pallas_parts.mlp_forward, e [n, H] in the
  activation dtype, the edge MLP's)`; `sender_rows` and `receiver_rows` `[n, D]` float32."""
  embed_params, edge_params = params[:6], params[6:]
  embedding = pallas_parts.mlp_forward(features, 0.0, embed_params, epsilon, products)
  e = embedding[-1].astype(features.dtype)  # the embedder's output, as XLA writes it
  edge = pallas_parts.mlp_forward(e, sender_rows + receiver_rows, edge_params, epsilon,
                                  products)
  return embedding, e, edge


def _slot_backward(features, forward, grad_message, params, products):
  """The gradients of one slot of a block given its messages' `grad_message [n, D]`
  float32 (`forward`: `_slot_forward`'s): `(the hidden layer's [n, D] in the activation
  dtype, as XLA hands it to the gathers of the sender and receiver rows; the twelve
  parameters', float32)`."""
  embedding, e, edge = forward
  grad_hidden, edge_grads = pallas_parts.mlp_backward(e, params[6:], edge, grad_message,
                                                      products)
  grad_hidden = grad_hidden.astype(e.dtype)
  grad_e = pallas_parts.mlp_dot(grad_hidden, params[6], products, contract=((1,), (1,)))
  _, embed_grads = pallas_parts.mlp_backward(features, params[:6], embedding, grad_e,
                                             products)
  return grad_hidden, (*embed_grads, *edge_grads)


def _in_rows(num_rows: int, block_rows: int):
  """`x -> x` with a block's rows past `num_rows` (the last block's, where `block_rows`
  does not divide it) made 0: they hold whatever lies past the arrays' ends, perhaps not
  finite, and would reach the parameters' gradients."""
  if num_rows % block_rows == 0:
    return lambda x: x
  row = pl.program_id(0) * block_rows + jax.lax.broadcasted_iota(jnp.int32, (block_rows, 1), 0)
  return lambda x: jnp.where(row < num_rows, x, jnp.zeros_like(x))


def _slot_senders(local_ref, list_ref, slot, products):
  """`(the 0/1 matrix [U, n] of the slot's edges' entries of the block's sender list,
  their sender rows [n, D] float32)`."""
  picks = pallas_parts.one_hot_rows(local_ref[0, pl.ds(slot, 1), :], list_ref.shape[1])
  return picks, pallas_parts.one_hot_dot(picks, list_ref[0], products, contract=((0,), (0,)))


def _decoder_forward_kernel(features_ref, local_ref, list_ref, receiver_ref, *refs, num_rows,
                            epsilon, products):
  param_refs, sums_ref = refs[:_PARAMS], refs[_PARAMS]
  params = [ref[...] for ref in param_refs]
  in_rows = _in_rows(num_rows, sums_ref.shape[0])
  receiver_rows = in_rows(receiver_ref[...].astype(jnp.float32))
  sums = jnp.zeros(sums_ref.shape, jnp.float32)
  for slot in range(features_ref.shape[0]):
    _, sender_rows = _slot_senders(local_ref, list_ref, slot, products)
    *_, edge = _slot_forward(in_rows(features_ref[slot]), sender_rows, receiver_rows, params,
                             epsilon, products)
    # The message in the activation dtype, summed in float32, as `sum_to_receivers` does.
    sums += edge[-1].astype(list_ref.dtype).astype(jnp.float32)
  sums_ref[...] = sums


def _decoder_backward_kernel(features_ref, local_ref, list_ref, receiver_ref, *refs, num_rows,
                             epsilon, products):
  param_refs, grad_sums_ref = refs[:_PARAMS], refs[_PARAMS]
  grad_list_ref, grad_receiver_ref, *grad_param_refs = refs[_PARAMS + 1:]

  pallas_parts.zero_in_first_block(grad_param_refs)
  params = [ref[...] for ref in param_refs]
  in_rows = _in_rows(num_rows, grad_receiver_ref.shape[0])
  receiver_rows = in_rows(receiver_ref[...].astype(jnp.float32))
  grad_message = in_rows(grad_sums_ref[...])  # each slot's message reaches its receiver's sum
  grad_receiver_rows = jnp.zeros(grad_receiver_ref.shape, jnp.float32)
  grad_list = jnp.zeros(grad_list_ref.shape[1:], jnp.float32)
  grad_params = [jnp.zeros(ref.shape, jnp.float32) for ref in grad_param_refs]
  for slot in range(features_ref.shape[0]):
    features = in_rows(features_ref[slot])
    picks, sender_rows = _slot_senders(local_ref, list_ref, slot, products)
    forward = _slot_forward(features, sender_rows, receiver_rows, params, epsilon, products)
    grad_hidden, grads = _slot_backward(features, forward, grad_message, params, products)
    grad_list += pallas_parts.one_hot_dot(picks, grad_hidden, products)
    grad_receiver_rows += grad_hidden.astype(jnp.float32)
    grad_params = [total + g for total, g in zip(grad_params, grads)]
  grad_list_ref[0] = grad_list
  grad_receiver_ref[...] = grad_receiver_rows.astype(grad_receiver_ref.dtype)
  for ref, grad in zip(grad_param_refs, grad_params):
    ref[...] += grad


def _decoder_specs(params, features, local, sender_lists):
  """`(the parameters as the kernels take them, vectors as [1, .]; the kernels' BlockSpecs)`:
  per block its rows of each slot's features and sender entries, its sender list, its
  rows of the receiver table, then the parameters whole."""
  params = pallas_parts.as_kernel_params(params)
  block_rows = local.shape[-1]
  by_slot = pl.BlockSpec((features.shape[0], block_rows, features.shape[2]),
                         lambda i: (0, i, 0))
  entries = pl.BlockSpec((1,) + local.shape[1:], lambda i: (i, 0, 0))
  lists = pl.BlockSpec((1,) + sender_lists.shape[1:], lambda i: (i, 0, 0))
  whole = lambda x: pl.BlockSpec(x.shape, lambda i: (0,) * x.ndim)
  rows = pl.BlockSpec((block_rows, sender_lists.shape[-1]), lambda i: (i, 0))
  return params, [by_slot, entries, lists, rows] + [whole(p) for p in params]


def _decoder_forward(params, features, sender_lists, receiver_table, local, epsilon):
  """`[R, D]` float32 sums. `sender_lists`: `[num_blocks, U, D]` each block's sender rows."""
  params, specs = _decoder_specs(params, features, local, sender_lists)
  kernel = functools.partial(_decoder_forward_kernel, num_rows=receiver_table.shape[0],
                             epsilon=epsilon)
  return pallas_parts.call(
      kernel, "parallel",
      out_shape=pallas_parts.out_shape(receiver_table.shape, jnp.float32, sender_lists),
      grid=(sender_lists.shape[0],), in_specs=specs, out_specs=specs[3],
  )(features, local, sender_lists, receiver_table, *params)


def _decoder_backward(params, features, sender_lists, receiver_table, local, grad_sums,
                      epsilon):
  """`(grad sender lists [num_blocks, U, D] float32, grad receiver table [R, D] in its
  dtype, then the twelve parameters' gradients, float32, vectors [1, .])`."""
  params, specs = _decoder_specs(params, features, local, sender_lists)
  param_outs = [pallas_parts.out_shape(p.shape, jnp.float32, sender_lists) for p in params]
  kernel = functools.partial(_decoder_backward_kernel, num_rows=receiver_table.shape[0],
                             epsilon=epsilon)
  # "arbitrary": the parameters' gradients add up over the blocks, in order.
  return pallas_parts.call(
      kernel, "arbitrary",
      out_shape=(pallas_parts.out_shape(sender_lists.shape, jnp.float32, sender_lists),
                 pallas_parts.out_shape(receiver_table.shape, receiver_table.dtype,
                                        sender_lists), *param_outs),
      grid=(sender_lists.shape[0],), in_specs=specs + [specs[3]],
      out_specs=(specs[2], specs[3], *specs[4:]),
  )(features, local, sender_lists, receiver_table, *params, grad_sums)


def encoder_edge_sums(embed_params: tuple, edge_params: tuple, features, sender_rows,
                      receiver_table, blocks: ReceiverBlocks, epsilon: float):
  """`[num_receivers, D]` float32: each receiver's sum of its edges' messages, for an edge
  set in receiver blocks (`receiver_blocks.ReceiverBlocks`: the encoder's, grid -> mesh),
  as `EncoderDecoderEdges` and `aggregation.sum_to_receivers` compute them.

  Per block of `slots` edges one kernel computes the edges' embeddings and messages as
  `decoder_edge_sums` does, each edge's receiver row read from the block's window of the
  receiver table and the messages summed onto the window's rows by 0/1 products (as
  `fused_edges` does); the partial sums are assembled by XLA (`aggregation.assemble`).

  Args:
    embed_params, edge_params: as `decoder_edge_sums` takes them.
    features: `[num_blocks * slots, F]` the edges' static features, in the blocks' layout.
    sender_rows: `[num_blocks * slots, D]` each edge's row of the projected senders, in the
      activation dtype (their gradient goes back through whatever gathered them).
    receiver_table: `[num_receivers, D]` the projected receivers.
    blocks: the edges' receiver blocks (padding edges reach no row: no message).
    epsilon: the layer norms'.
  """
  params, features, sender_rows, receiver_table = _varying_alike(
      (*embed_params, *edge_params), features.astype(sender_rows.dtype), sender_rows,
      receiver_table)
  return _encoder_sums(params, features, sender_rows, receiver_table, blocks, epsilon)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _encoder_sums(params, features, sender_rows, receiver_table, blocks, epsilon):
  partials = _encoder_forward(params, features, sender_rows,
                              aggregation.padded_table(receiver_table, blocks.width), blocks,
                              epsilon)
  return aggregation.assemble(partials, blocks)


def _encoder_sums_forward(params, features, sender_rows, receiver_table, blocks, epsilon):
  return (_encoder_sums(params, features, sender_rows, receiver_table, blocks, epsilon),
          (params, features, sender_rows, receiver_table, blocks))


def _encoder_sums_backward(epsilon, residuals, grad_sums):
  params, features, sender_rows, receiver_table, blocks = residuals
  pad = functools.partial(aggregation.padded_table, width=blocks.width)
  grad_sender_rows, grad_windows, *grad_params = _encoder_backward(
      params, features, sender_rows, pad(receiver_table), blocks,
      pad(grad_sums.astype(jnp.float32)), epsilon)
  grad_receiver_table = aggregation.assemble(grad_windows, blocks)
  grad_params = tuple(g.reshape(p.shape).astype(p.dtype) for g, p in zip(grad_params, params))
  return (grad_params, None, grad_sender_rows,
          grad_receiver_table.astype(receiver_table.dtype), None)


_encoder_sums.defvjp(_encoder_sums_forward, _encoder_sums_backward)


def _encoder_block(features_ref, sender_rows_ref, window_ref, column_ref, row_ref, params,
                   epsilon, products):
  """One block's forward pass: `(the one-hot pair ([slots, width], [width, slots]),
  _slot_forward's three)`."""
  one_hots = pallas_parts.one_hots(column_ref[0], row_ref[0], window_ref.shape[0])
  receiver_rows = pallas_parts.one_hot_dot(one_hots[0], window_ref[...], products)
  return one_hots, *_slot_forward(features_ref[...],
                                  sender_rows_ref[...].astype(jnp.float32), receiver_rows,
                                  params, epsilon, products)


def _encoder_forward_kernel(first_ref, features_ref, sender_rows_ref, window_ref, column_ref,
                            row_ref, *refs, epsilon, products):
  del first_ref  # read by the window's index map
  param_refs, partial_ref = refs[:_PARAMS], refs[_PARAMS]
  (_, from_rows), *_, edge = _encoder_block(
      features_ref, sender_rows_ref, window_ref, column_ref, row_ref,
      [ref[...] for ref in param_refs], epsilon, products)
  message = edge[-1].astype(sender_rows_ref.dtype)  # as `sum_to_receivers` gets it
  partial_ref[0] = pallas_parts.one_hot_dot(from_rows, message, products)


def _encoder_backward_kernel(first_ref, features_ref, sender_rows_ref, window_ref, column_ref,
                             row_ref, *refs, epsilon, products):
  del first_ref
  param_refs, grad_window_ref = refs[:_PARAMS], refs[_PARAMS]
  grad_sender_rows_ref, grad_partial_ref, *grad_param_refs = refs[_PARAMS + 1:]

  pallas_parts.zero_in_first_block(grad_param_refs)
  params = [ref[...] for ref in param_refs]
  (to_rows, from_rows), *forward = _encoder_block(
      features_ref, sender_rows_ref, window_ref, column_ref, row_ref, params, epsilon,
      products)
  # Padding edges reach no row: their messages' gradient is 0.
  grad_message = pallas_parts.one_hot_dot(to_rows, grad_window_ref[...], products)
  grad_hidden, grads = _slot_backward(features_ref[...], forward, grad_message, params,
                                      products)
  grad_sender_rows_ref[...] = grad_hidden.astype(grad_sender_rows_ref.dtype)
  grad_partial_ref[0] = pallas_parts.one_hot_dot(from_rows, grad_hidden, products)
  for ref, grad in zip(grad_param_refs, grads):
    ref[...] += grad


def _encoder_inputs(params, features, sender_rows, receiver_table, blocks):
  """`(the kernels' inputs, their BlockSpecs, the grid spec's arguments)`: the windows' first
  rows (prefetched: the window's index map reads them), per block its edges' features and
  sender rows, its receiver window and its receivers as a column and as a row, then the
  parameters whole."""
  num_blocks, slots = blocks.local.shape
  latent = sender_rows.shape[-1]
  params = pallas_parts.as_kernel_params(params)
  indices = [blocks.local[:, :, None], blocks.local[:, None, :]]
  by_edge = lambda x: pl.BlockSpec((slots, x.shape[-1]), lambda k, *_: (k, 0))
  by_block = lambda x: pl.BlockSpec((1,) + x.shape[1:], lambda k, *_: (k, 0, 0))
  whole = lambda x: pl.BlockSpec(x.shape, lambda k, *_: (0,) * x.ndim)
  specs = ([by_edge(features), by_edge(sender_rows),
            pallas_parts.window_spec(blocks.width, latent, 0)]
           + [by_block(i) for i in indices] + [whole(p) for p in params])
  inputs = [blocks.first, features, sender_rows, receiver_table, *indices, *params]
  return inputs, specs, dict(num_scalar_prefetch=1, grid=(num_blocks,))


def _encoder_forward(params, features, sender_rows, receiver_table, blocks, epsilon):
  """`[num_blocks, width, D]` float32 partial sums."""
  inputs, specs, grid = _encoder_inputs(params, features, sender_rows, receiver_table, blocks)
  shape = (blocks.local.shape[0], blocks.width, sender_rows.shape[-1])
  partials = pl.BlockSpec((1,) + shape[1:], lambda k, *_: (k, 0, 0))
  return pallas_parts.call(
      functools.partial(_encoder_forward_kernel, epsilon=epsilon), "parallel",
      out_shape=pallas_parts.out_shape(shape, jnp.float32, sender_rows),
      grid_spec=pltpu.PrefetchScalarGridSpec(**grid, in_specs=specs, out_specs=partials),
  )(*inputs)


def _encoder_backward(params, features, sender_rows, receiver_table, blocks, grad_sums,
                      epsilon):
  """`(grad sender rows [num_blocks * slots, D] in their dtype, grad receiver windows
  [num_blocks, width, D] float32, then the twelve parameters' gradients, float32, vectors
  [1, .])`. `grad_sums`: `[receiver rows, D]` float32, padded as the receiver table."""
  inputs, specs, grid = _encoder_inputs(params, features, sender_rows, receiver_table, blocks)
  shape = (blocks.local.shape[0], blocks.width, sender_rows.shape[-1])
  partials = pl.BlockSpec((1,) + shape[1:], lambda k, *_: (k, 0, 0))
  param_outs = [pallas_parts.out_shape(p.shape, jnp.float32, sender_rows)
                for p in inputs[-_PARAMS:]]
  # "arbitrary": the parameters' gradients add up over the blocks, in order.
  return pallas_parts.call(
      functools.partial(_encoder_backward_kernel, epsilon=epsilon), "arbitrary",
      out_shape=(pallas_parts.out_shape(sender_rows.shape, sender_rows.dtype, sender_rows),
                 pallas_parts.out_shape(shape, jnp.float32, sender_rows), *param_outs),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          **grid, in_specs=specs + [specs[2]],
          out_specs=(specs[1], partials, *specs[-_PARAMS:])),
  )(*inputs, grad_sums)
