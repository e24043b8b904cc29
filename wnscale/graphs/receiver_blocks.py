"""Edges cut into blocks of receivers, so that summing over a receiver's edges is a matrix product.

An accelerator's scatter (`segment_sum`, and the transpose of a gather) is a
slow operation: on a TPU v5e, summing the paper model's mesh messages onto its nodes
takes several times as long as reading and writing them once (docs/benchmarks.md,
"Figures behind the code"). Matrix products are what the chip is built for. With edges
sorted by receiver, every block of `slots`
consecutive edges points at a short run of consecutive receivers; within the
block, the sum over each receiver's edges is a product with a 0/1 matrix
`[width, slots]` (`wnscale.model.aggregation`), and gathering the receivers'
rows for the block's edges is the product with its transpose.

The layout (per edge set, host numpy, once):

  edges       padded to `num_blocks * slots` rows: padding edges send from node 0
              to receiver `num_receivers`, which every sum drops
  first       `[num_blocks]` where each block's window of `width` receivers starts: its
              run's first receiver rounded down to a multiple of 8 (`ALIGN`), moved back
              where the window would pass the table's last row (`table_rows`)
  local       `[num_blocks, slots]` each edge's receiver minus its block's first;
              `width` for padding edges (no row of the window)
  rows        `[num_receivers]` where each receiver's partial sums lie in the blocks'
              `[num_blocks * width]` rows: its first block's row (`num_blocks * width`
              where it has no edges: a zero row)
  extra_*     the receivers whose edges reach further blocks (a block's last receiver
              may go on in the next), with each further block's row: at most one per
              block and a few more, so that a receiver's sum is one gather of the
              first rows and a short scatter-add of these

`width` is the longest run of receivers a block spans from its aligned first, rounded
up to a multiple of 8.

The senders' side: the processor's blocks read their senders' rows from a window of the
sender table each, the few outside it from a short list (`SenderWindows`). A gradient
summed onto senders by index would be a scatter; it is summed by the same kind of blocks
laid over its rows sorted by sender (`in_sender_order`): the far lists' rows, and an
encoder's or decoder's edges (`SortedSenders`).

The fused encoder and decoder kernels read their edges by their own layouts: the
decoder's senders listed per kernel block (`KernelSenders`), the encoder's edges by
blocks of sender rows (`SenderBlocks`).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

# Edges per block: a block of the multi-mesh (8 edges per node on average, at least 5)
# spans about 100 receivers, at most 156.
SLOTS = 768
# Windows start at multiples of 8 rows: a TPU kernel then reads a block's window straight
# from its table (`wnscale.model.fused_edges`), a copy at a row offset the chip's (8, 128)
# tiling divides.
ALIGN = 8


def _round_up(count: int, multiple: int = ALIGN) -> int:
  return -(-count // multiple) * multiple


def table_rows(num_rows: int, width: int) -> int:
  """The rows a table of `num_rows` is padded to on the device so that every window of
  `width` rows lies inside it: a multiple of `ALIGN`, at least one window."""
  return max(_round_up(num_rows), width)


@dataclasses.dataclass(frozen=True)
class ReceiverBlocks:
  """Where a receiver-sorted edge set's blocks lie (see the module docstring).

  Attributes:
    first: `[num_blocks]` int32, each block's first receiver.
    local: `[num_blocks, slots]` int32, receiver - first (`width`: a padding edge).
    rows: `[num_receivers]` int32, each receiver's row of `[num_blocks * width + 1]` partial
      sums in its first block.
    extra_receivers: `[extras]` int32, receivers with rows in further blocks
      (`num_receivers`: none, padding), and `extra_rows` `[extras]` those rows.
    width: receivers per block's window (static).
  """

  first: np.ndarray
  local: np.ndarray
  rows: np.ndarray
  extra_receivers: np.ndarray
  extra_rows: np.ndarray
  width: int

  @property
  def slots(self) -> int:
    return self.local.shape[-1]


jax.tree_util.register_dataclass(
    ReceiverBlocks, data_fields=["first", "local", "rows", "extra_receivers", "extra_rows"],
    meta_fields=["width"])


def block_edges(receivers: np.ndarray, num_receivers: int, slots: int = SLOTS,
                num_blocks: int | None = None, width: int | None = None,
                extras: int | None = None) -> ReceiverBlocks:
  """The blocks of a receiver-sorted `[num_edges]` receivers array (padding edges:
  `num_receivers`, at the end).

  `num_blocks`, `width`, `extras`: at least these (several shards' blocks are stacked
  with the largest of each); by default what these edges need.
  """
  receivers = np.asarray(receivers, np.int64)
  real = receivers[receivers < num_receivers]
  if np.any(np.diff(real) < 0) or len(real) != np.count_nonzero(receivers < num_receivers) or (
      len(real) and np.any(receivers[:len(real)] >= num_receivers)):
    raise ValueError("block_edges needs edges sorted by receiver, padding edges last.")
  needed = max(-(-len(real) // slots), 1)
  num_blocks = max(num_blocks or 0, needed)
  padded = np.full(num_blocks * slots, num_receivers, np.int64)
  padded[:len(real)] = real
  by_block = padded.reshape(num_blocks, slots)
  first = np.where(by_block[:, 0] < num_receivers, by_block[:, 0], 0) // ALIGN * ALIGN
  last = np.max(np.where(by_block < num_receivers, by_block, -1), axis=1)
  width = max(width or 0, _round_up(int(max(np.max(last - first + 1), 1))))
  # Moved back by whole multiples of ALIGN: the window still reaches past the block's last.
  first = np.minimum(first, table_rows(num_receivers, width) - width)
  local = np.where(by_block < num_receivers, by_block - first[:, None], width)
  # Each receiver's partial sums: the blocks holding its first and its last edge, and any
  # between (a receiver with more edges than a block's slots).
  nodes = np.arange(num_receivers)
  start = np.searchsorted(real, nodes, side="left")
  stop = np.searchsorted(real, nodes, side="right")
  has_edges = stop > start
  first_block = start // slots
  last_block = np.where(has_edges, (stop - 1) // slots, first_block)
  zero_row = num_blocks * width
  row_in = lambda block, nodes: block * width + nodes - first[np.minimum(block, num_blocks - 1)]
  rows = np.where(has_edges, row_in(first_block, nodes), zero_row)
  further = np.repeat(nodes, np.maximum(last_block - first_block, 0))  # one per further block
  block = first_block[further] + 1 + (np.arange(len(further)) - np.searchsorted(further, further))
  extras = max(extras or 0, len(further), 1)
  extra_receivers = np.full(extras, num_receivers, np.int64)
  extra_rows = np.full(extras, zero_row, np.int64)
  extra_receivers[:len(further)] = further
  extra_rows[:len(further)] = row_in(block, further)
  return ReceiverBlocks(*(a.astype(np.int32) for a in (first, local, rows, extra_receivers,
                                                        extra_rows)), width)


# Rows each sender window reaches beyond its block's receivers, on either side. On the
# 1 deg paper mesh in the train path's node order (a space-filling curve), 75.5% of the
# edges' senders lie in their block's receiver window (104 rows), 88.1% within 128 more
# rows on either side, 93.7% within 512. A wider window means a wider 0/1 product per
# edge in the fused kernel, a narrower one more far rows to gather: on a TPU v5e the
# paper step at 1 deg took 0.435 s with 64 rows against 0.464 s with 128, 0.439 s with
# 32 (512 slots) and 0.457 s with 32 (384 slots) (docs/benchmarks.md).
SENDER_MARGIN = 64
# Far rows per block when they are summed onto their senders in sender order: on the 1 deg
# paper mesh 256 of them span at most 312 sender rows, a narrow 0/1 product.
FAR_SLOTS = 256


@dataclasses.dataclass(frozen=True)
class SenderWindows:
  """Where the senders of each block of a `ReceiverBlocks` layout lie: a window of `width`
  rows of the sender table per block for the near ones, a short list for the far ones.

  Attributes:
    first: `[num_blocks]` int32, each block's sender window's first row.
    local: `[num_blocks, slots]` int32, sender - first for a near edge; `width` for a far
      or padding edge.
    rows: `[spans, num_senders]` int32 rows of the `[num_blocks * width]` partial sums each
      sender's near edges reach (`num_blocks * width`: none).
    far_local: `[num_blocks, slots]` int32, a far edge's row of its block's far list;
      `far` for a near or padding edge.
    far_senders: `[num_blocks, far]` int32, the far lists: the far edges' senders (0 where
      none).
    far_order: `[far_blocks * FAR_SLOTS]` int32, the far lists' rows (`block * far + row`)
      that a far edge reads, in sender order (`num_blocks * far`: none, padding), and
      `far_blocks` their `ReceiverBlocks` (the "receivers": the sender table's rows), so
      that the far rows' gradient is summed onto their senders by blocks
      (`in_sender_order`), not scattered.
    width: rows per window (static).
  """

  first: np.ndarray
  local: np.ndarray
  rows: np.ndarray
  far_local: np.ndarray
  far_senders: np.ndarray
  far_order: np.ndarray
  far_blocks: ReceiverBlocks
  width: int


jax.tree_util.register_dataclass(
    SenderWindows, data_fields=["first", "local", "rows", "far_local", "far_senders",
                                "far_order", "far_blocks"],
    meta_fields=["width"])


def sender_windows(senders: np.ndarray, blocks: ReceiverBlocks, num_senders: int,
                   margin: int = SENDER_MARGIN, width: int | None = None,
                   far: int | None = None, spans: int | None = None,
                   far_blocks: dict | None = None) -> SenderWindows:
  """The sender windows of edges laid out in `blocks` (`senders`: `[num_blocks * slots]`).

  A block's window is as wide as its receiver window and `margin` rows on either side,
  centred on the block's median sender (the sender table need not hold the receivers at
  their own rows: under graph sharding it is the exchange's), moved to lie inside the
  table (`table_rows`), its first row a multiple of `ALIGN`. `width`, `far`, `spans`, and
  `far_blocks` (`block_edges`' `num_blocks`, `width`, `extras` of the far rows in sender
  order): at least these (several shards' windows are stacked with the largest of each).
  """
  num_blocks, slots = blocks.local.shape
  by_block = np.asarray(senders, np.int64).reshape(num_blocks, slots)
  real = blocks.local < blocks.width
  width = max(width or 0, _round_up(blocks.width + 2 * margin))
  centre = np.array([np.median(row[mask]) if mask.any() else 0
                     for row, mask in zip(by_block, real)], np.int64)
  first = np.clip(centre - width // 2, 0, table_rows(num_senders, width) - width)
  first = first // ALIGN * ALIGN
  near = real & (by_block >= first[:, None]) & (by_block < first[:, None] + width)
  local = np.where(near, by_block - first[:, None], width)
  is_far = real & ~near
  far = max(far or 0, _round_up(max(int(is_far.sum(axis=1).max(initial=0)), 1)))
  rank = np.cumsum(is_far, axis=1) - 1  # a far edge's row of its block's list
  far_local = np.where(is_far, rank, far)
  far_senders = np.zeros((num_blocks, far + 1), np.int64)
  far_senders[np.arange(num_blocks)[:, None], far_local] = np.where(is_far, by_block, 0)
  far_senders = far_senders[:, :far]
  far_order, far_by_sender = in_sender_order(
      far_senders.reshape(-1), np.flatnonzero(np.arange(far) < is_far.sum(axis=1)[:, None]),
      num_senders, FAR_SLOTS, **(far_blocks or {}))
  # Each sender's rows of the partial sums: one per block whose near edges it sends.
  flat = (np.arange(num_blocks)[:, None] * width + local)[near]
  pairs = np.unique(np.stack([by_block[near], flat]), axis=1)  # sorted by sender
  counts = np.bincount(pairs[0], minlength=num_senders)
  spans = max(spans or 0, int(counts.max(initial=1)), 1)
  rows = np.full((spans, num_senders), num_blocks * width, np.int64)
  span = np.arange(pairs.shape[1]) - np.repeat(np.cumsum(counts) - counts, counts)
  rows[span, pairs[0]] = pairs[1]
  return SenderWindows(*(a.astype(np.int32) for a in (first, local, rows, far_local,
                                                       far_senders, far_order)),
                       far_by_sender, width)


def common_windows_shape(windows: list[SenderWindows]) -> dict:
  """`sender_windows`' keyword arguments that give every one of `windows` (one graph
  shard's each) the largest one's shape."""
  return dict(width=max(w.width for w in windows),
              far=max(w.far_senders.shape[1] for w in windows),
              spans=max(w.rows.shape[0] for w in windows),
              far_blocks=common_blocks_shape([w.far_blocks for w in windows]))


# The edge sets laid out in receiver blocks on a device: the processor's, summed 16 times
# a step, and the grid's encoder edges (their sum to the mesh and the mesh rows they read).
BLOCKED_EDGE_SETS = ("mesh", "grid_to_mesh")
# ... and of those, the ones whose senders are read by windows too: the processor's. A
# block of encoder edges reads several grid rows per mesh receiver, too many for a window
# (at 1 deg: 768 edges to 128 mesh rows from about 500 grid rows): its senders by index.
SENDER_WINDOWED_EDGE_SETS = ("mesh",)


# The edge sets whose senders' gradient is summed by blocks of sender-sorted edges (the
# gather's transpose, a scatter by index): the encoder's and decoder's, read once a step.
SENDER_SORTED_EDGE_SETS = ("grid_to_mesh", "mesh_to_grid")
# The encoder edge sets laid out for the fused encoder kernel too (`SenderBlocks`).
SENDER_BLOCKED_EDGE_SETS = ("grid_to_mesh",)


@dataclasses.dataclass(frozen=True)
class SortedSenders:
  """An edge set's senders, and the same edges sorted by sender in receiver-block layout,
  so that the transpose of the gather of sender rows (each sender's sum of its edges'
  gradient rows) is a permutation and products with 0/1 matrices, not a scatter.

  Attributes:
    indices: `[num_edges]` int32, each edge's sender row (as `EdgeSet.senders`).
    order: `[num_blocks * slots]` int32, the edges in sender order (a stable sort of
      `indices`; `num_edges`: none, padding).
    blocks: `ReceiverBlocks` of the sorted senders: "receivers" are the sender table's rows.
  """

  indices: np.ndarray
  order: np.ndarray
  blocks: ReceiverBlocks


jax.tree_util.register_dataclass(SortedSenders, data_fields=["indices", "order", "blocks"],
                                 meta_fields=[])


def in_sender_order(senders: np.ndarray, rows: np.ndarray, num_senders: int,
                    slots: int = SLOTS, num_blocks: int | None = None,
                    width: int | None = None, extras: int | None = None
                    ) -> tuple[np.ndarray, ReceiverBlocks]:
  """`(order [num_blocks * slots], blocks)`: the `rows` (positions in `senders`, the sender
  row of each of a gradient's rows) in sender order, padded with `len(senders)` (none),
  and the blocks of their senders (`block_edges` with these arguments; "receivers": the
  sender table's `num_senders` rows)."""
  senders = np.asarray(senders, np.int64)
  rows = np.asarray(rows, np.int64)
  rows = rows[np.argsort(senders[rows], kind="stable")]
  blocks = block_edges(senders[rows], num_senders, slots, num_blocks, width, extras)
  order = np.full(blocks.local.size, len(senders), np.int64)
  order[:len(rows)] = rows
  return order.astype(np.int32), blocks


def common_blocks_shape(blocks: list[ReceiverBlocks]) -> dict:
  """`block_edges`' `num_blocks`, `width`, `extras` that give every one of `blocks` the
  largest one's shape (several graph shards' are stacked)."""
  return dict(num_blocks=max(b.local.shape[0] for b in blocks),
              width=max(b.width for b in blocks),
              extras=max(len(b.extra_rows) for b in blocks))


def sorted_senders(senders: np.ndarray, num_senders: int, slots: int = SLOTS,
                   num_blocks: int | None = None, width: int | None = None,
                   extras: int | None = None) -> SortedSenders:
  """`SortedSenders` of `[num_edges]` sender rows of a table of `num_senders` rows (padding
  edges read a real row: their gradient rows are zero). `num_blocks`, `width`, `extras`:
  at least these, as `block_edges` takes them."""
  senders = np.asarray(senders, np.int32)
  return SortedSenders(senders, *in_sender_order(senders, np.arange(len(senders)), num_senders,
                                                 slots, num_blocks, width, extras))


@dataclasses.dataclass(frozen=True)
class BlockSenders:
  """The senders of a decoder's edges per block of its receiver rows (`model.grid_blocks`),
  each block's read through the few sender rows it needs, so that the gradient of their
  gather is neither a scatter of every edge's row nor a product as wide as the sender table.

  A block of grid rows (a region of the sphere) reads a few thousand of the mesh's rows:
  `rows` (ascending). Its edges' gradient rows are summed onto those by a `SortedSenders`
  over them (products with 0/1 matrices), and only those few thousand rows are added into
  the sender table's gradient. (Sorted over the whole table instead, a block's senders
  skip most of the mesh, and a 0/1 block would span the gaps.)

  Attributes (on a device, a leading `[num_blocks]` axis; one block's without):
    rows: `[U]` int32, the sender table's rows the block's edges read, ascending, padded with
      0 (no edge reads a padding row: its gradient row is zero).
    senders: `SortedSenders` of the block's edges, `indices` their rows of `rows`.
  """

  rows: np.ndarray
  senders: SortedSenders


jax.tree_util.register_dataclass(BlockSenders, data_fields=["rows", "senders"], meta_fields=[])


def block_senders(senders: np.ndarray, num_row_blocks: int, slots: int = SLOTS,
                  rows: int = 0, **blocks_shape) -> BlockSenders:
  """`BlockSenders` `[num_row_blocks, ...]` of `[num_row_blocks * m]` sender rows, each block's `m`
  consecutive (padding edges read a real row: their gradient rows are zero). `rows`, and
  `block_edges`' `num_blocks`, `width`, `extras` (`blocks_shape`): at least these (several
  shards' are stacked: `common_block_senders_shape`)."""
  by_block = np.asarray(senders, np.int64).reshape(num_row_blocks, -1)
  uniques = [np.unique(block) for block in by_block]
  rows = max(rows, max(len(u) for u in uniques))
  local = [np.searchsorted(u, block) for u, block in zip(uniques, by_block)]
  own = [sorted_senders(block, rows, slots, **blocks_shape) for block in local]
  shape = common_blocks_shape([s.blocks for s in own])
  if len({(s.blocks.local.shape, len(s.blocks.extra_rows), s.blocks.width) for s in own}) > 1:
    own = [sorted_senders(block, rows, slots, **shape) for block in local]
  table = np.zeros((num_row_blocks, rows), np.int32)
  for index, u in enumerate(uniques):
    table[index, :len(u)] = u
  return BlockSenders(table, jax.tree.map(lambda *arrays: np.stack(arrays), *own))


def common_block_senders_shape(stacked: list[BlockSenders]) -> dict:
  """`block_senders`' `rows` and blocks' shape that give every one of `stacked` (each
  `[num_blocks, ...]`) the largest one's shape."""
  blocks = [b.senders.blocks for b in stacked]
  return dict(rows=max(b.rows.shape[1] for b in stacked),
              num_blocks=max(b.local.shape[1] for b in blocks),
              width=max(b.width for b in blocks),
              extras=max(b.extra_rows.shape[1] for b in blocks))


# Receiver rows per block of the fused decoder kernel (`wnscale.model.fused_encoder_decoder`),
# whose `KernelSenders` list each block's senders.
DECODER_KERNEL_ROWS = 512
# A block's list of senders is padded to a multiple of this (a bfloat16 tile's rows).
KERNEL_SENDERS_ALIGN = 16


@dataclasses.dataclass(frozen=True)
class KernelSenders:
  """A decoder's senders as its fused kernel reads them: per block of `block_rows`
  receiver rows, the few sender rows its edges read, gathered once; each edge picks its
  own from those by a 0/1 product in the kernel, and the gradient of those rows (each
  one's sum over the block's edges) comes out of the kernel too. Neither the gather nor
  its gradient then goes edge by edge: a block of grid rows is a small region of the
  sphere (in the layout's space-filling order), and its `k * block_rows` edges read a few
  dozen mesh rows (at 0.25 deg, 47 on average and at most 93 of 1,536 edges' senders).

  Attributes (one decoder call's; on a device a leading `[S]` shard axis and, under
  `model.grid_blocks`, a `[grid_blocks]` axis after it):
    rows: `[num_kernel_blocks, U]` int32, each block's sender table rows, padded with 0 (no
      edge picks a padding entry: its gradient is zero).
    local: `[num_kernel_blocks, k, block_rows]` int32, each edge's entry of its block's
      `rows`, slot-major within the block (the padding receiver rows past the edge set's:
      0); a kernel block's whole (any `block_rows` makes a TPU block of it).
  """

  rows: np.ndarray
  local: np.ndarray

  @property
  def block_rows(self) -> int:
    return self.local.shape[-1]


jax.tree_util.register_dataclass(KernelSenders, data_fields=["rows", "local"], meta_fields=[])


def _block_lists(block: np.ndarray, items: np.ndarray, num_blocks: int, width: int = 0
                 ) -> tuple[np.ndarray, np.ndarray]:
  """`(lists [num_blocks, U], entries [n])`: each block's distinct `items` (non-negative
  table rows), ascending, padded with 0 to `U` (at least `width`, a multiple of
  `KERNEL_SENDERS_ALIGN`), and each of the `[n]` items' entry of its `block`'s list."""
  span = int(items.max(initial=0)) + 1
  pairs, entry_of_item = np.unique(block * span + items, return_inverse=True)
  pair_block = pairs // span
  per_list = np.bincount(pair_block, minlength=num_blocks)
  width = _round_up(max(width, int(per_list.max(initial=1)), 1), KERNEL_SENDERS_ALIGN)
  entry = np.arange(len(pairs)) - (np.cumsum(per_list) - per_list)[pair_block]
  lists = np.zeros((num_blocks, width), np.int64)
  lists[pair_block, entry] = pairs % span
  return lists, entry[entry_of_item.reshape(-1)]


def kernel_senders(senders: np.ndarray, k: int, block_rows: int = DECODER_KERNEL_ROWS,
                   width: int = 0) -> KernelSenders:
  """`KernelSenders` of `[k * R]` slot-major senders (edge `j * R + r` is row r's j-th),
  their lists at least `width` long (several shards' are stacked)."""
  by_slot = np.asarray(senders, np.int64).reshape(k, -1)
  num_rows = by_slot.shape[1]
  num_blocks = -(-num_rows // block_rows)
  padded = np.pad(by_slot, [(0, 0), (0, num_blocks * block_rows - num_rows)], mode="edge")
  by_block = padded.reshape(k, num_blocks, block_rows).transpose(1, 0, 2)
  rows, entries = _block_lists(np.repeat(np.arange(num_blocks), k * block_rows),
                               by_block.reshape(-1), num_blocks, width)
  local = entries.reshape(num_blocks, k, block_rows)
  local[-1, :, num_rows - (num_blocks - 1) * block_rows:] = 0
  return KernelSenders(rows.astype(np.int32), local.astype(np.int32))


# Sender rows per block of the fused encoder kernel (`wnscale.model.fused_encoder_decoder`),
# whose `SenderBlocks` lay its edges out: at 0.25 deg a block of 512 grid rows sends 798
# edges on average (a grid node 1 to 3; 877 at the 99th percentile, 1,536 at the poles) to
# 38 mesh nodes (at most 77). Each edge's 0/1 product that picks its sender row is as wide
# as the block; fewer rows make more, smaller kernel blocks. On a TPU v5e the 0.25 deg
# encoder edge step (forward and backward, bfloat16) took 121.5 ms with 512 rows, 124.7
# with 256 and 170.0 with 128 (docs/benchmarks.md).
ENCODER_KERNEL_ROWS = 512
# A kernel block's edges are a multiple of this many: they are the last axis (a TPU's 128
# lanes) of the block of features the kernel reads.
ENCODER_SLOTS_ALIGN = 128


@dataclasses.dataclass(frozen=True)
class SenderBlocks:
  """An encoder's edges as its fused kernel reads them: by blocks of `block_rows` rows of
  the sender table (grid rows, a small region of the sphere in the layout's space-filling
  order). A kernel block's `slots` edges read their senders from its block of rows and
  their receivers from a short list of receiver rows (a few dozen mesh rows) gathered once,
  each edge picking its own by a 0/1 product; the kernel writes the gradient of its block
  of sender rows whole, so no edge-sized array of sender rows or of their gradient is
  made. A block of rows with more edges than `slots` (around the poles, where grid nodes
  crowd) has several kernel blocks, one after the other; every block of rows has one.

  Attributes (on a device, a leading `[S]` shard axis):
    window: `[K]` int32, each kernel block's block of sender rows (rows `window *
      block_rows` on), ascending.
    edges: `[K, slots]` int32, the edge set's edge in each slot (`num_edges`: none, padding).
    features: `[F, K * slots]` the edges' static features in their slots (padding: zeros),
      so that the kernel reads them in order (a gather of a million narrow rows costs a
      TPU ~10 ms a pass), a row per feature (a TPU pads an array's last axis to 128:
      `[K * slots, F]` would take 32 times the memory, 0.9 GiB at 0.25 deg).
    sender_local: `[K, 1, slots]` int32, each edge's sender minus its block's first row
      (`block_rows`: padding).
    receiver_rows: `[K, U]` int32, each kernel block's receiver rows, padded with 0 (no edge
      picks a padding entry).
    receiver_local: `[K, 1, slots]` int32, each edge's entry of its kernel block's
      `receiver_rows` (`U`: padding).
    block_rows: sender rows per block (static).
    num_senders: the sender table's rows (static): the kernel writes the gradient of
      those its blocks cover, so a table of other rows is refused.
  """

  window: np.ndarray
  edges: np.ndarray
  features: np.ndarray
  sender_local: np.ndarray
  receiver_rows: np.ndarray
  receiver_local: np.ndarray
  block_rows: int
  num_senders: int

  @property
  def slots(self) -> int:
    return self.edges.shape[-1]


jax.tree_util.register_dataclass(
    SenderBlocks, data_fields=["window", "edges", "features", "sender_local", "receiver_rows",
                               "receiver_local"], meta_fields=["block_rows", "num_senders"])


def _fewest_slots(counts: np.ndarray, least: int) -> int:
  """The multiple of `ENCODER_SLOTS_ALIGN` slots per kernel block, at least `least`, that
  makes the fewest slots in all for blocks of rows with `counts` edges each (the smallest
  of equals)."""
  most = max(_round_up(int(counts.max(initial=1)), ENCODER_SLOTS_ALIGN), least)
  slots = np.arange(least, most + 1, ENCODER_SLOTS_ALIGN)
  total = [np.maximum(1, -(-counts // s)).sum() * s for s in slots]
  return int(slots[int(np.argmin(total))])


def sender_blocks(senders: np.ndarray, receivers: np.ndarray, features: np.ndarray,
                  num_senders: int, num_receivers: int, block_rows: int = ENCODER_KERNEL_ROWS,
                  slots: int | None = None, num_kernel_blocks: int = 0,
                  width: int = 0) -> SenderBlocks:
  """`SenderBlocks` of `[num_edges]` edges with `[num_edges, F]` features from a table of
  `num_senders` rows to one of `num_receivers` (edges with `receivers >= num_receivers`:
  padding, left out). `slots`
  (by default the fewest in all, at least `block_rows`: `_fewest_slots`), and at least
  `num_kernel_blocks` kernel blocks and `width` receiver entries each: several shards'
  are stacked (`common_sender_blocks_shape`)."""
  senders, receivers = np.asarray(senders, np.int64), np.asarray(receivers, np.int64)
  real = np.flatnonzero(receivers < num_receivers)
  order = real[np.argsort(senders[real], kind="stable")]
  row_block = senders[order] // block_rows
  counts = np.bincount(row_block, minlength=-(-num_senders // block_rows))
  # At least a block's rows: fewer edges would leave the matrix unit a thin product and
  # pay a kernel block's fixed cost (its parameters, its list) for little.
  slots = slots or _fewest_slots(counts, _round_up(block_rows, ENCODER_SLOTS_ALIGN))
  per_block = np.maximum(1, -(-counts // slots))
  num_blocks = max(int(per_block.sum()), num_kernel_blocks)
  # Padding kernel blocks (several shards stacked) repeat the last block of rows.
  window = np.full(num_blocks, len(counts) - 1, np.int64)
  window[:per_block.sum()] = np.repeat(np.arange(len(counts)), per_block)
  rank = np.arange(len(order)) - (np.cumsum(counts) - counts)[row_block]
  block = (np.cumsum(per_block) - per_block)[row_block] + rank // slots
  slot = rank % slots
  edges = np.full((num_blocks, slots), len(senders), np.int64)
  edges[block, slot] = order
  features = np.asarray(features)
  slot_features = np.zeros((features.shape[-1], num_blocks * slots), features.dtype)
  slot_features[:, block * slots + slot] = features[order].T
  sender_local = np.full((num_blocks, slots), block_rows, np.int64)
  sender_local[block, slot] = senders[order] - row_block * block_rows
  # Each kernel block's receivers, ascending, and each edge's entry of them.
  receiver_rows, entries = _block_lists(block, receivers[order], num_blocks, width)
  receiver_local = np.full((num_blocks, slots), receiver_rows.shape[1], np.int64)
  receiver_local[block, slot] = entries
  window, edges, sender_local, receiver_rows, receiver_local = (a.astype(np.int32) for a in (
      window, edges, sender_local[:, None], receiver_rows, receiver_local[:, None]))
  return SenderBlocks(window, edges, slot_features, sender_local, receiver_rows,
                      receiver_local, block_rows, num_senders)


def common_sender_blocks_shape(stacked: list[SenderBlocks]) -> dict:
  """`sender_blocks`' `slots`, `num_kernel_blocks` and `width` that give every one of
  `stacked` the largest one's shape (with the largest `slots`, a shard's kernel blocks can
  only be fewer, its receiver lists longer: make them again with these and ask again)."""
  return dict(slots=max(b.slots for b in stacked),
              num_kernel_blocks=max(b.window.shape[0] for b in stacked),
              width=max(b.receiver_rows.shape[1] for b in stacked))


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """How a blocked edge set is cut (the interaction network's `model.edge_block_slots` and
  `model.sender_window_margin`): edges per block, and the rows each sender window reaches
  beyond its block's receivers on either side."""

  slots: int = SLOTS
  sender_margin: int = SENDER_MARGIN


def with_blocks(edge_set, num_receivers: int, num_senders: int,
                blocks: ReceiverBlocks | None = None, windows_shape: dict | None = None,
                sizes: BlockSizes = BlockSizes(), windowed: bool = True):
  """`edge_set` (an `EdgeSet`, receiver-sorted, padding edges last) padded to whole blocks,
  its `blocks` set (`blocks` if given, of these receivers, else `block_edges`' own of
  `sizes.slots`) and, if `windowed`, its `sender_windows` (of a sender table of
  `num_senders` rows, margin `sizes.sender_margin`; `windows_shape`: at least
  `sender_windows`' `width`, `far`, `spans`)."""
  blocks = blocks or block_edges(edge_set.receivers, num_receivers, sizes.slots)
  rows = blocks.local.size
  num_edges = edge_set.senders.shape[-1]
  if num_edges > rows:
    raise ValueError(f"{num_edges} edges do not fit {rows} block slots.")
  pad = lambda array, fill: np.concatenate(
      [np.asarray(array), np.full((rows - num_edges,) + np.shape(array)[1:], fill,
                                  np.asarray(array).dtype)])
  senders = pad(edge_set.senders, 0)
  return edge_set.replace(
      senders=senders, receivers=pad(edge_set.receivers, num_receivers),
      features=pad(edge_set.features, 0), blocks=blocks,
      sender_windows=sender_windows(senders, blocks, num_senders, sizes.sender_margin,
                                    **(windows_shape or {})) if windowed else None)


def graphs_with_blocks(graphs):
  """`graphs` (a `Graphs` of one device) with `BLOCKED_EDGE_SETS` laid out in blocks,
  `SENDER_SORTED_EDGE_SETS` given their `sorted_senders` and `SENDER_BLOCKED_EDGE_SETS`
  their `sender_blocks`."""
  edges = {name: (with_blocks(edge_set, graphs.num_nodes(edge_set.receiver_set),
                              graphs.num_nodes(edge_set.sender_set),
                              windowed=name in SENDER_WINDOWED_EDGE_SETS)
                  if name in BLOCKED_EDGE_SETS and edge_set.blocks is None else edge_set)
           for name, edge_set in graphs.edges.items()}
  edges = {name: (edge_set.replace(sorted_senders=sorted_senders(
      edge_set.senders, graphs.num_nodes(edge_set.sender_set)))
                  if name in SENDER_SORTED_EDGE_SETS and edge_set.sorted_senders is None
                  else edge_set)
           for name, edge_set in edges.items()}
  edges = {name: (edge_set.replace(sender_blocks=sender_blocks(
      edge_set.senders, edge_set.receivers, edge_set.features,
      graphs.num_nodes(edge_set.sender_set),
      graphs.num_nodes(edge_set.receiver_set)))
                  if name in SENDER_BLOCKED_EDGE_SETS and edge_set.sender_blocks is None
                  else edge_set)
           for name, edge_set in edges.items()}
  return graphs._replace(edges=edges)
