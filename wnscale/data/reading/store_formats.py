"""The formats a store wnscale reads may be in, one registry entry each (`FORMATS`):
anemoi-datasets (`anemoi`), point stores of observations (`observations`), WeatherBench2's
zarr (`weatherbench2_zarr`) and the regional cut-out (`cutout`), a format that joins two
stores of the others.

An entry (`format_interface.StoreFormat`) knows how to recognise a store of its format,
open it (a grid store, `store.WeatherStore`, or a point store,
`observations.ObservationStore`), describe it (a lazy xarray Dataset, and its own time
step) and read the normalization statistics it carries, if it carries any.
`open_store`, `open_points`, `open_dataset`, `native_time_step_hours` (here) and
`normalization.read_stats` ask the entry of a store's format (`format_of`), so no reading
code tests for a format itself. A new format is one module and one more entry of
`FORMATS`.
"""

from __future__ import annotations

import xarray as xr

from wnscale import paths
from wnscale.data import variables as variables_lib
from wnscale.data.reading import anemoi, cutout, observations, weatherbench2_zarr
from wnscale.data.reading import store as store_lib
from wnscale.data.reading.format_interface import GRID, POINTS, StoreFormat
from wnscale.errors import UserError
from wnscale.graphs import region as region_lib

# In the order tried: a store's format is the first entry that recognises it (WeatherBench2's
# zarr takes any store the others do not). The cut-out recognises no store: a regional
# store named beside the store chooses it.
FORMATS = (anemoi.FORMAT, observations.FORMAT, weatherbench2_zarr.FORMAT, cutout.FORMAT)

# What each kind of store is, for a store given where the other kind is read.
_KINDS = {GRID: "a grid store (fields over time, as data.path names)",
          POINTS: "a point store (observations at stations, as a data.modalities source names)"}


def format_of(path: str, regional_path: str = "") -> StoreFormat:
  """The format of the store at `path` (local or a URL); with a `regional_path`, the
  composing format that cuts that regional store into it."""
  if regional_path:
    return next(entry for entry in FORMATS if entry.composes)
  return next(entry for entry in FORMATS if not entry.composes and entry.recognises(path))


def open_store(path: str,
               variables,
               levels,
               time_step_hours: int = 6,
               resolution: float | None = None,
               forcings=(),
               member: int = 0,
               regional_path: str = "",
               region: region_lib.Box | None = None) -> store_lib.WeatherStore:
  """Opens the grid store at `path` for reading `variables` on `levels` every
  `time_step_hours`, as its format's entry opens it (`format_of`).

  Args:
    path: directory or URL (`gs://bucket/era5.zarr`) of a zarr v2 or v3 store
      in a WB2 layout, or of another grid format of `FORMATS`.
    variables: variable names (catalogue names, config order).
    levels: pressure levels in hPa, config order; each must be in the store.
    time_step_hours: the model's time step; the store's step must divide it.
    resolution: if given, a regular store's lat/lon spacing must equal it (degrees);
      a store on other points says its grid, and this is not used.
    forcings: forcings to read from the store (`variables.FORCING_CHANNELS`
      names, stored like surface variables).
    member: the ensemble member of an anemoi-datasets store (`data.reading.anemoi`; such
      a store is found by its layout, and its `missing_dates` are `missing`).
    regional_path: a regional store to cut into the store at `path` (`data.regional_path`):
      the cut-out's points, at the times both hold (`cutout`); `resolution` applies to
      `path` only, the regional store's spacing is its own.
    region: the cut-out's box (`data.region`); None: the regional points' convex hull.

  The store raises on NaN until its `fill` values are set.

  Raises:
    ValueError: naming the problem, for any store that does not fit.
  """
  path = paths.normalize(path)
  variables = tuple(variables)
  forcings = tuple(forcings)
  levels = tuple(int(level) for level in levels)
  for name in variables:
    variables_lib.lookup(name)
  unknown = [name for name in forcings if name not in variables_lib.FORCING_CHANNELS]
  if unknown:
    raise UserError(f"Unknown forcing(s) {unknown}; known: {variables_lib.FORCING_CHANNELS}")
  arguments = (variables, levels, time_step_hours, resolution, forcings, member)
  if regional_path:
    return format_of(path, regional_path).open(
        _open_grid, path, *arguments, paths.normalize(regional_path), region)
  return _open_grid(path, *arguments)


def _open_grid(path: str, *arguments) -> store_lib.WeatherStore:
  """The grid store at `path`, opened by its format with `open_store`'s checked arguments."""
  return _yielding(path, GRID).open(path, *arguments)


def open_points(path: str, variables) -> observations.ObservationStore:
  """Opens the point store at `path` (local or a URL) and reads `variables` (WeatherBench2
  names), as its format's entry opens it (`format_of`)."""
  path = paths.normalize(path)
  return _yielding(path, POINTS).open(path, tuple(variables))


def _yielding(path: str, kind: str) -> StoreFormat:
  """`format_of(path)`, a format that yields `kind` (`GRID` or `POINTS`).

  Raises:
    UserError: the store is of the other kind, or (a point store asked for) none is there.
  """
  entry = format_of(path)
  if entry.yields == kind:
    return entry
  if not paths.exists(path):
    raise UserError(f"Store not found: {path} (no such file or directory).")
  raise UserError(f"{path} is {_KINDS[entry.yields]}, not {_KINDS[kind]}.")


def open_dataset(path: str) -> xr.Dataset:
  """Any store as a lazy xarray Dataset (data read on access), as its format's entry
  describes it: a zarr store as it is (`weatherbench2_zarr`, a point store), an
  anemoi-datasets store as `anemoi.open_as_dataset` lays it out (WeatherBench2's layout)."""
  return format_of(path).dataset(path)


def native_time_step_hours(path: str, default: float) -> float:
  """The grid store's own time step in hours (`default` for a store of one time), as its
  format's entry reads it."""
  return _yielding(path, GRID).time_step_hours(path, default)
