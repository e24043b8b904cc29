"""The mesh processors, one registry entry each (`model.processor` names one).

An entry owns the processor's module, the edge sets it reads beyond
GraphCast's three (`setup.graphs_for_grid` builds them), the masks its
attention kernel reads (`setup.with_masks` and the sharded layout make them
for their node order), its FLOP count (for `wnscale.planner.flops`) and the
model settings it cannot run. A new processor is one more entry of `PROCESSORS`.
"""

from __future__ import annotations

from typing import Callable, NamedTuple


from wnscale.graphs.edge_sets import EdgeSetSpec, KHopNeighbours
from wnscale.graphs.features import EDGE_FEATURES
from wnscale.graphs.graph import Graphs
from wnscale.model.mesh_gnn import MeshGNN
from wnscale.model.mesh_transformer import MeshTransformer, attention_masks
from wnscale.model.message_passing import interaction_flops
from wnscale.model.mlp import mlp_flops
from wnscale.specs import ModelSpec


class ProcessorCost(NamedTuple):
  """What one example costs in the processor.

  Attributes:
    forward: forward FLOPs.
    block_recompute: FLOPs its edge blocks redo in the backward pass (each block
      under its own checkpoint; 0 without blocks).
    layers: scanned layers (the remat groups are `mesh_remat_every` of them).
    carry_rows: rows `latent_size` wide carried from layer to layer.
  """

  forward: float
  block_recompute: float
  layers: int
  carry_rows: int


class Processor(NamedTuple):
  """A registry entry.

  Attributes:
    module: `(model spec, *, dtype, rngs) -> nnx.Module`, called as
      `(graphs, mesh latents [num_mesh_nodes, latent], exchange) -> mesh latents`.
    edge_sets: `model spec -> {name: EdgeSetSpec}`, the edge sets it needs
      beyond GraphCast's `grid_to_mesh`, `mesh` and `mesh_to_grid`.
    masks: `(model spec, graphs, platform, graph shards) -> {edge set name: mask}`,
      the `Graphs.masks` it reads, for `graphs` (one shard's) in their node order on
      a JAX platform ("tpu", "cpu", ...) with the graph over that many devices.
    cost: `(model spec, graphs) -> ProcessorCost` (graphs: global counts).
    check: `model spec -> None`, or what is wrong with it for this processor.
  """

  module: type
  edge_sets: Callable[[ModelSpec], dict[str, EdgeSetSpec]]
  masks: Callable[[ModelSpec, Graphs, str, int], dict]
  cost: Callable[[ModelSpec, Graphs], ProcessorCost]
  check: Callable[[ModelSpec], str | None]


def _gnn_cost(m: ModelSpec, graphs: Graphs) -> ProcessorCost:
  d, mesh, edges = m.latent_size, graphs.num_nodes("mesh"), graphs.num_edges("mesh")
  forward = mlp_flops(edges, EDGE_FEATURES, d, d) + m.message_passing_steps * (
      interaction_flops(edges, mesh, mesh, d, d) + mlp_flops(mesh, 2 * d, d, d))
  # With mesh edge blocks, each redoes its edge MLP (node projections stay outside).
  blocks = (m.message_passing_steps * mlp_flops(edges, d, d, d) if m.mesh_edge_chunks > 1
            else 0.0)
  # The GNN carries its mesh-edge latents too.
  return ProcessorCost(forward, blocks, m.message_passing_steps, mesh + edges)


def _attention_flops(m: ModelSpec, graphs: Graphs) -> float:
  """One block's attention over the neighbour edges: q.k and weights x values."""
  return 4.0 * graphs.num_edges("mesh_neighbours") * m.latent_size


def _transformer_cost(m: ModelSpec, graphs: Graphs) -> ProcessorCost:
  d, mesh = m.latent_size, graphs.num_nodes("mesh")
  # Projections q, k, v, output; feed-forward; attention.
  block = 2.0 * mesh * (4 * d * d + 2 * d * m.transformer_ffw_size)
  attention = _attention_flops(m, graphs)
  blocks = m.transformer_layers * attention if m.transformer_edges_per_block else 0.0
  return ProcessorCost(m.transformer_layers * (block + attention), blocks,
                       m.transformer_layers, mesh)


def _transformer_check(m: ModelSpec) -> str | None:
  if m.latent_size % m.transformer_heads:
    return (f"model.transformer_heads={m.transformer_heads} must divide "
            f"model.latent_size={m.latent_size}")
  return None


PROCESSORS = {
    "interaction_network": Processor(
        MeshGNN, edge_sets=lambda m: {}, masks=lambda *_: {}, cost=_gnn_cost,
        check=lambda m: None),
    "transformer": Processor(
        MeshTransformer,
        edge_sets=lambda m: {"mesh_neighbours": EdgeSetSpec(
            "mesh", "mesh", KHopNeighbours(m.transformer_k_hop), features=False)},
        masks=attention_masks, cost=_transformer_cost, check=_transformer_check),
}
