"""Normalization statistics: mean, std, std of model-step changes, per channel.

Either computed from the training time range of a store, in one streaming pass
(time blocks, float64 accumulators, NaN ignored), for the configured variables
and levels, the forcings and the statics; or read from `data.stats_path`: a
file of this module's format, or a directory of GraphCast's published files
(`mean_by_level.nc`, `stddev_by_level.nc`, `diffs_stddev_by_level.nc`).

How inputs are normalized (`data.input_normalization`): the state always as
`(x - mean) / std`; with "all" (GraphCast's way) every forcing and static too;
with "state" (wnscale's own) only the surface geopotential, the land-sea mask
and the forcings entering as they are (`InputScales`).
Computed statistics are cached in `<cache dir>/stats/` under a key of the
store, variables, levels, time range, time step and this code (never beside
the store: a published or remote store is read-only).

The stats dataset has one data variable per store variable, dims
`(statistic[, level])`, `statistic` = `mean`, `std`, `diff_std`,
`nan_first_hour`, `nan_last_hour`.
`diff_std` is the std of `x(t + time_step_hours) - x(t)`, GraphCast's scale for
the residual the model predicts. The pass sees every value, so it also notes
the first and last time (hours since 1970) at which a channel holds a NaN (NaN
if never): a run then finds a NaN in its time range before it compiles anything
(`source.WeatherExampleSource`), at no extra read for a store without NaN.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
import warnings
from typing import TYPE_CHECKING

import numpy as np
import xarray as xr

from wnscale import cache, paths
from wnscale.data import netcdf
from wnscale.data import variables as variables_lib
from wnscale.data.reading import store as store_lib
from wnscale.data.reading import store_formats
from wnscale.data.reading.std_floor import floor_std
from wnscale.errors import UserError

if TYPE_CHECKING:  # the layer above; only its type here
  from wnscale.specs import DataSpec

STATISTICS = ("mean", "std", "diff_std")
# data.input_normalization: which inputs besides the state are normalized (module docstring).
INPUT_NORMALIZATIONS = ("state", "all")
# GraphCast's published statistics: one file per statistic, in one directory.
GRAPHCAST_FILES = {"mean": "mean_by_level.nc", "std": "stddev_by_level.nc",
                   "diff_std": "diffs_stddev_by_level.nc"}
NAN_HOURS = ("nan_first_hour", "nan_last_hour")
# Bytes of (float32) state read per block of the streaming pass.
BLOCK_BYTES = 64 * 2**20


def cached_stats_path(path: str, variables, levels, start: str | None, end: str | None,
                      time_step_hours: int = 6, forcings=(), stored_forcings=(),
                      member: int = 0) -> str:
  """Where `compute_stats`' result for these arguments is cached: `<cache dir>/stats/...nc`."""
  key = json.dumps([paths.normalize(path), list(variables), [int(v) for v in levels],
                    start or "", end or "", time_step_hours, list(forcings),
                    list(stored_forcings), member,
                    cache.source_digest("data/reading/normalization.py", "data/reading/store.py",
                                        "data/forcings.py", "data/reading/anemoi.py",
                                        "data/reading/weatherbench2_zarr.py",
                                        "data/reading/store_formats.py",
                                        "data/reading/std_floor.py")])
  name = paths.normalize(path).rstrip("/").rsplit("/", 1)[-1]
  return cache.cache_path("stats", f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.nc")


def load_or_compute_stats(path: str, variables, levels, start: str | None = None,
                          end: str | None = None, time_step_hours: int = 6, forcings=(),
                          stored_forcings=(), member: int = 0) -> xr.Dataset:
  """The cached statistics of `compute_stats(...)`, computing and caching them if missing."""
  target = cached_stats_path(path, variables, levels, start, end, time_step_hours, forcings,
                             stored_forcings, member)
  if paths.exists(target):
    return from_bytes(paths.read_bytes(target))
  begin = time.perf_counter()
  stats = compute_stats(path, variables, levels, start, end, time_step_hours, forcings,
                        stored_forcings, member)
  cache.write_bytes(target, to_bytes(stats))  # whole or not at all (or not cached)
  logging.info("Computed the statistics of %s (%s .. %s) in %.1f s (one pass); cached in %s",
               path, start, end, time.perf_counter() - begin, target)
  return stats


def to_bytes(stats: xr.Dataset) -> bytes:
  """The statistics as a netCDF file's bytes."""
  return netcdf.to_bytes(stats)


def from_bytes(data: bytes, name: str = "statistics") -> xr.Dataset:
  return netcdf.from_bytes(data, name)


def read_stats(path: str, time_step_hours: int | None = None) -> xr.Dataset:
  """Statistics from `data.stats_path`: a file of this module's format, a directory
  (local or URL) of GraphCast's three files, or an anemoi-datasets store (its own
  statistics, diff_std over `time_step_hours`, the store's step if None)."""
  if paths.exists(paths.join(path, GRAPHCAST_FILES["mean"])):
    return _from_graphcast(path)
  carried = store_formats.format_of(path).statistics
  if carried is not None:
    stats = carried(path, time_step_hours)
    for name in stats.data_vars:  # as computed statistics are floored
      mean = stats[name].sel(statistic="mean").values
      for statistic in ("std", "diff_std"):
        stats[name].loc[dict(statistic=statistic)] = floor_std(
            stats[name].sel(statistic=statistic).values, mean)
    return stats
  if not paths.exists(path):
    raise UserError(f"Statistics not found: {path} (a .nc file written by wnscale, or a "
                     f"directory holding {sorted(GRAPHCAST_FILES.values())})")
  what = (f"a wnscale statistics file (.nc) nor a directory of GraphCast's "
          f"{sorted(GRAPHCAST_FILES.values())}")
  if paths.as_epath(path).is_dir():
    raise UserError(f"{path} is not {what}: it is a directory without them.")
  stats = netcdf.load(path)  # a file that is not netCDF is named there
  if "statistic" not in stats.coords:
    raise UserError(f"{path} is not {what}: it has no 'statistic' coordinate.")
  return stats


def _from_graphcast(directory: str) -> xr.Dataset:
  """GraphCast's files -> this module's format (catalogue variables, forcings, statics).

  Each file holds one data variable per name; atmospheric ones over a `level`
  coordinate (all 37 ERA5 levels, selected later by value), the others
  scalars. Statics have no change, so their diff_std is set to their std; so is
  a forcing's where the diffs file lacks it (WeatherNext 2's files; no forcing
  is predicted, so its diff_std is never used).
  """
  files = {}
  for statistic, name in GRAPHCAST_FILES.items():
    file = paths.join(directory, name)
    if not paths.exists(file):
      raise UserError(f"{directory} has {GRAPHCAST_FILES['mean']} but no {name}")
    files[statistic] = netcdf.load(file)
  data, levels = {}, None
  for name in (tuple(variables_lib.VARIABLES) + variables_lib.FORCING_CHANNELS
               + variables_lib.STATIC_VARIABLES):
    no_change = name in variables_lib.STATIC_VARIABLES or (
        name in variables_lib.FORCING_CHANNELS and name not in files["diff_std"])
    if not all(name in files[s] for s in ("mean", "std") + (() if no_change else ("diff_std",))):
      continue
    columns = [files[s][name] for s in ("mean", "std", "std" if no_change else "diff_std")]
    if "level" in columns[0].dims:
      levels = columns[0]["level"].values
      data[name] = (("statistic", "level"),
                    np.stack([c.transpose("level").values for c in columns]))
    else:
      data[name] = (("statistic",), np.stack([float(c.values) for c in columns]))
  coords = {"statistic": list(STATISTICS)}
  if levels is not None:
    coords["level"] = np.asarray(levels, np.int64)
  return xr.Dataset(data, coords=coords, attrs={"source": directory, "format": "graphcast"})


def to_graphcast(stats: xr.Dataset) -> dict[str, xr.Dataset]:
  """This module's format -> GraphCast's files' datasets (`{statistic: Dataset}`, the
  file of each in `GRAPHCAST_FILES`), the inverse of `_from_graphcast`: every variable in
  each, float64, atmospheric ones over an int32 `level` coordinate, the others scalars."""
  files = {}
  for statistic in GRAPHCAST_FILES:
    data = {}
    for name, values in stats.data_vars.items():
      column = values.sel(statistic=statistic).astype(np.float64)
      data[name] = column.drop_vars("statistic")
    dataset = xr.Dataset(data)
    if "level" in dataset.coords:
      dataset = dataset.assign_coords(level=dataset["level"].values.astype(np.int32))
    files[statistic] = dataset
  return files


def compute_stats(path: str, variables, levels, start: str | None = None,
                  end: str | None = None, time_step_hours: int = 6, forcings=(),
                  stored_forcings=(), member: int = 0) -> xr.Dataset:
  """One streaming pass over the store's times in [start, end]; see the module docstring.

  Args:
    path: the store (local or URL).
    variables, levels: the channels to cover (catalogue names, hPa).
    start, end: inclusive time range (`store.time_range`); None: the store's ends.
    time_step_hours: the model's step, the lag of `diff_std`.
    forcings: forcings to cover too (mean and std; `diff_std` set to std):
      those in `stored_forcings` as the store holds them, the others as
      `forcings.compute_forcings` computes them at the store's times.
    member: the ensemble member of an anemoi-datasets store (`store_formats.open_store`).
  """
  store_step = store_formats.native_time_step_hours(path, time_step_hours)
  lag = time_step_hours / store_step
  if not float(store_step).is_integer() or not float(lag).is_integer():
    raise UserError(f"Store {path} has a time step of {store_step:g} h, which"
                    f" does not divide time_step_hours={time_step_hours}")
  lag = int(lag)
  # Native step: every store time counts, and diffs use `lag` store steps.
  store = store_formats.open_store(path, variables, levels, time_step_hours=int(store_step),
                               forcings=stored_forcings, member=member)
  first_time, num_times = store_lib.time_range(store.times, start, end, path)
  if num_times < 1 + lag:
    raise UserError(f"Time range {start} .. {end} of {path} has {num_times} time(s); "
                     f"statistics need at least {1 + lag}")
  sums = _Moments(store.num_channels)
  diff_sums = _Moments(store.num_channels)
  hours = (store.times - np.datetime64(0, "ns")) / np.timedelta64(1, "h")
  nan_first = np.full(store.num_channels, np.nan)
  nan_last = np.full(store.num_channels, np.nan)
  forcing_sums = _Moments(len(forcings))
  block = max(1, BLOCK_BYTES // (4 * store.num_grid_nodes * (store.num_channels
                                                               + len(forcings))))
  for first in range(first_time, first_time + num_times, block):
    last = min(first + block, first_time + num_times)
    # Read `lag` extra steps so the diffs starting in this block are complete.
    state = store.read_state(np.arange(first, min(last + lag, first_time + num_times)),
                             allow_nan=True)
    nan_rows = sums.add(state[:last - first])
    if nan_rows is not None and store.missing is not None:
      nan_rows &= ~store.missing[first:last, None]  # a missing time is no NaN of the data
    if nan_rows is not None:
      for channel in np.flatnonzero(nan_rows.any(axis=0)):
        rows = hours[first:last][nan_rows[:, channel]]
        nan_first[channel] = np.fmin(nan_first[channel], rows[0])
        nan_last[channel] = rows[-1]
    num_diffs = min(last - first, state.shape[0] - lag)
    if num_diffs > 0:
      diff_sums.add(state[lag:lag + num_diffs] - state[:num_diffs])
    if forcings:
      forcing_sums.add(store.forcings_at(np.arange(first, last), forcings, allow_nan=True))
  statics = store.read_statics(allow_nan=True)[None]
  static_sums = _Moments(statics.shape[1])
  static_sums.add(statics)
  times = store.times[[first_time, first_time + num_times - 1]]
  return _to_dataset(store, sums, diff_sums, static_sums, (nan_first, nan_last),
                     time_step_hours, times, forcings, forcing_sums)


class _Moments:
  """NaN-ignoring running count, sum, and sum of squares per channel.

  Values stay float32 (half the memory traffic); the sums are float64. Sums
  are of `x - shift` (the first block's mean) so that the variance of, e.g.,
  geopotential (~1e5, std ~1e3) keeps its digits.
  """

  def __init__(self, num_channels: int):
    self.count = np.zeros(num_channels)
    self.sum = np.zeros(num_channels)
    self.sum_squares = np.zeros(num_channels)
    self.shift = None

  def add(self, values: np.ndarray) -> np.ndarray | None:
    """Adds `[time, channels, grid]` values.

    Returns:
      `[time, channels]` True where a value was NaN, or None if none was.
    """
    if self.shift is None:
      with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN channels
        self.shift = np.nan_to_num(np.nanmean(values, axis=(0, 2), dtype=np.float64))
    centred = values - self.shift.astype(values.dtype)[:, None]
    missing = np.isnan(centred)
    nan_rows = None
    if missing.any():
      centred[missing] = 0.0
      self.count += np.sum(~missing, axis=(0, 2))
      nan_rows = missing.any(axis=2)
    else:
      self.count += centred.shape[0] * centred.shape[2]
    self.sum += centred.sum(axis=(0, 2), dtype=np.float64)
    self.sum_squares += np.square(centred).sum(axis=(0, 2), dtype=np.float64)
    return nan_rows

  def mean_std(self):
    count = np.maximum(self.count, 1)
    mean = self.sum / count
    variance = np.maximum(self.sum_squares / count - mean**2, 0.0)
    shift = 0.0 if self.shift is None else self.shift
    return mean + shift, np.sqrt(variance)


def _to_dataset(store, sums, diff_sums, static_sums, nan_hours, time_step_hours, times,
                forcings, forcing_sums):
  """Per-channel moments and NaN hours -> the per-variable stats dataset."""
  mean, std = sums.mean_std()
  _, diff_std = diff_sums.mean_std()
  per_channel = np.stack([mean, floor_std(std, mean), floor_std(diff_std, mean), *nan_hours])
  data = {}
  channel = 0
  for name in store.variables:
    if variables_lib.lookup(name).atmospheric:
      width = len(store.levels)
      data[name] = (("statistic", "level"), per_channel[:, channel:channel + width])
    else:
      width = 1
      data[name] = (("statistic",), per_channel[:, channel])
    channel += width
  static_mean, static_std = static_sums.mean_std()
  static_std = floor_std(static_std, static_mean)
  for i, name in enumerate(variables_lib.STATIC_VARIABLES):
    # Statics do not change: their diff_std is meaningless, set to std. Their NaN
    # are found when they are read, once, as the run starts.
    data[name] = (("statistic",), np.array(
        [static_mean[i], static_std[i], static_std[i], np.nan, np.nan]))
  if forcings:
    forcing_mean, forcing_std = forcing_sums.mean_std()
    forcing_std = floor_std(forcing_std, forcing_mean)
    for i, name in enumerate(forcings):  # inputs only: diff_std is unused, set to std
      data[name] = (("statistic",), np.array(
          [forcing_mean[i], forcing_std[i], forcing_std[i], np.nan, np.nan]))
  coords = {"statistic": list(STATISTICS + NAN_HOURS)}
  if store.levels:
    coords["level"] = np.asarray(store.levels, np.int64)
  return xr.Dataset(data, coords=coords, attrs={
      "time_step_hours": time_step_hours,
      "store": store.path,
      "first_time": str(times[0]),
      "last_time": str(times[1]),
  })


def channel_stats(stats: xr.Dataset, variables, levels) -> dict[str, np.ndarray]:
  """Stats in the channel layout of `variables.py` of `variables` (any catalogue names).

  Returns:
    `{"mean": [C], "std": [C], "diff_std": [C]}` float32.
  """
  table = _channel_table(stats, STATISTICS, variables, levels).astype(np.float32)
  return {statistic: table[i] for i, statistic in enumerate(STATISTICS)}


def nan_hours(stats: xr.Dataset, variables, levels) -> tuple[np.ndarray, np.ndarray] | None:
  """`(first [C], last [C])` hours since 1970 of each channel's NaN (NaN: none).

  None for statistics that do not record them.
  """
  if not set(NAN_HOURS) <= set(stats["statistic"].values):
    return None
  first, last = _channel_table(stats, NAN_HOURS, variables, levels)
  return first, last


def _channel_table(stats, statistics, variables, levels) -> np.ndarray:
  """`[len(statistics), C]` float64: `statistics` of each state channel."""
  stats = stats.sel(statistic=list(statistics))
  columns = []
  for name in variables:
    if name not in stats:
      raise UserError(f"Statistics have no variable {name!r}; they have "
                      f"{sorted(str(n) for n in stats.data_vars)}")
    values = stats[name]
    if variables_lib.is_atmospheric(name):
      stats_levels = [int(level) for level in stats["level"].values]
      absent = [level for level in levels if int(level) not in stats_levels]
      if absent:
        raise UserError(f"Statistics have no level(s) {absent} for {name!r}")
      columns.append(values.sel(level=list(levels)).values)
    else:
      columns.append(values.values[:, None])
  if not columns:
    return np.zeros((len(statistics), 0))
  return np.concatenate(columns, axis=1).astype(np.float64)


def residual_scale(output_stats: dict, num_state_channels: int) -> np.ndarray:
  """`[C_out]` float32 scale of the network's outputs (`model.forecast.one_step`).

  diff_std / std for the state channels (the first `num_state_channels` of
  `output_stats`, `channel_stats` of the output variables): the network
  predicts the change in units of its std; 1 for the target-only channels,
  predicted outright in units of their std.
  """
  scale = (output_stats["diff_std"] / output_stats["std"]).astype(np.float32)
  scale[num_state_channels:] = 1.0
  return scale


def static_stats(stats: xr.Dataset) -> dict[str, np.ndarray]:
  """`{"mean": [2], "std": [2]}` float32 of `variables.STATIC_VARIABLES`."""
  table = np.stack([stats[name].sel(statistic=["mean", "std"]).values for name in
                    variables_lib.STATIC_VARIABLES], axis=1).astype(np.float32)
  return {"mean": table[0], "std": table[1]}


@dataclasses.dataclass(frozen=True)
class InputScales:
  """How forcings and statics enter the model: `(x - mean) / std` per channel.

  With `input_normalization="state"` the scales of the land-sea mask, of
  the forcings and of the global forcings are mean 0, std 1 (they enter as
  they are).

  Attributes:
    forcing_mean, forcing_std: `[F]` float32, the config's forcings in order.
    static_mean, static_std: `[2]` float32, `variables.STATIC_VARIABLES` in order.
    global_mean, global_std: `[F_global]` float32, the config's global forcings.
  """

  forcing_mean: np.ndarray
  forcing_std: np.ndarray
  static_mean: np.ndarray
  static_std: np.ndarray
  global_mean: np.ndarray
  global_std: np.ndarray

  def forcings(self, values: np.ndarray) -> np.ndarray:
    """`[..., F, grid]` forcings, normalized (a new float32 array)."""
    return ((values - self.forcing_mean[:, None]) / self.forcing_std[:, None]).astype(np.float32)

  def statics(self, values: np.ndarray) -> np.ndarray:
    """`[..., 2, grid]` statics, normalized (a new float32 array)."""
    return ((values - self.static_mean[:, None]) / self.static_std[:, None]).astype(np.float32)

  def globals(self, values: np.ndarray) -> np.ndarray:
    """`[..., F_global]` global forcings, normalized (a new float32 array)."""
    return ((values - self.global_mean) / self.global_std).astype(np.float32)


def input_scales(stats: xr.Dataset, forcings, input_normalization: str,
                 global_forcings=()) -> InputScales:
  """The `InputScales` of `forcings`, the statics and `global_forcings` under
  `input_normalization`.

  Raises:
    ValueError: "all" and `stats` lack a forcing or static (naming it).
  """
  if input_normalization not in INPUT_NORMALIZATIONS:
    raise ValueError(f"input_normalization={input_normalization!r}, expected one of "
                     f"{INPUT_NORMALIZATIONS}")
  statics = static_stats(stats)
  if input_normalization == "state":
    normalized = np.array([name == "geopotential_at_surface"
                           for name in variables_lib.STATIC_VARIABLES])
    return InputScales(np.zeros(len(forcings), np.float32), np.ones(len(forcings), np.float32),
                       np.where(normalized, statics["mean"], 0).astype(np.float32),
                       np.where(normalized, statics["std"], 1).astype(np.float32),
                       np.zeros(len(global_forcings), np.float32),
                       np.ones(len(global_forcings), np.float32))
  absent = [name for name in tuple(forcings) + tuple(global_forcings) if name not in stats]
  if absent:
    raise ValueError(
        f"Statistics have no {absent}; data.input_normalization='all' normalizes every input, "
        "forcings included: use statistics that hold them (GraphCast's files in "
        "data.stats_path, or computed ones: leave data.stats_path empty).")
  table = channel_stats(stats, forcings, ())
  global_table = channel_stats(stats, global_forcings, ())
  return InputScales(table["mean"], table["std"], statics["mean"], statics["std"],
                     global_table["mean"], global_table["std"])


@dataclasses.dataclass(frozen=True)
class Normalization:
  """How a run's model sees physical values: its outputs' scale and its inputs' scales,
  made once from the run's statistics (`from_stats`) for its example sources and its model.

  Attributes:
    stats: the statistics (this module's format) the rest is read from.
    mean, std: `[C_out]` float32 of the output channels (the state, then the
      target-only ones): output = normalized * std + mean.
    diff_std: `[C_out]` the std of one step's change.
    num_state: how many of the output channels are the state (fed back).
    input_scales: the forcings' and statics' (`InputScales`).
  """

  stats: xr.Dataset
  mean: np.ndarray
  std: np.ndarray
  diff_std: np.ndarray
  num_state: int
  input_scales: InputScales

  @classmethod
  def from_stats(cls, data: DataSpec, stats: xr.Dataset) -> Normalization:
    """Of the run's data spec and its statistics."""
    table = channel_stats(stats, data.outputs, data.pressure_levels)
    return cls(stats, table["mean"], table["std"], table["diff_std"],
               len(data.state_channels),
               input_scales(stats, data.forcings, data.input_normalization,
                            data.global_forcings))

  @property
  def channel_stats(self) -> dict[str, np.ndarray]:
    """`{"mean", "std", "diff_std"}` `[C_out]` (`channel_stats`' form)."""
    return {"mean": self.mean, "std": self.std, "diff_std": self.diff_std}

  @property
  def residual_scale(self) -> np.ndarray:
    """`[C_out]` what the network's outputs are scaled by (`residual_scale`)."""
    return residual_scale(self.channel_stats, self.num_state)
