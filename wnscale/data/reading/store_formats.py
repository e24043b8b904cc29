"""The formats a dataset store may be in, one registry entry each.

An entry knows how to recognise a store of its format, open it for reading batches
(a `store.WeatherStore`), describe it (as a lazy xarray Dataset in WeatherBench2's
layout, and its own time step) and read the normalization statistics it carries, if it
carries any. `open_store`, `open_dataset`, `native_time_step_hours` (here) and
`normalization.read_stats` ask the entry of a store's format (`format_of`), so no reading
code tests for a format itself. A new format is one module and one more entry of `FORMATS`.
"""

from __future__ import annotations

import xarray as xr

from wnscale import paths
from wnscale.data import variables as variables_lib
from wnscale.data.reading import anemoi, weatherbench2_zarr
from wnscale.data.reading import store as store_lib
from wnscale.data.reading.format_interface import StoreFormat
from wnscale.errors import UserError


# In the order tried: a store's format is the first entry that recognises it.
FORMATS = (anemoi.FORMAT, weatherbench2_zarr.FORMAT)


def format_of(path: str) -> StoreFormat:
  """The format of the store at `path` (local or a URL)."""
  return next(entry for entry in FORMATS if entry.recognises(path))


def open_store(path: str,
               variables,
               levels,
               time_step_hours: int = 6,
               resolution: float | None = None,
               forcings=(),
               member: int = 0) -> store_lib.WeatherStore:
  """Opens `path` for reading `variables` on `levels` every `time_step_hours`, as its
  format's entry opens it (`format_of`).

  Args:
    path: directory or URL (`gs://bucket/era5.zarr`) of a zarr v2 or v3 store
      in a WB2 layout, or of another format of `FORMATS`.
    variables: variable names (catalogue names, config order).
    levels: pressure levels in hPa, config order; each must be in the store.
    time_step_hours: the model's time step; the store's step must divide it.
    resolution: if given, a regular store's lat/lon spacing must equal it (degrees);
      a store on other points says its grid, and this is not used.
    forcings: forcings to read from the store (`variables.FORCING_CHANNELS`
      names, stored like surface variables).
    member: the ensemble member of an anemoi-datasets store (`data.reading.anemoi`; such
      a store is found by its layout, and its `missing_dates` are `missing`).

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
  return format_of(path).open(path, variables, levels, time_step_hours, resolution,
                            forcings, member)


def open_dataset(path: str) -> xr.Dataset:
  """Any store as a lazy xarray Dataset in WeatherBench2's layout (data read on access), as
  its format's entry describes it: a zarr store as it is (`weatherbench2_zarr`), an
  anemoi-datasets store as `anemoi.open_as_dataset` lays it out."""
  return format_of(path).dataset(path)


def native_time_step_hours(path: str, default: float) -> float:
  """The store's own time step in hours (`default` for a store of one time), as its
  format's entry reads it."""
  return format_of(path).time_step_hours(path, default)
