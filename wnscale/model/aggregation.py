"""Receiver-side gathers and sums of an edge set: by index, or by matrix products on blocks.

Message passing reads each edge's receiver row (`gather`) and sums each
receiver's messages (`sum_to_receivers`). By index these are a gather and a
`segment_sum`; their transposes (in the backward pass) a scatter and a gather.
An accelerator's scatter is slow, so an edge set laid out in receiver blocks
(`wnscale.graphs.receiver_blocks`) does both as products with each block's
0/1 matrix `[width, slots]` (which edge goes to which receiver of the block's
window), on the matrix unit:

  sum_to_receivers   partial sums per block   [blocks, width, D] = onehot @ values
                     then each receiver's row(s) of them gathered (`rows`)
  gather             each block's window of receiver rows [blocks, width, D]
                     (a contiguous slice per block), then onehot^T @ windows

The two are each other's transposes, and their gradients are written so
(`jax.custom_vjp`): the backward pass of either is the other's forward pass,
with no scatter anywhere. Results equal the indexed versions' to float
rounding: the products have one nonzero term per output element (the gather)
or sum the same terms (the sum, in float32). Float32 values are multiplied as XLA
multiplies float32 operands on the platform (`float32_products`): at full precision
on a CPU or where `jax_default_matmul_precision` asks for it, in one bfloat16 pass on
a TPU at its default.

An edge set with exactly k edges into each of its R receiver rows, edge
`j * R + r` row r's j-th (`EdgeSet.in_degree`: the mesh-to-grid edges, 3 per
grid node), needs neither: its gather is k copies of the table one after the
other and its sum adds k slices `[R, D]`, each the other's transpose, with no
scatter and no matrix product. (Slot-major, not k consecutive edges per row: a
TPU tiles an array's last two axes, so cutting the leading axis is free where
`[R, k, D]` would be a copy.)

`Receivers` is what a stage hands these functions: the receiver indices (a
`[num_edges]` array, padding edges `num_receivers`), the `ReceiverBlocks`, or a
`FixedInDegree`. `receivers_of(edge_set, method)` picks one.
"""

from __future__ import annotations

import dataclasses
from typing import Union

import jax
import jax.numpy as jnp

from wnscale.graphs import receiver_blocks
from wnscale.graphs.receiver_blocks import (BlockSenders, ReceiverBlocks, SenderWindows,
                                            SortedSenders)
from wnscale.model.processor_interface import AGGREGATIONS


@dataclasses.dataclass(frozen=True)
class FixedInDegree:
  """Receivers of an edge set whose edge `j * R + r` goes to row r of `R = num_edges / k`."""

  k: int


Receivers = Union[jax.Array, ReceiverBlocks, FixedInDegree]


def target_platform() -> str | None:
  """The platform the program being traced is for, where known: inside `shard_map`, its
  mesh's (an ahead-of-time compile for a TPU on a CPU host says "tpu"); else None."""
  mesh = jax.sharding.get_abstract_mesh()
  device = getattr(mesh, "abstract_device", None) if not mesh.empty else None
  return getattr(device, "platform", None)


def _platform() -> str:
  """The target platform (`target_platform`), else this process's default backend."""
  return target_platform() or jax.default_backend()


def resolve(method: str) -> str:
  """`method`, with "auto" replaced by the target platform's choice (`target_platform`, else
  this process's default backend)."""
  if method not in AGGREGATIONS:
    raise ValueError(f"Unknown aggregation {method!r}; expected one of {AGGREGATIONS}.")
  if method == "auto":
    platform = _platform()
    # Measured on a TPU v5e, `fused` beat `matmul` in bfloat16 and float32 (and fits the
    # 1 deg paper model without remat, which `matmul` does not); its kernel is a TPU's.
    return {"cpu": "segment_sum", "tpu": "fused"}.get(platform, "matmul")
  return method


def receivers_of(edge_set, method: str = "segment_sum") -> Receivers:
  """The edge set's `FixedInDegree` if it has one, else its blocks if it has them and
  `method` uses them, else its receiver indices."""
  if edge_set.in_degree:
    return FixedInDegree(edge_set.in_degree)
  if resolve(method) in ("matmul", "fused") and edge_set.blocks is not None:
    return edge_set.blocks
  return edge_set.receivers


def gather(table: jax.Array, receivers: Receivers) -> jax.Array:
  """`table [num_receivers, D]` rows of each edge's receiver: `[num_edges, D]` (padding
  edges: any row, by index; zeros, by blocks)."""
  if isinstance(receivers, ReceiverBlocks):
    return _gather_blocks(table, receivers)
  if isinstance(receivers, FixedInDegree):
    return jnp.tile(table, (receivers.k,) + (1,) * (table.ndim - 1))
  return table[receivers]


def gather_senders(table: jax.Array, senders) -> jax.Array:
  """`table [num_senders, D]` rows of each edge's sender: `[num_edges, D]`.

  `senders`: the indices (`[num_edges]`); or the edges' `SenderWindows` (of a receiver
  block layout): the near senders' rows as products with each block's 0/1 matrix
  `[window, slots]`, the far ones gathered and placed; its gradient the transposes (the
  far rows' summed by blocks in sender order); or their `SortedSenders`: the rows
  gathered by index, the gradient (each sender's sum of its edges' rows) the edges' rows
  in sender order summed by blocks, no scatter; or one block's `BlockSenders`: the rows it
  reads taken from the table, the edges' rows from those as by their `SortedSenders` (the
  gradient a scatter of those few rows only).
  """
  if isinstance(senders, BlockSenders):
    return _gather_sorted(table[senders.rows], senders.senders)
  if isinstance(senders, SenderWindows):
    return _gather_windows(table, senders)
  if isinstance(senders, SortedSenders):
    return _gather_sorted(table, senders)
  return table[senders]


def sender_indices(senders) -> jax.Array:
  """`[num_edges]` the sender rows of `senders` as `gather_senders` takes them (not
  `SenderWindows`)."""
  if isinstance(senders, BlockSenders):
    return senders.rows[senders.senders.indices]
  return senders.indices if isinstance(senders, SortedSenders) else senders


def sum_to_receivers(values: jax.Array, receivers: Receivers, num_receivers: int) -> jax.Array:
  """`values [num_edges, D]` summed over each receiver's edges: `[num_receivers, D]` float32
  (padding edges dropped)."""
  if isinstance(receivers, ReceiverBlocks):
    return _sum_blocks(values, receivers)
  if isinstance(receivers, FixedInDegree):
    return values.astype(jnp.float32).reshape(
        (receivers.k, num_receivers) + values.shape[1:]).sum(0)
  return jax.ops.segment_sum(values.astype(jnp.float32), receivers, num_segments=num_receivers,
                             indices_are_sorted=True)


def float32_products(platform: str | None) -> str:
  """How products of float32 operands with a 0/1 matrix (and the fused kernels' MLPs) are
  made on `platform`: as XLA makes a float32 product there in the plain model. On a TPU at
  the default matmul precision (`jax_default_matmul_precision` unset) XLA rounds float32
  operands to bfloat16 and makes one pass ("bfloat16"); a CPU, or a TPU asked for more,
  multiplies in float32 ("float32").

  At "bfloat16" a gathered row is rounded to bfloat16 as the MLP it feeds rounds its
  inputs (in the plain model, the same row's product with its weights), and a receiver's
  sum adds its messages rounded to bfloat16, in float32. On the chip's float32 problems
  the exact products were most of the 0/1 products' matrix-unit work.
  """
  fast = jax.config.jax_default_matmul_precision in (None, "default", "bfloat16", "fastest")
  return "bfloat16" if platform == "tpu" and fast else "float32"


def _precision(dtype):
  """The 0/1 products' precision for values of `dtype` (`float32_products`)."""
  if jnp.dtype(dtype) != jnp.float32:
    return None
  return (jax.lax.Precision.DEFAULT if float32_products(_platform()) == "bfloat16"
          else jax.lax.Precision.HIGHEST)


# The block functions below take a `ReceiverBlocks` or a `SenderWindows` alike: both have
# a window (`first`, `width`) per block, each slot's row of it (`local`) and each node's rows
# of the blocks' partial sums (`rows`).


def _one_hot(blocks: ReceiverBlocks, dtype) -> jax.Array:
  """`[num_blocks, width, slots]`: 1 where the slot's edge goes to that row of the window."""
  rows = jax.lax.broadcasted_iota(jnp.int32, (1, blocks.width, 1), 1)
  return (blocks.local[:, None, :] == rows).astype(dtype)


def _partials(values, blocks: ReceiverBlocks) -> jax.Array:
  """`[num_blocks * slots, D] -> [num_blocks, width, D]` float32 sums per window row."""
  by_block = values.reshape(blocks.local.shape + values.shape[1:])
  return jnp.einsum("kws,ksd->kwd", _one_hot(blocks, values.dtype), by_block,
                    precision=_precision(values.dtype), preferred_element_type=jnp.float32)


def assemble(partials, blocks: ReceiverBlocks | SenderWindows) -> jax.Array:
  """`[num_blocks, width, D]` float32 partial sums -> `[num_receivers, D]`, each receiver's
  rows (one per block its edges reach, or window its senders lie in) added."""
  flat = partials.reshape((-1,) + partials.shape[2:])
  # The row past the last ("none") reads as 0.
  read = lambda rows: flat.at[rows].get(mode="fill", fill_value=0)
  if isinstance(blocks, ReceiverBlocks):
    # The first blocks' rows, then the few receivers that go on into further blocks.
    return read(blocks.rows).at[blocks.extra_receivers].add(read(blocks.extra_rows),
                                                            mode="drop")
  return sum(read(rows) for rows in blocks.rows)


def padded_table(table, width: int) -> jax.Array:
  """`table [num_rows, D]` padded with zero rows to `receiver_blocks.table_rows`: the rows
  every window of `width` lies inside (no copy where it has them already)."""
  missing = receiver_blocks.table_rows(table.shape[0], width) - table.shape[0]
  return jnp.pad(table, [(0, missing)] + [(0, 0)] * (table.ndim - 1)) if missing else table


def windows(table, blocks: ReceiverBlocks) -> jax.Array:
  """`[num_receivers, D] -> [num_blocks, width, D]`: rows `first .. first + width` per block
  (the windows lie inside the table padded as `padded_table` pads it)."""
  dimensions = jax.lax.GatherDimensionNumbers(offset_dims=(1, 2), collapsed_slice_dims=(),
                                              start_index_map=(0,))
  return jax.lax.gather(padded_table(table, blocks.width), blocks.first[:, None], dimensions,
                        slice_sizes=(blocks.width,) + table.shape[1:],
                        mode=jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS)


def _spread(window_rows, blocks: ReceiverBlocks, dtype) -> jax.Array:
  """`[num_blocks, width, D]` window rows -> `[num_blocks * slots, D]`, each slot's row."""
  spread = jnp.einsum("kws,kwd->ksd", _one_hot(blocks, window_rows.dtype), window_rows,
                      precision=_precision(window_rows.dtype), preferred_element_type=dtype)
  return spread.reshape((-1,) + spread.shape[2:])


@jax.custom_vjp
def _sum_blocks(values, blocks):
  return assemble(_partials(values, blocks), blocks)


def _sum_blocks_forward(values, blocks):
  return _sum_blocks(values, blocks), (blocks, jnp.zeros((0,), values.dtype))


def _sum_blocks_backward(residuals, grad):
  blocks, like = residuals
  return _spread(windows(grad, blocks), blocks, like.dtype), None


_sum_blocks.defvjp(_sum_blocks_forward, _sum_blocks_backward)


@jax.custom_vjp
def _gather_blocks(table, blocks):
  return _spread(windows(table, blocks), blocks, table.dtype)


def _gather_blocks_forward(table, blocks):
  return _gather_blocks(table, blocks), (blocks, jnp.zeros((0,), table.dtype))


def _gather_blocks_backward(residuals, grad):
  blocks, like = residuals
  return assemble(_partials(grad, blocks), blocks).astype(like.dtype), None


_gather_blocks.defvjp(_gather_blocks_forward, _gather_blocks_backward)


def sum_far_rows(far_rows, windows_: SenderWindows, num_senders: int) -> jax.Array:
  """`[num_blocks, far, D]` rows of the far lists (`SenderWindows.far_senders`; rows no
  edge reads: ignored) summed onto their senders: `[num_senders, D]` float32."""
  return _sum_in_order(far_rows, windows_.far_order, windows_.far_blocks, num_senders)


def _sum_in_order(values, order, blocks: ReceiverBlocks, num_rows: int) -> jax.Array:
  """`values [..., D]` summed onto the table rows `order` and `blocks` give them
  (`receiver_blocks.in_sender_order`; `order` indexes the rows of `values` flattened):
  `[num_rows, D]` float32. A permutation and products with 0/1 matrices, where a sum by
  index is a scatter. (Gathered by `order` unravelled, not from a flattened copy.)"""
  in_order = values.at[_unravel(order, values.shape[:-1])].get(mode="fill", fill_value=0)
  sums = assemble(_partials(in_order, blocks), blocks)
  # The layout's rows are the table's (rows past them, if any, have no values).
  missing = num_rows - sums.shape[0]
  return jnp.pad(sums, [(0, missing), (0, 0)]) if missing > 0 else sums[:num_rows]


def _unravel(index, shape: tuple) -> tuple:
  """Flat indices into `shape` as one index per axis; one past the end stays out of bounds
  (`jnp.unravel_index` clips it to the last element)."""
  per_axis = []
  for size in reversed(shape[1:]):
    per_axis.append(index % size)
    index = index // size
  return (index, *reversed(per_axis))


def _far_one_hot(windows_: SenderWindows, dtype) -> jax.Array:
  """`[num_blocks, far, slots]`: 1 where a block's slot holds that far edge."""
  far = windows_.far_senders.shape[1]
  rows = jax.lax.broadcasted_iota(jnp.int32, (1, far, 1), 1)
  return (windows_.far_local[:, None, :] == rows).astype(dtype)


@jax.custom_vjp
def _gather_windows(table, windows_: SenderWindows):
  near = _spread(windows(table, windows_), windows_, table.dtype)
  far = jnp.einsum("kfs,kfd->ksd", _far_one_hot(windows_, table.dtype),
                   table[windows_.far_senders], precision=_precision(table.dtype),
                   preferred_element_type=table.dtype)
  return near + far.reshape(near.shape)


def _gather_windows_forward(table, windows_):
  # `like`: the table's row count and dtype, in an array with no elements.
  return _gather_windows(table, windows_), (windows_, jnp.zeros((table.shape[0], 0),
                                                                table.dtype))


def _gather_windows_backward(residuals, grad):
  windows_, like = residuals
  by_block = grad.reshape(windows_.local.shape + grad.shape[1:])
  far = jnp.einsum("kfs,ksd->kfd", _far_one_hot(windows_, grad.dtype), by_block,
                   precision=_precision(grad.dtype), preferred_element_type=jnp.float32)
  grad_table = assemble(_partials(grad, windows_), windows_) + sum_far_rows(
      far, windows_, like.shape[0])
  return grad_table.astype(like.dtype), None


_gather_windows.defvjp(_gather_windows_forward, _gather_windows_backward)


@jax.custom_vjp
def _gather_sorted(table, senders: SortedSenders):
  return table[senders.indices]


def _gather_sorted_forward(table, senders):
  # `like`: the table's row count and dtype, in an array with no elements.
  return _gather_sorted(table, senders), (senders, jnp.zeros((table.shape[0], 0), table.dtype))


def _gather_sorted_backward(residuals, grad):
  senders, like = residuals
  grad_table = _sum_in_order(grad, senders.order, senders.blocks, like.shape[0])
  return grad_table.astype(like.dtype), None


_gather_sorted.defvjp(_gather_sorted_forward, _gather_sorted_backward)
