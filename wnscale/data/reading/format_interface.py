"""What the store formats' registry (`store_formats`) and the formats' modules
(`weatherbench2_zarr`, `anemoi`, `observations`, `cutout`) share, importing neither: the
interface a format's module implements, as its `FORMAT`, and the kinds of store a format
yields."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import xarray as xr

# What a format's `open` returns: a grid store (`store.WeatherStore`: fields on a grid or on
# any points, the model's state; `data.path`) or a point store
# (`observations.ObservationStore`: values at stations, a modality's; `data.modalities`).
GRID = "grid"
POINTS = "points"


class StoreFormat(NamedTuple):
  """A store format: what its module implements, as one entry of `store_formats.FORMATS`.

  Attributes:
    name: the format, as messages and logs name it.
    recognises: `path -> bool`: the store at `path` (local or a URL) is of this format;
      None for a composing format (`composes`), which holds no store of its own.
    open: by what the format yields:
      `GRID`: `(path, variables, levels, time_step_hours, resolution, forcings, member) ->
        store.WeatherStore`, `store_formats.open_store`'s arguments (a format without
        ensemble members or of its own grid leaves `member` or `resolution` unread);
      `POINTS`: `(path, variables) -> observations.ObservationStore`;
      composing: `(open_part, path, variables, levels, time_step_hours, resolution, forcings,
        member, regional_path, region) -> store.WeatherStore`, where `open_part` is the
        registry's open of one grid store (the `GRID` arguments).
    dataset: `path -> xr.Dataset`: the store's variables, data read on access
      (`store_formats.open_dataset`): a grid store in WeatherBench2's layout, a point store
      in its own; None for a composing format.
    time_step_hours: `(path, default) -> float`: the store's own time step (`default` for a
      store of one time); None: a store whose times need not be on a step (a point store's),
      or a composing format.
    statistics: `(path, time_step_hours) -> xr.Dataset`: the statistics the store carries,
      in `wnscale.data.reading.normalization`'s layout, diff_std over `time_step_hours` (None:
      the store's step), as stored (not floored); None: a format that carries none.
    yields: `GRID` or `POINTS`, what `open` returns.
    composes: a composing format, chosen whenever a run names a regional store
      (`store_formats.open_store`'s `regional_path`, the config's `data.regional_path`),
      whatever the store at `path` holds: it joins the stores at `path` and at
      `regional_path`, each opened by its own format.
  """

  name: str
  recognises: Callable[[str], bool] | None
  open: Callable[..., Any]
  dataset: Callable[[str], xr.Dataset] | None = None
  time_step_hours: Callable[[str, float], float] | None = None
  statistics: Callable[[str, float | None], xr.Dataset] | None = None
  yields: str = GRID
  composes: bool = False
