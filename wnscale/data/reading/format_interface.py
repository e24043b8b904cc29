"""What the store formats' registry (`store_formats`) and the formats' modules
(`weatherbench2_zarr`, `anemoi`) share, importing neither: the interface a format's module
implements, as its `FORMAT`."""

from __future__ import annotations

from typing import Callable, NamedTuple

import xarray as xr

from wnscale.data.reading import store as store_lib


class StoreFormat(NamedTuple):
  """A store format: what its module implements, as one entry of `store_formats.FORMATS`.

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
