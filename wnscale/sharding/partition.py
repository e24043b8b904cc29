"""Host-side partitioning of the graphs over the `graph` mesh axis (numpy, once).

* Nodes (each node set separately) are ordered along a space-filling curve (a
  Morton code of their 3-D position) and cut into contiguous, equally sized
  blocks, one per shard, each padded to the same length (padding rows are
  inert: their loss weight is zero, and no edge reads them); the grid, where the
  model works on it in `grid_blocks` blocks of rows, to a length those blocks divide.
* Each edge lives on the shard that owns its receiver, with a shard-local
  receiver index; padding edges point one past the last receiver, which the
  segment sum drops. The processor's edges (`receiver_blocks.BLOCKED_EDGE_SETS`)
  are laid out in receiver blocks, every shard's alike. A decoder's edge set
  (mesh to grid or points) with the same number k of edges into every receiver
  (GraphCast's: 3) is laid out as k runs of one edge per receiver row, padding
  rows included (their edges read sender 0 and are as inert as the rows), so
  its sums and receiver gathers are reshapes (`EdgeSet.in_degree`).
* Sender indices point into the shard's *sender table*, which the exchange
  mode plans (`wnscale.sharding.exchange.MODES`).

Every node set and every edge set of the graphs is partitioned alike.

Every stacked array has a leading `[num_shards]` axis, sharded over `graph`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np

from wnscale.graphs import receiver_blocks
from wnscale.graphs.graph import EdgeSet, Graphs, NodeSet
from wnscale.model.blocks import ROW_ALIGN, slot_major_row_blocks
from wnscale.sharding.exchange import MODES


class NodePartition(NamedTuple):
  """Where each node lives.

  Attributes:
    slot_of_node: `[num_nodes]` position in the padded, sharded layout
      (`shard * per_shard + local index`).
    node_of_slot: `[num_shards * per_shard]` node at each slot, -1 for padding.
    per_shard: rows per shard, padding included.
  """

  slot_of_node: np.ndarray
  node_of_slot: np.ndarray
  per_shard: int

  @property
  def num_shards(self) -> int:
    return len(self.node_of_slot) // self.per_shard

  def to_slots(self, array: np.ndarray, axis: int) -> np.ndarray:
    """Reorders `axis` (length num_nodes) into the padded layout; padding rows are 0."""
    # A gather (sequential writes) is faster than scattering into the slots.
    out = np.take(np.asarray(array), np.maximum(self.node_of_slot, 0), axis=axis)
    padding = self.node_of_slot < 0
    out[(slice(None),) * (axis % out.ndim) + (padding,)] = 0
    return out

  def from_slots(self, array, axis: int):
    """Inverse of `to_slots`: `[..., num_shards * per_shard, ...] -> [..., num_nodes, ...]`."""
    return np.take(np.asarray(array), self.slot_of_node, axis=axis)


class PartitionedGraphs(NamedTuple):
  """The graphs laid out over `num_shards` graph shards.

  Attributes:
    graphs: `Graphs` whose arrays have a leading `[num_shards]` axis and shard-local indices.
    nodes: per node set name, its `NodePartition`.
    plans: per edge set name, the exchange mode's plan for its senders
      (`exchange.Gathered` or `exchange.Halo`).
    exchange: the mode's name, a key of `exchange.MODES`.
  """

  graphs: Graphs
  nodes: dict[str, NodePartition]
  plans: dict
  exchange: str


def morton_order(xyz: np.ndarray, bits: int = 10) -> np.ndarray:
  """Indices sorting points `[n, 3]` along a Z-order curve of their 3-D position."""
  cells = np.clip(((xyz + 1.0) / 2.0 * (1 << bits)).astype(np.int64), 0, (1 << bits) - 1)
  code = np.zeros(len(xyz), dtype=np.int64)
  for bit in range(bits):
    for axis in range(3):
      code |= ((cells[:, axis] >> bit) & 1) << (3 * bit + axis)
  return np.argsort(code, kind="stable")


def partition_nodes(xyz: np.ndarray, num_shards: int, multiple: int = 1) -> NodePartition:
  """Contiguous blocks of the space-filling order of `xyz` `[n, 3]`, sizes within one, each
  shard's rows (padding included) a multiple of `multiple`."""
  num_nodes = len(xyz)
  order = morton_order(xyz)
  per_shard = -(-num_nodes // num_shards)
  per_shard = -(-per_shard // multiple) * multiple
  sizes = np.full(num_shards, num_nodes // num_shards)
  sizes[: num_nodes % num_shards] += 1
  starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
  node_of_slot = np.full(num_shards * per_shard, -1, dtype=np.int64)
  for shard, (start, size) in enumerate(zip(starts, sizes)):
    node_of_slot[shard * per_shard: shard * per_shard + size] = order[start:start + size]
  slot_of_node = np.empty(num_nodes, dtype=np.int64)
  real = node_of_slot >= 0
  slot_of_node[node_of_slot[real]] = np.nonzero(real)[0]
  return NodePartition(slot_of_node, node_of_slot, per_shard)


def _partition_edges(edges_name: str, edges: EdgeSet, senders_part: NodePartition,
                     receivers_part: NodePartition, exchange: str,
                     blocked: receiver_blocks.BlockSizes | None, grid_blocks: int = 1):
  """Stacks the edge set `edges_name` per receiver shard; returns (EdgeSet [S, E_max], the
  mode's plan).

  `blocked`: each shard's edges in receiver blocks of these sizes (`receiver_blocks`), all
  shards' of one shape, and sender windows for `receiver_blocks.SENDER_WINDOWED_EDGE_SETS`;
  None: not in blocks. `grid_blocks` > 1: a decoder's edge set of
  `receiver_blocks.SENDER_SORTED_EDGE_SETS` gets its `block_senders` for that many blocks of
  its receiver rows. Padding edges of `edges` (receiver past the last node) are dropped
  first.
  """
  num_shards, per_shard = receivers_part.num_shards, receivers_part.per_shard
  real = edges.receivers < len(receivers_part.slot_of_node)
  if not np.all(real):
    edges = edges.replace(senders=edges.senders[real], receivers=edges.receivers[real],
                          features=edges.features[real])
  edges = edges.replace(blocks=None, sender_windows=None, sorted_senders=None,
                        block_senders=None, kernel_senders=None, sender_blocks=None)
  receiver_slot = receivers_part.slot_of_node[edges.receivers]
  receiver_shard, receiver_local = np.divmod(receiver_slot, per_shard)
  sender_shard, sender_local = np.divmod(senders_part.slot_of_node[edges.senders],
                                         senders_part.per_shard)
  table_index, plan = MODES[exchange].plan(sender_shard, sender_local, receiver_shard,
                                           num_shards, senders_part.per_shard)
  # Sorted by (shard, local receiver), i.e. by receiver slot, then by table index: each
  # shard's block stays receiver-sorted. One int64 key sorts faster than a lexsort of
  # three, to the same order.
  order = np.argsort(receiver_slot * (int(table_index.max(initial=0)) + 1) + table_index,
                     kind="stable")
  counts = np.bincount(receiver_shard, minlength=num_shards)
  starts = np.concatenate([[0], np.cumsum(counts)])
  # The decoders' edge sets (mesh to grid or points), which the model reads by their
  # `FixedInDegree` alone: a slot-major layout is not sorted by receiver.
  decoded = edges.sender_set == "mesh" and edges.receiver_set != "mesh" and blocked is None
  in_degree = _in_degree(edges.receivers, len(receivers_part.slot_of_node)) if decoded else 0
  if in_degree:  # k slots per receiver row, padding rows' too: sums and gathers are reshapes
    max_edges = in_degree * per_shard
    receivers = np.broadcast_to(np.tile(np.arange(per_shard, dtype=np.int32), in_degree),
                                (num_shards, max_edges)).copy()
  else:
    max_edges = max(int(counts.max()), 1)
    receivers = np.full((num_shards, max_edges), receivers_part.per_shard, np.int32)
  senders = np.zeros((num_shards, max_edges), np.int32)
  features = np.zeros((num_shards, max_edges, edges.features.shape[1]), np.float32)
  for shard in range(num_shards):  # the shards' blocks are contiguous in `order`
    block = order[starts[shard]:starts[shard + 1]]
    # Regular: a receiver's k edges are consecutive in `block` (the j-th at j % k), and
    # its j-th goes to slot j * per_shard + its row.
    at = (np.arange(len(block)) % in_degree * per_shard + receiver_local[block]
          if in_degree else slice(0, len(block)))
    senders[shard, at] = table_index[block]
    receivers[shard, at] = receiver_local[block]
    features[shard, at] = edges.features[block]
  laid_out = edges.replace(senders=senders, receivers=receivers, features=features,
                           in_degree=in_degree)
  table_rows = senders_part.per_shard + plan.rows_received()
  if blocked is not None:
    laid_out = _in_blocks(laid_out, per_shard, table_rows, blocked,
                          windowed=edges_name in receiver_blocks.SENDER_WINDOWED_EDGE_SETS)
  if edges_name in receiver_blocks.SENDER_SORTED_EDGE_SETS:
    laid_out = laid_out.replace(sorted_senders=_sorted_senders(laid_out.senders, table_rows))
    if in_degree and grid_blocks > 1:
      laid_out = laid_out.replace(block_senders=_block_senders(
          laid_out.senders, in_degree, grid_blocks))
    if in_degree:
      laid_out = laid_out.replace(kernel_senders=_kernel_senders(
          laid_out.senders, in_degree, grid_blocks))
  if edges_name in receiver_blocks.SENDER_BLOCKED_EDGE_SETS:
    laid_out = laid_out.replace(sender_blocks=_sender_blocks(
        laid_out.senders, laid_out.receivers, laid_out.features, table_rows, per_shard))
  return laid_out, plan


def _sorted_senders(senders: np.ndarray, table_rows: int) -> receiver_blocks.SortedSenders:
  """Stacked `[S, ...]` `SortedSenders` of each shard's `[S, E_max]` senders (rows of its
  sender table of `table_rows`), every shard's of the largest shape."""
  own = [receiver_blocks.sorted_senders(row, table_rows) for row in senders]
  shape = receiver_blocks.common_blocks_shape([s.blocks for s in own])
  if len(own) > 1:  # again, each of the largest shape (one shard's is its own)
    own = [receiver_blocks.sorted_senders(row, table_rows, **shape) for row in senders]
  return jax.tree.map(lambda *arrays: np.stack(arrays), *own)


def _block_senders(senders: np.ndarray, k: int, grid_blocks: int
                   ) -> receiver_blocks.BlockSenders:
  """Stacked `[S, grid_blocks, ...]` `BlockSenders` of each shard's `[S, k * per_shard]`
  slot-major senders, cut as the model cuts them (`blocks.slot_major_row_blocks`), every
  shard's of the largest shape."""
  by_block = [slot_major_row_blocks(row, k, grid_blocks) for row in senders]
  own = [receiver_blocks.block_senders(row, grid_blocks) for row in by_block]
  if len(own) > 1:  # again, each of the largest shape (one shard's is its own)
    shape = receiver_blocks.common_block_senders_shape(own)
    own = [receiver_blocks.block_senders(row, grid_blocks, **shape) for row in by_block]
  return jax.tree.map(lambda *arrays: np.stack(arrays), *own)


def _kernel_senders(senders: np.ndarray, k: int, grid_blocks: int
                    ) -> receiver_blocks.KernelSenders:
  """Stacked `[S, grid_blocks, ...]` `KernelSenders` of each shard's `[S, k * per_shard]`
  slot-major senders, per block of rows as the model cuts them (one block: the whole),
  every shard's and block's of the largest shape."""
  by_block = [slot_major_row_blocks(row, k, grid_blocks).reshape(grid_blocks, -1)
              for row in senders]
  own = [[receiver_blocks.kernel_senders(block, k) for block in row] for row in by_block]
  width = max(b.rows.shape[1] for row in own for b in row)
  if any(b.rows.shape[1] != width for row in own for b in row):
    own = [[receiver_blocks.kernel_senders(block, k, width=width) for block in row]
           for row in by_block]
  stack = lambda trees: jax.tree.map(lambda *arrays: np.stack(arrays), *trees)
  return stack([stack(row) for row in own])


def _sender_blocks(senders: np.ndarray, receivers: np.ndarray, features: np.ndarray,
                   table_rows: int, num_receivers: int) -> receiver_blocks.SenderBlocks:
  """Stacked `[S, ...]` `SenderBlocks` of each shard's `[S, E_max]` edges (rows of its
  sender table of `table_rows` to its `num_receivers`; features `[S, E_max, F]`), every
  shard's of the largest shape."""
  make = lambda **shape: [receiver_blocks.sender_blocks(s, r, f, table_rows, num_receivers,
                                                         **shape)
                          for s, r, f in zip(senders, receivers, features)]
  own = make()
  if len(own) > 1:  # the most slots, then each of the largest shape with them
    own = make(slots=max(b.slots for b in own))
    own = make(**receiver_blocks.common_sender_blocks_shape(own))
  return jax.tree.map(lambda *arrays: np.stack(arrays), *own)


def _in_degree(receivers: np.ndarray, num_receivers: int) -> int:
  """k if each of the `num_receivers` receivers has exactly k > 0 edges, else 0."""
  counts = np.bincount(receivers, minlength=num_receivers)
  return int(counts[0]) if num_receivers and counts[0] > 0 and np.all(counts == counts[0]) else 0


def _in_blocks(edges: EdgeSet, per_shard: int, table_rows: int,
               sizes: receiver_blocks.BlockSizes, windowed: bool) -> EdgeSet:
  """Stacked `[S, E_max]` edges in receiver blocks and, if `windowed`, sender windows (of
  sender tables of `table_rows`) of `sizes`, every shard's of the largest shape."""
  shards = [edges.replace(senders=edges.senders[s], receivers=edges.receivers[s],
                          features=edges.features[s]) for s in range(len(edges.senders))]
  own = [receiver_blocks.block_edges(shard.receivers, per_shard, sizes.slots)
         for shard in shards]
  shape = receiver_blocks.common_blocks_shape(own)
  blocks = [receiver_blocks.block_edges(shard.receivers, per_shard, sizes.slots, **shape)
            for shard in shards]
  laid_out = [receiver_blocks.with_blocks(shard, per_shard, table_rows, b, sizes=sizes,
                                          windowed=windowed)
              for shard, b in zip(shards, blocks)]
  if not windowed:
    return jax.tree.map(lambda *arrays: np.stack(arrays), *laid_out)
  windows_shape = receiver_blocks.common_windows_shape(
      [shard.sender_windows for shard in laid_out])
  laid_out = [receiver_blocks.with_blocks(shard, per_shard, table_rows, b, windows_shape,
                                          sizes)
              for shard, b in zip(shards, blocks)]
  return jax.tree.map(lambda *arrays: np.stack(arrays), *laid_out)


def partition_graphs(graphs: Graphs, positions: dict[str, np.ndarray], num_shards: int,
                     exchange: str,
                     block_sizes: receiver_blocks.BlockSizes = receiver_blocks.BlockSizes(),
                     grid_blocks: int = 1) -> PartitionedGraphs:
  """Lays `graphs` out over `num_shards` graph shards for the `exchange` mode.

  Args:
    graphs: the global graphs (`wnscale.graphs.build.build_graphs`).
    positions: per node set, `[num_nodes, 3]` node positions, for spatial locality.
    exchange: a key of `exchange.MODES`.
    block_sizes: how the processor's edges are cut into blocks (the other
      `receiver_blocks.BLOCKED_EDGE_SETS`: the default sizes).
    grid_blocks: the blocks of grid rows the model decodes (`model.grid_blocks`).
  """
  if exchange not in MODES:
    raise ValueError(f"Unknown exchange mode {exchange!r}; expected one of {tuple(MODES)}.")
  # The grid, which the model works on in `grid_blocks` blocks of rows: as many rows a shard
  # as the blocks take (`blocks.block_rows`), so no block is padded (a copy of each
  # `[rows, latent]` array cut into them, and of each made of them: at 0.25 deg each a
  # gigabyte). (A modality's points are few: their blocks are padded.)
  multiple = ROW_ALIGN * grid_blocks if grid_blocks > 1 else 1
  parts = {name: partition_nodes(positions[name], num_shards,
                                 multiple if name == "grid" else 1) for name in graphs.nodes}
  nodes = {name: NodeSet(parts[name].to_slots(node_set.features, 0).reshape(
      num_shards, parts[name].per_shard, -1)) for name, node_set in graphs.nodes.items()}
  edges, plans = {}, {}
  for name, edge_set in graphs.edges.items():
    sizes = block_sizes if name == "mesh" else receiver_blocks.BlockSizes()
    edges[name], plans[name] = _partition_edges(
        name, edge_set, parts[edge_set.sender_set], parts[edge_set.receiver_set], exchange,
        blocked=sizes if name in receiver_blocks.BLOCKED_EDGE_SETS else None,
        grid_blocks=grid_blocks)
  return PartitionedGraphs(Graphs(nodes, edges), parts, plans, exchange)
