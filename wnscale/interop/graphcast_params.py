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

This table is `layout` below, data that both directions read: `convert_params`
(import: GraphCast's -> wnscale's) and `export_params` (export: wnscale's ->
GraphCast's). What wnscale's parameters do not hold (the mesh embedder's padded
rows, the decoder's unused mesh MLP) the import keeps aside (`remainder`), for an
export to write back as they were; without them an export writes zeros there
(they multiply zeros, or their output is dropped: the model computes the same).
"""

from __future__ import annotations

import dataclasses

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
MESH_EMBEDDER = ENCODER + "encoder_nodes_mesh_nodes"
# Modules wnscale's parameters do not determine whole: the unused ones, and the mesh
# embedder's first layer (its padded rows).
REMAINDER = UNUSED + (f"{MESH_EMBEDDER}_mlp/~/linear_0",)


@dataclasses.dataclass(frozen=True)
class Channels:
  """Where wnscale's channels sit in GraphCast's layers.

  Attributes:
    input_rows: `[C_in]`, GraphCast's grid input row of each wnscale input channel.
    output_columns: `[C_out]`, GraphCast's output column of each wnscale output channel.
  """

  input_rows: np.ndarray
  output_columns: np.ndarray

  def first_rows(self, rows: str):
    """`(rows, GraphCast's row count)`: the rows of an MLP's first layer that wnscale holds,
    by kind: "" all, "grid" all, permuted (the grid embedder's), "mesh" the last 3 (the
    mesh embedder's); the row count where they are not all (else None)."""
    num_inputs = len(self.input_rows)
    if rows == "grid":
      return np.concatenate([self.input_rows, num_inputs + np.arange(NODE_FEATURES)]), None
    if rows == "mesh":
      return np.arange(num_inputs, num_inputs + NODE_FEATURES), num_inputs + NODE_FEATURES
    return slice(None), None


@dataclasses.dataclass(frozen=True)
class Mlp:
  """GraphCast's MLP `part` (`<part>_mlp/~/linear_{0,1}`, `<part>_layer_norm`) as wnscale's
  `MLP` (`hidden`, `out`, `norm`); `rows`: which rows of the first layer (`Channels`);
  `outputs`: the last layer's columns permuted to wnscale's output channels;
  `conditioned`: the norm is conditioned (GenCast's `<part>_norm_conditioning/linear`,
  the norm's `conditioning` Linear) rather than GraphCast's `<part>_layer_norm`."""

  part: str
  layer_norm: bool = True
  rows: str = ""
  outputs: bool = False
  conditioned: bool = False

  def linear(self, i: int) -> str:
    return f"{self.part}_mlp/~/linear_{i}"

  def read(self, modules: _Modules, channels: Channels) -> dict:
    rows, _ = channels.first_rows(self.rows)
    columns = channels.output_columns if self.outputs else slice(None)
    mlp = {"hidden": {"kernel": modules.leaf(self.linear(0), "w")[rows],
                      "bias": modules.leaf(self.linear(0), "b")},
           "out": {"kernel": modules.leaf(self.linear(1), "w")[:, columns],
                   "bias": modules.leaf(self.linear(1), "b")[columns]}}
    if self.linear(2) in modules.params:
      raise UserError(f"{self.part} has more than one hidden layer; wnscale's MLPs have one.")
    if self.layer_norm and self.conditioned:
      module = f"{self.part}_norm_conditioning/linear"
      mlp["norm"] = {"conditioning": {"kernel": modules.leaf(module, "w"),
                                      "bias": modules.leaf(module, "b")}}
    elif self.layer_norm:
      mlp["norm"] = {"scale": modules.leaf(f"{self.part}_layer_norm", "scale"),
                     "bias": modules.leaf(f"{self.part}_layer_norm", "offset")}
    return mlp

  def write(self, mlp: dict, out: dict, channels: Channels, remainder: dict,
            first_kernel=None):
    """Puts `mlp` (wnscale's, host arrays) into `out` (`{module: {leaf: array}}`);
    `first_kernel`: the first layer's whole `w` where wnscale splits it (an edge MLP)."""
    rows, num_rows = channels.first_rows(self.rows)
    hidden = mlp["hidden"]["kernel"] if first_kernel is None else first_kernel
    kernel = hidden
    if num_rows is not None:  # rows wnscale does not hold: the import's, else zeros
      kept = remainder.get(self.linear(0), {}).get("w")
      shape = (num_rows, hidden.shape[1])
      kernel = (np.array(kept, np.float32) if kept is not None and kept.shape == shape
                else np.zeros(shape, np.float32))
      kernel[rows] = hidden
    elif self.rows:  # a permutation of every row
      kernel = np.empty_like(hidden)
      kernel[rows] = hidden
    out[self.linear(0)] = {"w": kernel, "b": mlp["hidden"]["bias"]}
    last, bias = mlp["out"]["kernel"], mlp["out"]["bias"]
    if self.outputs:
      last, bias = np.empty_like(last), np.empty_like(bias)
      last[:, channels.output_columns] = mlp["out"]["kernel"]
      bias[channels.output_columns] = mlp["out"]["bias"]
    out[self.linear(1)] = {"w": last, "b": bias}
    if self.layer_norm and self.conditioned:
      conditioning = mlp["norm"]["conditioning"]
      out[f"{self.part}_norm_conditioning/linear"] = {"w": conditioning["kernel"],
                                                      "b": conditioning["bias"]}
    elif self.layer_norm:
      out[f"{self.part}_layer_norm"] = {"scale": mlp["norm"]["scale"],
                                        "offset": mlp["norm"]["bias"]}


@dataclasses.dataclass(frozen=True)
class Interaction:
  """An interaction network: GraphCast's edge MLP `edges` (its first layer on [edge,
  sender, receiver] split into `edge_mlp.hidden` and the two projections) and node MLP
  `nodes`."""

  edges: str
  nodes: str
  conditioned: bool = False

  def read(self, modules: _Modules, channels: Channels) -> dict:
    first = modules.leaf(f"{self.edges}_mlp/~/linear_0", "w")
    latent = first.shape[1]
    if first.shape[0] != 3 * latent:
      raise UserError(f"{self.edges}'s first layer is {list(first.shape)}; expected "
                      f"[3 x {latent}, {latent}] on [edge, sender, receiver]")
    edge_mlp = Mlp(self.edges, conditioned=self.conditioned).read(modules, channels)
    edge_mlp["hidden"]["kernel"] = first[:latent]
    return {"edge_mlp": edge_mlp,
            "sender_projection": {"kernel": first[latent:2 * latent]},
            "receiver_projection": {"kernel": first[2 * latent:]},
            "node_mlp": Mlp(self.nodes, conditioned=self.conditioned).read(modules, channels)}

  def write(self, tree: dict, out: dict, channels: Channels, remainder: dict):
    first = np.concatenate([tree["edge_mlp"]["hidden"]["kernel"],
                            tree["sender_projection"]["kernel"],
                            tree["receiver_projection"]["kernel"]])
    Mlp(self.edges, conditioned=self.conditioned).write(tree["edge_mlp"], out, channels,
                                                         remainder, first_kernel=first)
    Mlp(self.nodes, conditioned=self.conditioned).write(tree["node_mlp"], out, channels,
                                                         remainder)


@dataclasses.dataclass(frozen=True)
class _Layers:
  """The processor's interaction networks, one per layer, stacked on axis 0 in wnscale."""

  layers: tuple[Interaction, ...]

  def read(self, modules: _Modules, channels: Channels) -> dict:
    return stack([layer.read(modules, channels) for layer in self.layers])

  def write(self, tree: dict, out: dict, channels: Channels, remainder: dict):
    for i, layer in enumerate(self.layers):
      layer.write(_index(tree, i), out, channels, remainder)


def layout(steps: int) -> dict:
  """`{wnscale parameter path: GraphCast's modules}` of a model of `steps` processor layers
  (the module docstring's table)."""
  return {
      ("grid_embedder",): Mlp(ENCODER + "encoder_nodes_grid_nodes", rows="grid"),
      ("mesh_embedder",): Mlp(MESH_EMBEDDER, rows="mesh"),
      ("grid_to_mesh_edges", "embedder"): Mlp(ENCODER + "encoder_edges_grid2mesh"),
      ("grid_to_mesh_edges", "interaction"): Interaction(
          ENCODER + "processor_edges_0_grid2mesh", ENCODER + "processor_nodes_0_mesh_nodes"),
      ("grid_to_mesh_grid_mlp",): Mlp(ENCODER + "processor_nodes_0_grid_nodes"),
      ("processor", "edge_embedder"): Mlp(PROCESSOR + "encoder_edges_mesh"),
      ("processor", "layers"): _Layers(tuple(
          Interaction(f"{PROCESSOR}processor_edges_{i}_mesh",
                       f"{PROCESSOR}processor_nodes_{i}_mesh_nodes") for i in range(steps))),
      ("mesh_to_grid_edges", "embedder"): Mlp(DECODER + "encoder_edges_mesh2grid"),
      ("mesh_to_grid_edges", "interaction"): Interaction(
          DECODER + "processor_edges_0_mesh2grid", DECODER + "processor_nodes_0_grid_nodes"),
      ("output_mlp",): Mlp(DECODER + "decoder_nodes_grid_nodes", layer_norm=False,
                            outputs=True),
  }


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


def convert_params(params: dict, task_config: dict, specs: specs_lib.Specs):
  """wnscale's parameters (`nnx.State`, float32) from a checkpoint's `params`.

  Args:
    params: `graphcast_checkpoint.GraphCastCheckpoint.params`.
    task_config: its task (the channel orders).
    specs: the specs of `graphcast_config.wnscale_config` of the checkpoint.

  Raises:
    ValueError: a parameter is missing, has another shape than the specs'
      model, or is not used (naming it).
  """
  modules = _Modules(params)
  channels = _channels(task_config, specs.data)
  steps = specs.model.processor.message_passing_steps
  tree = {}
  for path, part in layout(steps).items():
    _place(tree, path, part.read(modules, channels))
  return model_state(tree, params, modules.read, UNUSED, specs,
                     f" (e.g. more message-passing steps than model_config:gnn_msg_steps={steps})")


def model_state(tree: dict, params: dict, read: set, unused: tuple, specs: specs_lib.Specs,
                hint: str = ""):
  """The model's parameters (`nnx.State`) holding `tree` (a pure dict converted from a
  checkpoint's `params`, whose modules `read` were read and `unused` are not needed).

  Raises:
    UserError: a module neither read nor unused (`hint` added), or a leaf of `tree`
      missing or shaped otherwise than the model's (naming it).
  """
  unread = sorted(set(params) - read - set(unused))
  if unread:
    raise UserError(f"The checkpoint has parameters wnscale's model does not use: {unread[:5]}"
                    f"{' ...' if len(unread) > 5 else ''}{hint}")
  _, shapes = setup.init_model_shapes(specs)
  check_shapes(tree, nnx.to_pure_dict(shapes), prefix="")
  nnx.replace_by_pure_dict(shapes, tree)
  return shapes


def remainder(params: dict) -> dict:
  """The modules of a checkpoint's `params` that wnscale's do not hold whole (`REMAINDER`),
  for `export_params` to write back."""
  return {module: dict(params[module]) for module in REMAINDER if module in params}


def export_params(params: dict, task_config: dict, specs: specs_lib.Specs,
                  kept: dict | None = None) -> dict:
  """GraphCast's `{haiku module: {leaf: float32 array}}` of wnscale's parameters.

  Args:
    params: wnscale's parameters (`nnx.to_pure_dict` of the model's), host arrays.
    task_config: the GraphCast task they are exported as (the channel orders).
    specs: the run's specs.
    kept: the import's `remainder` (the modules wnscale's do not hold), or None: zeros
      there (layer-norm scales one), which change nothing the model computes.
  """
  tree = _float32(params)
  kept = kept or {}
  channels = _channels(task_config, specs.data)
  out = {}
  for path, part in layout(specs.model.processor.message_passing_steps).items():
    node = tree
    for key in path:
      node = node[key]
    part.write(node, out, channels, kept)
  latent = specs.model.latent_size
  blank = {UNUSED[0]: {"w": np.zeros((latent, latent), np.float32),
                       "b": np.zeros(latent, np.float32)},
           UNUSED[1]: {"w": np.zeros((latent, latent), np.float32),
                       "b": np.zeros(latent, np.float32)},
           UNUSED[2]: {"scale": np.ones(latent, np.float32),
                       "offset": np.zeros(latent, np.float32)}}
  for module in UNUSED:
    same = module in kept and all(np.shape(kept[module].get(leaf)) == value.shape
                                  for leaf, value in blank[module].items())
    out[module] = ({leaf: np.asarray(kept[module][leaf], np.float32) for leaf in blank[module]}
                   if same else blank[module])
  return out


def _channels(task_config: dict, data: specs_lib.DataSpec) -> Channels:
  """For each wnscale input channel of `data`, GraphCast's row of it; for each wnscale
  output channel, GraphCast's column of it."""
  time_step = data.time_step_hours
  reference = {key: i for i, key in enumerate(
      graphcast_config.reference_input_channels(task_config, time_step))}
  input_rows = np.array([reference[key] for key in
                         graphcast_config.wnscale_input_channels(data)])
  reference = {key: i for i, key in enumerate(
      graphcast_config.reference_output_channels(task_config))}
  output_columns = np.array([reference[key] for key in
                             graphcast_config.wnscale_output_channels(data)])
  if len(input_rows) != len(set(input_rows.tolist())) or len(input_rows) != len(
      graphcast_config.reference_input_channels(task_config, time_step)):
    raise UserError("The task's input channels do not map one to one onto wnscale's.")
  if len(output_columns) != len(reference):  # targets are outputs: distinct by construction
    raise UserError("The task's output channels do not map one to one onto wnscale's.")
  return Channels(input_rows, output_columns)


def _place(tree: dict, path: tuple, value):
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _float32(tree):
  """A nested dict of arrays as float32 numpy arrays."""
  if isinstance(tree, dict):
    return {key: _float32(value) for key, value in tree.items()}
  return np.asarray(tree, np.float32)


def _index(tree: dict, i: int) -> dict:
  """Layer `i` of a pure dict of stacked layers."""
  if isinstance(tree, dict):
    return {key: _index(value, i) for key, value in tree.items()}
  return tree[i]


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
