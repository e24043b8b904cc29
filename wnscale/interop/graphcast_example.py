"""Predictions for GraphCast's example files, in the format GraphCast returns them.

An example file (GraphCast's datasets, e.g. `source-era5_date-2022-01-01_res-1.0_
levels-13_steps-01.nc`) holds dims `batch, time, lat, lon, level`: `time` is the
time since the first one (timedelta), the coordinate `datetime (batch, time)`
the date; latitude in either order; statics on `(lat, lon)`. The first
`data.input_steps` times are the inputs; the later ones are targets, whose
values are not used, but the forcings the model reads from the data (the solar
radiation) are needed at those times.

The predictions come back as GraphCast's predictor returns them: the target
variables sorted by name, dims `(time, batch, [level,] lat, lon)`, `time` the
lead times after the last input (6 h, 12 h, ...), coordinates `time`, `lat`,
`lon`, `level` as the example has them (latitude in the example's order).

The model runs through `inference.predictor.Predictor` (the xarray boundary), on
one device, one batch member at a time (their dates may differ).

An FGN (WeatherNext 2) forecasts `members` ensemble members, each with its own
noise (`noise`: a file, or a seed); GenCast's denoiser samples `members` members with
the noise fields `launch.forecast` draws (from the run's seed, or the integer `noise`),
so member `k` equals that forecast's member `k`. The predictions then have a leading
`sample` dim, as WeatherNext 2's do.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import xarray as xr

from wnscale import outputs as outputs_lib
from wnscale import paths
from wnscale import specs as specs_lib
from wnscale.assembly import assemble
from wnscale.data import netcdf, run_data
from wnscale.data import variables as variables_lib
from wnscale.errors import ArgumentError, UserError
from wnscale.graphs.points import PointSet
from wnscale.inference.predictor import Predictor
from wnscale.inference.rollout import denoiser_sampler, init_hours
from wnscale.model import ensemble
from wnscale.sharding import mesh as mesh_lib
from wnscale.train.run_directory import RunDirectory


def predict_example(workdir: str, example_path: str, out_path: str,
                    steps: int | None = None, overwrite: bool = False,
                    members: int | None = None, noise: str | None = None,
                    params: str | None = None) -> xr.Dataset:
  """Predicts `steps` lead times (default: as many as the example has targets) and writes
  them to `out_path` (NetCDF, whole or not at all); returns them.

  Args:
    overwrite: replace an existing file at `out_path` (checked first: `outputs.check`).
    members: an ensemble's size (an FGN's or a denoiser's; required for one; none for a
      deterministic run).
    noise: an FGN's noise: an `.npz` file whose `noise` is `[members, K]` (each
      member's noise at every lead time) or `[members, steps, K]`, or an integer
      seed (`ensemble.forecast_noise` of that seed, initial time and member); a
      denoiser's: an integer seed of its noise fields (default: the run's seed,
      `launch.forecast`'s; `sampler.forecast_keys`).
    params: "ema" or "raw" (`run_directory.PARAMS`); default: the moving average of the
      parameters when the run kept one.

  Raises:
    ValueError: the example does not fit the run's model (naming what), or
      `out_path` exists (without `overwrite`) or cannot be written.
  """
  outputs_lib.check(out_path, outputs_lib.NETCDF, argument="out_path", overwrite=overwrite)
  example = netcdf.load(example_path)  # before the model: a wrong file is said at once
  run = RunDirectory(workdir, argument="workdir")
  specs = specs_lib.from_config(run.read_config())
  d = specs.data
  steps = _check_example(example, d, steps, example_path)
  ensemble_of = _ensemble(specs, members, noise, steps)
  grid = PointSet.regular(np.sort(example["lat"].values), example["lon"].values)
  assembly = assemble(specs, grid, run_data.resolve_stats(d), mesh_lib.single_device_mesh())
  restored, _ = run.restore_params(assembly.params, which=params)
  predictor = Predictor(specs, assembly, restored)
  rows = []
  for row in range(example.sizes["batch"]):
    inputs, statics, forcings = _member_inputs(example.isel(batch=row), d)
    if ensemble_of is None:
      rows.append(predictor(inputs, statics, num_steps=steps, forcings=forcings))
    else:  # the ensemble as a batch of members
      members_forecast = predictor(
          inputs.expand_dims(batch=members), statics, num_steps=steps, forcings=forcings,
          **ensemble_of(np.datetime64(inputs["time"].values[-1], "h")))
      rows.append(members_forecast.rename({"batch": "sample"}))
  predictions = _reference_format(rows, example, d)
  with outputs_lib.writing(out_path, "nothing was written"):
    paths.write_bytes(paths.normalize(out_path), netcdf.to_bytes(predictions))
  return predictions


def _check_example(example: xr.Dataset, data: specs_lib.DataSpec, steps: int | None,
                   path: str) -> int:
  """The number of lead times to predict; a clear error for an example that does not fit."""
  for dim in ("batch", "time", "lat", "lon"):
    if dim not in example.dims:
      raise UserError(f"{path} has dims {tuple(example.dims)}; GraphCast's example files "
                       "have batch, time, lat, lon (and level)")
  if "datetime" not in example.coords:
    raise UserError(f"{path} has no 'datetime' coordinate (batch, time)")
  needed = (tuple(data.variables) + tuple(data.stored_forcings)
            + variables_lib.STATIC_VARIABLES)
  missing = [name for name in needed if name not in example]
  if missing:
    raise UserError(f"{path} lacks {missing}, which the model reads; it has {sorted(example)}")
  levels = [int(level) for level in example["level"].values] if "level" in example.dims else []
  absent = [level for level in data.pressure_levels if level not in levels]
  if absent and any(variables_lib.is_atmospheric(name) for name in data.variables):
    raise UserError(f"{path} has levels {levels}; the model needs {list(data.pressure_levels)}")
  step = pd.Timedelta(hours=data.time_step_hours)
  spacing = np.diff(example["time"].values)
  if len(spacing) and not np.all(spacing == step.to_timedelta64()):
    raise UserError(f"{path}'s times are not {data.time_step_hours} h apart: "
                     f"{example['time'].values}")
  targets = example.sizes["time"] - data.input_steps
  if targets < 0:
    raise UserError(f"{path} has {example.sizes['time']} time(s); the model needs "
                     f"{data.input_steps} inputs")
  if steps is None:
    steps = targets
  if steps < 1:
    raise UserError(f"Nothing to predict: {path} has no target times after its "
                     f"{data.input_steps} inputs; ask for a number of steps")
  if data.stored_forcings and steps > targets:
    raise UserError(f"{steps} lead times asked for, but {path} has {targets} target time(s); "
                     f"the model reads {list(data.stored_forcings)} from the data at each.")
  return steps


def _ensemble(specs: specs_lib.Specs, members: int | None, noise: str | None, steps: int):
  """None for a deterministic run; else `init time -> the Predictor's keyword arguments`
  for the `members` rows of an ensemble: an FGN's `noise` `[members, steps, K]`, or a
  denoiser's `members` and `seed`."""
  channels = specs.model.noise_channels
  denoiser = denoiser_sampler(specs.model) is not None
  if not channels and not denoiser:
    if members is not None or noise is not None:
      raise ArgumentError("members" if members is not None else "noise",
                          members if members is not None else noise,
                          "is for an ensemble run (an FGN: model.noise_channels > 0; "
                          "GenCast's denoiser: model.denoiser_noise_frequencies > 0); this "
                          "one is deterministic")
    return None
  if members is None or members < 1:
    raise ArgumentError("members", members, "must be >= 1: the run is an ensemble model (" + (
        "GenCast's denoiser)" if denoiser else "an FGN)"))
  seed = int(noise) if noise is not None and noise.lstrip("-").isdigit() else None
  if denoiser:  # its noise fields drawn as launch.forecast draws them, from a seed
    if noise is not None and seed is None:
      raise ArgumentError("noise", noise, "must be an integer seed for GenCast's denoiser "
                          "(default: the run's seed)")
    return lambda init_time: {"members": np.arange(members), "seed": seed}
  if noise is None:
    raise ArgumentError("noise", None, "is required for an FGN run: a .npz file of "
                        "[members, noise_channels] noise, or a seed")
  if seed is not None:
    key = ensemble.noise_key(seed)

    def seeded(init_time):  # as launch.forecast draws them: the stream is the initial time
      streams = np.full(members, init_hours(init_time), np.int32)
      return {"noise": np.stack([np.asarray(ensemble.forecast_noise(
          key, streams, np.arange(members, dtype=np.int32), lead, channels))
                                 for lead in range(steps)], axis=1)}

    return seeded
  with np.load(io.BytesIO(paths.read_bytes(paths.normalize(noise)))) as file:
    if "noise" not in file.files:
      raise ArgumentError("noise", noise, f"has no 'noise' array (it has {file.files})")
    values = np.asarray(file["noise"], np.float32)
  if values.ndim == 2:
    values = np.broadcast_to(values[:, None], (values.shape[0], steps, values.shape[1]))
  if values.ndim != 3 or values.shape[0] < members or values.shape[1] < steps or (
      values.shape[2] != channels):
    raise ArgumentError("noise", noise, f"holds noise {list(values.shape)}; {members} "
                        f"members of {steps} steps need [{members}, ({steps},) {channels}]")
  return lambda init_time: {"noise": values[:members, :steps]}


def _member_inputs(member: xr.Dataset, data: specs_lib.DataSpec):
  """`(inputs, statics, forcings)` of one batch member, in wnscale's naming."""
  member = member.assign_coords(time=member["datetime"].values).drop_vars("datetime")
  member = member.rename({"lat": "latitude", "lon": "longitude"})
  inputs = member[list(data.variables)].isel(time=slice(0, data.input_steps))
  statics = member[list(variables_lib.STATIC_VARIABLES)]
  forcings = member[[name for name in data.forcings if name in member]]
  return inputs, statics, forcings


def _reference_format(rows: list, example: xr.Dataset,
                      data: specs_lib.DataSpec) -> xr.Dataset:
  """Each batch row's forecast (latitude in the example's order) -> one Dataset as GraphCast's
  predictor returns it (an ensemble's with a leading `sample` dim, as WeatherNext 2's)."""
  forecast = xr.concat(rows, dim="batch")
  sample = ("sample",) if "sample" in forecast.dims else ()
  lead_times = np.arange(1, forecast.sizes["time"] + 1) * np.timedelta64(
      data.time_step_hours, "h")
  variables = {}
  for name in sorted(forecast.data_vars):
    field = forecast[name].rename({"latitude": "lat", "longitude": "lon"})
    level = ("level",) if "level" in field.dims else ()
    field = field.transpose(*sample, "time", "batch", *level, "lat", "lon")
    variables[name] = (field.dims, field.values)
  coords = {"time": lead_times.astype("timedelta64[ns]"), "lat": example["lat"].values,
            "lon": example["lon"].values}
  if sample:
    coords["sample"] = np.arange(forecast.sizes["sample"])
  if any("level" in forecast[name].dims for name in forecast.data_vars):
    coords["level"] = example["level"].sel(level=list(data.pressure_levels)).values
  return xr.Dataset(variables, coords=coords)
