"""GenCast's parameters (Haiku modules) as wnscale's denoiser's (`wnscale.model.denoiser`).

GenCast's encoder and decoder are GraphCast's (`graphcast_params`: the same module
names, the edge MLPs' first layers split the same way, the mesh embedder's
zero-padded rows dropped), with every layer norm conditioned on the noise-level
encoding: `<part>_norm_conditioning/linear` is the norm's `conditioning` Linear
(`wnscale.model.norm.ConditionalLayerNorm`) where GraphCast has `<part>_layer_norm`.
Its processor is WeatherNext 2's transformer, module for module
(`weathernext2_params.transformer`, no `multimodality_forward/` root):

  fourier_features_mlp/~/mlp/~/linear_0|1  noise_level_encoder.hidden|out
  grid2mesh_gnn/...                        network.grid_embedder, mesh_embedder,
                                           grid_to_mesh_edges, grid_to_mesh_grid_mlp
  mesh_transformer/~/transformer/...       network.processor
  mesh2grid_gnn/...                        network.mesh_to_grid_edges, output_mlp
  (decoder) processor_nodes_0_mesh_nodes   unused (GenCast computes it and drops it)

Channel orders. GenCast stacks its grid inputs as GraphCast does (`dataset_to_stacked`
sorts by name): every input variable sorted by name, each time-major then by level;
then the target time's forcings and noisy targets together, sorted by name; its
outputs are the targets sorted by name. wnscale's are the forecaster's inputs
(`graphcast_config.wnscale_input_channels`), then the noisy targets in output order.
"""

from __future__ import annotations

import numpy as np

from wnscale import specs as specs_lib
from wnscale.errors import UserError
from wnscale.interop import graphcast_config, graphcast_params, weathernext2_params

ENCODER, DECODER = graphcast_params.ENCODER, graphcast_params.DECODER
NOISE_ENCODER = "fourier_features_mlp/~/mlp/~/"
TRANSFORMER = "mesh_transformer/~/transformer/"
UNUSED = (DECODER + "processor_nodes_0_mesh_nodes_mlp/~/linear_0",
          DECODER + "processor_nodes_0_mesh_nodes_mlp/~/linear_1",
          DECODER + "processor_nodes_0_mesh_nodes_norm_conditioning/linear")


def layout() -> dict:
  """`{wnscale parameter path: GenCast's modules}` of the encoder and decoder."""
  mlp = lambda part, **kw: graphcast_params.Mlp(part, conditioned=True, **kw)
  return {
      ("network", "grid_embedder"): mlp(ENCODER + "encoder_nodes_grid_nodes", rows="grid"),
      ("network", "mesh_embedder"): mlp(graphcast_params.MESH_EMBEDDER, rows="mesh"),
      ("network", "grid_to_mesh_edges", "embedder"): mlp(ENCODER + "encoder_edges_grid2mesh"),
      ("network", "grid_to_mesh_edges", "interaction"): graphcast_params.Interaction(
          ENCODER + "processor_edges_0_grid2mesh", ENCODER + "processor_nodes_0_mesh_nodes",
          conditioned=True),
      ("network", "grid_to_mesh_grid_mlp"): mlp(ENCODER + "processor_nodes_0_grid_nodes"),
      ("network", "mesh_to_grid_edges", "embedder"): mlp(DECODER + "encoder_edges_mesh2grid"),
      ("network", "mesh_to_grid_edges", "interaction"): graphcast_params.Interaction(
          DECODER + "processor_edges_0_mesh2grid", DECODER + "processor_nodes_0_grid_nodes",
          conditioned=True),
      ("network", "output_mlp"): graphcast_params.Mlp(DECODER + "decoder_nodes_grid_nodes",
                                                      layer_norm=False, outputs=True),
  }


def reference_input_channels(task_config: dict, time_step_hours: int) -> list[tuple]:
  """GenCast's grid input channels (before the structural features), in order."""
  levels = task_config["pressure_levels"]
  steps = range(1 - graphcast_config.input_steps(task_config["input_duration"],
                                                  time_step_hours), 1)
  inputs = [key for name in sorted(task_config["input_variables"])
            for key in graphcast_config.channel_keys(name, steps, levels)]
  target_time = sorted(task_config["forcing_variables"] + task_config["target_variables"])
  return inputs + [key for name in target_time
                   for key in graphcast_config.channel_keys(name, [1], levels)]


def wnscale_input_channels(d: specs_lib.DataSpec) -> list[tuple]:
  """wnscale's denoiser's grid input channels of the data `d`: the forecaster's, then the
  noisy targets."""
  return graphcast_config.wnscale_input_channels(d) + graphcast_config.wnscale_output_channels(d)


def channels(task_config: dict, d: specs_lib.DataSpec) -> graphcast_params.Channels:
  """GenCast's row of each of wnscale's input channels (of the data `d`), its column of each
  output channel.

  Raises:
    UserError: the two do not map one to one.
  """
  reference = reference_input_channels(task_config, d.time_step_hours)
  ours = wnscale_input_channels(d)
  if sorted(reference, key=str) != sorted(ours, key=str):
    raise UserError(f"The task's input channels do not map one to one onto wnscale's: "
                    f"{sorted(set(reference) ^ set(ours), key=str)[:4]}")
  rows = {key: i for i, key in enumerate(reference)}
  columns = {key: i for i, key in enumerate(
      graphcast_config.reference_output_channels(task_config))}
  return graphcast_params.Channels(
      np.array([rows[key] for key in ours]),
      np.array([columns[key] for key in graphcast_config.wnscale_output_channels(d)]))


def convert_params(params: dict, task_config: dict, specs: specs_lib.Specs):
  """wnscale's denoiser parameters (`nnx.State`, float32) from a checkpoint's `params`.

  Args:
    params: `gencast_checkpoint.GenCastCheckpoint.params`.
    task_config: its task (the channel orders).
    specs: the specs of `gencast_config.wnscale_config` of the checkpoint.

  Raises:
    UserError: a parameter is missing, not used, or shaped otherwise than the specs'
      model (naming it).
  """
  modules = weathernext2_params.Modules(params, root="")
  order = channels(task_config, specs.data)
  tree = {"noise_level_encoder": {"hidden": modules.linear(NOISE_ENCODER + "linear_0"),
                                  "out": modules.linear(NOISE_ENCODER + "linear_1")},
          "network": {"processor": weathernext2_params.transformer(
              modules, specs.model.processor.layers, TRANSFORMER)}}
  for path, part in layout().items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = part.read(modules, order)
  return graphcast_params.model_state(tree, params, modules.read, UNUSED, specs)
