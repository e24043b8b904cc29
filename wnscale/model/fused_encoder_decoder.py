"""The encoder's and decoder's edge steps as one Pallas kernel per block of edges
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
- the encoder (`encoder_edge_sums`, grid -> mesh): a grid node sends 1 to 3 edges, a mesh
  node hears about 40 (at 0.25 deg). Its edges come by blocks of sender (grid) rows,
  `receiver_blocks.SenderBlocks`: a kernel block's edges pick their sender rows from its
  block of the sender table and their receivers from its list of a few dozen mesh rows,
  both by 0/1 products, and sum their messages onto that list the same way; XLA adds the
  lists' sums into the mesh's rows. Its backward kernel writes each block of sender rows'
  gradient whole, so neither the edges' sender rows nor their gradient is ever an
  edge-sized array (at 0.25 deg 1.6M rows of the 1 GiB grid table, whose three gathers
  and the assembly of their gradient were ~90 ms of the step on a TPU v5e when the kernel
  took its edges by receiver blocks).

The backward kernels recompute a block's forward pass and write the gradients of the
sender rows and of the receiver rows (per block, or per list), accumulating the two MLPs'
twelve parameters' gradients across blocks. The arithmetic is `fused_edges`': products of
the activation dtype accumulated in float32, float32 products made as
`aggregation.float32_products` says, everything else in float32; on a CPU the kernels run
in Pallas's interpreter (tests; slow).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from wnscale.graphs import receiver_blocks
from wnscale.graphs.receiver_blocks import KernelSenders, SenderBlocks
from wnscale.model import pallas_parts
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
  # Each block's list rows' gradient (summed over its edges in the kernel) onto the table.
  grad_sender_table = _onto_rows(grad_sender_lists, senders.rows, sender_table.shape[0])
  grad_params = tuple(g.reshape(p.shape).astype(p.dtype) for g, p in zip(grad_params, params))
  return (grad_params, None, grad_sender_table.astype(sender_table.dtype), grad_receiver_table,
          None)


_decoder_sums.defvjp(_decoder_sums_forward, _decoder_sums_backward)


def _onto_rows(lists, rows, num_rows: int):
  """`[num_rows, D]` float32: the kernel blocks' `lists` `[K, U, D]` (float32) added into
  their `rows` `[K, U]` of a table (a few dozen a block: padding entries add zeros to row
  0)."""
  return jnp.zeros((num_rows, lists.shape[-1]), jnp.float32).at[rows.reshape(-1)].add(
      lists.reshape(-1, lists.shape[-1]))


def _slot_forward(features, sender_rows, receiver_rows, params, epsilon, products,
                  transposed: bool = False):
  """One slot of a block: `(the embedder's pallas_parts.mlp_forward, e [n, H] in the
  activation dtype, the edge MLP's)`; `features` `[n, F]` (`[F, n]` if `transposed`),
  `sender_rows` and `receiver_rows` `[n, D]` float32."""
  embed_params, edge_params = params[:6], params[6:]
  embedding = pallas_parts.mlp_forward(features, 0.0, embed_params, epsilon, products,
                                       transposed)
  e = embedding[-1].astype(features.dtype)  # the embedder's output, as XLA writes it
  edge = pallas_parts.mlp_forward(e, sender_rows + receiver_rows, edge_params, epsilon,
                                  products)
  return embedding, e, edge


def _slot_backward(features, forward, grad_message, params, products,
                   transposed: bool = False):
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
                                             products, transposed)
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


def encoder_edge_sums(embed_params: tuple, edge_params: tuple, sender_table, receiver_table,
                      blocks: SenderBlocks, epsilon: float):
  """`[num_receivers, D]` float32: each receiver's sum of its edges' messages, for an edge
  set laid out by blocks of sender rows (`receiver_blocks.SenderBlocks`: the encoder's,
  grid -> mesh), as `EncoderDecoderEdges` and `aggregation.sum_to_receivers` compute them.

  Per kernel block one kernel computes its edges' embeddings and messages as
  `decoder_edge_sums` does, each edge's sender row picked from the block's rows of the
  sender table and its receiver row from the block's receiver list by 0/1 products, the
  messages summed onto the list the same way; XLA adds the lists' sums into the receivers'.

  Args:
    embed_params, edge_params: as `decoder_edge_sums` takes them.
    sender_table: `[blocks.num_senders, D]` the projected senders (not necessarily a
      multiple of `blocks.block_rows`: the last block's rows past them are read as zeros).
    receiver_table: `[num_receivers, D]` the projected receivers.
    blocks: the edges' `SenderBlocks` (their features, in their slots, too).
    epsilon: the layer norms'.
  """
  if sender_table.shape[0] != blocks.num_senders:
    raise ValueError(f"The encoder's SenderBlocks cover a sender table of "
                     f"{blocks.num_senders} rows, not {sender_table.shape[0]}.")
  params, sender_table, receiver_table = _varying_alike(
      (*embed_params, *edge_params), sender_table, receiver_table)
  return _encoder_sums(params, sender_table, receiver_table, blocks, epsilon)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _encoder_sums(params, sender_table, receiver_table, blocks, epsilon):
  partials = _encoder_forward(params, sender_table, receiver_table[blocks.receiver_rows],
                              blocks, epsilon)
  return _onto_rows(partials, blocks.receiver_rows, receiver_table.shape[0])


def _encoder_sums_forward(params, sender_table, receiver_table, blocks, epsilon):
  return (_encoder_sums(params, sender_table, receiver_table, blocks, epsilon),
          (params, sender_table, receiver_table, blocks))


def _encoder_sums_backward(epsilon, residuals, grad_sums):
  params, sender_table, receiver_table, blocks = residuals
  rows = blocks.receiver_rows
  grad_sender_table, grad_lists, *grad_params = _encoder_backward(
      params, sender_table, receiver_table[rows], blocks,
      grad_sums.astype(jnp.float32)[rows], epsilon)
  grad_receiver_table = _onto_rows(grad_lists, rows, receiver_table.shape[0])
  grad_params = tuple(g.reshape(p.shape).astype(p.dtype) for g, p in zip(grad_params, params))
  return (grad_params, grad_sender_table.astype(sender_table.dtype),
          grad_receiver_table.astype(receiver_table.dtype), None)


_encoder_sums.defvjp(_encoder_sums_forward, _encoder_sums_backward)


def _encoder_block(window_ref, features_ref, sender_local_ref, sender_ref, list_ref,
                   receiver_local_ref, params, num_senders, epsilon, products):
  """One kernel block's forward pass: `(its edges' 0/1 matrices of their senders
  [block_rows, n] and of their receivers [U, n], _slot_forward's three)`."""
  block_rows = sender_ref.shape[0]
  # The last block's rows past the table's end hold whatever lies there, perhaps not
  # finite: a 0/1 product would carry it.
  row = (window_ref[pl.program_id(0)] * block_rows
         + jax.lax.broadcasted_iota(jnp.int32, (block_rows, 1), 0))
  senders = jnp.where(row < num_senders, sender_ref[...], jnp.zeros_like(sender_ref))
  sender_picks = pallas_parts.one_hot_rows(sender_local_ref[0], block_rows)
  receiver_picks = pallas_parts.one_hot_rows(receiver_local_ref[0], list_ref.shape[1])
  sender_rows = pallas_parts.one_hot_dot(sender_picks, senders, products,
                                         contract=((0,), (0,)))
  receiver_rows = pallas_parts.one_hot_dot(receiver_picks, list_ref[0], products,
                                           contract=((0,), (0,)))
  return sender_picks, receiver_picks, *_slot_forward(
      _features(features_ref, sender_ref), sender_rows, receiver_rows, params, epsilon,
      products, transposed=True)


def _features(features_ref, sender_ref):
  """A kernel block's edge features `[F, slots]` in the activation dtype (the sender
  table's), as the edge MLP takes them."""
  return features_ref[...].astype(sender_ref.dtype)


def _encoder_forward_kernel(window_ref, *refs, num_senders, epsilon, products):
  inputs, param_refs, partial_ref = refs[:5], refs[5:5 + _PARAMS], refs[5 + _PARAMS]
  _, receiver_picks, *_, edge = _encoder_block(
      window_ref, *inputs, [ref[...] for ref in param_refs], num_senders, epsilon, products)
  message = edge[-1].astype(inputs[3].dtype)  # as `sum_to_receivers` gets it
  partial_ref[0] = pallas_parts.one_hot_dot(receiver_picks, message, products)


def _encoder_backward_kernel(window_ref, *refs, num_senders, epsilon, products):
  inputs, param_refs, grad_list_ref = refs[:5], refs[5:5 + _PARAMS], refs[5 + _PARAMS]
  grad_sender_ref, grad_receiver_list_ref, *grad_param_refs = refs[6 + _PARAMS:]

  pallas_parts.zero_in_first_block(grad_param_refs)
  block = pl.program_id(0)

  # A block of sender rows with several kernel blocks (consecutive) sums their gradients.
  @pl.when((block == 0) | (window_ref[block] != window_ref[jnp.maximum(block - 1, 0)]))
  def _():
    grad_sender_ref[...] = jnp.zeros_like(grad_sender_ref)

  params = [ref[...] for ref in param_refs]
  sender_picks, receiver_picks, *forward = _encoder_block(
      window_ref, *inputs, params, num_senders, epsilon, products)
  # Padding edges have no entry: their messages' gradient is 0.
  grad_message = pallas_parts.one_hot_dot(receiver_picks, grad_list_ref[0], products,
                                          contract=((0,), (0,)))
  grad_hidden, grads = _slot_backward(_features(inputs[0], inputs[2]), forward, grad_message,
                                      params, products, transposed=True)
  grad_sender_ref[...] += pallas_parts.one_hot_dot(sender_picks, grad_hidden, products)
  grad_receiver_list_ref[0] = pallas_parts.one_hot_dot(receiver_picks, grad_hidden, products)
  for ref, grad in zip(grad_param_refs, grads):
    ref[...] += grad


def _encoder_inputs(params, sender_table, receiver_lists, blocks):
  """`(the kernels' inputs, their BlockSpecs, the grid spec's arguments)`: the kernel
  blocks' blocks of sender rows (prefetched: the sender table's index map reads them), per
  kernel block its edges' features and senders' entries, its block of sender rows, its
  receiver list and its edges' entries of it, then the parameters whole."""
  num_blocks, _, slots = blocks.sender_local.shape
  params = pallas_parts.as_kernel_params(params)
  by_block = lambda x: pl.BlockSpec((1,) + x.shape[1:], lambda k, window: (k, 0, 0))
  whole = lambda x: pl.BlockSpec(x.shape, lambda k, window: (0,) * x.ndim)
  sender_rows = pl.BlockSpec((blocks.block_rows, sender_table.shape[-1]),
                             lambda k, window: (window[k], 0))
  specs = ([pl.BlockSpec((blocks.features.shape[0], slots), lambda k, window: (0, k)),
            by_block(blocks.sender_local), sender_rows, by_block(receiver_lists),
            by_block(blocks.receiver_local)] + [whole(p) for p in params])
  inputs = [blocks.window, blocks.features, blocks.sender_local, sender_table, receiver_lists,
            blocks.receiver_local, *params]
  return inputs, specs, dict(num_scalar_prefetch=1, grid=(num_blocks,))


def _encoder_forward(params, sender_table, receiver_lists, blocks, epsilon):
  """`[K, U, D]` float32 each kernel block's sums onto its receiver list
  (`receiver_lists` `[K, U, D]`: its rows of the receiver table)."""
  inputs, specs, grid = _encoder_inputs(params, sender_table, receiver_lists, blocks)
  kernel = functools.partial(_encoder_forward_kernel, num_senders=sender_table.shape[0],
                             epsilon=epsilon)
  return pallas_parts.call(
      kernel, "parallel",
      out_shape=pallas_parts.out_shape(receiver_lists.shape, jnp.float32, sender_table),
      grid_spec=pltpu.PrefetchScalarGridSpec(**grid, in_specs=specs, out_specs=specs[3]),
  )(*inputs)


def _encoder_backward(params, sender_table, receiver_lists, blocks, grad_lists, epsilon):
  """`(grad sender table [num_senders, D] float32, grad receiver lists [K, U, D] float32,
  then the twelve parameters' gradients, float32, vectors [1, .])`. `grad_lists`: `[K, U,
  D]` float32, the receiver lists' rows of the sums' gradient."""
  inputs, specs, grid = _encoder_inputs(params, sender_table, receiver_lists, blocks)
  param_outs = [pallas_parts.out_shape(p.shape, jnp.float32, sender_table)
                for p in inputs[-_PARAMS:]]
  kernel = functools.partial(_encoder_backward_kernel, num_senders=sender_table.shape[0],
                             epsilon=epsilon)
  # "arbitrary": a block of sender rows and the parameters add up their gradients over
  # the kernel blocks, in order.
  return pallas_parts.call(
      kernel, "arbitrary",
      out_shape=(pallas_parts.out_shape(sender_table.shape, jnp.float32, sender_table),
                 pallas_parts.out_shape(receiver_lists.shape, jnp.float32, sender_table),
                 *param_outs),
      grid_spec=pltpu.PrefetchScalarGridSpec(
          **grid, in_specs=specs + [specs[3]],
          out_specs=(specs[2], specs[3], *specs[-_PARAMS:])),
  )(*inputs, grad_lists)
