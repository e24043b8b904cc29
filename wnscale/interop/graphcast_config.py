"""A GraphCast checkpoint's `ModelConfig` and `TaskConfig` as a wnscale config, and the
channel orders of the two implementations.

How the task maps onto wnscale's data contract (`wnscale.data.variables`):
  * targets that are also inputs are the state (`data.variables`), in the
    task's order; targets that are not inputs are `data.target_only_variables`
    (predicted outright, un-normalized with mean and std);
  * `forcing_variables` are `data.forcings` (each also an input: GraphCast feeds
    forcings at the input times and the target time); the solar radiation is
    read from the data (`data.stored_forcings`), as GraphCast takes ERA5's
    field from its datasets; the day and year progresses are computed, as
    GraphCast derives them from the time;
  * the statics are both of `variables.STATIC_VARIABLES`;
  * every input is normalized, as GraphCast's `InputsAndResiduals` does
    (`data.input_normalization="all"`), with the checkpoint's statistics.
Anything else (an input that is neither state, forcing nor static, an unknown
variable, more than one hidden layer) is an error naming it.

The way back (`graphcast_configs`, for `graphcast_export`): GraphCast's configs
of a wnscale config, checked by mapping them forward again (`wnscale_config`):
a run whose model or data keys (all but `NOT_EXPORTED`, those that do not
change what the parameters compute) come out different is one GraphCast
cannot express, and the first such key is named.

Channel orders. GraphCast stacks its grid inputs as every input variable
(statics included) sorted by name, each time-major then by level, then the
forcings at the target time sorted by name, then 3 structural node features;
its outputs are the targets sorted by name, each by level. wnscale's are in
`wnscale.model.forecast` (state history, forcings at every time, statics) and
`variables.py`. Both are lists of `(name, step, level)` keys here: `step` 0 is
the last input time, -1 the one before, +1 the target time; None for statics;
`level` None for a surface variable.
"""

from __future__ import annotations

import ml_collections
import pandas as pd

from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.data import variables as variables_lib
from wnscale.errors import UserError
from wnscale.model import processors

# Forcings GraphCast takes from its datasets rather than computing them.
READ_FROM_DATA = ("toa_incident_solar_radiation",)


def wnscale_config(model_config: dict, task_config: dict,
                   stats_path: str) -> ml_collections.ConfigDict:
  """The validated wnscale config of a checkpoint's model and task.

  Args:
    model_config, task_config: `graphcast_checkpoint.GraphCastCheckpoint`'s.
    stats_path: the run's statistics (a directory of GraphCast's three files).

  Raises:
    ValueError: a setting wnscale cannot run, named.
  """
  if model_config["hidden_layers"] != 1:
    raise UserError(f"The checkpoint's MLPs have hidden_layers="
                     f"{model_config['hidden_layers']}; wnscale's have 1 (GraphCast's "
                     "published models).")
  config = config_lib.default_config()
  m, d = config.model, config.data
  m.latent_size = int(model_config["latent_size"])
  m.mesh_levels = int(model_config["mesh_size"])
  m.message_passing_steps = int(model_config["gnn_msg_steps"])
  m.radius_fraction = float(model_config["radius_query_fraction_edge_length"])
  # None (absent): divided by the longest mesh-to-grid edge, which is wnscale's 0.
  m.mesh_to_grid_edge_normalization = float(
      model_config.get("mesh2grid_edge_normalization_factor") or 0.0)
  apply_task(config, task_config)
  if "resolution" in model_config:
    d.resolution = float(model_config["resolution"])
  d.stats_path = stats_path
  return config_lib.validate(config)


def apply_task(config: ml_collections.ConfigDict, task_config: dict):
  """Sets `config.data`'s variables, levels, forcings and input steps from a GraphCast
  `TaskConfig` (the module docstring's mapping; `data.time_step_hours` as set).

  Raises:
    UserError: a variable wnscale does not know, or an input it cannot feed, named.
  """
  inputs, targets = task_config["input_variables"], task_config["target_variables"]
  forcings = task_config["forcing_variables"]
  unknown = [name for name in inputs + targets + forcings if not _known(name)]
  if unknown:
    raise UserError(f"The checkpoint's task has variables wnscale does not know: "
                     f"{sorted(set(unknown))}")
  not_input = [name for name in forcings if name not in inputs]
  if not_input:
    raise UserError(f"Forcings {not_input} are not inputs of the checkpoint's task; wnscale "
                     "feeds forcings at the input times and the target time.")
  statics = [name for name in variables_lib.STATIC_VARIABLES if name not in inputs]
  if statics:
    raise UserError(f"The checkpoint's task lacks the statics {statics}; wnscale's model "
                     f"takes {variables_lib.STATIC_VARIABLES}.")
  others = [name for name in inputs if name not in targets and name not in forcings
            and name not in variables_lib.STATIC_VARIABLES]
  if others:
    raise UserError(f"Inputs {others} of the checkpoint's task are neither targets, forcings "
                     "nor statics; wnscale cannot feed them.")
  d = config.data
  d.variables = tuple(name for name in targets if name in inputs)
  d.target_only_variables = tuple(name for name in targets if name not in inputs)
  d.pressure_levels = tuple(int(level) for level in task_config["pressure_levels"])
  d.forcings = tuple(forcings)
  d.stored_forcings = tuple(name for name in forcings if name in READ_FROM_DATA)
  d.input_normalization = "all"
  d.input_steps = input_steps(task_config["input_duration"], d.time_step_hours)


# Keys that do not change what the parameters compute (how it is computed, which data it
# trains on, where): a run may set them as it likes and still be exported. Every other
# model and data key must be what GraphCast's configs map to.
NOT_EXPORTED = {
    # the remat's and the dtype (how it computes), and the processor keys it does not read
    # (model.processor itself is compared)
    "model": (tuple(specs_lib.RematSpec.config_keys()) + ("dtype",)
              + processors.keys_not_exported("interaction_network")),
    "data": ("path", "member", "synthetic", "stats_path", "regional_path", "region",
             "regional_loss_weight", "resolution", "grid", "target_steps", "train_start",
             "train_end", "eval_start", "eval_end", "worker_count"),
}


def graphcast_configs(config: ml_collections.ConfigDict) -> tuple[dict, dict]:
  """`(model_config, task_config)`: GraphCast's `ModelConfig` and `TaskConfig` fields of a
  run's `config`, as `graphcast_checkpoint.GraphCastCheckpoint` holds them.

  Inputs are the state, the forcings and the statics (in that order), targets the
  state and the target-only variables.

  Raises:
    UserError: `config` is a model GraphCast's code cannot run (`check_expressible`).
  """
  m, d = config.model, config.data
  model_config = {
      "resolution": float(d.resolution), "mesh_size": int(m.mesh_levels),
      "latent_size": int(m.latent_size), "gnn_msg_steps": int(m.message_passing_steps),
      "hidden_layers": 1, "radius_query_fraction_edge_length": float(m.radius_fraction)}
  if m.mesh_to_grid_edge_normalization:  # 0: the longest edge, GraphCast's None
    model_config["mesh2grid_edge_normalization_factor"] = float(
        m.mesh_to_grid_edge_normalization)
  task_config = {
      "input_variables": (tuple(d.variables) + tuple(d.forcings)
                          + tuple(variables_lib.STATIC_VARIABLES)),
      "target_variables": tuple(d.variables) + tuple(d.target_only_variables),
      "forcing_variables": tuple(d.forcings),
      "pressure_levels": tuple(int(level) for level in d.pressure_levels),
      "input_duration": f"{d.input_steps * d.time_step_hours}h"}
  check_expressible(config, model_config, task_config)
  return model_config, task_config


def check_expressible(config: ml_collections.ConfigDict, model_config: dict,
                      task_config: dict):
  """A `UserError` naming the first model or data key of `config` (outside
  `NOT_EXPORTED`) that differs from what `model_config` and `task_config` map to (those
  of `_WHY`, the kind of model, first)."""
  try:
    mapped = wnscale_config(model_config, task_config, config.data.stats_path)
  except UserError as error:
    raise UserError(f"GraphCast cannot express this run: {error}") from error
  for section in ("model", "data"):
    # The keys that say what kind of model a run is first, then the others.
    for key in sorted(config[section], key=lambda key: key not in _WHY):
      if key in NOT_EXPORTED[section]:
        continue
      value, expected = plain(config[section][key]), plain(mapped[section][key])
      if value != expected:
        raise UserError(
            f"GraphCast's model cannot express this run's {section}.{key}={value!r}: "
            f"GraphCast's is {expected!r}{_WHY.get(key, '')}. Only runs GraphCast's code can "
            "run are exported (interaction-network processor, deterministic, GraphCast's "
            "inputs).")


# What a refused key means, for the message.
_WHY = {
    "processor": " (its processor is an interaction network)",
    "noise_channels": " (deterministic: an FGN's noise-conditioned layer norms have no "
                      "counterpart)",
    "modalities": " (the grid alone)",
    "input_normalization": " (it normalizes every input, forcings and statics too)",
    "stored_forcings": " (it reads the solar radiation from its data, ERA5's)",
    "global_forcings": " (no inputs without position)",
}


def plain(value):
  """Lists as tuples, recursively (a config read from JSON holds lists)."""
  if isinstance(value, (list, tuple)):
    return tuple(plain(item) for item in value)
  return value


def _known(name: str) -> bool:
  return (name in variables_lib.VARIABLES or name in variables_lib.FORCING_CHANNELS
          or name in variables_lib.STATIC_VARIABLES)


def input_steps(duration: str, time_step_hours: int) -> int:
  """Input times in GraphCast's `input_duration` (e.g. "12h": t - 6h and t)."""
  try:
    hours = pd.Timedelta(duration) / pd.Timedelta(hours=1)
  except ValueError as error:
    raise UserError(f"task_config:input_duration={duration!r} is not a duration") from error
  steps = hours / time_step_hours
  if steps < 1 or not float(steps).is_integer():
    raise UserError(f"task_config:input_duration={duration!r} is not a positive multiple of "
                     f"the {time_step_hours} h time step")
  return int(steps)


def channel_keys(name: str, steps, levels) -> list[tuple]:
  """`(name, step, level)` of a variable's channels at `steps` (the module docstring's keys)."""
  if name in variables_lib.STATIC_VARIABLES:
    return [(name, None, None)]
  if variables_lib.is_atmospheric(name):
    return [(name, step, level) for step in steps for level in levels]
  return [(name, step, None) for step in steps]


def reference_input_channels(task_config: dict, time_step_hours: int = 6) -> list[tuple]:
  """GraphCast's grid input channels (before the structural features), in order."""
  levels = task_config["pressure_levels"]
  steps = range(1 - input_steps(task_config["input_duration"], time_step_hours), 1)
  keys = [key for name in sorted(task_config["input_variables"])
          for key in channel_keys(name, steps, levels)]
  return keys + [(name, 1, None) for name in sorted(task_config["forcing_variables"])]


def reference_output_channels(task_config: dict) -> list[tuple]:
  levels = task_config["pressure_levels"]
  return [key for name in sorted(task_config["target_variables"])
          for key in channel_keys(name, [1], levels)]


def wnscale_input_channels(d: specs_lib.DataSpec) -> list[tuple]:
  """wnscale's grid input channels (`model.forecast.one_step`) of the data `d`, in order."""
  steps = list(range(1 - d.input_steps, 1))
  history = [key for step in steps for name in d.variables
             for key in channel_keys(name, [step], d.pressure_levels)]
  forcings = [(name, step, None) for step in steps + [1] for name in d.forcings]
  statics = [(name, None, None) for name in variables_lib.STATIC_VARIABLES]
  return history + forcings + statics


def wnscale_output_channels(d: specs_lib.DataSpec) -> list[tuple]:
  """wnscale's output channels of the data `d`, in order."""
  return [key for name in d.outputs for key in channel_keys(name, [1], d.pressure_levels)]
