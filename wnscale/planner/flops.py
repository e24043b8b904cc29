"""Analytic FLOPs of a training step and of the recomputation each remat option adds.

XLA's `cost_analysis()` counts a scan body once, not once per iteration, so it
undercounts the processor (a scan over layers) and cannot rank remat options;
these counts multiply the matmul FLOPs of every MLP by the rows it runs on.
"""

from __future__ import annotations

from wnscale import specs as specs_lib
from wnscale.graphs.features import EDGE_FEATURES, NODE_FEATURES
from wnscale.graphs.graph import Graphs
from wnscale.model import processors
from wnscale.model.message_passing import interaction_flops
from wnscale.model.mlp import mlp_flops
from wnscale.model.remat_policies import resolve_policy


# The encoder's and decoder's edge sets, by the stage their edge work counts in.
EDGE_STAGES = {"encoder_edges": "grid_to_mesh", "decoder_edges": "mesh_to_grid"}


def forward_flops(specs: specs_lib.Specs, graphs: Graphs) -> dict[str, float]:
  """Forward FLOPs of one example per stage and part of a stage (`*_points`: every
  modality's, `data.modalities`).

  `graphs`: the global graphs, or their shapes (only sizes are read).
  """
  d = specs.model.latent_size
  e = specs.model.edge_size
  data = specs.data
  channels = len(data.output_channels)
  inputs = data.input_channels + NODE_FEATURES
  mesh_inputs = NODE_FEATURES + data.global_channels
  grid, mesh = graphs.num_nodes("grid"), graphs.num_nodes("mesh")

  def edge_flops(name):  # an encoder's or decoder's edge set: its embedder and messages
    edges, count = graphs.edges[name], graphs.num_edges(name)
    return mlp_flops(count, EDGE_FEATURES, e, e) + interaction_flops(
        count, graphs.num_nodes(edges.sender_set), graphs.num_nodes(edges.receiver_set), d, e)

  edge_stages = {stage: edge_flops(name) for stage, name in EDGE_STAGES.items()}
  encoder_points = decoder_points = 0.0
  for m in data.modalities:  # each as the grid: an embedder, its edges, its node MLPs
    points = graphs.num_nodes(m.name)
    encoder_points += mlp_flops(points, m.input_channels(data.input_steps) + NODE_FEATURES,
                                d, d)
    if m.inputs:
      encoder_points += edge_flops(f"{m.name}_to_mesh")
    if m.targets:
      encoder_points += mlp_flops(points, d, d, d)
      decoder_points += (edge_flops(f"mesh_to_{m.name}") + mlp_flops(points, 2 * d, d, d)
                         + mlp_flops(points, d, d, len(m.targets)))
  return {
      "encoder_edges": edge_stages["encoder_edges"],
      "encoder_grid": mlp_flops(grid, inputs, d, d) + mlp_flops(grid, d, d, d),
      "encoder_mesh": mlp_flops(mesh, mesh_inputs, d, d) + mlp_flops(mesh, 2 * d, d, d),
      "encoder_points": encoder_points,
      "processor": processors.implementation(specs.model).cost(specs.model, graphs).forward,
      "decoder_edges": edge_stages["decoder_edges"],
      "decoder_nodes": mlp_flops(grid, 2 * d, d, d) + mlp_flops(grid, d, d, channels),
      "decoder_points": decoder_points,
  }


def step_flops(specs: specs_lib.Specs, graphs: Graphs, num_devices: int) -> dict:
  """Per-device cost of one training step (`graphs`: as `forward_flops` takes them).

  Returns:
    `{"model": forward + backward FLOPs, "recompute": FLOPs the remat settings
    add, "offloaded_bytes": bytes the offload policy moves between device and
    host memory (out and back)}`.
  """
  model, remat = specs.model, specs.model.remat
  stages = forward_flops(specs, graphs)
  processor = processors.implementation(model).cost(model, graphs)
  policy = resolve_policy(remat.remat_policy)
  fraction = policy.recompute_fraction
  encoder = (stages["encoder_edges"] + stages["encoder_grid"] + stages["encoder_mesh"]
             + stages["encoder_points"])
  decoder = stages["decoder_edges"] + stages["decoder_nodes"] + stages["decoder_points"]
  if remat.decoder_keeps_messages:  # its edge step's output kept, not made again
    decoder -= stages["decoder_edges"]
  # The processor's layers under checkpoints (its last mesh_layers_saved are not).
  checkpointed_layers = max(processor.layers - remat.mesh_layers_saved, 0)
  extra = 0.0
  if remat.remat_grid_to_mesh_gnn:
    extra += fraction * encoder
  if remat.remat_mesh_gnn:
    extra += fraction * checkpointed_layers / processor.layers * stages["processor"]
  if remat.remat_mesh_to_grid_gnn:
    extra += fraction * decoder
  # Each block's forward is redone inside its own checkpoint.
  if remat.grid_blocks > 1:
    extra += stages["encoder_grid"] + decoder  # the decoder runs per grid block
  if remat.edge_chunks > 1:
    extra += stages["encoder_edges"] + (stages["decoder_edges"] if remat.grid_blocks == 1
                                        else 0.0)
  extra += processor.block_recompute
  examples = specs.train.batch_size * specs.data.target_steps
  scale = examples / num_devices
  offloaded = 0.0
  if remat.remat_mesh_gnn and policy.offloads_carries:
    groups = -(-checkpointed_layers // remat.mesh_remat_every)
    width = 2 if model.dtype == "bfloat16" else 4
    carry = processor.carry_rows * model.latent_size * width
    offloaded = 2 * groups * carry  # out in the forward pass, back in the backward
  return {"model": 3.0 * sum(stages.values()) * scale, "recompute": extra * scale,
          "offloaded_bytes": offloaded * scale}
