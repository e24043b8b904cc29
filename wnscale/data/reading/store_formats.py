"""The formats a dataset store may be in, one registry entry each.

An entry knows how to recognise a store of its format, open it for reading batches
(a `store.WeatherStore`), describe it (as a lazy xarray Dataset in WeatherBench2's
layout, and its own time step) and read the normalization statistics it carries, if it
carries any. `open_store`, `open_dataset`, `native_time_step_hours` (here) and
`normalization.read_stats` ask the entry of a store's format (`format_of`), so no reading
code tests for a format itself. A new format is one module and one more entry of `FORMATS`.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import xarray as xr

from wnscale import paths
from wnscale.data.reading import anemoi
from wnscale.data.reading import store as store_lib
from wnscale.data import variables as variables_lib
from wnscale.errors import UserError


class StoreFormat(NamedTuple):
  """A registry entry.

  Attributes:
    name: the format, as messages and logs name it.
    recognises: `path -> bool`: the store at `path` (local or a URL) is of this format.
    open: `(path, variables, levels, time_step_hours, resolution, forcings, member) ->
      store.WeatherStore`, `open_store`'s arguments (a format without ensemble
      members or of its own grid leaves `member` or `resolution` unread).
    dataset: `path -> xr.Dataset`: the store's variables in WeatherBench2's layout, data
      read on access (`open_dataset`).
    time_step_hours: `(path, default) -> float`: the store's own time step (`default` for
      a store of one time).
    statistics: `(path, time_step_hours) -> xr.Dataset`: the statistics the store carries,
      in `wnscale.data.reading.normalization`'s layout, diff_std over `time_step_hours` (None: the
      store's step), as stored (not floored); None: a format that carries none.
  """

  name: str
  recognises: Callable[[str], bool]
  open: Callable[..., store_lib.WeatherStore]
  dataset: Callable[[str], xr.Dataset]
  time_step_hours: Callable[[str, float], float]
  statistics: Callable[[str, float | None], xr.Dataset] | None


ANEMOI = StoreFormat(
    "anemoi-datasets", recognises=anemoi.is_anemoi_store, open=anemoi.open_weather_store,
    dataset=anemoi.open_as_dataset,
    time_step_hours=lambda path, default: anemoi.open_anemoi(path).time_step_hours,
    statistics=lambda path, time_step_hours: anemoi.anemoi_statistics(
        anemoi.open_anemoi(path), time_step_hours))
# WeatherBench2's layout, which wnscale writes (launch.make_dataset, the synthetic store):
# the format of any store no other entry recognises (opening one says what is wrong).
ZARR = StoreFormat(
    "zarr (WeatherBench2 layout)", recognises=lambda path: True, open=store_lib.open_zarr,
    dataset=store_lib.open_metadata, time_step_hours=store_lib.zarr_time_step_hours,
    statistics=None)

# In the order tried: a store's format is the first entry that recognises it.
FORMATS = (ANEMOI, ZARR)


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
  its format's entry describes it: a zarr store as it is (`store.open_metadata`), an
  anemoi-datasets store as `anemoi.open_as_dataset` lays it out."""
  return format_of(path).dataset(path)


def native_time_step_hours(path: str, default: float) -> float:
  """The store's own time step in hours (`default` for a store of one time), as its
  format's entry reads it."""
  return format_of(path).time_step_hours(path, default)
