"""ERA5 files, as the Climate Data Store delivers them, into one WeatherBench2-layout store.

  convert_era5(["era5_pl_*.grib", "era5_sfc.nc"], "era5.zarr")

Every file is opened lazily in WeatherBench2's conventions (`era5_files`). The
files are merged along time and variables: a time two files both hold must have
the same values in both (else an error naming the time and the files), and the
store's times must be equally spaced (a missing time is an error naming it).
Hourly total precipitation becomes `total_precipitation_6hr`, the sum of the six
hours ending at each time (times without six earlier hours are left out at the
start); `toa_incident_solar_radiation` stays the hourly integral, as GraphCast was
trained on it. The land-sea mask and surface geopotential are statics (no time
dim), whether they come in a file of their own or at every time step.

The store is written block of times by block of times, never holding more than
`block_bytes` of data, with progress, at `<out>.partial` until it is whole (then
renamed to `out`; in a bucket, in place, marked complete at the end). Its
`conversion` attribute records the sources and how many times are written; a
command killed midway and run again continues there.
Continuing a conversion of other sources is an error; an existing store at `out`
is replaced only when asked (`overwrite`), and stays intact until then.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os

import numpy as np
import pandas as pd
import xarray as xr

from wnscale import outputs, paths
from wnscale.data import variables as variables_lib
from wnscale.data.making import era5_files, hdf5_reads, writer
from wnscale.data.reading import weatherbench2_zarr
from wnscale.data.reading.weatherbench2_zarr import CONVERSION_ATTR as CONVERSION
from wnscale.errors import UserError
from wnscale.progress import WriteProgress

BLOCK_BYTES = 256 * 2**20
HOURLY_PRECIPITATION = "total_precipitation"
PRECIPITATION_6HR = "total_precipitation_6hr"
STATICS = variables_lib.STATIC_VARIABLES


def expand_sources(patterns: list[str]) -> list[str]:
  """Files named by comma-separated paths or globs, sorted; a pattern matching none is an error."""
  files = []
  for pattern in patterns:
    if paths.is_url(pattern):
      matched = [str(p) for p in paths.as_epath(os.path.dirname(pattern)).glob(
          os.path.basename(pattern))] if any(c in pattern for c in "*?[") else [pattern]
    else:
      matched = sorted(glob.glob(os.path.expanduser(pattern)))
    if not matched:
      raise UserError(f"No file matches {pattern!r}.")
    files.extend(paths.normalize(path) for path in matched)
  return sorted(dict.fromkeys(files))


def is_converting(path: str) -> bool:
  """Whether a conversion into `path` was cut short (run the same command again)."""
  path = paths.normalize(path)
  where = path if paths.is_url(path) else paths.partial_path(path)
  attrs = _store_attrs(where)
  return bool(attrs and CONVERSION in attrs and not attrs[CONVERSION]["complete"])


def convert_era5(sources: list[str], out: str, *, member: int | None = None,
                 start: str | None = None, end: str | None = None, overwrite: bool = False,
                 block_bytes: int = BLOCK_BYTES, write_times=None) -> str:
  """Writes the store at `out` from the CDS files `sources` (paths or globs); returns `out`.

  Locally the store is built at `<out>.partial` and renamed to `out` when whole (an
  existing store at `out` is replaced only with `overwrite`, and stays intact until
  then); a conversion cut short is continued there by the same call. In a bucket it
  is built in place, its `conversion` attribute marking it incomplete until the end;
  one cut short there is continued in place by the same call.

  Args:
    member: the ensemble member of files holding several (ERA5's EDA).
    start, end: the first and last time to keep (any pandas time string).
    overwrite: replace an existing store at `out`, and a conversion of other sources
      cut short.
    write_times: `(where, plan, done, per_block, out)`, writes the times from `done` on
      into the store laid out at `where`, `per_block` at a time (`start_block`), and marks
      it complete (`finish`); default: here, block after block, with progress.
      `convert_beam` runs the blocks as a Beam pipeline.
  """
  out = paths.normalize(out)
  # A bucket's conversion cut short is continued in place (`_resume_point` checks that
  # it is of the same sources), never replaced by `outputs.building`.
  continuing = paths.is_url(out) and is_converting(out)
  if not continuing:
    # Before any file is opened.
    outputs.check(out, outputs.DATASET, argument="out", overwrite=overwrite)
  files = expand_sources(sources)
  datasets = [era5_files.open_era5_file(path, member) for path in files]
  plan = _Plan(files, datasets, start, end)
  fingerprint = _fingerprint(files, member, plan.times)
  with outputs.building(out, overwrite and not continuing, resumable=True) as where:
    done = _resume_point(where, fingerprint, overwrite)
    if done is None:
      writer.create_store(where, plan.coords(), plan.layouts(), attrs={CONVERSION: {
          "sources": files, "member": member, "fingerprint": fingerprint,
          "times_written": 0, "complete": False, "notes": plan.notes}})
      _write_statics(where, plan)
      done = 0
    else:
      logging.info("Continuing the conversion into %s after %d of %d times.", out, done,
                   len(plan.times))
    (write_times or _write_times)(where, plan, done,
                                  max(1, block_bytes // plan.bytes_per_time), out)
  return out


def _write_times(where: str, plan: _Plan, done: int, per_block: int, out: str):
  """Writes the times from `done` on, recording each block once it is written.

  The next block is read while the last one is compressed and written (tensorstore's
  threads): two blocks are in memory at once, each of half `per_block` times, in two
  sets of buffers used in turn (fresh memory for every block cost more page faults
  than the reads themselves).
  """
  handles = {name: writer.open_variable(where, name) for name in plan.time_variables}
  progress = WriteProgress(out, len(plan.times), plan.bytes_per_time)
  progress.done(done)
  record = writer.read_attrs(where)[CONVERSION]
  per_block = max(1, per_block // 2)
  buffers = [{name: np.empty(plan.shape(name, per_block), np.float32)
              for name in plan.time_variables} for _ in range(2)]
  writing = None  # (writes, first time, last time + 1) of the block in flight

  def written(writes, first, last):
    wait_block(handles, writes, first, last)
    record["times_written"] = last
    writer.update_attrs(where, {CONVERSION: record})  # after the data: a resume redoes no less
    progress.done(last)

  try:
    for block, first in enumerate(range(done, len(plan.times), per_block)):
      last = min(first + per_block, len(plan.times))
      # The buffers of the block before the last: its writes are done.
      writes = start_block(plan, handles, first, last, {
          name: buffer[:last - first] for name, buffer in buffers[block % 2].items()})
      if writing:
        written(*writing)
      writing = writes, first, last
    if writing:
      written(*writing)
      writing = None
  finally:
    if writing:  # an error: no write may still land once it is raised
      writer.wait_all(writing[0], raise_error=False)
  progress.close()
  finish(where, plan)


def start_block(plan: _Plan, handles: dict, first: int, last: int,
                buffers: dict[str, np.ndarray] | None = None) -> list:
  """Reads the store's times `first:last` of every time variable from the plan's files and
  starts writing them through `handles` (`{name: writer.open_variable(...)}`); returns the
  writes (`wait_block` them before `buffers` are used again).

  Args:
    buffers: `{name: array}` to read into (`plan.shape(name, last - first)`); default:
      fresh ones.
  """
  block = plan.times[first:last]
  buffers = buffers or {}
  return [handles[name][first:last].write(plan.read(name, block, buffers.get(name)))
          for name in plan.time_variables]


def wait_block(handles: dict, writes: list, first: int, last: int):
  """Waits for the writes of the times `first:last` (`start_block`), then evicts them from
  the page cache (`writer.evict_written`: a conversion does not read them back)."""
  writer.wait_all(writes)
  for handle in handles.values():
    writer.evict_written(handle, first, last)


def finish(where: str, plan: _Plan):
  """Marks the store at `where` complete: every time of `plan` is written."""
  record = writer.read_attrs(where)[CONVERSION]
  record.update(times_written=len(plan.times), complete=True)
  writer.update_attrs(where, {CONVERSION: record})


class _Plan:
  """What the store holds: its times, grid, levels and variables, and which file has what."""

  def __init__(self, files, datasets, start, end):
    self.files, self.datasets = files, datasets
    # GRIB 1 holds coordinates in millidegrees (87.188 for 87.1875): the grids must agree to
    # that, and the store takes the most evenly spaced (most precise) file's coordinates.
    grids = [(d["latitude"].values, d["longitude"].values) for d in datasets]
    for path, (latitude, longitude) in zip(files[1:], grids[1:]):
      for dim, ours, theirs in (("latitude", latitude, grids[0][0]),
                                ("longitude", longitude, grids[0][1])):
        if ours.shape != theirs.shape or not np.allclose(
            ours, theirs, rtol=0, atol=weatherbench2_zarr.RESOLUTION_TOLERANCE):
          raise UserError(f"{path} and {files[0]} have other {dim}s; every file must be on "
                          "the same grid.")
    self.latitude, self.longitude = min(grids, key=_unevenness)
    names = sorted({name for dataset in datasets for name in dataset.data_vars})
    self.statics = [name for name in names if name in STATICS]
    self.time_variables = [PRECIPITATION_6HR if name == HOURLY_PRECIPITATION else name
                           for name in names if name not in STATICS]
    self.levels = self._levels()
    self.times = self._times(start, end)
    self.units = {name: next(d[name].attrs.get("units") for d in datasets if name in d)
                  for name in names}
    if HOURLY_PRECIPITATION in self.units:
      self.units[PRECIPITATION_6HR] = self.units.pop(HOURLY_PRECIPITATION)
    self.notes = ["merged along time and variables from the sources, in WeatherBench2's "
                  "names and conventions (levels ascending, longitude 0..360, float32)"]
    if PRECIPITATION_6HR in self.time_variables:
      self.notes.append("total_precipitation_6hr: the sum of the hourly total_precipitation "
                        "of the 6 hours ending at each time")
    if "toa_incident_solar_radiation" in self.time_variables:
      self.notes.append("toa_incident_solar_radiation: the hourly integral, as delivered")
    self.bytes_per_time = 4 * self.latitude.size * self.longitude.size * sum(
        len(self.levels) if self._has_levels(name) else 1 for name in self.time_variables)

  def _has_levels(self, name) -> bool:
    source = HOURLY_PRECIPITATION if name == PRECIPITATION_6HR else name
    return any(source in d and "level" in d[source].dims for d in self.datasets)

  def _levels(self) -> list[int]:
    levels = {}
    for path, dataset in zip(self.files, self.datasets):
      for name, variable in dataset.data_vars.items():
        if "level" in variable.dims:
          levels.setdefault(tuple(int(x) for x in variable["level"].values), []).append(
              f"{name} in {os.path.basename(path)}")
    if len(levels) > 1:
      raise UserError("The files hold variables on different pressure levels: " + "; ".join(
          f"{list(k)}: {', '.join(v[:3])}" for k, v in levels.items()) + ". A store has one "
          "set of levels; request the same levels for every variable.")
    return list(next(iter(levels))) if levels else []

  def _source_times(self, name) -> pd.DatetimeIndex:
    times = [pd.DatetimeIndex(d["time"].values) for d in self.datasets
             if name in d and "time" in d[name].dims]
    return times[0].append(times[1:]).unique().sort_values() if times else pd.DatetimeIndex([])

  def _times(self, start, end) -> pd.DatetimeIndex:
    instant = [name for name in self.time_variables if name != PRECIPITATION_6HR]
    times = {name: self._source_times(name) for name in instant}
    union = (pd.DatetimeIndex(np.concatenate([t.values for t in times.values()])).unique()
             .sort_values() if times else pd.DatetimeIndex([]))
    if PRECIPITATION_6HR in self.time_variables:
      hourly = self._source_times(HOURLY_PRECIPITATION)
      if not instant:
        union = hourly[hourly.hour % 6 == 0]
      whole = [t for t in union if all(t - pd.Timedelta(hours=k) in hourly for k in range(6))]
      leading = union[:union.get_loc(whole[0])] if whole else union
      if len(leading):
        logging.warning("The first %d time(s) (%s ..) lack 6 hours of hourly precipitation "
                        "before them; the store starts at %s.", len(leading), leading[0],
                        whole[0] if whole else "none")
        union = union[len(leading):]
    if start is not None or end is not None:
      union = union[(union >= pd.Timestamp(start or union.min()))
                    & (union <= pd.Timestamp(end or union.max()))]
    if len(union) == 0:
      raise UserError(f"The files {self.files} hold no time to convert"
                      + (f" between {start} and {end}" if start or end else "") + ".")
    if len(union) > 1:
      step = pd.Series(union).diff().min()
      expected = pd.date_range(union[0], union[-1], freq=step)
      missing = expected.difference(union)
      if len(missing):
        raise UserError(f"The files have a gap: no data at {missing[0]} (every {step} from "
                        f"{union[0]} to {union[-1]}; {len(missing)} time(s) missing). Add "
                        "the file that holds it.")
    for name in instant:
      lacking = union.difference(times[name])
      if len(lacking):
        raise UserError(f"{name} has no value at {lacking[0]} ({len(lacking)} time(s) of "
                        "the store); every variable must cover every time.")
    return union

  def coords(self) -> dict:
    coords = {"time": self.times.values, "latitude": self.latitude,
              "longitude": self.longitude}
    if self.levels:
      coords["level"] = np.asarray(self.levels, np.int64)
    return coords

  def layouts(self) -> dict[str, writer.VariableLayout]:
    layouts = {}
    for name in self.time_variables:
      dims = ("time", "level", "latitude", "longitude") if self._has_levels(name) else (
          "time", "latitude", "longitude")
      chunks = (1,) + tuple(len(self.coords()[d]) for d in dims[1:])
      layouts[name] = writer.VariableLayout(dims, chunks, self._attrs(name))
    for name in self.statics:
      layouts[name] = writer.VariableLayout(("latitude", "longitude"), (
          self.latitude.size, self.longitude.size), self._attrs(name))
    return layouts

  def _attrs(self, name) -> dict:
    units = self.units.get(name)
    return {"units": units} if units else {}

  def shape(self, name: str, count: int) -> tuple[int, ...]:
    """The shape of `count` times of the store's variable `name`."""
    return (count,) + ((len(self.levels),) if self._has_levels(name) else ()) + (
        self.latitude.size, self.longitude.size)

  def read(self, name: str, times: pd.DatetimeIndex, out: np.ndarray | None = None
           ) -> np.ndarray:
    """`[len(times)(, level), lat, lon]` float32 values of `name` at `times`, into `out`
    (of that shape) when given."""
    if out is None:
      out = np.empty(self.shape(name, len(times)), np.float32)
    if name == PRECIPITATION_6HR:
      hourly = pd.DatetimeIndex(sorted({t - pd.Timedelta(hours=k) for t in times
                                        for k in range(6)}))
      values = self._gather(HOURLY_PRECIPITATION, hourly,
                            np.empty(self.shape(name, len(hourly)), np.float32))
      position = {t: i for i, t in enumerate(hourly)}
      for row, t in zip(out, times):
        row[...] = sum(values[position[t - pd.Timedelta(hours=k)]].astype(np.float64)
                       for k in range(6))
      return out
    return self._gather(name, times, out)

  def _gather(self, name, times: pd.DatetimeIndex, values: np.ndarray) -> np.ndarray:
    """Values at `times` from every file holding them, into `values`; two files must agree
    where both do."""
    origin = {}
    for path, dataset in zip(self.files, self.datasets):
      if name not in dataset:
        continue
      held = times.intersection(dataset.indexes["time"])
      if len(held) == 0:
        continue
      dims = ("time", "level", "latitude", "longitude") if "level" in dataset[name].dims else (
          "time", "latitude", "longitude")
      rows = times.get_indexer(held)
      if _consecutive(rows) and not origin.keys() & set(held):  # straight into place
        _read(dataset, name, dims, held, values[rows[0]:rows[-1] + 1])
        origin.update(dict.fromkeys(held, path))
        continue
      block = np.empty((len(held),) + values.shape[1:], np.float32)
      _read(dataset, name, dims, held, block)
      for row, time in zip(block, held):
        index = times.get_loc(time)
        if time in origin:
          if not np.array_equal(values[index], row, equal_nan=True):
            raise UserError(f"{name} at {time} differs between {origin[time]} and {path}; "
                            "overlapping files must agree (remove one of them).")
          continue
        values[index], origin[time] = row, path
    values[[i for i, time in enumerate(times) if time not in origin]] = np.nan
    return values

  def static(self, name: str) -> np.ndarray:
    """`[lat, lon]`: a static field (the first time, where a file has it at every time)."""
    for dataset in self.datasets:
      if name in dataset:
        variable = dataset[name]
        if "time" in variable.dims:
          variable = variable.isel(time=0)
        return variable.transpose("latitude", "longitude").values.astype(np.float32)
    raise KeyError(name)


def _read(dataset: xr.Dataset, name: str, dims: tuple[str, ...], times: pd.DatetimeIndex,
          out: np.ndarray):
  """Reads `name` at `times` (all in `dataset`) in `dims` order into `out` (float32):
  straight from HDF5 where the times are consecutive in a variable marked for it."""
  positions = dataset.indexes["time"].get_indexer(times)
  selection = slice(positions[0], positions[-1] + 1) if _consecutive(positions) else positions
  variable = dataset[name].variable
  if isinstance(selection, slice) and variable.dims == dims and hdf5_reads.is_marked(variable):
    hdf5_reads.read_times(variable, selection, out)
  else:
    out[...] = dataset[name].isel(time=selection).transpose(*dims).values


def _consecutive(positions: np.ndarray) -> bool:
  return bool(np.all(np.diff(positions) == 1))


def _unevenness(grid) -> float:
  """How far a grid's coordinates are from equal spacing (0 for exact ones)."""
  return sum(float(np.ptp(np.diff(values))) if values.size > 2 else 0.0 for values in grid)


def _write_statics(out: str, plan: _Plan):
  for name in plan.statics:
    writer.open_variable(out, name).write(plan.static(name)).result()


def _fingerprint(files, member, times) -> str:
  """Names what a store is made from: the files (path, size, modification time), the member
  and the time range; a resumed conversion must have the same."""
  stats = [(path, paths.as_epath(path).stat().length, paths.as_epath(path).stat().mtime)
           for path in files]
  text = json.dumps([stats, member, str(times[0]), str(times[-1]), len(times)])
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def _store_attrs(path: str) -> dict | None:
  if not any(paths.exists(paths.join(path, marker)) for marker in (".zgroup", "zarr.json")):
    return None
  return writer.read_attrs(path)


def _resume_point(where: str, fingerprint: str, overwrite: bool) -> int | None:
  """Times already written into `where` by a conversion of the same sources, or None to
  start afresh (with `overwrite`, a conversion of other sources there is discarded)."""
  if not outputs.holds_data(where):
    return None
  record = (_store_attrs(where) or {}).get(CONVERSION)
  if record and record["fingerprint"] == fingerprint:  # complete: killed before its rename
    return int(record["times_written"])
  if record is None and not overwrite:  # never delete what this module did not write
    raise UserError(f"{where} is in the way and is not a conversion cut short; remove it.")
  if not overwrite:
    raise UserError(f"{where} is a conversion of other sources cut short "
                    f"({record['sources']}); continue it with those, or start afresh with "
                    "`overwrite=True`.")
  paths.as_epath(where).rmtree()
  return None
