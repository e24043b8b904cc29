"""The xarray boundary: `xarray.Dataset` in, `xarray.Dataset` out.

Coordinates and metadata stay here, outside jit: the predictor strips the
variables to normalized `[batch, time, channels, grid]` arrays, steps the
model one lead time at a time with the forecasts' sharded step
(`rollout.ShardedStep`, on a one-device mesh), and puts coordinates back on
the result. A denoiser's (GenCast's) step runs its sampler with the noise
`launch.forecast` draws: member `k` from the last input time `t` at lead `l`
from `(seed, t, k, l)` (`wnscale.model.sampler.forecast_keys`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from wnscale.assembly import Assembly
from wnscale.data import forcings as forcings_lib
from wnscale.data import variables as variables_lib
from wnscale.data.variables import STATIC_VARIABLES
from wnscale.errors import UserError
from wnscale.graphs.points import PointSet
from wnscale.inference.nan_fill import NanFill
from wnscale.inference.rollout import ShardedStep, denoiser_sampler, init_hours
from wnscale.model import sampler as sampler_lib
from wnscale.specs import Specs


def dataset_to_channels(dataset: xr.Dataset, variables, levels) -> np.ndarray:
  """`[..., time, channels, grid]` float32 in the `variables.py` layout.

  `dataset` has `(..., time, [level,] latitude, longitude)` variables with
  latitude ascending; leading dims (e.g. `batch`) are kept.
  """
  parts = []
  for name in variables:
    if name not in dataset:
      raise UserError(f"Input dataset lacks variable {name!r}; it has {sorted(dataset)}.")
    field = dataset[name]
    if variables_lib.is_atmospheric(name):
      field = field.sel(level=list(levels)).transpose(..., "time", "level", "latitude",
                                                       "longitude")
    else:
      field = field.transpose(..., "time", "latitude", "longitude").expand_dims(
          "channel", axis=-3)
    values = field.values
    parts.append(values.reshape(values.shape[:-2] + (-1,)))
  return np.concatenate(parts, axis=-2).astype(np.float32)


def channels_to_dataset(array: np.ndarray, variables, levels, coords: dict) -> xr.Dataset:
  """Inverse of `dataset_to_channels`: `[batch, time, C, grid]` -> Dataset.

  `coords` holds `batch`, `time`, `latitude` (ascending) and `longitude`.
  """
  grid_shape = (len(coords["latitude"]), len(coords["longitude"]))
  fields, channel = {}, 0
  grid_dims = ("batch", "time", "latitude", "longitude")
  for name in variables:
    if variables_lib.is_atmospheric(name):
      block = array[:, :, channel:channel + len(levels)]
      fields[name] = (grid_dims[:2] + ("level",) + grid_dims[2:],
                      block.reshape(block.shape[:3] + grid_shape))
      channel += len(levels)
    else:
      fields[name] = (grid_dims, array[:, :, channel].reshape(array.shape[:2] + grid_shape))
      channel += 1
  return xr.Dataset(fields, coords=dict(coords, level=np.asarray(levels)))


class Predictor:
  """Forecasts from xarray inputs with a trained (or imported) model.

  Args:
    specs: the run's `Specs`; its `data` says what the model reads and predicts
      (variables, target-only variables, levels, forcings computed or stored,
      global forcings, time step).
    assembly: the model on the inputs' grid and a one-device mesh
      (`assemble(..., mesh_lib.single_device_mesh())`), normalized with the
      run's statistics.
    params: the model's parameters (e.g. `assembly.params`, initialized).
  """

  def __init__(self, specs: Specs, assembly: Assembly, params):
    d = specs.data
    self.variables, self.levels = d.variables, d.pressure_levels
    self.outputs = d.outputs
    self.forcings, self.stored_forcings = d.forcings, d.stored_forcings
    self.global_forcings = d.global_forcings
    self.noise_channels = specs.model.noise_channels
    self.input_steps = d.input_steps
    self.time_step = pd.Timedelta(hours=d.time_step_hours)
    self.normalization = norm = assembly.normalization
    self.nan_fill = NanFill(d, norm.mean[:norm.num_state], norm.std[:norm.num_state])
    self.grid = assembly.layout.grid
    self.grid_slots = assembly.layout.grid_slots
    self.seed = specs.seed
    self.sampler = denoiser_sampler(specs.model)
    self.step = ShardedStep(assembly, params, sampler=self.sampler)

  def __call__(self, inputs: xr.Dataset, statics: xr.Dataset, num_steps: int = 1,
               forcings: xr.Dataset | None = None,
               noise: np.ndarray | None = None, members=None,
               seed: int | None = None) -> xr.Dataset:
    """Forecasts `num_steps` time steps after the last input time.

    Args:
      inputs: the state at the input times, `(time, [level,] latitude, longitude)`
        (optionally with a leading `batch` dim), latitude in either order.
      statics: `geopotential_at_surface` and `land_sea_mask` on the same grid.
      num_steps: lead times to forecast, one model step apart.
      forcings: forcings `(time, latitude, longitude)` at the input and target
        times; those it lacks are computed from time and position, except the
        ones the model reads from the data (`data.stored_forcings`), which it
        must hold.
      noise: an FGN's (`model.noise_channels > 0`, required then) standard-normal
        noise: `[batch, noise_channels]` (the same at every lead time) or
        `[batch, num_steps, noise_channels]`; each batch row is one member.
      members: a denoiser's (required then) member of each batch row, `[batch]` ints: row
        `b`'s sampler noise is member `members[b]`'s of `launch.forecast`.
      seed: a denoiser's noise seed (default: the run's, `config.seed`, as
        `launch.forecast`'s).

    A variable of `data.nan_fill_values` enters with its NaN replaced by the
    value, and its forecast is NaN wherever one of its input times was.

    Returns:
      The forecast of the output variables (state, then target-only),
      `(batch?, time, [level,] latitude, longitude)`, with target times and
      the inputs' latitude order.
    """
    batched = "batch" in inputs.dims
    inputs = inputs if batched else inputs.expand_dims("batch")
    descending = inputs.latitude.values[0] > inputs.latitude.values[-1]
    inputs, statics = inputs.sortby("latitude"), statics.sortby("latitude")
    noise = self._check_noise(noise, inputs.sizes["batch"], num_steps)
    times = pd.DatetimeIndex(inputs.time.values)
    members = self._check_members(members, inputs.sizes["batch"])
    target_times = pd.DatetimeIndex([times[-1] + self.time_step * k
                                     for k in range(1, num_steps + 1)])
    norm = self.normalization
    mean, std = norm.mean[:norm.num_state, None], norm.std[:norm.num_state, None]
    state = (dataset_to_channels(inputs, self.variables, self.levels) - mean) / std
    nan_mask = self.nan_fill.clean(state)  # [B, C, G]
    static = np.stack([statics[name].transpose("latitude", "longitude").values.reshape(-1)
                       for name in STATIC_VARIABLES]).astype(np.float32)
    all_times = times.append(target_times)
    forcing = forcings_lib.compute_forcings(
        all_times.values, PointSet.regular(inputs.latitude.values, inputs.longitude.values),
        self.forcings,
        given=self._given_forcings(forcings, all_times))
    batch_size = inputs.sizes["batch"]
    batched_put = lambda key, array, dtype=np.float32: self.step.put(  # noqa: E731
        key, np.broadcast_to(array, (batch_size,) + array.shape), dtype)  # rows: the same
    forcing = self.grid.to_slots(norm.input_scales.forcings(forcing), -1)  # [T, F, slots]
    static = batched_put("statics", self.grid.to_slots(norm.input_scales.statics(static), -1))
    history = self.step.put("inputs", self.grid.to_slots(state, -1))
    refill = self.nan_fill.refill(self.grid.to_slots(nan_mask, -1), self.step.put)
    global_values = (norm.input_scales.globals(forcings_lib.compute_global_forcings(
        all_times.values, self.global_forcings)) if self.global_forcings else None)
    grid_nodes = (None if members is None else  # a denoiser's: each slot's grid node
                  batched_put("grid_nodes", self.grid_slots, np.int32))
    outputs = []
    for lead in range(num_steps):
      window = slice(lead, lead + self.input_steps + 1)  # the history's times and the next
      extra = {} if global_values is None else {
          "globals": batched_put("globals", global_values[window])}
      if noise is not None:
        extra["noise"] = self.step.put("noise", noise[:, lead])
      if members is not None:
        extra["sampler_keys"] = self.step.put("sampler_keys", sampler_lib.forecast_keys(
            self.seed if seed is None else seed,
            np.full(batch_size, init_hours(times[-1]), np.int32), members, lead), np.uint32)
        extra["grid_nodes"] = grid_nodes
      history, step_outputs, _, _ = self.step(history, batched_put("forcings", forcing[window]),
                                        static, extra)
      if refill is not None:  # the fill value again where the inputs were NaN
        history = refill(history)
      outputs.append(self.grid.from_slots(np.asarray(step_outputs), -1))
    normalized = self.nan_fill.reintroduce(np.stack(outputs, axis=1), nan_mask)  # [B, T, C, G]
    coords = {"batch": inputs.batch.values, "time": target_times.values,
              "latitude": inputs.latitude.values, "longitude": inputs.longitude.values}
    result = channels_to_dataset(normalized * norm.std[:, None] + norm.mean[:, None],
                                 self.outputs, self.levels, coords)
    if descending:
      result = result.isel(latitude=slice(None, None, -1))
    return result if batched else result.isel(batch=0, drop=True)

  def _check_noise(self, noise, batch_size: int, num_steps: int) -> np.ndarray | None:
    """`[batch, num_steps, K]` float32 noise, or None for a deterministic model."""
    if not self.noise_channels:
      if noise is not None:
        raise UserError("noise is given, but the model is deterministic "
                        "(model.noise_channels=0).")
      return None
    if noise is None:
      raise UserError(f"The model is an FGN (model.noise_channels={self.noise_channels}): "
                      "pass the noise of each member.")
    noise = np.asarray(noise, np.float32)
    if noise.ndim == 2:
      noise = np.broadcast_to(noise[:, None], (noise.shape[0], num_steps, noise.shape[1]))
    if noise.shape != (batch_size, num_steps, self.noise_channels):
      raise UserError(f"noise has shape {noise.shape}; the forecast needs [batch={batch_size}, "
                      f"(steps={num_steps},) {self.noise_channels}].")
    return noise

  def _check_members(self, members, batch_size: int) -> np.ndarray | None:
    """`[batch]` int32 members of a denoiser's rows, or None for a forecaster."""
    if self.sampler is None:
      if members is not None:
        raise UserError("members are given, but the model is not a denoiser "
                        "(model.denoiser_noise_frequencies=0).")
      return None
    if members is None:
      raise UserError("The model is GenCast's denoiser (model.denoiser_noise_frequencies > 0):"
                      " pass the member of each batch row.")
    members = np.asarray(members, np.int32)
    if members.shape != (batch_size,):
      raise UserError(f"members has shape {members.shape}; the forecast needs [batch="
                      f"{batch_size}].")
    return members

  def _given_forcings(self, forcings: xr.Dataset | None, times) -> dict:
    """`{name: [time, grid]}` of the forcings `forcings` holds, latitude ascending."""
    given = {}
    for name in self.forcings:
      if forcings is not None and name in forcings:
        field = forcings[name].sortby("latitude")
        absent = [t for t in times.values if t not in field.time.values]
        if absent:
          raise ValueError(f"Forcing {name!r} is given at {field.time.values}; the forecast "
                           f"needs it at {times.values} (input and target times).")
        given[name] = (field.sel(time=times.values).transpose("time", "latitude", "longitude")
                       .values.reshape(len(times), -1))
    missing = [name for name in self.stored_forcings if name not in given]
    if missing:
      raise ValueError(f"The model reads {missing} from the data (data.stored_forcings), "
                       "not computed: pass them in `forcings` at the input and target times.")
    return given
