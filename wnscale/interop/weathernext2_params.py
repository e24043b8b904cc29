"""WeatherNext 2's parameters (Haiku modules of `ForwardPass`) as wnscale's, and back.

Every module is under `multimodality_forward/`. The encoders take their inputs
through `split_input_matmul`: one weight per input array, named after it,
`w_<input>_<dims>` (e.g. `w_input_temperature_level=50,...,1000_time=-21600`
`[13, D]`: rows by level; `time` in seconds from the last input time, the
target time positive; `input_` an input, `forcing_` a forcing at the target
time; `w_spatial_feature=sin_lat,sin_lon,cos_lon` `[3, D]`). Their sum is the
first layer of an MLP whose bias is `shared_dense/mlp/linear_0:b`; here the
weights are stacked in wnscale's channel order into one kernel. The decoder's
`split_output_linear` is the other way round (`w_<target>_..._time=21600`
`[D, n]` columns, `b_...` biases).

  grid_encoder                          grid_embedder
  mesh_encoder                          mesh_embedder (spatial features, globals)
  global_norm_conditioning_encoder      noise_embedding (one bias-free linear layer)
  grid_to_mesh_gnn/edge_encoder         grid_to_mesh_edges.embedder
  grid_to_mesh_gnn/deep_gnn/
    processor_edges_0_edge_*, _sender_* grid_to_mesh_edges.interaction: edge_mlp.hidden
      (the first layer, pre-gather,     (the edge part, with linear_0:b),
      per part), processor_edges_0_*    sender_projection (no receiver part)
    processor_nodes_0_mesh_nodes        ... .node_mlp (rows: mesh latent, summed messages)
    processor_nodes_0_point_nodes       grid_to_mesh_grid_mlp
  mesh_transformer/transformer/block_i  processor.layers[i]: mha_proj_q -> query,
                                        mha_proj_k|v -> key_value, mha_final ->
                                        attention_output, ffw_up/down, the two
                                        norm conditionings -> attention_norm, ffw_norm
    transformer_final_norm_conditioning processor.final_norm
  mesh_to_grid_gnn/...                  mesh_to_grid_edges (edge, sender and receiver
                                        parts; processor_nodes_0_point_nodes: node_mlp)
    processor_nodes_0_mesh_nodes        unused (WeatherNext 2 computes it and drops it)
  grid_decoder                          output_mlp (columns in wnscale's output order)

A `DenseLayer`'s `mlp/linear_1` is an MLP's `out`, its
`normalization/linear_norm_conditioning/linear` the norm's `conditioning`.
`convert_params` reads a checkpoint's modules into wnscale's tree; `export_params` writes
them back (the split weights named as WeatherNext 2 names them, from the run's specs).
"""

from __future__ import annotations

import re

import numpy as np

from wnscale import specs as specs_lib
from wnscale.data import variables as variables_lib
from wnscale.errors import UserError
from wnscale.interop import graphcast_params

ROOT = "multimodality_forward/"
# wnscale's node features (`graphs.features.node_features`) by WeatherNext 2's names.
NODE_FEATURES = ("sin_lat", "cos_lon", "sin_lon")
EDGE_FEATURES = ("distance", "rel_x", "rel_y", "rel_z")
# The order of WeatherNext 2's rows of its `spatial_feature=...` weights.
SPATIAL_ORDER = ("sin_lat", "sin_lon", "cos_lon") + EDGE_FEATURES
UNUSED = tuple(f"{ROOT}mesh_to_grid_gnn/deep_gnn/processor_nodes_0_mesh_nodes/{part}"
               for part in ("mlp/linear_0", "mlp/linear_1",
                            "normalization/linear_norm_conditioning/linear"))
_SPLIT = re.compile(r"^(?P<leaf>[wb])_(?P<name>.+?)(_level=(?P<levels>[\d,]+))?"
                    r"(_time=(?P<time>-?\d+))?$")


class Modules:
  """The checkpoint's `{module: {leaf: array}}`, remembering which modules were read;
  module names are relative to `root` (WeatherNext 2's `ROOT`; GenCast's: "")."""

  def __init__(self, params: dict, root: str = ROOT):
    self.params, self.read, self.root = params, set(), root

  def leaf(self, module: str, leaf: str) -> np.ndarray:
    module = self.root + module
    if module not in self.params or leaf not in self.params[module]:
      raise UserError(f"The checkpoint has no parameter {module}:{leaf}")
    self.read.add(module)
    return np.asarray(self.params[module][leaf], np.float32)

  def linear(self, module: str, bias: bool = True) -> dict:
    linear = {"kernel": self.leaf(module, "w")}
    if bias:
      linear["bias"] = self.leaf(module, "b")
    return linear

  def split_rows(self, module: str, time_step_seconds: int) -> dict:
    """`{channel key: [D] row}` of a `split_input_matmul` (see `_channel_keys`)."""
    module_name = self.root + module
    if module_name not in self.params:
      raise UserError(f"The checkpoint has no module {module_name}")
    self.read.add(module_name)
    rows = {}
    for leaf, weight in self.params[module_name].items():
      for key, row in zip(_channel_keys(leaf, time_step_seconds), np.asarray(weight)):
        rows[key] = np.asarray(row, np.float32)
    return rows

  def dense(self, module: str, first_kernel: np.ndarray | None = None) -> dict:
    """A `DenseLayer` (`mlp/linear_0|1`, conditioned norm) as wnscale's MLP pure dict.

    `first_kernel`: the first layer's kernel where the checkpoint splits it
    (the `split_input_matmul` or pre-gather weights); its bias is `linear_0:b`.
    """
    hidden = {"kernel": (self.leaf(f"{module}/mlp/linear_0", "w") if first_kernel is None
                         else first_kernel),
              "bias": self.leaf(f"{module}/mlp/linear_0", "b")}
    if f"{self.root}{module}/mlp/linear_2" in self.params:
      raise UserError(f"{module} has more than one hidden layer; wnscale's MLPs have one.")
    return {"hidden": hidden, "out": self.linear(f"{module}/mlp/linear_1"),
            "norm": {"conditioning": self.linear(
                f"{module}/normalization/linear_norm_conditioning/linear")}}


def _channel_keys(leaf: str, time_step_seconds: int) -> list[tuple]:
  """The `(name, step, level)` key of each row (column) of a split weight `leaf`.

  `name` is `input_<variable>`, `forcing_<variable>`, `spatial_feature=<a,b,c>`'s
  features as `spatial:<feature>`, or an output variable; `step` 0 is the last
  input time (None: no time); `level` None for a surface variable.
  """
  match = _SPLIT.match(leaf)
  if not match:
    raise UserError(f"A split weight named {leaf!r}, which this importer cannot read")
  name, time = match.group("name"), match.group("time")
  step = None if time is None else int(time) // time_step_seconds
  if name.startswith("spatial_feature="):
    return [(f"spatial:{feature}", None, None)
            for feature in name.removeprefix("spatial_feature=").split(",")]
  if name.startswith("input_noise_noise_channels=range("):
    channels = int(name.removeprefix("input_noise_noise_channels=range(").rstrip(")"))
    return [("noise", None, channel) for channel in range(channels)]
  levels = match.group("levels")
  if levels is None:
    return [(name, step, None)]
  return [(name, step, int(level)) for level in levels.split(",")]


def _stacked(rows: dict, keys: list[tuple], module: str) -> np.ndarray:
  """`[len(keys), D]`: the rows of `keys`, in order; an error naming a missing or extra one."""
  missing = [key for key in keys if key not in rows]
  extra = sorted(set(rows) - set(keys), key=str)
  if missing or extra:
    raise UserError(f"{ROOT}{module}'s inputs do not match the config's: missing "
                    f"{missing[:4]}, not used {extra[:4]}")
  return np.stack([rows[key] for key in keys])


def input_keys(specs: specs_lib.Specs) -> list[tuple]:
  """WeatherNext 2's `(name, step, level)` of each row of wnscale's grid embedder.

  wnscale's order (`model.forecast.one_step`): the state at each input time,
  the forcings at each input time and the target time, the statics, the
  global forcings at the same times, then the 3 node features.
  """
  d = specs.data
  steps = list(range(1 - d.input_steps, 1))
  level_keys = lambda name, step: (
      [(name, step, level) for level in d.pressure_levels] if _is_atmospheric(name)
      else [(name, step, None)])
  source = lambda name, step: f"{'forcing' if step == 1 else 'input'}_{name}"
  history = [key for step in steps for name in d.variables
             for key in level_keys(f"input_{name}", step)]
  forcings = [(source(name, step), step, None) for step in steps + [1] for name in d.forcings]
  statics = [(f"input_{name}", None, None) for name in variables_lib.STATIC_VARIABLES]
  globals_ = [(source(name, step), step, None) for step in steps + [1]
              for name in d.global_forcings]
  return history + forcings + statics + globals_ + _node_feature_keys()


def _node_feature_keys() -> list[tuple]:
  return [(f"spatial:{feature}", None, None) for feature in NODE_FEATURES]


def _edge_feature_keys() -> list[tuple]:
  return [(f"spatial:{feature}", None, None) for feature in EDGE_FEATURES]


def _mesh_keys(d: specs_lib.DataSpec) -> list[tuple]:
  """The rows of wnscale's mesh embedder: the node features, the global forcings at each
  input time and the target time."""
  steps = list(range(1 - d.input_steps, 1)) + [1]
  return _node_feature_keys() + [(f"{'forcing' if step == 1 else 'input'}_{name}", step, None)
                                 for step in steps for name in d.global_forcings]


def _output_keys(d: specs_lib.DataSpec) -> list[tuple]:
  """The columns of wnscale's output layer: each output at the target time (and level)."""
  return [key for name in d.outputs for key in (
      [(name, 1, level) for level in d.pressure_levels] if _is_atmospheric(name)
      else [(name, 1, None)])]


def _is_atmospheric(name: str) -> bool:
  return variables_lib.is_atmospheric(name.removeprefix("input_").removeprefix(
      "forcing_"))


def convert_params(params: dict, specs: specs_lib.Specs):
  """wnscale's parameters (`nnx.State`, float32) from a WeatherNext 2 checkpoint's `params`.

  Args:
    params: `{haiku module: {leaf: array}}` of the checkpoint.
    specs: the specs of `weathernext2_config.wnscale_config` of its model config.

  Raises:
    ValueError: a parameter is missing, unused, or shaped otherwise than the
      specs' model (naming it).
  """
  d, m = specs.data, specs.model
  modules = Modules(params)
  seconds = d.time_step_hours * 3600
  grid_rows = modules.split_rows("grid_encoder/split_input_matmul", seconds)
  mesh_rows = modules.split_rows("mesh_encoder/split_input_matmul", seconds)
  noise_rows = modules.split_rows("global_norm_conditioning_encoder/split_input_matmul", seconds)
  decoder_columns = {"w": {}, "b": {}}
  decoder = ROOT + "grid_decoder/split_output_linear"
  if decoder not in params:
    raise UserError(f"The checkpoint has no module {decoder}")
  modules.read.add(decoder)
  for leaf, weight in params[decoder].items():
    weight = np.asarray(weight, np.float32)
    columns = weight.T if leaf.startswith("w_") else weight
    for key, column in zip(_channel_keys(leaf, seconds), columns):
      decoder_columns[leaf[0]][key] = column
  tree = {
      "grid_embedder": modules.dense(
          "grid_encoder/shared_dense", _stacked(grid_rows, input_keys(specs), "grid_encoder")),
      "mesh_embedder": modules.dense(
          "mesh_encoder/shared_dense", _stacked(mesh_rows, _mesh_keys(d), "mesh_encoder")),
      "noise_embedding": {"kernel": _stacked(
          noise_rows, [("noise", None, c) for c in range(m.noise_channels)],
          "global_norm_conditioning_encoder")},
      "grid_to_mesh_edges": _edges(modules, "grid_to_mesh_gnn", "points_to_mesh_nodes",
                                   receivers=m.grid_to_mesh_gather_from_receivers,
                                   node_set="mesh_nodes", seconds=seconds),
      "grid_to_mesh_grid_mlp": modules.dense(
          "grid_to_mesh_gnn/deep_gnn/processor_nodes_0_point_nodes"),
      "processor": transformer(modules, m.processor.layers),
      "mesh_to_grid_edges": _edges(modules, "mesh_to_grid_gnn", "mesh_to_points_nodes",
                                   receivers=True, node_set="point_nodes", seconds=seconds),
      "output_mlp": {
          "hidden": modules.linear("grid_decoder/shared_dense/mlp/linear_0"),
          "out": {"kernel": _stacked(decoder_columns["w"], _output_keys(d), "grid_decoder").T,
                  "bias": _stacked(decoder_columns["b"], _output_keys(d), "grid_decoder")}},
  }
  return graphcast_params.model_state(tree, params, modules.read, UNUSED, specs)


def _edges(modules: Modules, gnn: str, edge_set: str, *, receivers: bool, node_set: str,
           seconds: int) -> dict:
  """An encoder's or decoder's edges: the edge embedder and the interaction step."""
  edge_rows = modules.split_rows(f"{gnn}/edge_encoder/split_input_matmul", seconds)
  edge_keys = _edge_feature_keys()
  step = f"{gnn}/deep_gnn/processor_edges_0_"
  interaction = {
      "edge_mlp": modules.dense(f"{step}{edge_set}",
                                modules.leaf(f"{step}edge_{edge_set}", "w")),
      "sender_projection": {"kernel": modules.leaf(f"{step}sender_{edge_set}", "w")},
      "node_mlp": modules.dense(f"{gnn}/deep_gnn/processor_nodes_0_{node_set}")}
  if receivers:
    interaction["receiver_projection"] = {"kernel": modules.leaf(f"{step}receiver_{edge_set}",
                                                                 "w")}
  return {"embedder": modules.dense(f"{gnn}/edge_encoder/shared_dense",
                                    _stacked(edge_rows, edge_keys, f"{gnn}/edge_encoder")),
          "interaction": interaction}


def transformer(modules: Modules, layers: int, root: str = "mesh_transformer/transformer/"
                ) -> dict:
  """The mesh transformer's blocks, stacked on a leading layer axis, and its final norm;
  `root`: the transformer's module (GenCast's: `mesh_transformer/~/transformer/`)."""

  def block(i: int) -> dict:
    name = f"{root}block_{i:02d}/"
    conditioning = lambda suffix: {"conditioning": modules.linear(
        f"{name}block_{i:02d}_norm_conditioning{suffix}/linear")}
    return {
        "attention_norm": conditioning(""), "ffw_norm": conditioning("_1"),
        "query": modules.linear(f"{name}mha_proj_q", bias=False),
        "key_value": {"kernel": np.concatenate(
            [modules.leaf(f"{name}mha_proj_k", "w"), modules.leaf(f"{name}mha_proj_v", "w")],
            axis=1)},
        "attention_output": modules.linear(f"{name}mha_final"),
        "ffw_up": modules.linear(f"{name}ffw_up"), "ffw_down": modules.linear(f"{name}ffw_down")}

  if f"{modules.root}{root}block_{layers:02d}/mha_final" in modules.params:
    raise UserError(f"The checkpoint has more transformer blocks than the config's {layers}")
  return {"layers": graphcast_params.stack([block(i) for i in range(layers)]),
          "final_norm": {"conditioning": modules.linear(
              f"{root}transformer_final_norm_conditioning/linear")}}


def remainder(params: dict) -> dict:
  """The modules of a checkpoint's `params` that wnscale's model does not hold (`UNUSED`),
  for `export_params` to write back."""
  return {module: dict(params[module]) for module in UNUSED if module in params}


def export_params(params: dict, specs: specs_lib.Specs, kept: dict | None = None) -> dict:
  """WeatherNext 2's `{haiku module: {leaf: float32 array}}` of wnscale's parameters: the
  inverse of `convert_params` (the stacked first layers split back into one weight per
  input array, k and v apart, the transformer's blocks one module each).

  Args:
    params: wnscale's parameters (`nnx.to_pure_dict` of the model's), host arrays.
    specs: the run's specs (of a `weathernext2_predictor.check_expressible` config).
    kept: the import's `remainder` (the decoder's unused mesh MLP), or None: zeros there,
      which change nothing the model computes.
  """
  d, m = specs.data, specs.model
  tree = _float32(params)
  seconds = d.time_step_hours * 3600
  out = {}

  def put(module: str, leaves: dict):
    out[ROOT + module] = leaves

  def dense(module: str, node: dict, split: bool = False):
    """An MLP as a `DenseLayer`; `split`: its first kernel is written elsewhere."""
    put(f"{module}/mlp/linear_0", {"b": node["hidden"]["bias"]} | (
        {} if split else {"w": node["hidden"]["kernel"]}))
    put(f"{module}/mlp/linear_1", _linear(node["out"]))
    put(f"{module}/normalization/linear_norm_conditioning/linear",
        _linear(node["norm"]["conditioning"]))

  def split_input(module: str, node: dict, keys: list[tuple]):
    put(f"{module}/split_input_matmul", {leaf: node["hidden"]["kernel"][rows]
                                         for leaf, rows in _split_leaves(keys, seconds)})
    dense(f"{module}/shared_dense", node, split=True)

  split_input("grid_encoder", tree["grid_embedder"], input_keys(specs))
  split_input("mesh_encoder", tree["mesh_embedder"], _mesh_keys(d))
  put("global_norm_conditioning_encoder/split_input_matmul", {
      leaf: tree["noise_embedding"]["kernel"][rows] for leaf, rows in _split_leaves(
          [("noise", None, c) for c in range(m.noise_channels)], seconds)})
  for gnn, edge_set, node_set, node in (
      ("grid_to_mesh_gnn", "points_to_mesh_nodes", "mesh_nodes", tree["grid_to_mesh_edges"]),
      ("mesh_to_grid_gnn", "mesh_to_points_nodes", "point_nodes", tree["mesh_to_grid_edges"])):
    split_input(f"{gnn}/edge_encoder", node["embedder"], _edge_feature_keys())
    step, interaction = f"{gnn}/deep_gnn/processor_edges_0_", node["interaction"]
    dense(f"{step}{edge_set}", interaction["edge_mlp"], split=True)
    put(f"{step}edge_{edge_set}", {"w": interaction["edge_mlp"]["hidden"]["kernel"]})
    for part in ("sender", "receiver"):
      if f"{part}_projection" in interaction:
        put(f"{step}{part}_{edge_set}", {"w": interaction[f"{part}_projection"]["kernel"]})
    dense(f"{gnn}/deep_gnn/processor_nodes_0_{node_set}", interaction["node_mlp"])
  dense("grid_to_mesh_gnn/deep_gnn/processor_nodes_0_point_nodes",
        tree["grid_to_mesh_grid_mlp"])
  _export_transformer(tree["processor"], m.processor.layers, put)
  decoder = tree["output_mlp"]
  put("grid_decoder/shared_dense/mlp/linear_0", _linear(decoder["hidden"]))
  columns = _split_leaves(_output_keys(d), seconds)
  put("grid_decoder/split_output_linear", {
      **{leaf: decoder["out"]["kernel"][:, rows] for leaf, rows in columns},
      **{"b" + leaf[1:]: decoder["out"]["bias"][rows] for leaf, rows in columns}})
  latent, noise = m.latent_size, m.noise_channels
  blank = {UNUSED[0]: {"w": np.zeros((latent, latent), np.float32),
                       "b": np.zeros(latent, np.float32)},
           UNUSED[1]: {"w": np.zeros((latent, latent), np.float32),
                       "b": np.zeros(latent, np.float32)},
           UNUSED[2]: {"w": np.zeros((noise, 2 * latent), np.float32),
                       "b": np.zeros(2 * latent, np.float32)}}
  kept = kept or {}
  for module, leaves in blank.items():
    same = module in kept and all(np.shape(kept[module].get(leaf)) == value.shape
                                  for leaf, value in leaves.items())
    out[module] = ({leaf: np.asarray(kept[module][leaf], np.float32) for leaf in leaves}
                   if same else leaves)
  return out


def _export_transformer(processor: dict, layers: int, put):
  """The stacked blocks, one module each, and the final norm (`_transformer`'s inverse)."""
  root = "mesh_transformer/transformer/"
  for i in range(layers):
    block = {key: _index(value, i) for key, value in processor["layers"].items()}
    name = f"{root}block_{i:02d}/"
    put(f"{name}block_{i:02d}_norm_conditioning/linear",
        _linear(block["attention_norm"]["conditioning"]))
    put(f"{name}block_{i:02d}_norm_conditioning_1/linear",
        _linear(block["ffw_norm"]["conditioning"]))
    put(f"{name}mha_proj_q", {"w": block["query"]["kernel"]})
    key, value = np.split(block["key_value"]["kernel"], 2, axis=1)
    put(f"{name}mha_proj_k", {"w": key})
    put(f"{name}mha_proj_v", {"w": value})
    for part in ("attention_output", "ffw_up", "ffw_down"):
      put(name + {"attention_output": "mha_final"}.get(part, part), _linear(block[part]))
  put(f"{root}transformer_final_norm_conditioning/linear",
      _linear(processor["final_norm"]["conditioning"]))


def _split_leaves(keys: list[tuple], seconds: int) -> list[tuple[str, list[int]]]:
  """`[(WeatherNext 2's weight name, the rows of `keys` it holds, in its order)]` of a
  weight split per input (`_channel_keys` read backwards): one per variable and time,
  its levels in order; one of the spatial features in WeatherNext 2's order; the noise."""
  groups = {}
  for row, (name, step, level) in enumerate(keys):
    if name.startswith("spatial:"):
      group = ("spatial", None)
    elif name == "noise":
      group = ("noise", None)
    else:
      group = (name, step)
    groups.setdefault(group, []).append((row, name, step, level))
  leaves = []
  for (name, step), rows in groups.items():
    if name == "spatial":
      rows = sorted(rows, key=lambda row: SPATIAL_ORDER.index(row[1].removeprefix("spatial:")))
      leaf = "spatial_feature=" + ",".join(row[1].removeprefix("spatial:") for row in rows)
    elif name == "noise":
      leaf = f"input_noise_noise_channels=range({len(rows)})"
    else:
      levels = [row[3] for row in rows if row[3] is not None]
      leaf = name + (f"_level={','.join(map(str, levels))}" if levels else "") + (
          f"_time={step * seconds}" if step is not None else "")
    leaves.append((f"w_{leaf}", [row[0] for row in rows]))
  return leaves


def _linear(node: dict) -> dict:
  return {"w": node["kernel"]} | ({"b": node["bias"]} if "bias" in node else {})


def _index(tree, i: int):
  """Layer `i` of stacked layers (a pure dict, or an array)."""
  if isinstance(tree, dict):
    return {key: _index(value, i) for key, value in tree.items()}
  return tree[i]


def _float32(tree):
  """A nested dict of arrays as float32 numpy arrays."""
  if isinstance(tree, dict):
    return {key: _float32(value) for key, value in tree.items()}
  return np.asarray(tree, np.float32)
