"""The formats a dataset store may be in, one registry entry each.

An entry knows how to recognise a store of its format, open it for reading batches
(a `store.WeatherStore`), describe it (as a lazy xarray Dataset in WeatherBench2's
layout, and its own time step) and read the normalization statistics it carries, if it
carries any. `store.open_store`, `store.open_dataset`, `store.native_time_step_hours` and
`normalization.read_stats` ask the entry of a store's format (`format_of`), so no reading
code tests for a format itself. A new format is one module and one more entry of `FORMATS`.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import xarray as xr

from wnscale.data import anemoi
from wnscale.data import store as store_lib


class StoreFormat(NamedTuple):
  """A registry entry.

  Attributes:
    name: the format, as messages and logs name it.
    recognises: `path -> bool`: the store at `path` (local or a URL) is of this format.
    open: `(path, variables, levels, time_step_hours, resolution, forcings, member) ->
      store.WeatherStore`, `store.open_store`'s arguments (a format without ensemble
      members or of its own grid leaves `member` or `resolution` unread).
    dataset: `path -> xr.Dataset`: the store's variables in WeatherBench2's layout, data
      read on access (`store.open_dataset`).
    time_step_hours: `(path, default) -> float`: the store's own time step (`default` for
      a store of one time).
    statistics: `(path, time_step_hours) -> xr.Dataset`: the statistics the store carries,
      in `wnscale.data.normalization`'s layout, diff_std over `time_step_hours` (None: the
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
