"""A WeatherNext 2 model config (its fiddle `PredictorConfig`) as a wnscale config.

WeatherNext 2's released configs (`WeatherNext2.json`, `WeatherNextCyclones.json`,
`WeatherNextCyclones_Mini.json`) build an FGN: `fgn.Predictor` around
`architecture.ForwardPass`, wrapped by `InputsAndResiduals` (normalization and
residuals, its statistics inside the config), `NaNCleaner` (sea-surface
temperature over land), the autoregressive rollout and the ensemble's sample
dim. How it maps onto wnscale (`wnscale.model.graphcast.GraphCast`):

  ForwardPass                              wnscale
  latent_dense_kwargs (MLP: 1 hidden        model.latent_size; every MLP is one
    layer, swish, conditioned layer norm)   hidden layer, swish, layer norm
  noise input, 32 channels, its encoder     model.noise_channels, the bias-free
    (one bias-free linear layer)            noise embedding; every norm conditioned
  grid inputs: state, forcings, statics,    the grid embedder's inputs (same
    globals merged; spatial features        features: sin lat, cos lon, sin lon)
    sin lat, sin lon, cos lon
  global inputs (no lat/lon: year progress) data.global_forcings (grid and mesh)
  mesh_num_splits                           model.mesh_levels (the same icosahedron)
  points-to-mesh GNN: ball query,           model.radius_fraction; one interaction
    1 step, aggregate_normalization,        step; grid_to_mesh_aggregate_normalization,
    gather_from_receivers                   grid_to_mesh_gather_from_receivers
  edge encoder (distance, rel_x/y/z)        model.edge_latent_size (same features)
  mesh transformer (k-hop mask on the       processor "transformer": heads, layers,
    finest mesh, self included)             feed-forward, k hop
  mesh-to-points GNN: in-triangle, 1 step   the decoder's interaction step
  output MLP, per-variable activation       output_mlp; model.output_activations
  InputsAndResiduals                        data.input_normalization "all"
  NaNCleaner(var, fill, reintroduce)        data.nan_fill_values
  autoregressive(gradient_checkpointing)    train.remat_rollout
  WithSampleDim(num_samples), crps loss     train.loss "crps", train.ensemble_members

The attention implementation (`mha`, `triblockdiag_mha`, `splash_mha`) is the
same function computed three ways, and the node order WeatherNext 2 chooses
for a banded adjacency changes no result: neither is mapped (wnscale's own
`model.transformer_attention` chooses how it computes where it runs). Anything
else that does not map is an error naming the setting.
"""

from __future__ import annotations

import ml_collections
import numpy as np
import xarray as xr

from wnscale import config as config_lib
from wnscale.data import forcings as forcings_lib
from wnscale.data import variables as variables_lib
from wnscale.errors import UserError
from wnscale.interop import graphcast_config
from wnscale.interop.fiddle_json import Buildable

# The spatial features WeatherNext 2's node encoders may use, as wnscale computes them.
SPATIAL_FEATURES = {"add_sin_latitude": True, "add_sin_longitude": True,
                    "add_cos_longitude": True}
EDGE_FEATURES = {"add_scalar_distances": True, "add_vector_distances": True,
                 "relative_latitude_vectors": True, "relative_longitude_vectors": True}
ATTENTION_TYPES = ("mha", "triblockdiag_mha", "splash_mha")
STATISTICS = {"mean": "mean_by_level", "std": "stddev_by_level",
              "diff_std": "diffs_stddev_by_level"}  # InputsAndResiduals' arguments


def wnscale_config(predictor: Buildable, stats_path: str) -> ml_collections.ConfigDict:
  """The validated wnscale config of WeatherNext 2's `PredictorConfig` `predictor`.

  Args:
    predictor: `fiddle_json.load` of the config file.
    stats_path: the run's statistics (a directory of GraphCast's three files).

  Raises:
    ValueError: a setting wnscale cannot express, named by its path in the config.
  """
  _expect(predictor.fn.name, "PredictorConfig", "the config's root")
  kwargs = predictor.arguments["predictor_kwargs"]
  _expect(predictor.arguments["predictor_constructor"].name, "Predictor",
          "predictor_constructor (fgn.Predictor)")
  _expect(kwargs["noisy_function_constructor"].name, "ForwardPass",
          "predictor_kwargs.noisy_function_constructor")
  forward = kwargs["noisy_function_kwargs"]
  config = config_lib.default_config()
  _model(config.model, forward, _noise_channels(kwargs, forward))
  _task(config.data, predictor.arguments["task"].arguments)
  _wrappers(config, predictor.arguments["predictor_wrappers"])
  config.model.output_activations = tuple(
      _output_activation(name, activation)
      for name, activation in (forward.get("per_var_activation_fns") or {}).items())
  config.data.stats_path = stats_path
  config.train.loss = "crps"
  config.train.variable_loss_weights = _loss_weights(
      kwargs.get("fgn_loss_function_kwargs") or {}, config.data)
  return config_lib.validate(config)


def statistics(predictor: Buildable) -> dict[str, xr.Dataset]:
  """`{"mean" | "std" | "diff_std": Dataset}`: the statistics the config holds
  (`InputsAndResiduals`' arguments)."""
  wrapper = _wrapper(predictor.arguments["predictor_wrappers"], "InputsAndResiduals")
  return {statistic: wrapper["kwargs"][name] for statistic, name in STATISTICS.items()}


def _model(m: ml_collections.ConfigDict, forward: dict, noise_channels: int):
  latent = _dense(forward["latent_dense_kwargs"], "latent_dense_kwargs", normalized=True)
  m.latent_size = latent
  m.noise_channels = noise_channels
  conditioning = forward.get("norm_conditioning_latent_dense_kwargs") or {}
  path = "noisy_function_kwargs.norm_conditioning_latent_dense_kwargs"
  for key, expected in (("num_hidden_layers", 0), ("with_bias", False),
                        ("activation_normalization", None), ("activate_final", False),
                        ("output_size", noise_channels)):
    _expect(conditioning.get(key), expected, f"{path}.{key}")
  output = forward["output_dense_kwargs"]
  for key, expected in (("hidden_size", latent), ("num_hidden_layers", 1),
                        ("activation", "swish"), ("activate_final", False),
                        ("activation_normalization", None)):
    _expect(output.get(key), expected, f"noisy_function_kwargs.output_dense_kwargs.{key}")
  _expect(dict(forward["spatial_features_kwargs"]), SPATIAL_FEATURES,
          "noisy_function_kwargs.spatial_features_kwargs")
  _expect(tuple(forward.get("extra_dims_to_split") or ()), (),
          "noisy_function_kwargs.extra_dims_to_split")
  m.mesh_levels = int(forward["mesh_num_splits"])
  for stage in ("grid_to_mesh_gnn", "mesh_gnn", "mesh_to_grid_gnn"):
    m[f"remat_{stage}"] = bool(forward.get(f"remat_{stage}", False))
  encoder = _points_mesh_gnn(forward["points_to_mesh_model_ctor"], "points_to_mesh_model_ctor",
                             latent, to_mesh=True)
  decoder = _points_mesh_gnn(forward["mesh_to_grid_model_ctor"], "mesh_to_grid_model_ctor",
                             latent, to_mesh=False)
  _expect(decoder["edge_size"], encoder["edge_size"], "the two GNNs' edge_encoder output_size")
  m.edge_latent_size = encoder["edge_size"]
  m.radius_fraction = encoder["radius_fraction"]
  m.grid_to_mesh_gather_from_receivers = encoder["gather_from_receivers"]
  m.grid_to_mesh_aggregate_normalization = encoder["aggregate_normalization"]
  _transformer(m, forward["mesh_model_ctor"], latent)


def _dense(kwargs: dict, path: str, *, normalized: bool) -> int:
  """The width of a WeatherNext 2 `DenseLayer` shaped as wnscale's MLP; else an error."""
  size = int(kwargs["output_size"])
  expected = {"hidden_size": size, "num_hidden_layers": 1, "activation": "swish",
              "activate_final": False}
  if normalized:
    expected["activation_normalization"] = "layer_norm"
  for key, value in expected.items():
    _expect(kwargs.get(key), value, f"{path}.{key}")
  if normalized:
    _expect(dict(kwargs.get("activation_normalization_kwargs") or {}),
            {"use_norm_conditioning": True}, f"{path}.activation_normalization_kwargs")
  return size


def _points_mesh_gnn(ctor: Buildable, path: str, latent: int, *, to_mesh: bool) -> dict:
  """A `PointsMeshTypedGraphGNN` partial's settings wnscale expresses; else an error."""
  path = f"noisy_function_kwargs.{path}"
  args = ctor.arguments
  _expect(ctor.fn.name, "PointsMeshTypedGraphGNN", path)
  _expect(bool(args["is_points_to_mesh"]), to_mesh, f"{path}.is_points_to_mesh")
  _expect(args["connectivity_type"].name,
          "BALL_QUERY" if to_mesh else "IN_TRIANGLE",
          f"{path}.connectivity_type")
  _expect(bool(args.get("stacked_points_inputs", False)), False,
          f"{path}.stacked_points_inputs")
  _expect(_dense(args["dense_kwargs"], f"{path}.dense_kwargs", normalized=True), latent,
          f"{path}.dense_kwargs.output_size")
  edge_size = _dense(args["edge_encoder_dense_kwargs"], f"{path}.edge_encoder_dense_kwargs",
                     normalized=True)
  _expect(dict(args["spatial_edge_features_kwargs"]), EDGE_FEATURES,
          f"{path}.spatial_edge_features_kwargs")
  gnn = args["deep_gnn_kwargs"]
  _expect(gnn.get("num_message_passing_steps"), 1, f"{path}.deep_gnn_kwargs."
          "num_message_passing_steps")
  _expect(bool(gnn.get("f32_aggregation", True)), True,
          f"{path}.deep_gnn_kwargs.f32_aggregation")
  settings = {"edge_size": edge_size,
              "gather_from_receivers": bool(gnn.get("gather_from_receivers", True)),
              "aggregate_normalization": float(gnn.get("aggregate_normalization") or 1.0)}
  if to_mesh:
    settings["radius_fraction"] = float(args["ball_query_radius_fraction"])
  else:  # the decoder as wnscale runs it: receivers seen, sums as they are
    _expect(settings["gather_from_receivers"], True,
            f"{path}.deep_gnn_kwargs.gather_from_receivers")
    _expect(settings["aggregate_normalization"], 1.0,
            f"{path}.deep_gnn_kwargs.aggregate_normalization")
  return settings


def _transformer(m: ml_collections.ConfigDict, ctor: Buildable, latent: int):
  path = "noisy_function_kwargs.mesh_model_ctor"
  _expect(ctor.fn.name, "MeshSparseTransformer", path)
  kwargs = ctor.arguments["transformer_kwargs"]
  path += ".transformer_kwargs"
  _expect(int(kwargs["d_model"]), latent, f"{path}.d_model")
  if kwargs.get("attention_type") not in ATTENTION_TYPES:
    raise UserError(f"{path}.attention_type={kwargs.get('attention_type')!r}: wnscale "
                    f"computes {ATTENTION_TYPES} (one function)")
  _expect(kwargs.get("activation", "gelu"), "gelu", f"{path}.activation")
  for key in ("key_size", "value_size"):
    _expect(kwargs.get(key), None, f"{path}.{key}")
  m.processor = "transformer"
  m.transformer_layers = int(kwargs["num_layers"])
  m.transformer_heads = int(kwargs["num_heads"])
  m.transformer_ffw_size = int(kwargs.get("ffw_hidden") or 4 * latent)
  m.transformer_k_hop = int(kwargs["attention_k_hop"])


def _noise_channels(kwargs: dict, forward: dict) -> int:
  """The noise's width: one `noise` input `[batch, noise_channels]`, the norms' conditioning."""
  noise = (kwargs.get("noise_generator_kwargs") or {}).get("noise_var_dict") or {}
  _expect(sorted(noise), ["noise"], "predictor_kwargs.noise_generator_kwargs.noise_var_dict")
  _expect(noise["noise"].get("source"), "input", "noise_var_dict.noise.source")
  shape = tuple(tuple(dim) for dim in noise["noise"]["non_batch_shape"])
  if len(shape) != 1 or shape[0][0] != "noise_channels":
    raise UserError(f"noise_var_dict.noise.non_batch_shape={shape}: wnscale's noise is one "
                    "vector per member, [noise_channels]")
  _expect(tuple(forward.get("norm_conditioning_features") or ()), ("noise",),
          "noisy_function_kwargs.norm_conditioning_features")
  return int(shape[0][1])


def _task(d: ml_collections.ConfigDict, task: dict):
  """The data keys of WeatherNext 2's `TaskConfig`."""
  inputs, targets = tuple(task["input_variables"]), tuple(task["target_variables"])
  forcings = tuple(task["forcing_variables"])
  known = lambda name: (name in variables_lib.VARIABLES or name in variables_lib.STATIC_VARIABLES
                        or name in variables_lib.FORCING_CHANNELS)
  unknown = sorted({name for name in inputs + targets + forcings if not known(name)})
  if unknown:
    raise UserError(f"task: variables wnscale does not know: {unknown}")
  statics = [name for name in variables_lib.STATIC_VARIABLES if name not in inputs]
  if statics:
    raise UserError(f"task.input_variables lack the statics {statics}; wnscale's model takes "
                    f"{variables_lib.STATIC_VARIABLES}")
  others = [name for name in inputs if name not in targets + forcings
            + variables_lib.STATIC_VARIABLES]
  if others:
    raise UserError(f"task.input_variables {others} are neither targets, forcings nor "
                    "statics; wnscale cannot feed them")
  not_input = [name for name in forcings if name not in inputs]
  if not_input:
    raise UserError(f"task.forcing_variables {not_input} are not inputs too; wnscale feeds "
                    "forcings at the input times and the target time")
  d.variables = tuple(name for name in targets if name in inputs)
  d.target_only_variables = tuple(name for name in targets if name not in inputs)
  d.pressure_levels = tuple(int(level) for level in task["pressure_levels"])
  # Forcings without a position are WeatherNext 2's global inputs (grid and mesh encoders).
  d.global_forcings = tuple(name for name in forcings if name in forcings_lib.GLOBAL_FORCINGS)
  d.forcings = tuple(name for name in forcings if name not in forcings_lib.GLOBAL_FORCINGS)
  d.stored_forcings = tuple(name for name in d.forcings
                            if name in graphcast_config.READ_FROM_DATA)
  d.input_normalization = "all"
  d.input_steps = graphcast_config.input_steps(task["input_duration"], d.time_step_hours)


def _wrappers(config: ml_collections.ConfigDict, wrappers: list):
  names = [wrapper["constructor"].name for wrapper in wrappers]
  known = ("InputsAndResiduals", "NaNCleaner", "Predictor", "WithSampleDim")
  unknown = [name for name in names if name not in known]
  if unknown or not names or names[0] != "InputsAndResiduals":
    raise UserError(f"predictor_wrappers {names}: wnscale runs InputsAndResiduals first, "
                    f"then any of {known[1:]}")
  cleaners = [wrapper["kwargs"] for wrapper in wrappers if wrapper["constructor"].name ==
              "NaNCleaner"]
  for cleaner in cleaners:
    _expect(bool(cleaner.get("reintroduce_nans", False)), True,
            "NaNCleaner.reintroduce_nans (wnscale's forecasts keep the inputs' NaN)")
    name = cleaner["var_to_clean"]
    value = float(np.asarray(cleaner["fill_value"][name].values))
    config.data.nan_fill_values += (f"{name}:{value!r}",)
  for wrapper in wrappers:
    kwargs = wrapper.get("kwargs") or {}
    if wrapper["constructor"].name == "Predictor":  # autoregressive
      config.train.remat_rollout = bool(kwargs.get("gradient_checkpointing", False))
    if wrapper["constructor"].name == "WithSampleDim":
      config.train.ensemble_members = int(kwargs["num_samples"])


def _loss_weights(loss_kwargs: dict, d: ml_collections.ConfigDict) -> tuple[str, ...]:
  """`train.variable_loss_weights` entries: WeatherNext 2's weight (1 where it names none)
  of each output whose catalogue weight differs."""
  given = loss_kwargs.get("per_variable_weights") or {}
  outputs = tuple(d.variables) + tuple(d.target_only_variables)
  weights = {name: float(given.get(name, 1.0)) for name in outputs}
  return tuple(f"{name}:{weight!r}" for name, weight in weights.items()
               if weight != variables_lib.lookup(name).loss_weight)


def _wrapper(wrappers: list, name: str) -> dict:
  for wrapper in wrappers:
    if wrapper["constructor"].name == name:
      return wrapper
  raise UserError(f"predictor_wrappers have no {name}")


def _output_activation(name: str, activation) -> str:
  """`model.output_activations` entry of a `per_var_activation_fns` item."""
  path = f"noisy_function_kwargs.per_var_activation_fns.{name}"
  function, kwargs = activation
  _expect(function.name, "shifted_activation", path)
  _expect(kwargs.get("output_scale"), None, f"{path}.output_scale")
  return f"{name}:{kwargs['activation_fn'].name}:{float(kwargs.get('input_offset') or 0.0)!r}"


def _expect(value, expected, path: str):
  if value != expected:
    raise UserError(f"{path}={value!r}: wnscale's model has {expected!r} there")
