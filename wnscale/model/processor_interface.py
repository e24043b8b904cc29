"""What the processors' registry (`wnscale.model.processors`) and the processors' modules
share, importing neither: the implementation a processor's module declares, its cost, and
the values of `model.aggregation` that `wnscale.model.aggregation` computes with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, NamedTuple

if TYPE_CHECKING:
  from wnscale.graphs.edge_sets import EdgeSetSpec
  from wnscale.graphs.graph import Graphs
  from wnscale.specs import ModelSpec

# `model.aggregation`: "matmul" (blocks, where the edge set has them), "fused" (blocks,
# and the processor's edge step as one kernel per block: `wnscale.model.fused_edges`;
# TPU, and CPU in Pallas's interpreter), "segment_sum" (indices), or "auto": fused on a TPU,
# matmul on another accelerator, segment_sum on a CPU (where a scatter is cheap and the products' extra
# arithmetic is not).
AGGREGATIONS = ("auto", "matmul", "fused", "segment_sum")


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


class ProcessorImplementation(NamedTuple):
  """What a processor computes with, defined in its module (with Flax).

  Attributes:
    module: `(model spec, *, dtype, rngs) -> nnx.Module`, called as
      `(graphs, mesh latents [num_mesh_nodes, latent], exchange) -> mesh latents`.
    edge_sets: `model spec -> {name: EdgeSetSpec}`, the edge sets it needs
      beyond GraphCast's `grid_to_mesh`, `mesh` and `mesh_to_grid`.
    masks: `(model spec, graphs, platform, graph shards) -> {edge set name: mask}`,
      the `Graphs.masks` it reads, for `graphs` (one shard's) in their node order on
      a JAX platform ("tpu", "cpu", ...) with the graph over that many devices.
    cost: `(model spec, graphs) -> ProcessorCost` (graphs: global counts).
  """

  module: type
  edge_sets: Callable[[ModelSpec], dict[str, EdgeSetSpec]]
  masks: Callable[[ModelSpec, Graphs, str, int], dict]
  cost: Callable[[ModelSpec, Graphs], ProcessorCost]
