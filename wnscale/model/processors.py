"""The mesh processors, one registry entry each (`model.processor` names one).

An entry owns the processor's settings (its spec class: the config keys, their
defaults and meanings, `ModelSpec.processor`), its module, the edge sets it reads
beyond GraphCast's three (`setup.graphs_for_grid` builds them), the masks its
attention kernel reads (`setup.with_masks` and the sharded layout make them for
their node order), its FLOP count (for `wnscale.planner.flops`) and the settings it
cannot run with. A new processor is one module with its spec and one more entry of
`PROCESSORS` (tests/test_processor_registry.py adds one).
"""

from __future__ import annotations

from typing import Callable, NamedTuple


from wnscale.graphs.edge_sets import EdgeSetSpec, KHopNeighbours
from wnscale.graphs.features import EDGE_FEATURES
from wnscale.graphs.graph import Graphs
from wnscale.model.mesh_gnn import GNNSpec, MeshGNN
from wnscale.model.mesh_transformer import MeshTransformer, TransformerSpec, attention_masks
from wnscale.model.message_passing import interaction_flops
from wnscale.model.mlp import mlp_flops
from wnscale.specs import ModelSpec, ProcessorSpec, Specs


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
    spec: its settings, a frozen `ProcessorSpec` dataclass (`ModelSpec.processor`);
      `spec.name` is the entry's key.
    module: `(model spec, *, dtype, rngs) -> nnx.Module`, called as
      `(graphs, mesh latents [num_mesh_nodes, latent], exchange) -> mesh latents`.
    edge_sets: `model spec -> {name: EdgeSetSpec}`, the edge sets it needs
      beyond GraphCast's `grid_to_mesh`, `mesh` and `mesh_to_grid`.
    masks: `(model spec, graphs, platform, graph shards) -> {edge set name: mask}`,
      the `Graphs.masks` it reads, for `graphs` (one shard's) in their node order on
      a JAX platform ("tpu", "cpu", ...) with the graph over that many devices.
    cost: `(model spec, graphs) -> ProcessorCost` (graphs: global counts).
    check: `specs -> None`, or what is wrong with them for this processor (beyond
      its settings' own bounds and choices, which `wnscale.config.validate` checks).
  """

  spec: type[ProcessorSpec]
  module: type
  edge_sets: Callable[[ModelSpec], dict[str, EdgeSetSpec]]
  masks: Callable[[ModelSpec, Graphs, str, int], dict]
  cost: Callable[[ModelSpec, Graphs], ProcessorCost]
  check: Callable[[Specs], str | None]


def _gnn_cost(m: ModelSpec, graphs: Graphs) -> ProcessorCost:
  d, mesh, edges = m.latent_size, graphs.num_nodes("mesh"), graphs.num_edges("mesh")
  steps = m.processor.message_passing_steps
  forward = mlp_flops(edges, EDGE_FEATURES, d, d) + steps * (
      interaction_flops(edges, mesh, mesh, d, d) + mlp_flops(mesh, 2 * d, d, d))
  # With mesh edge blocks, each redoes its edge MLP (node projections stay outside).
  blocks = steps * mlp_flops(edges, d, d, d) if m.remat.mesh_edge_chunks > 1 else 0.0
  # The GNN carries its mesh-edge latents too.
  return ProcessorCost(forward, blocks, steps, mesh + edges)


def _attention_flops(m: ModelSpec, graphs: Graphs) -> float:
  """One block's attention over the neighbour edges: q.k and weights x values."""
  return 4.0 * graphs.num_edges("mesh_neighbours") * m.latent_size


def _transformer_cost(m: ModelSpec, graphs: Graphs) -> ProcessorCost:
  d, mesh, own = m.latent_size, graphs.num_nodes("mesh"), m.processor
  # Projections q, k, v, output; feed-forward; attention.
  block = 2.0 * mesh * (4 * d * d + 2 * d * own.ffw_size)
  attention = _attention_flops(m, graphs)
  blocks = own.layers * attention if own.edges_per_block else 0.0
  return ProcessorCost(own.layers * (block + attention), blocks, own.layers, mesh)


def _transformer_check(specs: Specs) -> str | None:
  m = specs.model
  if m.latent_size % m.processor.heads:
    return (f"model.transformer_heads={m.processor.heads} must divide "
            f"model.latent_size={m.latent_size}")
  if m.regional_mesh_levels:
    return (f"model.regional_mesh_levels={m.regional_mesh_levels} works with the "
            "interaction_network processor, not model.processor='transformer' (its "
            "neighbourhoods are of the uniform mesh)")
  if m.processor.attention == "splash" and specs.mesh.graph not in (1, -1):
    return (f"model.transformer_attention='splash' runs with the graph on one device, not "
            f"mesh.graph={specs.mesh.graph} (\"auto\" computes it from the edges there)")
  return None


PROCESSORS = {entry.spec.name: entry for entry in (
    Processor(GNNSpec, MeshGNN, edge_sets=lambda m: {}, masks=lambda *_: {}, cost=_gnn_cost,
              check=lambda specs: None),
    Processor(TransformerSpec, MeshTransformer,
              edge_sets=lambda m: {"mesh_neighbours": EdgeSetSpec(
                  "mesh", "mesh", KHopNeighbours(m.processor.k_hop), features=False)},
              masks=attention_masks, cost=_transformer_cost, check=_transformer_check),
)}


def keys_not_exported(name: str) -> tuple[str, ...]:
  """The processor keys that a model of processor `name` exported to another framework may
  set as it likes: the other processors' (not read), and its own that change how it
  computes, not what."""
  own = PROCESSORS[name].spec
  return tuple(key for entry in PROCESSORS.values() for key in entry.spec.config_keys()
               if entry.spec is not own or key in own.how_only_keys())
