"""A wnscale run as WeatherNext 2's `PredictorConfig`: the way back of `weathernext2_config`.

`predictor_config(config, specs, statistics, template)` builds the fiddle Buildable (as
`fiddle_json.load` gives it, for `fiddle_json.dump`) of the FGN a run trains: every
setting `weathernext2_config` maps is written from the run's config (widths, heads,
layers, k hops, mesh, noise, variables and levels, the global inputs, NaN filling, output
activations, remat, ensemble size, loss weights), the statistics as `InputsAndResiduals`'
datasets. What wnscale does not express (how attention is computed and its block sizes,
the GNNs' names and implementation switches, the NaN-masked cyclone targets of the loss)
is taken from `template`, the WeatherNext 2 config the run was imported from, else as
WeatherNext 2 released it (`RELEASED`). So an import exported again gives back its config.

A run WeatherNext 2's model cannot express is refused naming the setting: the kind of
model first (the transformer processor, an FGN, WeatherNext 2's inputs and activations),
then every model and data key that does not come back the same when the built config is
mapped forward again (`weathernext2_config.wnscale_config`), but those that do not change
what the parameters compute (`NOT_EXPORTED`).
"""

from __future__ import annotations

import copy

import ml_collections
import numpy as np
import xarray as xr

from wnscale import specs as specs_lib
from wnscale.data import variables as variables_lib
from wnscale.errors import UserError
from wnscale.model import processors
from wnscale.interop import graphcast_config, weathernext2_config
from wnscale.interop.fiddle_json import Buildable, Symbol

_WN = "weathernext."
_GNN = Symbol(f"{_WN}utils.points_mesh_gnn", "PointsMeshTypedGraphGNN")
_CONNECTIVITY = f"{_WN}utils.points_mesh_gnn"
_ACTIVATIONS = f"{_WN}utils.activations"
# The output activations of WeatherNext 2's `activations` module.
ACTIVATIONS = ("sigmoid",)
# WeatherNext 2's released values of the settings wnscale does not express.
RELEASED = {
    # (None: a setting wnscale expresses, written from the run's config.)
    "transformer": {"attention_type": "splash_mha", "block_q": 1024, "block_kv": 512,
                    "block_kv_compute": 256, "block_q_dkv": 512, "block_kv_dkv": 1024,
                    "block_kv_dkv_compute": 1024, "mask_type": "lazy",
                    "attention_k_hop": None, "d_model": None, "num_heads": None,
                    "num_layers": None, "attn_winit_final_mult": 0.0,
                    "ffw_winit_final_mult": 0.0, "ffw_hidden": None,
                    "upcast_attn_to_fp32": True},
    "encoder_gnn": {"num_message_passing_steps": 1, "use_edge_residuals": False,
                    "gather_from_receivers": False, "pre_gather_matmul": True,
                    "f32_aggregation": True, "remat_block_size": None,
                    "edge_update_remat_block_size": None, "gather_scatter_kwargs": {},
                    "aggregate_normalization": 4},
    "decoder_gnn": {"num_message_passing_steps": 1, "use_edge_residuals": False,
                    "pre_gather_matmul": True, "remat_block_size": None,
                    "edge_update_remat_block_size": None, "gather_scatter_kwargs": {}},
    "names": ("{points_name}_to_{mesh_name}_gnn", "{mesh_name}_to_{points_name}_gnn",
              "{mesh_name}_transformer"),
    # The cyclone targets without a value where there is no cyclone (NaN there; loss 0).
    "nan_targets": tuple(f"cyclone_{name}_disc" for name in (
        "all_wind", "usa_wind", *(f"usa_r{speed}_{quadrant}_radius" for speed in (34, 50, 64)
                                  for quadrant in ("ne", "se", "sw", "nw")),
        "usa_rmw", "usa_pres")),
    "loss_for_nan_targets": 0.0,
}
# Keys that do not change what the parameters compute (how a run computes, its data).
NOT_EXPORTED = {
    # its config says which stages are checkpointed, not how
    "model": (tuple(key for key in specs_lib.RematSpec.config_keys()
                    if key not in specs_lib.RematSpec.STAGES)
              + ("dtype",) + processors.keys_not_exported("transformer")),
    "data": graphcast_config.NOT_EXPORTED["data"],
}


def predictor_config(config: ml_collections.ConfigDict, specs: specs_lib.Specs,
                     statistics: dict[str, xr.Dataset],
                     template: Buildable | None = None) -> Buildable:
  """WeatherNext 2's `PredictorConfig` of the run `config` (see the module docstring).

  Args:
    config: the run's config: the built config maps back to its keys (`check_expressible`).
    specs: its specs.
    statistics: `{"mean" | "std" | "diff_std": Dataset}` in GraphCast's layout (the run's).
    template: the config the run was imported from (`fiddle_json.load`), or None.

  Raises:
    UserError: the run is not one WeatherNext 2's model expresses (naming the setting).
  """
  check_kind(config, specs)
  d, m, t = specs.data, specs.model, specs.train
  kept = _Template(template)
  inputs = d.variables + variables_lib.STATIC_VARIABLES + d.global_forcings + d.forcings
  task = Buildable("Config", Symbol(f"{_WN}utils.task", "TaskConfig"), {
      "input_variables": kept.order("task.input_variables", inputs),
      "target_variables": kept.order("task.target_variables", d.outputs),
      "forcing_variables": kept.order("task.forcing_variables",
                                      d.global_forcings + d.forcings),
      "pressure_levels": tuple(d.pressure_levels),
      "input_duration": f"{d.input_steps * d.time_step_hours}h"})
  forward = _forward(m, kept)
  weights = {name: weight for name, weight in t.variable_loss_weights}
  weight = lambda name: weights.get(name, variables_lib.lookup(name).loss_weight)
  per_variable = {name: (weight(name) if name in d.outputs else value)
                  for name, value in kept.get("loss.per_variable_weights", {}).items()}
  per_variable |= {name: weight(name) for name in d.outputs
                   if name not in per_variable and weight(name) != 1.0}
  nan_targets = kept.get("loss.vars_with_nan_targets", list(RELEASED["nan_targets"]))
  # `num_samples` is the config's key, which a run of any loss keeps (the specs hold it
  # only for the CRPS's).
  ensemble_members = int(config.train.ensemble_members)
  kwargs = {
      "noisy_function_constructor": Symbol(f"{_WN}weathernext2.architecture", "ForwardPass"),
      "noisy_function_kwargs": forward,
      "noise_generator_constructor": Symbol(f"{_WN}weathernext2.fgn",
                                            "gaussian_noise_generator"),
      "noise_generator_kwargs": {"noise_var_dict": {"noise": {
          "source": "input", "non_batch_shape": (("noise_channels", m.noise_channels),)}}},
      "fgn_loss_function_kwargs": {
          "per_variable_weights": per_variable,
          "vars_with_nan_targets": [name for name in nan_targets if name in d.outputs],
          "loss_for_nan_targets": kept.get("loss.loss_for_nan_targets",
                                           RELEASED["loss_for_nan_targets"])}}
  predictor = Buildable("Config", Symbol(f"{_WN}weathernext2.fgn", "PredictorConfig"), {
      "task": task, "predictor_constructor": Symbol(f"{_WN}weathernext2.fgn", "Predictor"),
      "predictor_kwargs": kwargs,
      "predictor_wrappers": _wrappers(specs, statistics, kept, ensemble_members)})
  check_expressible(config, predictor)
  return predictor


def check_expressible(config: ml_collections.ConfigDict, predictor: Buildable):
  """A `UserError` naming the first model or data key of `config` (outside `NOT_EXPORTED`)
  that `predictor` does not map back to (`weathernext2_config.wnscale_config`)."""
  mapped = weathernext2_config.wnscale_config(predictor, config.data.stats_path)
  for section in ("model", "data"):
    for key in config[section]:
      if key in NOT_EXPORTED[section]:
        continue
      value = graphcast_config.plain(config[section][key])
      expected = graphcast_config.plain(mapped[section][key])
      if value != expected:
        raise UserError(f"WeatherNext 2's model cannot express this run's {section}.{key}="
                        f"{value!r}: its config maps to {expected!r} there.")


def check_kind(config: ml_collections.ConfigDict, specs: specs_lib.Specs):
  """Raises a `UserError` naming a setting without which there is no WeatherNext 2 config
  to build (the kind of model), read from the run's `config` (named as it holds them) and
  its `specs` (the output activations, parsed) alone."""
  m, d = config.model, config.data
  for key, value, expected, why in (
      ("model.processor", m.processor, "transformer", "its processor is the mesh transformer"),
      ("data.input_normalization", d.input_normalization, "all",
       "it normalizes every input"),
      ("data.modalities", tuple(d.modalities), (), "the grid alone"),
      ("data.time_step_hours", d.time_step_hours, 6, "it steps 6 h")):
    if value != expected:
      raise UserError(f"WeatherNext 2's model cannot express this run's {key}={value!r}: "
                      f"WeatherNext 2's is {expected!r} ({why}).")
  if m.noise_channels <= 0:
    raise UserError(f"WeatherNext 2's model cannot express this run's model.noise_channels="
                    f"{m.noise_channels}: it is an FGN, its layer norms conditioned on noise "
                    "(model.noise_channels > 0).")
  for name, activation, _ in specs.model.output_activations:
    if activation not in ACTIVATIONS:
      raise UserError(f"WeatherNext 2's model cannot express this run's model."
                      f"output_activations {name}:{activation}: its activations are "
                      f"{ACTIVATIONS}.")


class _Template:
  """The values of the config a run was imported from, where there is one."""

  def __init__(self, template: Buildable | None):
    self.values = {}
    if template is None:
      return
    kwargs = template.arguments["predictor_kwargs"]
    forward = kwargs["noisy_function_kwargs"]
    loss = kwargs.get("fgn_loss_function_kwargs") or {}
    self.values = {
        **{f"task.{key}": value for key, value in template.arguments["task"].arguments.items()},
        **{f"loss.{key}": value for key, value in loss.items()},
        "transformer": forward["mesh_model_ctor"].arguments["transformer_kwargs"],
        "transformer_name": forward["mesh_model_ctor"].arguments.get("name"),
        "encoder": forward["points_to_mesh_model_ctor"].arguments,
        "decoder": forward["mesh_to_grid_model_ctor"].arguments,
        "forward_keys": tuple(forward),
        "wrappers": {wrapper["constructor"].name: wrapper.get("kwargs") or {}
                     for wrapper in template.arguments["predictor_wrappers"]}}

  def get(self, key: str, default):
    return copy.deepcopy(self.values.get(key, default))

  def order(self, key: str, names) -> tuple:
    """`names` in the template's order when it holds the same ones."""
    held = self.values.get(key)
    return tuple(held) if held is not None and sorted(held) == sorted(names) else tuple(names)


def _dense(size: int, normalized: bool = True, **more) -> dict:
  """A `DenseLayer`'s kwargs as wnscale's MLPs are: one hidden layer, swish, a layer norm
  conditioned on the noise."""
  norm = ({"activation_normalization": "layer_norm",
           "activation_normalization_kwargs": {"use_norm_conditioning": True}}
          if normalized else {})
  return {"output_size": size, **norm, "hidden_size": size, "num_hidden_layers": 1,
          "activation": "swish", "activate_final": False, **more}


def _forward(m: specs_lib.ModelSpec, kept: _Template) -> dict:
  """`ForwardPass`' kwargs (`noisy_function_kwargs`) of the model `m` (a transformer's)."""
  latent, noise = m.latent_size, m.noise_channels
  edges = m.edge_size
  kept_keys = kept.get("forward_keys", ())
  activations = {name: (Symbol(_ACTIVATIONS, "shifted_activation"), {
      "activation_fn": Symbol(_ACTIVATIONS, activation), "input_offset": offset})
                 for name, activation, offset in m.output_activations}
  output = _dense(latent, normalized=False)
  output.pop("output_size")
  forward = {
      "latent_dense_kwargs": _dense(latent),
      "norm_conditioning_latent_dense_kwargs": {
          "num_hidden_layers": 0, "activation_normalization": None, "activate_final": False,
          "with_bias": False, "hidden_size": noise, "activation": "swish",
          "output_size": noise},
      "output_dense_kwargs": output,
      "spatial_features_kwargs": dict(weathernext2_config.SPATIAL_FEATURES),
      "mesh_num_splits": m.mesh_levels,
      "per_var_activation_fns": activations,
      "norm_conditioning_features": ("noise",)}
  for stage in specs_lib.RematSpec.STAGES:
    remat = getattr(m.remat, stage)
    if remat or stage in kept_keys:
      forward[stage] = bool(remat)
  encoder_gnn = kept.get("encoder", {}).get("deep_gnn_kwargs") or dict(RELEASED["encoder_gnn"])
  normalization = m.grid_to_mesh_aggregate_normalization  # 1: none (WeatherNext 2's None)
  encoder_gnn.update(gather_from_receivers=bool(m.grid_to_mesh_gather_from_receivers),
                     aggregate_normalization=None if normalization == 1.0 else normalization)
  decoder_gnn = kept.get("decoder", {}).get("deep_gnn_kwargs") or dict(RELEASED["decoder_gnn"])
  names = [kept.get(part, {}).get("name", default) for part, default in
           zip(("encoder", "decoder"), RELEASED["names"][:2])]
  edge_features = dict(weathernext2_config.EDGE_FEATURES)
  forward["points_to_mesh_model_ctor"] = Buildable("Partial", _GNN, {
      "name": names[0], "is_points_to_mesh": True, "is_mesh_to_points": False,
      "connectivity_type": Symbol(_CONNECTIVITY, "ConnectivityType.BALL_QUERY"),
      "dense_kwargs": _dense(latent), "deep_gnn_kwargs": encoder_gnn,
      "spatial_edge_features_kwargs": edge_features,
      "edge_encoder_dense_kwargs": _dense(edges, remat=False),
      "ball_query_radius_fraction": m.radius_fraction})
  forward["mesh_to_grid_model_ctor"] = Buildable("Partial", _GNN, {
      "name": names[1], "is_points_to_mesh": False, "is_mesh_to_points": True,
      "connectivity_type": Symbol(_CONNECTIVITY, "ConnectivityType.IN_TRIANGLE"),
      "dense_kwargs": _dense(latent), "deep_gnn_kwargs": decoder_gnn,
      "spatial_edge_features_kwargs": dict(edge_features),
      "edge_encoder_dense_kwargs": _dense(edges, remat=False)})
  transformer = kept.get("transformer", None) or dict(RELEASED["transformer"])
  transformer.update(attention_k_hop=m.processor.k_hop, d_model=latent,
                     num_heads=m.processor.heads, num_layers=m.processor.layers,
                     ffw_hidden=m.processor.ffw_size)
  forward["mesh_model_ctor"] = Buildable(
      "Partial", Symbol(f"{_WN}utils.mesh_transformer", "MeshSparseTransformer"), {
          "name": kept.get("transformer_name", None) or RELEASED["names"][2],
          "transformer_kwargs": transformer})
  return forward


def _wrappers(specs: specs_lib.Specs, statistics: dict[str, xr.Dataset], kept: _Template,
              ensemble_members: int) -> list[dict]:
  """`InputsAndResiduals` (the statistics), a `NaNCleaner` per filled variable, the
  autoregressive rollout, the ensemble's sample dim (of `ensemble_members`)."""
  kept_wrappers = kept.get("wrappers", {})
  held = kept_wrappers.get("InputsAndResiduals")
  names = weathernext2_config.STATISTICS
  datasets = ({names[statistic]: held[names[statistic]] for statistic in ("diff_std", "mean",
                                                                           "std")}
              if held is not None and _same_statistics(statistics, held, specs.data)
              else {names[statistic]: _plain_dataset(statistics[statistic])
                    for statistic in ("diff_std", "mean", "std")})
  wrappers = [{"constructor": Symbol(f"{_WN}utils.normalization", "InputsAndResiduals"),
               "kwargs": datasets}]
  cleaner = kept_wrappers.get("NaNCleaner")
  for name, value in specs.data.nan_fill_values:
    fill = (cleaner["fill_value"] if cleaner is not None and cleaner["var_to_clean"] == name
            and float(cleaner["fill_value"][name]) == value
            else xr.Dataset({name: xr.DataArray(float(value))}))
    wrappers.append({"constructor": Symbol(f"{_WN}utils.nan_cleaning", "NaNCleaner"),
                     "kwargs": {"fill_value": fill, "var_to_clean": name,
                                "reintroduce_nans": True}})
  wrappers.append({"constructor": Symbol(f"{_WN}utils.autoregressive", "Predictor"),
                   "kwargs": {"gradient_checkpointing": bool(specs.train.remat_rollout)}})
  wrappers.append({"constructor": Symbol(f"{_WN}utils.ensemble", "WithSampleDim"),
                   "kwargs": {"num_samples": ensemble_members}})
  return wrappers


def _same_statistics(statistics: dict[str, xr.Dataset], held: dict,
                     data: specs_lib.DataSpec) -> bool:
  """Whether the run's statistics are the template's for every variable the model reads
  (where the template has none, the import's mean 0 and std 1)."""
  read = data.outputs + data.forcings + data.global_forcings + variables_lib.STATIC_VARIABLES
  for statistic, key in weathernext2_config.STATISTICS.items():
    # The residuals' scales are the state's; mean and std, of every input and output.
    for name in (data.variables if statistic == "diff_std" else read):
      if name not in statistics[statistic]:  # e.g. no diff_std of a static
        if name in held[key]:
          return False
        continue
      ours = np.asarray(statistics[statistic][name].values, np.float64)
      theirs = (np.asarray(held[key][name].values, np.float64) if name in held[key]
                else np.full_like(ours, 0.0 if statistic == "mean" else 1.0))
      if ours.shape != theirs.shape or not np.array_equal(ours, theirs):
        return False
  return True


def _plain_dataset(dataset: xr.Dataset) -> xr.Dataset:
  """Statistics as WeatherNext 2's config holds them: float64 values, int64 levels, no
  attributes."""
  variables = {name: (array.dims, np.asarray(array.values, np.float64))
               for name, array in dataset.data_vars.items()}
  coords = ({"level": np.asarray(dataset["level"].values, np.int64)}
            if "level" in dataset.coords else {})
  return xr.Dataset(variables, coords=coords)
