"""Host-side partitioning of the graphs over the `graph` mesh axis (numpy, once).

* Nodes (grid and mesh separately) are ordered along a space-filling curve (a
  Morton code of their 3-D position) and cut into contiguous, equally sized
  blocks, one per shard, each padded to the same length (padding rows are
  inert: no edge reads or writes them and their loss weight is zero).
* Each edge lives on the shard that owns its receiver, with a shard-local
  receiver index; padding edges point one past the last receiver, which the
  segment sum drops.
* Sender indices point into the shard's *sender table*, which depends on the
  exchange mode:
    all_gather: the all-gathered sender array, `[num_shards * per_shard, D]`;
    halo: the shard's own rows followed by the rows received from other shards,
      one block per shard offset k (received from shard `s - k` by `ppermute`).

Every stacked array has a leading `[num_shards]` axis, sharded over `graph`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from wnscale.graphs.build import EdgeSet, Graphs

EXCHANGE_MODES = ("all_gather", "halo")


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
    # A gather (sequential writes) is ~3x faster than scattering into the slots.
    out = np.take(np.asarray(array), np.maximum(self.node_of_slot, 0), axis=axis)
    padding = self.node_of_slot < 0
    out[(slice(None),) * (axis % out.ndim) + (padding,)] = 0
    return out

  def from_slots(self, array, axis: int):
    """Inverse of `to_slots`: `[..., num_shards * per_shard, ...] -> [..., num_nodes, ...]`."""
    return np.take(np.asarray(array), self.slot_of_node, axis=axis)


class Halo(NamedTuple):
  """Rows each shard sends, per shard offset `k` (shard s sends to shard s + k).

  Attributes:
    offsets: the offsets with any traffic, ascending.
    send_indices: per offset, `[num_shards, rows]` local row indices to send
      (padded with 0; the receiver never reads padded rows).
  """

  offsets: tuple[int, ...]
  send_indices: tuple[np.ndarray, ...]

  def rows_received(self) -> int:
    """Rows each shard receives per exchange (padding included)."""
    return sum(i.shape[1] for i in self.send_indices)


class PartitionedGraphs(NamedTuple):
  """The graphs laid out over `num_shards` graph shards.

  Attributes:
    graphs: `Graphs` whose arrays have a leading `[num_shards]` axis and shard-local indices.
    grid, mesh: node partitions.
    halos: per edge set name, the `Halo` for its senders (halo mode), else None.
    exchange: "all_gather" or "halo".
  """

  graphs: Graphs
  grid: NodePartition
  mesh: NodePartition
  halos: dict | None
  exchange: str


def morton_order(xyz: np.ndarray, bits: int = 10) -> np.ndarray:
  """Indices sorting points `[n, 3]` along a Z-order curve of their 3-D position."""
  cells = np.clip(((xyz + 1.0) / 2.0 * (1 << bits)).astype(np.int64), 0, (1 << bits) - 1)
  code = np.zeros(len(xyz), dtype=np.int64)
  for bit in range(bits):
    for axis in range(3):
      code |= ((cells[:, axis] >> bit) & 1) << (3 * bit + axis)
  return np.argsort(code, kind="stable")


def partition_nodes(xyz: np.ndarray, num_shards: int) -> NodePartition:
  """Contiguous blocks of the space-filling order of `xyz` `[n, 3]`, sizes within one."""
  num_nodes = len(xyz)
  order = morton_order(xyz)
  per_shard = -(-num_nodes // num_shards)
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


def _halo(sender_shard, sender_local, receiver_shard, num_shards, per_shard):
  """Plans the halo of one edge set; returns (Halo, table index of each edge's sender)."""
  table_index = np.where(sender_shard == receiver_shard, sender_local, -1)
  remote = sender_shard != receiver_shard
  offsets, send_indices, base = [], [], per_shard
  offset_of_edge = (receiver_shard - sender_shard) % num_shards
  for k in range(1, num_shards):
    at_k = remote & (offset_of_edge == k)
    if not at_k.any():
      continue
    # Rows shard t sends to t + k: its distinct local rows that edges on t + k read,
    # as keys t * per_shard + local (1-D: np.unique of rows is slow for 10^8 edges).
    edge_keys = sender_shard[at_k] * per_shard + sender_local[at_k]
    pair_keys = np.unique(edge_keys)
    pairs = np.stack(np.divmod(pair_keys, per_shard), 1)
    counts = np.bincount(pairs[:, 0], minlength=num_shards)
    rows = counts.max()
    send = np.zeros((num_shards, rows), dtype=np.int32)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    position = np.arange(len(pairs)) - first[pairs[:, 0]]
    send[pairs[:, 0], position] = pairs[:, 1]
    # Receiving shard r finds row (t, local) at base + position in its table.
    table_index[at_k] = base + position[np.searchsorted(pair_keys, edge_keys)]
    offsets.append(k)
    send_indices.append(send)
    base += rows
  return Halo(tuple(offsets), tuple(send_indices)), table_index


def _partition_edges(edges: EdgeSet, senders_part: NodePartition,
                     receivers_part: NodePartition, exchange: str):
  """Stacks an edge set per receiver shard; returns (EdgeSet [S, E_max], Halo | None)."""
  num_shards, per_shard = receivers_part.num_shards, receivers_part.per_shard
  receiver_slot = receivers_part.slot_of_node[edges.receivers]
  receiver_shard, receiver_local = np.divmod(receiver_slot, per_shard)
  sender_slot = senders_part.slot_of_node[edges.senders]
  halo = None
  if exchange == "all_gather":
    table_index = sender_slot
  else:
    sender_shard, sender_local = np.divmod(sender_slot, senders_part.per_shard)
    halo, table_index = _halo(sender_shard, sender_local, receiver_shard, num_shards,
                              senders_part.per_shard)
  # Sorted by (shard, local receiver), i.e. by receiver slot, then by table index: each
  # shard's block stays receiver-sorted. One int64 key sorts ~3x faster than a lexsort
  # of three (10^8 attention edges), to the same order.
  order = np.argsort(receiver_slot * (int(table_index.max(initial=0)) + 1) + table_index,
                     kind="stable")
  counts = np.bincount(receiver_shard, minlength=num_shards)
  starts = np.concatenate([[0], np.cumsum(counts)])
  max_edges = max(int(counts.max()), 1)
  senders = np.zeros((num_shards, max_edges), np.int32)
  receivers = np.full((num_shards, max_edges), receivers_part.per_shard, np.int32)
  features = np.zeros((num_shards, max_edges, edges.features.shape[1]), np.float32)
  for shard in range(num_shards):  # the shards' blocks are contiguous in `order`
    block = order[starts[shard]:starts[shard + 1]]
    senders[shard, :len(block)] = table_index[block]
    receivers[shard, :len(block)] = receiver_local[block]
    features[shard, :len(block)] = edges.features[block]
  return EdgeSet(senders, receivers, features), halo


def partition_graphs(graphs: Graphs, grid_xyz: np.ndarray, mesh_xyz: np.ndarray,
                     num_shards: int, exchange: str) -> PartitionedGraphs:
  """Lays `graphs` out over `num_shards` graph shards for the `exchange` mode.

  Args:
    graphs: the global graphs (`wnscale.graphs.build_graphs`).
    grid_xyz, mesh_xyz: `[num_*_nodes, 3]` node positions, for spatial locality.
  """
  if exchange not in EXCHANGE_MODES:
    raise ValueError(f"Unknown exchange mode {exchange!r}; expected one of {EXCHANGE_MODES}.")
  grid = partition_nodes(grid_xyz, num_shards)
  mesh = partition_nodes(mesh_xyz, num_shards)
  stack = lambda part, features: part.to_slots(features, 0).reshape(
      num_shards, part.per_shard, -1)
  edge_sets, halos = {}, {}
  for name, senders_part, receivers_part in [("grid_to_mesh", grid, mesh),
                                             ("mesh", mesh, mesh),
                                             ("mesh_to_grid", mesh, grid),
                                             ("mesh_neighbours", mesh, mesh)]:
    if getattr(graphs, name) is None:  # no transformer, no neighbour lists
      continue
    edge_sets[name], halos[name] = _partition_edges(getattr(graphs, name), senders_part,
                                                    receivers_part, exchange)
  stacked = Graphs(stack(grid, graphs.grid_node_features),
                   stack(mesh, graphs.mesh_node_features), **edge_sets)
  return PartitionedGraphs(stacked, grid, mesh, halos if exchange == "halo" else None,
                           exchange)
