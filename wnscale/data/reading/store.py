"""The reader every store format opens a store as (`WeatherStore`: coordinates plus one
tensorstore view per variable in wnscale's internal order, read into the caller's buffer),
and what the formats share: the errors of a read (`NanError`, `CorruptChunk`), time ranges
and time checks, unit conversions, and the zarr layout's metadata and points
(`open_metadata`, `dataset_points`), which evaluation reads too.

Internal order (see `variables.py`): a regular grid's latitude ascending (-90 -> 90),
longitude ascending in [0, 360) whatever the store's convention, flattened latitude-major;
a point store's points in the store's own order. A format's views are index transforms
into that order, so reordering happens inside tensorstore's copy. Each format is one
module of `store_formats.FORMATS` (`weatherbench2_zarr`, `anemoi`; a cut-out, `cutout`,
joins two of them).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from typing import NamedTuple

import numpy as np
import pandas as pd
import tensorstore as ts
import xarray as xr

from wnscale import paths
from wnscale.data import forcings as forcings_lib
from wnscale.data import units as units_lib
from wnscale.data import variables as variables_lib
from wnscale.errors import UserError
from wnscale.graphs.points import PointSet

_COPY_THREADS = None


def _copy_threads() -> concurrent.futures.ThreadPoolExecutor:
  """Threads for per-variable copies, made on first use (so each Grain worker has its own)."""
  global _COPY_THREADS
  if _COPY_THREADS is None:
    _COPY_THREADS = concurrent.futures.ThreadPoolExecutor(max(2, os.cpu_count() or 2))
  return _COPY_THREADS


# The spatial dimensions of a regular store (a static variable's), in internal order, and
# the one of a store on other points; a stored variable may hold its dimensions in any order.
STATIC_DIMS = ("latitude", "longitude")
POINT_DIM = "values"
# A point store's attribute that names its grid (e.g. "O32"), for the logs.
GRID_ATTR = "grid"
# A point store's own cell areas (a coordinate or a variable along `values`).
CELL_AREA = "cell_area"
REGION = "region"  # a cut-out forecast's mask of its regional points, along `values`


class Channels(NamedTuple):
  """The variables that fill a buffer's channel axis, in order, and their normalization.

  Attributes:
    names: variable (or stored forcing) names; an atmospheric one takes one
      channel per level of the store's `levels`.
    mean, std: `[channels]`: the buffer gets `(x - mean) / std`; None: `x`.
  """

  names: tuple[str, ...]
  mean: np.ndarray | None = None
  std: np.ndarray | None = None

  def scales(self):
    """`(mean [channels, 1], 1 / std [channels, 1])` float32, or `(None, None)`."""
    if self.mean is None:
      return None, None
    return (np.asarray(self.mean, np.float32)[:, None],
            1.0 / np.asarray(self.std, np.float32)[:, None])


@dataclasses.dataclass(eq=False)
class WeatherStore:
  """An opened store: coordinates plus one tensorstore view per variable.

  Attributes:
    path: the store's path or URL.
    variables: state variable names, config order.
    levels: pressure levels (hPa) used, config order.
    time_step_hours: the model's step; `times` are the store's times at it.
    times: `[num_times]` datetime64[ns], every `time_stride`-th store time.
    points: the grid nodes in internal order (a regular grid's latitude ascending).
    handles: `{name: TensorStore}` the stored arrays, in the store's own order.
    views: `{name: TensorStore}` the same arrays in internal order:
      `[time, level, *space]`, `[time, *space]` or `[*space]`, space `lat, lon`
      (latitude ascending) or a point store's `values`.
    flip_latitude: the store holds latitude descending (its views flip it).
    forcings: forcings read from the store (`[time, lat, lon]` like a surface
      variable), not part of `variables`.
    fill: `{name: [channels]}` values that replace NaN in a variable's
      channels, statics included (a NaN in a variable without one is an error).
    missing: `[num_times]` bool, times the store lacks (an anemoi-datasets store's
      `missing_dates`): never read as inputs or targets. None: none.
    convert: `{name: (scale, offset)}` applied to a variable's values as read, before
      any normalization (`units.conversion`: a store in degC or hPa).
  """

  path: str
  variables: tuple[str, ...]
  levels: tuple[int, ...]
  time_step_hours: int
  times: np.ndarray
  points: PointSet
  time_stride: int
  level_indices: np.ndarray
  handles: dict
  views: dict
  flip_latitude: bool = False
  forcings: tuple[str, ...] = ()
  fill: dict = dataclasses.field(default_factory=dict)
  missing: np.ndarray | None = None
  convert: dict = dataclasses.field(default_factory=dict)

  @property
  def fill_nan(self) -> bool:
    return bool(self.fill)

  @property
  def num_grid_nodes(self) -> int:
    return self.points.size

  @property
  def channel_names(self) -> list[str]:
    return variables_lib.channel_names(self.variables, self.levels)

  @property
  def num_channels(self) -> int:
    return len(self.channel_names)

  def __repr__(self) -> str:
    # Stable (no addresses): Grain compares sources by repr on restore.
    forcings = f", forcings={self.forcings}" if self.forcings else ""
    return (f"WeatherStore(path={self.path!r}, variables={self.variables}{forcings}, "
            f"levels={self.levels}, time_step_hours={self.time_step_hours}, "
            f"fill_nan={self.fill_nan})")

  def read_state(self, time_indices, allow_nan: bool = False, mean=None,
                 std=None, grid_index: np.ndarray | None = None) -> np.ndarray:
    """Reads `variables` at `times[time_indices]`, `[time, channels, grid]` f32.

    See `read_into` for the arguments.
    """
    num_points = self.num_grid_nodes if grid_index is None else len(grid_index)
    state = np.empty((len(time_indices), self.num_channels, num_points), np.float32)
    self.read_into([(time_indices, state, Channels(self.variables, mean, std))],
                   allow_nan=allow_nan, grid_index=grid_index)
    return state

  def read_into(self, requests, allow_nan: bool = False,
                grid_index: np.ndarray | None = None):
    """Reads several blocks at once, each into a caller's buffer.

    Channel-major, as the stores hold it. Every variable of every request is
    requested at once; tensorstore decodes each straight into its block of the
    buffer (reordering dimensions and flipping latitude on the way, in C++
    threads), then a thread per block normalizes it in place to
    `(x - mean) / std` when the request's `Channels` give them (numpy
    releases the GIL there). NaN raises a ValueError naming variable and time,
    unless the store has fill values (`fill`: then filled with them) or
    `allow_nan` (then left, for statistics).

    Args:
      requests: `[(time_indices [T], out [T, channels, points] float32, Channels)]`:
        the `Channels`' variables (of `variables` or `forcings`) fill `out`'s
        channels in order; `out` must be C-contiguous.
      grid_index: `[points]` the internal grid node at each output position,
        -1 for a zero (e.g. a sharded layout's slots): then each variable is
        decoded into a temporary and gathered from it. Default: every node
        in internal order.
    """
    if grid_index is not None:
      grid_index = np.asarray(grid_index, np.int64)
      padding = grid_index < 0
      gather = np.maximum(grid_index, 0)
    tasks = []
    for time_indices, out, channels_of_out in requests:
      names = tuple(channels_of_out.names)
      mean, inverse_std = channels_of_out.scales()
      time_indices = self._check_times(time_indices)
      store_indices = time_indices * self.time_stride
      expected = (len(time_indices), len(variables_lib.channel_names(names, self.levels)),
                  self.num_grid_nodes if grid_index is None else len(grid_index))
      if out.shape != expected or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"Buffer {out.dtype}{list(out.shape)} (C-contiguous: "
                         f"{out.flags.c_contiguous}) cannot take {names} of shape {expected}")
      if grid_index is None:
        target = ts.array(out.reshape(out.shape[:2] + (self.points.field_shape or (-1,))),
                          copy=False, write=True)
      channel = 0
      for name in names:
        view = self.views[name]
        atmospheric = variables_lib.is_atmospheric(name)
        width = len(self.level_indices) if atmospheric else 1
        view = (view.oindex[store_indices, self.level_indices] if atmospheric
                else view.oindex[store_indices])
        channels = slice(channel, channel + width)
        if grid_index is None:  # decoded in place
          future = (target[:, channels] if atmospheric else target[:, channel]).write(view)
        else:
          future = view.read()
        tasks.append((future, out, channels, mean, inverse_std, name, time_indices))
        channel += width

    def finish(task) -> bool:
      future, out, channels, mean, inverse_std, name, time_indices = task
      block = out[:, channels]
      try:
        data = future.result()
      except ValueError as error:  # tensorstore: a chunk it cannot decode
        if not _damaged(error):
          raise
        raise CorruptChunk(name, self.times[time_indices], self.path, error) from error
      if grid_index is not None:
        flat = data.reshape(data.shape[0], block.shape[1], -1)
        for step in range(out.shape[0]):  # block[step] is contiguous: no buffering
          np.take(flat[step], gather, axis=-1, out=block[step], mode="clip")
      if name in self.convert:  # into the catalogue's units
        scale, offset = self.convert[name]
        block *= scale
        block += offset
      if mean is not None:
        block -= mean[channels]
        block *= inverse_std[channels]
      if grid_index is not None:
        block[..., padding] = 0.0
      # A sum is NaN if any value is (or, rarely, if +inf meets -inf): one
      # pass without a boolean temporary; `_fill_or_raise` looks closer.
      return bool(np.isnan(block.sum()))

    has_nan = list(_copy_threads().map(finish, tasks))
    if any(has_nan) and not allow_nan:
      for time_indices, out, channels_of_out in requests:
        if np.isnan(out).any():
          fill = self._fill_values(channels_of_out.names)
          mean, inverse_std = channels_of_out.scales()
          if mean is not None:
            fill = (fill - mean[:, 0]) * inverse_std[:, 0]
          self._fill_or_raise(out, fill,
                              variables_lib.channel_names(channels_of_out.names, self.levels),
                              self.times[np.asarray(time_indices, np.int64)])

  def _fill_values(self, names) -> np.ndarray:
    """`[channels]` fill values of `names`' channels, NaN for those without one."""
    widths = [len(self.levels) if variables_lib.is_atmospheric(name) else 1 for name in names]
    return np.concatenate([
        np.broadcast_to(np.atleast_1d(self.fill.get(name, np.nan)), (width,))
        for name, width in zip(names, widths)]).astype(np.float32)

  def _check_times(self, time_indices) -> np.ndarray:
    time_indices = np.asarray(time_indices, dtype=np.int64)
    if time_indices.min() < 0 or time_indices.max() >= len(self.times):
      raise ValueError(f"time indices {time_indices} outside the store's "
                       f"{len(self.times)} times")
    return time_indices

  def forcings_at(self, time_indices, names, allow_nan: bool = False) -> np.ndarray:
    """`[time, len(names), grid]` forcings at `times[time_indices]`, internal grid order:
    those the store holds (`forcings`) read, the others computed (`forcings.py`)."""
    time_indices = np.asarray(time_indices, np.int64)
    stored = tuple(name for name in names if name in self.forcings)
    values = np.empty((len(time_indices), len(stored), self.num_grid_nodes), np.float32)
    if stored:
      self.read_into([(time_indices, values, Channels(stored))], allow_nan=allow_nan)
    return forcings_lib.compute_forcings(
        self.times[time_indices], self.points, names,
        given={name: values[:, i] for i, name in enumerate(stored)})

  def read_statics(self, allow_nan: bool = False) -> np.ndarray:
    """`[2, grid]` float32: `variables.STATIC_VARIABLES` in that order.

    NaN is handled as in `read_state`.
    """
    futures = [self.views[name].read() for name in variables_lib.STATIC_VARIABLES]
    fields = []
    for name, future in zip(variables_lib.STATIC_VARIABLES, futures):
      try:
        field = future.result().astype(np.float32)
      except ValueError as error:
        if not _damaged(error):
          raise
        raise CorruptChunk(name, None, self.path, error) from error
      scale, offset = self.convert.get(name, (1.0, 0.0))
      fields.append(field * np.float32(scale) + np.float32(offset))
    statics = np.stack(fields).reshape(len(futures), -1)
    if not allow_nan and np.isnan(statics).any():
      self._fill_or_raise(statics[None], self._fill_values(variables_lib.STATIC_VARIABLES),
                          list(variables_lib.STATIC_VARIABLES), None)
    return statics

  def _fill_or_raise(self, array, fill, names, times):
    """Fills NaN in `[time, channels, grid]` in place with `fill` `[channels]`; raises on a
    NaN in a channel whose fill is NaN (no fill value)."""
    np.copyto(array, np.broadcast_to(np.asarray(fill)[:, None], array.shape),
              where=np.isnan(array))
    if not np.isnan(array).any():
      return
    bad_time, bad_channel, _ = np.argwhere(np.isnan(array))[0]
    when = "" if times is None else f" at time {times[bad_time]}"
    raise NanError(names[bad_channel], when, self.path)


class NanError(UserError):
  """A NaN in a store without fill values; `problem` says where, the message what to do.

  Args:
    channel: the channel, e.g. "temperature@850".
    when: " at time ..." or "" (a static field).
    path: the store.
  """

  def __init__(self, channel: str, when: str, path: str):
    self.arguments = (channel, when, path)
    self.problem = f"NaN in variable {channel!r}{when} of store {path}"
    super().__init__(f"{self.problem}. Set data.fill_nan=True to fill NaN with the "
                     "variable's mean, or repair the store.")

  def __reduce__(self):  # pickled whole out of a Grain worker process
    return type(self), self.arguments


def _damaged(error: BaseException) -> bool:
  """Whether tensorstore's `error` says a chunk's bytes could not be decoded (not, e.g.,
  that a bucket could not be reached)."""
  text = str(error)
  return any(word in text for word in ("FAILED_PRECONDITION", "DATA_LOSS", "Invalid ",
                                       "decompress", "decod"))


class CorruptChunk(UserError):
  """A chunk of a store that cannot be read (truncated, overwritten, not what its array's
  compressor wrote), found when it is read; the message names it and what to do.

  Args:
    name: the variable; times: `[T]` datetime64 the read asked for (None: a static).
    path: the store; error: tensorstore's error (its first line is kept).
  """

  def __init__(self, name: str, times, path: str, error):
    detail = str(error).split(" [")[0]
    self.arguments = (name, times, path, detail)
    when = "" if times is None or len(times) == 0 else (
        f" at {pd.Timestamp(times[0])}" + (f" .. {pd.Timestamp(times[-1])}"
                                           if len(times) > 1 else ""))
    super().__init__(f"Cannot read variable {name!r}{when} of store {path}: a chunk file is "
                     f"damaged ({detail}); restore the store from a good copy or write it "
                     "again.")

  def __reduce__(self):  # pickled whole out of a Grain worker process
    return type(self), self.arguments


def unit_conversions(store_units_of: dict, names, path: str) -> dict:
  """`{name: (scale, offset)}` of the variables whose units in the store (`store_units_of`:
  `{name: units or None}`) differ from the catalogue's by an affine conversion (said
  once); a mismatch is a `UserError`."""
  convert = {}
  for name in names:
    variable = variables_lib.VARIABLES.get(name)
    if variable is None or name not in store_units_of:
      continue
    scale_offset = units_lib.read_as(name, store_units_of[name], variable.units, path)
    if scale_offset is not None:
      convert[name] = scale_offset
  return convert


def spatial_dims(dataset: xr.Dataset) -> tuple[str, ...]:
  """A dataset's spatial dims: `(values,)` on points, else `(latitude, longitude)`."""
  return (POINT_DIM,) if POINT_DIM in dataset.dims else STATIC_DIMS


def open_metadata(path: str) -> xr.Dataset:
  """The store as a lazy xarray Dataset (metadata and coordinates only)."""
  path = paths.normalize(path)
  if not paths.exists(path):
    raise UserError(f"Store not found: {path} (no such file or directory).")
  # v2 stores carry .zmetadata (WB2 does); v3 has no consolidated standard.
  consolidated = tensorstore_driver(path) == "zarr" and paths.exists(
      paths.join(path, ".zmetadata"))
  try:
    return xr.open_zarr(path, chunks=None, consolidated=consolidated)
  except Exception as error:  # zarr raises many types for a broken store
    raise UserError(f"Cannot open {path} as a zarr store: {error}") from error


class SpacingError(UserError):
  """A regular store whose grid `spacing` `(lat, lon)` degrees is not `data.resolution`."""

  def __init__(self, message: str, spacing: tuple[float, float]):
    super().__init__(message)
    self.spacing = spacing


class TimeRangeError(UserError):
  """A time range that reaches outside its store's times (`time_range`).

  Attributes:
    side: "start" or "end", the end of the range that lies outside.
    value: the range's `start` or `end` as given.
    late: whether that value is after the store's last time (else before its first).
    coverage: e.g. "covers 2020-01-01 00:00:00 .. 2020-01-31 18:00:00 every 6 h".
  """

  def __init__(self, message: str, side: str, value, late: bool, coverage: str):
    super().__init__(message)
    self.side, self.value, self.late, self.coverage = side, value, late, coverage

  def where(self, times: str = "time") -> str:
    """E.g. "is after the last time" (`times`: what the store's times are to the caller)."""
    return f"is after the last {times}" if self.late else f"is before the first {times}"


def time_range(times: np.ndarray, start, end, path: str) -> tuple[int, int]:
  """(index of the first time >= start, number of times in [start, end]).

  `start`, `end`: inclusive ("2020-01-01", "2020-06-30T18"); a date without a
  time covers that whole day; empty or None: the store's first / last time.
  `path`: the store of `times`, for the errors.

  Raises:
    TimeRangeError: the range reaches outside the store (it is never clipped to
      it): a time (at the store's step) before its first time or after its last,
      or a date (`start`, `end` without a time) before its first day or after its last.
  """
  day = np.timedelta64(1, "D")
  step = times[1] - times[0] if len(times) > 1 else np.timedelta64(1, "ns")
  begin = np.datetime64(pd.Timestamp(start)) if start else times[0]
  # A date covers its day, which the store may hold in part (e.g. up to 12:00).
  early = (begin + day <= times[0]) if _is_date(start) else (begin <= times[0] - step)
  if end:
    stop = np.datetime64(pd.Timestamp(end))
    late = stop > times[-1] if _is_date(end) else stop >= times[-1] + step
    if _is_date(end):
      stop += day - np.timedelta64(1, "s")
  else:
    stop, late = times[-1], False
  if stop < begin:
    raise UserError(f"Time range end {end} is before its start {start}")
  if early or late:
    hours = step / np.timedelta64(1, "h")
    coverage = (f"covers {pd.Timestamp(times[0])} .. {pd.Timestamp(times[-1])} every "
                f"{hours:g} h")
    outside = begin > times[-1] or stop < times[0]
    how = "lies outside" if outside else ("starts before" if early else "ends after")
    side = "start" if early or begin > times[-1] else "end"
    raise TimeRangeError(f"Time range {start or '(the first time)'} .. "
                         f"{end or '(the last time)'} {how} the store {path}, which "
                         f"{coverage}", side, start if side == "start" else end,
                         not early, coverage)
  inside = np.flatnonzero((times >= begin) & (times <= stop))
  if inside.size == 0:
    return 0, 0
  return int(inside[0]), int(inside.size)


def _is_date(text) -> bool:
  """`text` is a date without a time ("2020-01-31"), which stands for its whole day."""
  return bool(text) and len(str(text).strip()) <= 10


def check_times(times: np.ndarray, path: str, what: str = "Times", evenly: bool = True):
  """`times` increase (at one step, if `evenly`), or a `UserError` naming the first that
  does not: a duplicate, a time out of order, or a step unlike the first. (Times that
  are not datetimes are the caller's to refuse.)"""
  if not np.issubdtype(np.asarray(times).dtype, np.datetime64):
    return
  steps = np.diff(times)
  at = lambda index: pd.Timestamp(times[index])  # noqa: E731
  bad = np.flatnonzero(steps <= np.timedelta64(0))
  if bad.size:
    i = int(bad[0])
    how = "is there twice" if steps[i] == np.timedelta64(0) else f"comes after {at(i)}"
    raise UserError(f"{what} of {path} are not in order: {at(i + 1)} (position {i + 1}) "
                    f"{how}; sort the store by time and drop duplicates.")
  uneven = np.flatnonzero(steps != steps[0]) if evenly else ()
  if len(uneven):
    i = int(uneven[0])
    hours = lambda step: step / np.timedelta64(1, "h")  # noqa: E731
    raise UserError(f"{what} of {path} are not evenly spaced: every {hours(steps[0]):g} h "
                    f"up to {at(i)}, then {at(i + 1)} ({hours(steps[i]):g} h later); a store "
                    "needs one time step (fill the gap, or mark missing times as NaN).")


def dataset_points(dataset: xr.Dataset, path: str) -> PointSet:
  """The points of a store (or a dataset of one) with a `values` dimension, in its order:
  its own `cell_area` as the areas where it has one, else the Voronoi cells'."""
  coordinates = {}
  for name in ("latitude", "longitude") + ((CELL_AREA,) if CELL_AREA in dataset else ()):
    if name not in dataset or dataset[name].dims != (POINT_DIM,):
      have = dataset[name].dims if name in dataset else "none"
      raise UserError(f"Store {path} has a {POINT_DIM!r} dimension but its {name!r} is not "
                      f"one value per point along it (dims: {have}); a point store needs "
                      f"latitude({POINT_DIM}) and longitude({POINT_DIM}).")
    coordinates[name] = np.asarray(dataset[name].values, np.float64)
  named = dataset.attrs.get(GRID_ATTR)
  return PointSet.from_points(
      coordinates["latitude"], coordinates["longitude"], coordinates.get(CELL_AREA),
      f"{named} ({coordinates['latitude'].size:,} points)" if named else None)


def tensorstore_driver(path: str) -> str:
  """`zarr` for a v2 store (`.zgroup`), `zarr3` for v3 (`zarr.json`)."""
  if paths.exists(paths.join(path, "zarr.json")):
    return "zarr3"
  if paths.exists(paths.join(path, ".zgroup")):
    return "zarr"
  raise UserError(f"{path} has neither .zgroup (zarr v2) nor zarr.json (v3)")
