"""GraphCast's parameters (Haiku modules) as wnscale's (`wnscale.model.graphcast.GraphCast`).

Module names are `<gnn>/~_networks_builder/<part>` with `<gnn>` one of
`grid2mesh_gnn` (encoder), `mesh_gnn` (processor), `mesh2grid_gnn` (decoder).
Each `<part>_mlp/~/linear_0` and `linear_1` (`w [in, out]`, `b`) is an MLP's
`hidden` and `out` Linear (`kernel`, `bias`); `<part>_layer_norm`'s `scale` and
`offset` are its `norm`'s `scale` and `bias`. The parts:

  encoder_nodes_grid_nodes            grid_embedder (input rows permuted by name)
  encoder_nodes_mesh_nodes            mesh_embedder (GraphCast pads the mesh nodes'
                                      3 features with the grid inputs' width of
                                      zeros in front: only the last 3 rows count)
  encoder_edges_grid2mesh             grid_to_mesh_edges.embedder
  processor_edges_0_grid2mesh         grid_to_mesh_edges.interaction (edge MLP, split)
  processor_nodes_0_mesh_nodes        grid_to_mesh_edges.interaction.node_mlp
  processor_nodes_0_grid_nodes        grid_to_mesh_grid_mlp
  encoder_edges_mesh                  processor.edge_embedder
  processor_edges_{i}_mesh,           processor.layers, layer i of the stacked axis 0
  processor_nodes_{i}_mesh_nodes
  encoder_edges_mesh2grid             mesh_to_grid_edges.embedder
  processor_edges_0_mesh2grid         mesh_to_grid_edges.interaction (edge MLP, split)
  processor_nodes_0_grid_nodes        mesh_to_grid_edges.interaction.node_mlp
  decoder_nodes_grid_nodes            output_mlp (no layer norm; outputs permuted by name)
  (decoder) processor_nodes_0_mesh_nodes: unused (GraphCast computes it and drops it)

The edge MLPs' first layer, `w [3 L, L]` on the concatenation [edge, sender,
receiver], splits into `edge_mlp.hidden` (rows 0:L, with the bias),
`sender_projection` (rows L:2L) and `receiver_projection` (rows 2L:3L).
"""

from __future__ import annotations

import ml_collections
import numpy as np
from flax import nnx

from wnscale import specs as specs_lib
from wnscale.errors import UserError
from wnscale.graphs.features import NODE_FEATURES
from wnscale.interop import graphcast_config
from wnscale.model import setup

ENCODER = "grid2mesh_gnn/~_networks_builder/"
PROCESSOR = "mesh_gnn/~_networks_builder/"
DECODER = "mesh2grid_gnn/~_networks_builder/"
UNUSED = (DECODER + "processor_nodes_0_mesh_nodes_mlp/~/linear_0",
          DECODER + "processor_nodes_0_mesh_nodes_mlp/~/linear_1",
          DECODER + "processor_nodes_0_mesh_nodes_layer_norm")


class _Modules:
  """The checkpoint's `{module: {leaf: array}}`, remembering which modules were read."""

  def __init__(self, params: dict):
    self.params = params
    self.read = set()

  def leaf(self, module: str, leaf: str) -> np.ndarray:
    if module not in self.params or leaf not in self.params[module]:
      raise UserError(f"The checkpoint has no parameter {module}:{leaf}")
    self.read.add(module)
    return np.asarray(self.params[module][leaf], np.float32)

  def mlp(self, part: str, *, layer_norm: bool = True, first_rows=slice(None),
          outputs=slice(None)) -> dict:
    """The MLP `part` as wnscale's `MLP` pure dict; rows of the first / columns of the last
    layer selected (and so permuted) by `first_rows` / `outputs`."""
    linear = lambda i: f"{part}_mlp/~/linear_{i}"
    mlp = {"hidden": {"kernel": self.leaf(linear(0), "w")[first_rows],
                      "bias": self.leaf(linear(0), "b")},
           "out": {"kernel": self.leaf(linear(1), "w")[:, outputs],
                   "bias": self.leaf(linear(1), "b")[outputs]}}
    if f"{part}_mlp/~/linear_2" in self.params:
      raise UserError(f"{part} has more than one hidden layer; wnscale's MLPs have one.")
    if layer_norm:
      mlp["norm"] = {"scale": self.leaf(f"{part}_layer_norm", "scale"),
                     "bias": self.leaf(f"{part}_layer_norm", "offset")}
    return mlp

  def interaction(self, edges: str, nodes: str) -> dict:
    """An interaction network: edge MLP `edges` (its first layer split) and node MLP `nodes`."""
    first = self.leaf(f"{edges}_mlp/~/linear_0", "w")
    latent = first.shape[1]
    if first.shape[0] != 3 * latent:
      raise UserError(f"{edges}'s first layer is {list(first.shape)}; expected "
                       f"[3 x {latent}, {latent}] on [edge, sender, receiver]")
    return {"edge_mlp": self.mlp(edges, first_rows=slice(0, latent)),
            "sender_projection": {"kernel": first[latent:2 * latent]},
            "receiver_projection": {"kernel": first[2 * latent:]},
            "node_mlp": self.mlp(nodes)}


def convert_params(params: dict, task_config: dict, config: ml_collections.ConfigDict):
  """wnscale's parameters (`nnx.State`, float32) from a checkpoint's `params`.

  Args:
    params: `graphcast_checkpoint.GraphCastCheckpoint.params`.
    task_config: its task (the channel orders).
    config: `graphcast_config.wnscale_config` of the checkpoint.

  Raises:
    ValueError: a parameter is missing, has another shape than `config`'s
      model, or is not used (naming it).
  """
  modules = _Modules(params)
  input_rows, output_columns = _permutations(task_config, config)
  num_inputs = len(input_rows)
  grid_rows = np.concatenate([input_rows, num_inputs + np.arange(NODE_FEATURES)])
  steps = config.model.message_passing_steps
  layers = [modules.interaction(f"{PROCESSOR}processor_edges_{i}_mesh",
                                f"{PROCESSOR}processor_nodes_{i}_mesh_nodes")
            for i in range(steps)]
  tree = {
      "grid_embedder": modules.mlp(ENCODER + "encoder_nodes_grid_nodes", first_rows=grid_rows),
      "mesh_embedder": modules.mlp(ENCODER + "encoder_nodes_mesh_nodes",
                                   first_rows=slice(num_inputs, num_inputs + NODE_FEATURES)),
      "grid_to_mesh_edges": {
          "embedder": modules.mlp(ENCODER + "encoder_edges_grid2mesh"),
          "interaction": modules.interaction(ENCODER + "processor_edges_0_grid2mesh",
                                             ENCODER + "processor_nodes_0_mesh_nodes")},
      "grid_to_mesh_grid_mlp": modules.mlp(ENCODER + "processor_nodes_0_grid_nodes"),
      "processor": {"edge_embedder": modules.mlp(PROCESSOR + "encoder_edges_mesh"),
                    "layers": stack(layers)},
      "mesh_to_grid_edges": {
          "embedder": modules.mlp(DECODER + "encoder_edges_mesh2grid"),
          "interaction": modules.interaction(DECODER + "processor_edges_0_mesh2grid",
                                             DECODER + "processor_nodes_0_grid_nodes")},
      "output_mlp": modules.mlp(DECODER + "decoder_nodes_grid_nodes", layer_norm=False,
                                outputs=output_columns),
  }
  unread = sorted(set(params) - modules.read - set(UNUSED))
  if unread:
    raise UserError(f"The checkpoint has parameters wnscale's model does not use: {unread[:5]}"
                     f"{' ...' if len(unread) > 5 else ''} (e.g. more message-passing steps "
                     f"than model_config:gnn_msg_steps={steps})")
  _, shapes = setup.init_model_shapes(specs_lib.from_config(config))
  check_shapes(tree, nnx.to_pure_dict(shapes), prefix="")
  nnx.replace_by_pure_dict(shapes, tree)
  return shapes


def _permutations(task_config: dict, config: ml_collections.ConfigDict):
  """`(input rows, output columns)`: for each wnscale input channel, GraphCast's row of it;
  for each wnscale output channel, GraphCast's column of it."""
  time_step = config.data.time_step_hours
  reference = {key: i for i, key in enumerate(
      graphcast_config.reference_input_channels(task_config, time_step))}
  input_rows = np.array([reference[key] for key in
                         graphcast_config.wnscale_input_channels(config)])
  reference = {key: i for i, key in enumerate(
      graphcast_config.reference_output_channels(task_config))}
  output_columns = np.array([reference[key] for key in
                             graphcast_config.wnscale_output_channels(config)])
  if len(input_rows) != len(set(input_rows.tolist())) or len(input_rows) != len(
      graphcast_config.reference_input_channels(task_config, time_step)):
    raise UserError("The task's input channels do not map one to one onto wnscale's.")
  return input_rows, output_columns


def stack(trees: list):
  """Pure dicts of one layer each -> one pure dict, leaves stacked on a new axis 0."""
  if isinstance(trees[0], dict):
    return {key: stack([tree[key] for tree in trees]) for key in trees[0]}
  return np.stack(trees)


def check_shapes(tree: dict, expected: dict, prefix: str):
  """Same keys and leaf shapes as the model's parameters; an error naming the first that differ."""
  if set(tree) != set(expected):
    raise UserError(f"Converted parameters under {prefix or 'the root'} have "
                     f"{sorted(tree)}, the model {sorted(expected)}")
  for key, value in tree.items():
    if isinstance(value, dict):
      check_shapes(value, expected[key], f"{prefix}{key}.")
    elif tuple(value.shape) != tuple(expected[key].shape):
      raise UserError(f"{prefix}{key}: the checkpoint gives {list(value.shape)}, the model "
                       f"of its config has {list(expected[key].shape)} (does the task's "
                       "variable list match the checkpoint's parameters?)")
