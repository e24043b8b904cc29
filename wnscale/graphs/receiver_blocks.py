"""Edges cut into blocks of receivers, so that summing over a receiver's edges is a matrix product.

An accelerator's scatter (`segment_sum`, and the transpose of a gather) is a
slow operation: on a TPU v5e, summing the paper model's mesh messages onto its nodes
takes several times as long as reading and writing them once (docs/benchmarks.md,
"Figures behind the code"). Matrix products are what the chip is built for. With edges sorted by receiver, every block of `slots`
consecutive edges points at a short run of consecutive receivers; within the
block, the sum over each receiver's edges is a product with a 0/1 matrix
`[width, slots]` (`wnscale.model.aggregation`), and gathering the receivers'
rows for the block's edges is the product with its transpose.

The layout (per edge set, host numpy, once):

  edges       padded to `num_blocks * slots` rows: padding edges send from node 0
              to receiver `num_receivers`, which every sum drops
  first       `[num_blocks]` where each block's window of `width` receivers starts: its
              run's first receiver, moved back where the window would pass the last
  local       `[num_blocks, slots]` each edge's receiver minus its block's first;
              `width` for padding edges (no row of the window)
  rows        `[spans, num_receivers]` where each receiver's partial sums lie in the
              blocks' `[num_blocks * width]` rows (one per block its edges reach;
              `num_blocks * width` where none: a zero row)

`width` is the longest run of receivers a block spans, rounded up to a
multiple of 8; `spans` the most blocks a receiver's edges reach (2 for the
multi-mesh, whose receivers have at most 36 edges).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

# Edges per block: a block of the multi-mesh (8 edges per node on average, at least 5)
# spans about 100 receivers, at most 156.
SLOTS = 768


@dataclasses.dataclass(frozen=True)
class ReceiverBlocks:
  """Where a receiver-sorted edge set's blocks lie (see the module docstring).

  Attributes:
    first: `[num_blocks]` int32, each block's first receiver.
    local: `[num_blocks, slots]` int32, receiver - first (`width`: a padding edge).
    rows: `[spans, num_receivers]` int32 rows of `[num_blocks * width + 1]` partial sums.
    width: receivers per block's window (static).
  """

  first: np.ndarray
  local: np.ndarray
  rows: np.ndarray
  width: int

  @property
  def slots(self) -> int:
    return self.local.shape[-1]


jax.tree_util.register_dataclass(ReceiverBlocks, data_fields=["first", "local", "rows"],
                                 meta_fields=["width"])


def block_edges(receivers: np.ndarray, num_receivers: int, slots: int = SLOTS,
                num_blocks: int | None = None, width: int | None = None,
                spans: int | None = None) -> ReceiverBlocks:
  """The blocks of a receiver-sorted `[num_edges]` receivers array (padding edges:
  `num_receivers`, at the end).

  `num_blocks`, `width`, `spans`: at least these (several shards' blocks are stacked
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
  first = np.where(by_block[:, 0] < num_receivers, by_block[:, 0], 0)
  last = np.max(np.where(by_block < num_receivers, by_block, -1), axis=1)
  needed_width = int(max(np.max(last - first + 1), 1))
  width = max(width or 0, -(-needed_width // 8) * 8)
  if num_receivers >= width:  # every window inside the receivers: no padding on the device
    first = np.minimum(first, num_receivers - width)
  local = np.where(by_block < num_receivers, by_block - first[:, None], width)
  # Each receiver's partial sums: the blocks holding its first and its last edge, and any
  # between (a receiver with more edges than a block's slots).
  nodes = np.arange(num_receivers)
  start = np.searchsorted(real, nodes, side="left")
  stop = np.searchsorted(real, nodes, side="right")
  has_edges = stop > start
  first_block = start // slots
  last_block = np.where(has_edges, (stop - 1) // slots, first_block)
  spans = max(spans or 0, int(np.max(last_block - first_block + 1, initial=1)))
  zero_row = num_blocks * width
  rows = np.full((spans, num_receivers), zero_row, np.int64)
  for span in range(spans):
    block = first_block + span
    reached = has_edges & (block <= last_block)
    rows[span, reached] = (block[reached] * width
                           + nodes[reached] - first[np.minimum(block[reached], num_blocks - 1)])
  return ReceiverBlocks(first.astype(np.int32), local.astype(np.int32),
                        rows.astype(np.int32), width)


# The edge sets laid out in blocks on a device: the processor's, summed 16 times a step.
BLOCKED_EDGE_SETS = ("mesh",)


def with_blocks(edge_set, num_receivers: int, blocks: ReceiverBlocks | None = None):
  """`edge_set` (an `EdgeSet`, receiver-sorted, padding edges last) padded to whole blocks,
  its `blocks` set: `blocks` if given (of these receivers), else `block_edges`' own."""
  blocks = blocks or block_edges(edge_set.receivers, num_receivers)
  rows = blocks.local.size
  num_edges = edge_set.senders.shape[-1]
  if num_edges > rows:
    raise ValueError(f"{num_edges} edges do not fit {rows} block slots.")
  pad = lambda array, fill: np.concatenate(
      [np.asarray(array), np.full((rows - num_edges,) + np.shape(array)[1:], fill,
                                  np.asarray(array).dtype)])
  return edge_set.replace(senders=pad(edge_set.senders, 0),
                          receivers=pad(edge_set.receivers, num_receivers),
                          features=pad(edge_set.features, 0), blocks=blocks)


def graphs_with_blocks(graphs):
  """`graphs` (a `Graphs` of one device) with `BLOCKED_EDGE_SETS` laid out in blocks."""
  edges = {name: (with_blocks(edge_set, graphs.num_nodes(edge_set.receiver_set))
                  if name in BLOCKED_EDGE_SETS and edge_set.blocks is None else edge_set)
           for name, edge_set in graphs.edges.items()}
  return graphs._replace(edges=edges)
