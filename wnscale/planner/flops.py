"""Analytic FLOPs of a training step and of the recomputation each remat option adds.

XLA's `cost_analysis()` counts a scan body once, not once per iteration, so it
undercounts the processor (a scan over layers) and cannot rank remat options;
these counts multiply the matmul FLOPs of every MLP by the rows it runs on.
"""

from __future__ import annotations

import ml_collections

from wnscale.graphs.features import EDGE_FEATURES, NODE_FEATURES
from wnscale.model import forecast, setup

# Fraction of a checkpointed region's forward FLOPs that the backward pass
# recomputes under each policy (matmuls dominate; saved dots are not redone).
RECOMPUTE_FRACTION = {
    "nothing_saveable": 1.0, "dots_saveable": 0.05, "dots_with_no_batch_dims_saveable": 0.05,
    "everything_saveable": 0.0, "offload_dots": 0.05,
}


def _mlp(rows: int, n_in: int, latent: int, n_out: int) -> float:
  return 2.0 * rows * (n_in * latent + latent * n_out)


def _edge_update(edges: int, senders: int, receivers: int, latent: int,
                 edge_size: int) -> float:
  """Edge MLP with node-level sender/receiver projections (see message_passing.py)."""
  return _mlp(edges, edge_size, latent, latent) + 2.0 * (senders + receivers) * latent * latent


def _attention(config: ml_collections.ConfigDict, counts: dict) -> float:
  """One transformer block's attention over the neighbour edges: q.k and weights x values."""
  return 4.0 * counts["mesh_neighbour_edges"] * config.model.latent_size


def _processor(config: ml_collections.ConfigDict, counts: dict) -> float:
  m, mesh = config.model, counts["mesh_nodes"]
  d = m.latent_size
  if m.processor == "transformer":  # projections q, k, v, output; feed-forward; attention
    block = 2.0 * mesh * (4 * d * d + 2 * d * m.transformer_ffw_size)
    return m.transformer_layers * (block + _attention(config, counts))
  m2m = counts["mesh_edges"]
  return _mlp(m2m, EDGE_FEATURES, d, d) + m.message_passing_steps * (
      _edge_update(m2m, mesh, mesh, d, d) + _mlp(mesh, 2 * d, d, d))


def forward_flops(config: ml_collections.ConfigDict, counts: dict) -> dict[str, float]:
  """Forward FLOPs of one example per stage: encoder edges / rest, processor, decoder."""
  d = config.model.latent_size
  e = config.model.edge_latent_size or d
  data = config.data
  channels = setup.num_state_channels(data)
  num_globals = len(data.global_forcings)
  inputs = forecast.input_channels(channels, data.input_steps, num_globals) + NODE_FEATURES
  mesh_inputs = NODE_FEATURES + forecast.global_channels(data.input_steps, num_globals)
  grid, mesh = counts["grid_nodes"], counts["mesh_nodes"]
  g2m, m2g = counts["grid_to_mesh_edges"], counts["mesh_to_grid_edges"]
  return {
      "encoder_edges": _mlp(g2m, EDGE_FEATURES, e, e) + _edge_update(g2m, grid, mesh, d, e),
      "encoder_nodes": (_mlp(grid, inputs, d, d) + _mlp(mesh, mesh_inputs, d, d)
                        + _mlp(mesh, 2 * d, d, d) + _mlp(grid, d, d, d)),
      "processor": _processor(config, counts),
      "decoder_edges": _mlp(m2g, EDGE_FEATURES, e, e) + _edge_update(m2g, mesh, grid, d, e),
      "decoder_nodes": _mlp(grid, 2 * d, d, d) + _mlp(grid, d, d, channels),
  }


def step_flops(config: ml_collections.ConfigDict, counts: dict, num_devices: int) -> dict:
  """Per-device FLOPs of one training step: `{"model": fwd + bwd, "recompute": extra}`."""
  model = config.model
  stages = forward_flops(config, counts)
  fraction = RECOMPUTE_FRACTION.get(model.remat_policy, 1.0)
  extra = 0.0
  if model.remat_grid_to_mesh_gnn:
    extra += fraction * (stages["encoder_edges"] + stages["encoder_nodes"])
  if model.remat_mesh_gnn:
    extra += fraction * stages["processor"]
  if model.remat_mesh_to_grid_gnn:
    extra += fraction * (stages["decoder_edges"] + stages["decoder_nodes"])
  if model.edge_chunks > 1:  # each block's forward is redone inside its own checkpoint
    extra += stages["encoder_edges"] + stages["decoder_edges"]
  if model.processor == "transformer" and model.transformer_edges_per_block:  # likewise
    extra += model.transformer_layers * _attention(config, counts)
  examples = config.train.batch_size * config.data.target_steps
  scale = examples / num_devices
  return {"model": 3.0 * sum(stages.values()) * scale, "recompute": extra * scale}
