"""The xarray boundary: `xarray.Dataset` in, `xarray.Dataset` out.

Coordinates and metadata stay here, outside jit: the predictor strips the
variables to a normalized `[batch, time, channels, grid]` array, runs the pure
`forecast.rollout`, and puts coordinates back on the result.
"""

from __future__ import annotations

import jax
import numpy as np
import pandas as pd
import xarray as xr
from flax import nnx

from wnscale.data import forcings as forcings_lib
from wnscale.data import variables as variables_lib
from wnscale.data.variables import STATIC_VARIABLES
from wnscale.errors import UserError
from wnscale.model import forecast


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
    if variables_lib.lookup(name).atmospheric:
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
    if variables_lib.lookup(name).atmospheric:
      block = array[:, :, channel:channel + len(levels)]
      fields[name] = (grid_dims[:2] + ("level",) + grid_dims[2:],
                      block.reshape(block.shape[:3] + grid_shape))
      channel += len(levels)
    else:
      fields[name] = (grid_dims, array[:, :, channel].reshape(array.shape[:2] + grid_shape))
      channel += 1
  return xr.Dataset(fields, coords=dict(coords, level=np.asarray(levels)))


class Predictor:
  """Forecasts from xarray inputs with a trained model.

  Args:
    graphdef, params: the model (`nnx.split`).
    constants: host `forecast.Constants` for the model's grid.
    channel_stats: `{"mean", "std"}` `[C]`; static_stats: `{"mean", "std"}` `[2]`.
    variables, levels: the state layout the model was trained on.
    global_forcings: the model's global forcings (`data.global_forcings`).
  """

  def __init__(self, graphdef, params, constants: forecast.Constants, channel_stats: dict,
               static_stats: dict, variables, levels, time_step_hours: int = 6,
               global_forcings=()):
    self.params = params
    self.constants = jax.device_put(constants)
    self.mean = np.asarray(channel_stats["mean"], np.float32)
    self.std = np.asarray(channel_stats["std"], np.float32)
    self.static_stats = static_stats
    self.variables, self.levels = tuple(variables), tuple(levels)
    self.time_step = pd.Timedelta(hours=time_step_hours)
    self.global_forcings = tuple(global_forcings)
    self._rollout = jax.jit(
        lambda params, constants, batch: forecast.rollout(nnx.merge(graphdef, params),
                                                          constants, batch))

  def __call__(self, inputs: xr.Dataset, statics: xr.Dataset, num_steps: int = 1,
               forcings: xr.Dataset | None = None) -> xr.Dataset:
    """Forecasts `num_steps` time steps after the last input time.

    Args:
      inputs: the state at the input times, `(time, [level,] latitude, longitude)`
        (optionally with a leading `batch` dim), latitude in either order.
      statics: `geopotential_at_surface` and `land_sea_mask` on the same grid.
      forcings: optional, the `variables.FORCING_CHANNELS` at input and target
        times; computed from time and position if omitted.

    Returns:
      The forecast, `(batch?, time, [level,] latitude, longitude)`, with target
      times and the inputs' latitude order.
    """
    batched = "batch" in inputs.dims
    inputs = inputs if batched else inputs.expand_dims("batch")
    descending = inputs.latitude.values[0] > inputs.latitude.values[-1]
    inputs, statics = inputs.sortby("latitude"), statics.sortby("latitude")
    times = pd.DatetimeIndex(inputs.time.values)
    target_times = pd.DatetimeIndex([times[-1] + self.time_step * k
                                     for k in range(1, num_steps + 1)])
    state = ((dataset_to_channels(inputs, self.variables, self.levels) - self.mean[:, None])
             / self.std[:, None])
    static = np.stack([statics[name].transpose("latitude", "longitude").values.reshape(-1)
                       for name in STATIC_VARIABLES]).astype(np.float32)
    static[0] = (static[0] - self.static_stats["mean"][0]) / self.static_stats["std"][0]
    all_times = times.append(target_times)
    if forcings is None:
      forcing = forcings_lib.compute_forcings(all_times.values, inputs.latitude.values,
                                              inputs.longitude.values)
    else:
      forcing = np.stack([forcings[name].sortby("latitude").sel(time=all_times)
                          .transpose("time", "latitude", "longitude").values
                          .reshape(len(all_times), -1)
                          for name in variables_lib.FORCING_CHANNELS], 1)
    batch_size = inputs.sizes["batch"]
    batch = {
        "inputs": state,
        "forcings": np.broadcast_to(forcing, (batch_size,) + forcing.shape).astype(np.float32),
        "statics": np.broadcast_to(static, (batch_size,) + static.shape),
    }
    if self.global_forcings:
      values = forcings_lib.compute_global_forcings(all_times.values, self.global_forcings)
      batch["globals"] = np.broadcast_to(values, (batch_size,) + values.shape)
    normalized = np.asarray(self._rollout(self.params, self.constants, batch))
    coords = {"batch": inputs.batch.values, "time": target_times.values,
              "latitude": inputs.latitude.values, "longitude": inputs.longitude.values}
    result = channels_to_dataset(normalized * self.std[:, None] + self.mean[:, None],
                                 self.variables, self.levels, coords)
    if descending:
      result = result.isel(latitude=slice(None, None, -1))
    return result if batched else result.isel(batch=0, drop=True)
