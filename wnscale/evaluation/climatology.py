"""Day-of-year x hour-of-day climatology of a store, as WeatherBench2 computes it.

For each hour of day h in the store and each day of year d = 1..366, the
climatology is the weighted mean of the store's values at hour h on days
d - 30 .. d + 30 of every year in the range, the weight falling linearly from
1 at d to 0 at +-30 days (WeatherBench2's default 61-day window), days of year
wrapping around the year's end. A year without a day 366 (not a leap year, or
not covered) counts its day 365 there. Missing values (NaN, or days outside
the range) are left out; where nothing is left the climatology is NaN. (This
is WeatherBench2's "explicit" method. Given no leap year at all it wraps over
365 days and has no day 366; here day 366 always exists.)

`compute_climatology` reads the store (a WeatherBench2-layout one, a point store,
or an anemoi-datasets one: `store_formats.open_dataset`) once per variable (once per
block of levels and latitude rows, or of points, when the sums would not fit
`memory_bytes`), in blocks of times, and writes a WeatherBench2-layout zarr
store, dims `(hour, dayofyear, [level,] latitude, longitude)`, latitude in the
store's order, or on a point set `(hour, dayofyear, [level,] values)` with
`latitude(values)` and `longitude(values)`, with `units`; under a temporary
name, renamed when complete (`paths.building`: an existing store is replaced
only when asked, and stays intact until then).
`at_valid_times` looks the climatology up for forecast valid times.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import xarray as xr

from wnscale import outputs, paths
from wnscale.data import units as units_lib
from wnscale.data import variables as variables_lib
from wnscale.data.making import writer
from wnscale.data.reading import store as store_lib
from wnscale.data.reading import store_formats
from wnscale.data.reading.store import check_times, time_range
from wnscale.errors import UserError
from wnscale.progress import TaskProgress

DAYS = 366
# Bytes per (hour, day of year, grid value) while a block is summed and smoothed:
# float64 sums, int32 counts, and the smoothing's transforms and results.
_BYTES_PER_VALUE = 8 + 4 + 40
_READ_BYTES = 256 * 2**20  # bytes of store values read at once


def window_weights(window: int) -> np.ndarray:
  """`[window]` weights of day offsets -window//2 .. window//2: 1 at 0, 0 at the ends."""
  if window < 3 or window % 2 == 0:
    raise UserError(f"The smoothing window must be an odd number of days >= 3; got {window}")
  half = window // 2
  return 1.0 - np.abs(np.arange(-half, half + 1)) / half


class _DayHourSums:
  """Sums and counts of one block of grid values per (hour, day of year), over years.

  Values come one time at a time, in time order. A year's day 365 waits (per
  hour) until it is known whether that year has a day 366 of its own.
  """

  def __init__(self, num_hours: int, shape: tuple[int, ...]):
    self.sums = np.zeros((num_hours, DAYS) + shape)
    self.counts = np.zeros((num_hours, DAYS) + shape, np.int32)
    self._day_365 = {}  # hour -> (year, values)

  def add(self, hour: int, year: int, day: int, values: np.ndarray):
    waiting = self._day_365.get(hour)
    if waiting is not None and waiting[0] != year:
      self._add(hour, DAYS, self._day_365.pop(hour)[1])  # that year had no day 366
    if day == DAYS and waiting is not None and waiting[0] == year:
      values = np.where(np.isnan(values), self._day_365.pop(hour)[1], values)
    if day == DAYS - 1:
      self._day_365[hour] = (year, values)
    self._add(hour, day, values)

  def _add(self, hour, day, values):
    present = ~np.isnan(values)
    self.sums[hour, day - 1] += np.where(present, values, 0.0)
    self.counts[hour, day - 1] += present

  def smoothed(self, weights: np.ndarray) -> np.ndarray:
    """`[hours, 366, ...]` float32: the window-weighted means, days wrapping around."""
    for hour in list(self._day_365):
      self._add(hour, DAYS, self._day_365.pop(hour)[1])
    # A circular convolution over days (the window is symmetric, so day d takes
    # weight w_k of day d + k), through the FFT: one pass however wide the window.
    kernel = np.zeros(DAYS)
    half = len(weights) // 2
    for offset, w in zip(range(-half, half + 1), weights):
      kernel[offset % DAYS] += w
    spectrum = np.fft.rfft(kernel).reshape((1, -1) + (1,) * (self.sums.ndim - 2))

    def smooth(x):
      return np.fft.irfft(np.fft.rfft(x, axis=1) * spectrum, n=DAYS, axis=1)

    total, weight = smooth(self.sums), smooth(self.counts.astype(np.float64))
    # Weights are 0 or at least 1 / half; the FFT leaves ~1e-12 where they are 0.
    present = weight > 0.5 / half
    return np.where(present, total / np.where(present, weight, 1.0), np.nan).astype(np.float32)


def compute_climatology(path: str, out: str, start: str | None = None, end: str | None = None,
                        *, variables=None, levels=None, window: int = 61,
                        memory_bytes: int = 2 * 2**30, overwrite: bool = False,
                        for_each=None) -> str:
  """Writes the climatology of store `path` over [start, end] to the zarr store `out`.

  Args:
    variables: catalogue variables to include; default: all the store has.
    levels: pressure levels (hPa) of the atmospheric ones; default: all.
    window: smoothing window in days (odd).
    memory_bytes: bound on the sums held at once (blocks of levels and rows).
    overwrite: replace an existing climatology store at `out`.
    for_each: `(function, items) -> None`, calls `function(item)` for every block of a
      variable's levels and latitude rows (`beam_pipelines.for_each` runs them as a Beam
      pipeline); default: here, one after the other.

  Returns:
    `out`, absolute.

  Raises:
    ValueError: naming a missing variable or level, an empty time range, or an
      existing `out` (without `overwrite`; `outputs.check`).
    errors.NoSpaceLeft: the disk filled up (nothing is left at `out`).
  """
  weights = window_weights(window)
  out = paths.normalize(out)
  outputs.check(out, outputs.CLIMATOLOGY, argument="out", overwrite=overwrite, reads=(path,))
  dataset = store_formats.open_dataset(path)
  names = _variables(dataset, variables, path)
  for name in names:  # a store in degC or hPa: said (another mismatch refused) before work
    units_lib.read_as(name, dataset[name].attrs.get("units"),
                      variables_lib.lookup(name).units, path)
  level_values = _levels(dataset, names, levels, path)
  times = pd.DatetimeIndex(dataset["time"].values)
  check_times(times.values, path, evenly=False)  # a time twice would count twice
  first, count = time_range(times.values, start, end, path)
  if count == 0:
    raise UserError(f"Store {path} has no times in {start} .. {end}; it covers "
                     f"{times[0]} .. {times[-1]}")
  indices = np.arange(first, first + count)
  hours = np.unique(times.hour[indices])
  layout = _layout(dataset, names, level_values, hours, window, path, times[indices])
  with outputs.building(out, overwrite) as where:
    writer.create_store(where, *layout)
    blocks = [(name, *block) for name in names
              for block in _blocks(dataset, name, level_values, len(hours), memory_bytes)]
    (for_each or functools.partial(_in_turn, what=f"Climatology of {path}"))(
        functools.partial(_write_block, paths.normalize(path), level_values, indices, hours,
                          weights, where), blocks)
  return out


def _in_turn(function, items, what: str = "climatology"):
  """`function(item)` of each block in turn, with progress (`progress.TaskProgress`)."""
  progress = TaskProgress(what, len(items), "blocks")
  for item in items:
    progress.done(label=function(item))
  progress.close()


def _variables(dataset, variables, path):
  present = [name for name in variables_lib.VARIABLES if name in dataset]
  if variables is None:
    if not present:
      raise UserError(f"Store {path} has none of the catalogue variables "
                       f"{sorted(variables_lib.VARIABLES)}")
    return present
  for name in variables:
    variables_lib.lookup(name)
    if name not in dataset:
      raise UserError(f"Store {path} lacks variable {name!r}; it has {present}")
  return list(variables)


def _levels(dataset, names, levels, path):
  if not any(variables_lib.lookup(name).atmospheric for name in names):
    return []
  store_levels = [int(level) for level in dataset["level"].values]
  if levels is None:
    return store_levels
  absent = [int(level) for level in levels if int(level) not in store_levels]
  if absent:
    raise UserError(f"Level(s) {absent} hPa not in store {path}; it has {store_levels}")
  return [int(level) for level in levels]


def _layout(dataset, names, levels, hours, window, path, times):
  """`(coords, variables, attrs)` of the climatology store (see `writer.create_store`)."""
  space = store_lib.spatial_dims(dataset)
  coords = {"hour": hours.astype(np.int64), "dayofyear": np.arange(1, DAYS + 1)}
  for name in ("latitude", "longitude"):
    values = dataset[name].values
    coords[name] = (space, values) if space == (store_lib.POINT_DIM,) else values
  grid = tuple(dataset.sizes[dim] for dim in space)
  if levels:
    coords["level"] = np.asarray(levels, np.int64)
  variables = {}
  for name in names:
    atmospheric = variables_lib.lookup(name).atmospheric
    dims = ("hour", "dayofyear") + (("level",) if atmospheric else ()) + space
    chunks = (1, 1) + ((len(levels),) if atmospheric else ()) + grid
    variables[name] = writer.VariableLayout(dims, chunks,
                                            {"units": variables_lib.lookup(name).units})
  attrs = {"source": paths.normalize(path), "window_days": window,
           "start": str(times[0]), "end": str(times[-1]),
           "description": "day-of-year x hour-of-day climatology (WeatherBench2's method)"}
  return coords, variables, attrs


def _field(dataset, name, levels):
  """`name` of the store `[time, level, lat, lon]` (on points `[time, level, values]`), at
  `levels` (a surface one: 1 level)."""
  field = dataset[name]
  space = store_lib.spatial_dims(dataset)
  if variables_lib.lookup(name).atmospheric:
    store_levels = [int(level) for level in dataset["level"].values]
    field = field.isel(level=[store_levels.index(level) for level in levels])
    return field.transpose("time", "level", *space)
  return field.transpose("time", *space).expand_dims("level", axis=1)


def _blocks(dataset, name, levels, num_hours, memory_bytes) -> list[tuple[slice, slice]]:
  """`(levels, latitude rows)` blocks of `name` whose sums fit `memory_bytes` (on points, a
  row is a point)."""
  num_levels, num_lat, *row = _field(dataset, name, levels).shape[1:]
  num_lon = int(np.prod(row))  # 1 on points
  per_value = num_hours * DAYS * _BYTES_PER_VALUE
  whole_levels = memory_bytes // (per_value * num_lat * num_lon)
  levels_per_block = max(1, whole_levels)
  rows_per_block = num_lat if whole_levels else max(1, memory_bytes // (per_value * num_lon))
  return [(slice(level_start, min(level_start + levels_per_block, num_levels)),
           slice(row_start, min(row_start + rows_per_block, num_lat)))
          for level_start in range(0, num_levels, levels_per_block)
          for row_start in range(0, num_lat, rows_per_block)]


def _write_block(path, levels, indices, hours, weights, out, block):
  """Sums, smooths and writes `block = (name, levels, latitude rows)` over the store's
  times at `indices`.

  The store at `path` is opened here (its metadata), so that a block can be written
  by another process (a Beam worker).
  """
  name, level_block, rows = block
  dataset = store_formats.open_dataset(path)
  field = _field(dataset, name, levels)
  # Summed in the catalogue's units, which the climatology says it is in.
  scale, offset = units_lib.conversion(name, dataset[name].attrs.get("units"),
                                       variables_lib.lookup(name).units, path) or (1.0, 0.0)
  atmospheric = variables_lib.lookup(name).atmospheric
  num_levels, num_lat = field.shape[1:3]
  block_field = field.isel({"level": level_block, field.dims[2]: rows})
  times = pd.DatetimeIndex(field["time"].values)[indices]
  hour_index = np.searchsorted(hours, times.hour)  # hours: sorted, all present
  years, days = np.asarray(times.year), np.asarray(times.day_of_year)
  sums = _DayHourSums(len(hours), block_field.shape[1:])
  step = max(1, _READ_BYTES // (4 * int(np.prod(block_field.shape[1:]))))
  for first in range(0, len(indices), step):
    values = block_field.isel(time=indices[first:first + step]).values.astype(np.float64)
    values = values * scale + offset
    for i, value in enumerate(values, start=first):
      sums.add(hour_index[i], years[i], days[i], value)
  result = sums.smoothed(weights)  # [hours, days, levels, rows, lon]
  target = result if atmospheric else result[:, :, 0]
  region = (slice(None), slice(None)) + ((level_block,) if atmospheric else ()) + (rows,)
  writer.open_variable(out, name)[region].write(target).result()
  levels_done = (f"levels {level_block.start + 1}-{level_block.stop} of {num_levels}, "
                 if atmospheric else "")
  rows_done = "points" if field.dims[2] == store_lib.POINT_DIM else "latitude rows"
  return f"{name}, {levels_done}{rows_done} {rows.start + 1}-{rows.stop} of {num_lat}"


def at_valid_times(climatology: xr.Dataset, valid_times, dim: str = "lead_time") -> xr.Dataset:
  """The climatology at each of `valid_times` (day of year and hour), stacked along `dim`.

  Raises:
    ValueError: a valid time's hour of day is not in the climatology.
  """
  valid_times = pd.DatetimeIndex(valid_times)
  hours = [int(h) for h in climatology["hour"].values]
  missing = [time for time in valid_times if time.hour not in hours]
  if missing:
    raise UserError(f"The climatology has no hour {missing[0].hour} (valid time "
                     f"{missing[0]}); it has hours {hours}. Make it from a store with "
                     "these hours.")
  days = [int(d) for d in climatology["dayofyear"].values]
  return climatology.isel(
      hour=xr.DataArray([hours.index(t.hour) for t in valid_times], dims=dim),
      dayofyear=xr.DataArray([days.index(t.day_of_year) for t in valid_times], dims=dim),
      drop=True)
