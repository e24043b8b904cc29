"""The model's graph: node sets and edge sets by name (as GraphCast's `TypedGraph`).

`Graphs` holds node sets (`grid`, `mesh`, ...) and edge sets (`grid_to_mesh`,
`mesh`, `mesh_to_grid`, ...); each edge set names its sender and receiver node
sets. An edge set may also come as a block-sparse mask for an attention kernel
(`masks`), made on the host for the graphs' node order. It is a pytree of
plain arrays (the names are static metadata), taken by the model as an
argument, never closed over: the index arrays are not baked into the HLO. The
same object describes the global graph (host numpy) and a partitioned one
(`wnscale.sharding.partition`: every array with a leading shard axis and
shard-local indices).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import numpy as np

from wnscale.graphs.receiver_blocks import (BlockSenders, KernelSenders, ReceiverBlocks,
                                            SenderBlocks, SenderWindows, SortedSenders)


class NodeSet(NamedTuple):
  """Nodes of one kind.

  Attributes:
    features: `[num_nodes, F]` float32 static node features.
  """

  features: np.ndarray


@dataclasses.dataclass(frozen=True)
class EdgeSet:
  """Directed edges from one node set to another, sorted by receiver (but see `in_degree`).

  Attributes:
    senders: `[num_edges]` int32 indices into the sender set's nodes.
    receivers: `[num_edges]` int32 indices into the receiver set's nodes.
    features: `[num_edges, F]` float32 static edge features (`F` may be 0).
    sender_set, receiver_set: names of the node sets (static, not leaves).
    blocks: on a device, the edges' receiver blocks (`receiver_blocks.ReceiverBlocks`),
      for sums and gathers by matrix products; None: by index only.
    sender_windows: with `blocks`, where each block's senders lie
      (`receiver_blocks.SenderWindows`), for their rows by matrix products.
    sorted_senders: on a device, the senders and the edges sorted by them
      (`receiver_blocks.SortedSenders`), for the senders' gradient by matrix products;
      None: by index (a scatter).
    block_senders: on a device, a decoder's senders per block of its receiver rows when the
      model decodes its grid in blocks (`model.grid_blocks`, `receiver_blocks.BlockSenders`,
      a leading `[grid_blocks]` axis), for each block's senders' gradient without a
      scatter; None: by index.
    kernel_senders: on a device, a decoder's senders as its fused kernel reads them
      (`receiver_blocks.KernelSenders`, with `in_degree`; a leading `[grid_blocks]` axis,
      `model.grid_blocks`, 1 included); None: from the indices, each edge its own entry.
    sender_blocks: on a device, an encoder's edges as its fused kernel reads them, by
      blocks of sender rows (`receiver_blocks.SenderBlocks`); None: not fused.
    in_degree: k > 0 where every one of the R receiver rows has exactly k edges, edge
      `j * R + r` being row r's j-th (on a device: GraphCast's mesh-to-grid edges, 3 per
      grid node; padding rows get k inert edges of their own), so that sums and gathers
      of receiver rows are reshapes along the leading axis (static); 0: any layout.
  """

  senders: np.ndarray
  receivers: np.ndarray
  features: np.ndarray
  sender_set: str
  receiver_set: str
  blocks: ReceiverBlocks | None = None
  sender_windows: SenderWindows | None = None
  sorted_senders: SortedSenders | None = None
  block_senders: BlockSenders | None = None
  kernel_senders: KernelSenders | None = None
  sender_blocks: SenderBlocks | None = None
  in_degree: int = 0

  def replace(self, **arrays) -> EdgeSet:
    return dataclasses.replace(self, **arrays)


jax.tree_util.register_dataclass(
    EdgeSet, data_fields=["senders", "receivers", "features", "blocks", "sender_windows",
                          "sorted_senders", "block_senders", "kernel_senders",
                          "sender_blocks"],
    meta_fields=["sender_set", "receiver_set", "in_degree"])


class Graphs(NamedTuple):
  """Node sets and edge sets by name; insertion order is the order of `counts`.

  Attributes:
    nodes: `{name: NodeSet}`; today `grid` (latitude-major grid nodes) and
      `mesh` (the finest mesh's vertices).
    edges: `{name: EdgeSet}`; GraphCast's `grid_to_mesh`, `mesh` (the
      multi-mesh) and `mesh_to_grid`, and those a processor adds
      (the transformer's `mesh_neighbours`, `wnscale.model.processors`).
    masks: `{edge set name: that edge set as a block-sparse attention mask}` in
      these graphs' node order, for the attention kernels that read one
      (`wnscale.model.splash_attention.SplashMask`); empty unless the processor's
      attention needs one (`wnscale.model.setup.with_masks`). Never mutated.
  """

  nodes: dict[str, NodeSet]
  edges: dict[str, EdgeSet]
  masks: dict = {}

  def num_nodes(self, node_set: str) -> int:
    return self.nodes[node_set].features.shape[-2]

  def num_edges(self, edge_set: str) -> int:
    return self.edges[edge_set].senders.shape[-1]

  def counts(self) -> dict[str, int]:
    """Node and edge counts, the keys of `launch.graph_info --json`.

    `<node set>_nodes`, then `<edge set>_edges` with a plural name made
    singular (`mesh_neighbours` -> `mesh_neighbour_edges`).
    """
    counts = {f"{name}_nodes": self.num_nodes(name) for name in self.nodes}
    counts.update({f"{name.removesuffix('s')}_edges": self.num_edges(name)
                   for name in self.edges})
    return counts
