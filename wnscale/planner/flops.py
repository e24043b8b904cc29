"""Analytic FLOPs of a training step and of the recomputation each remat option adds.

XLA's `cost_analysis()` counts a scan body once, not once per iteration, so it
undercounts the processor (a scan over layers) and cannot rank remat options;
these counts multiply the matmul FLOPs of every MLP by the rows it runs on.
"""

from __future__ import annotations

import ml_collections

from wnscale.graphs.features import EDGE_FEATURES, NODE_FEATURES
from wnscale import specs as specs_lib

# Fraction of a checkpointed region's forward FLOPs that the backward pass
# recomputes under each policy (matmuls dominate; saved dots are not redone).
RECOMPUTE_FRACTION = {
    "nothing_saveable": 1.0, "dots_saveable": 0.05, "dots_with_no_batch_dims_saveable": 0.05,
    "everything_saveable": 0.0, "offload_dots": 0.05, "offload_carries": 1.0,
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
  """Forward FLOPs of one example per stage and part of a stage."""
  d = config.model.latent_size
  e = config.model.edge_latent_size or d
  data = specs_lib.from_config(config).data
  channels = len(data.output_channels)
  inputs = data.input_channels + NODE_FEATURES
  mesh_inputs = NODE_FEATURES + data.global_channels
  grid, mesh = counts["grid_nodes"], counts["mesh_nodes"]
  g2m, m2g = counts["grid_to_mesh_edges"], counts["mesh_to_grid_edges"]
  return {
      "encoder_edges": _mlp(g2m, EDGE_FEATURES, e, e) + _edge_update(g2m, grid, mesh, d, e),
      "encoder_grid": _mlp(grid, inputs, d, d) + _mlp(grid, d, d, d),
      "encoder_mesh": _mlp(mesh, mesh_inputs, d, d) + _mlp(mesh, 2 * d, d, d),
      "processor": _processor(config, counts),
      "decoder_edges": _mlp(m2g, EDGE_FEATURES, e, e) + _edge_update(m2g, mesh, grid, d, e),
      "decoder_nodes": _mlp(grid, 2 * d, d, d) + _mlp(grid, d, d, channels),
  }


def step_flops(config: ml_collections.ConfigDict, counts: dict, num_devices: int) -> dict:
  """Per-device cost of one training step.

  Returns:
    `{"model": forward + backward FLOPs, "recompute": FLOPs the remat settings
    add, "offloaded_bytes": bytes the offload policy moves between device and
    host memory (out and back)}`.
  """
  model = config.model
  stages = forward_flops(config, counts)
  fraction = RECOMPUTE_FRACTION.get(model.remat_policy, 1.0)
  encoder = stages["encoder_edges"] + stages["encoder_grid"] + stages["encoder_mesh"]
  decoder = stages["decoder_edges"] + stages["decoder_nodes"]
  extra = 0.0
  if model.remat_grid_to_mesh_gnn:
    extra += fraction * encoder
  if model.remat_mesh_gnn:
    extra += fraction * stages["processor"]
  if model.remat_mesh_to_grid_gnn:
    extra += fraction * decoder
  # Each block's forward is redone inside its own checkpoint.
  if model.grid_blocks > 1:
    extra += stages["encoder_grid"] + decoder  # the decoder runs per grid block
  if model.edge_chunks > 1:
    extra += stages["encoder_edges"] + (stages["decoder_edges"] if model.grid_blocks == 1
                                        else 0.0)
  if model.processor == "interaction_network" and model.mesh_edge_chunks > 1:
    d = model.latent_size  # the edge MLP (node projections stay outside the blocks)
    extra += model.message_passing_steps * _mlp(counts["mesh_edges"], d, d, d)
  if model.processor == "transformer" and model.transformer_edges_per_block:  # likewise
    extra += model.transformer_layers * _attention(config, counts)
  examples = config.train.batch_size * config.data.target_steps
  scale = examples / num_devices
  offloaded = 0.0
  if model.remat_mesh_gnn and model.remat_policy == "offload_carries":
    transformer = model.processor == "transformer"
    layers = model.transformer_layers if transformer else model.message_passing_steps
    groups = -(-layers // model.mesh_remat_every)
    width = 2 if model.dtype == "bfloat16" else 4
    # The GNN carries its mesh-edge latents too; the transformer only the mesh latents.
    rows = counts["mesh_nodes"] + (0 if transformer else counts["mesh_edges"])
    carry = rows * model.latent_size * width
    offloaded = 2 * groups * carry  # out in the forward pass, back in the backward
  return {"model": 3.0 * sum(stages.values()) * scale, "recompute": extra * scale,
          "offloaded_bytes": offloaded * scale}
