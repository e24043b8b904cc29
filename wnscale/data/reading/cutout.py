"""The regional cut-out (`FORMAT`, the composing entry of `store_formats.FORMATS`): a global
store and a regional store read as one store on the cut-out's points.

`open_cutout` opens both stores, each by its own format, and `combine` joins them
(`graphs.region.cut_out` says which points of each are kept) into one `store.WeatherStore`
on the joined points: each variable's view is a virtual concatenation (`tensorstore.concat`)
along the points of the two stores' views, taken at the times both hold, so a read of the
cut-out is one read of each store, decoded straight into the caller's buffer as for any
store.
"""

from __future__ import annotations

import numpy as np
import tensorstore as ts

from wnscale.data import variables as variables_lib
from wnscale.data.reading import store as store_lib
from wnscale.data.reading.format_interface import StoreFormat
from wnscale.errors import UserError
from wnscale.graphs import region as region_lib


def open_cutout(open_part, path: str, variables: tuple[str, ...], levels: tuple[int, ...],
                time_step_hours: int, resolution: float | None, forcings: tuple[str, ...],
                member: int, regional_path: str, region: region_lib.Box | None
                ) -> store_lib.WeatherStore:
  """`store_formats.open_store` of a cut-out (its arguments checked): the store at `path`
  with the regional store at `regional_path` cut into it (`combine`), each opened by
  `open_part` (the registry's open of one grid store, by that store's format) with the
  same variables, levels and forcings. `resolution` applies to `path`; the regional store's
  spacing is its own. `region`: the cut-out's box; None: the regional points' convex hull."""
  outer = open_part(path, variables, levels, time_step_hours, resolution, forcings, member)
  inner = open_part(regional_path, variables, levels, time_step_hours, None, forcings,
                    member)
  return combine(outer, inner, region)


def combine(outer: store_lib.WeatherStore, inner: store_lib.WeatherStore,
            box: region_lib.Box | None) -> store_lib.WeatherStore:
  """`outer` (global) with `inner`'s (regional) points in place of its own in the region.

  Both stores hold the same variables, levels and forcings (`open_cutout` opens each with
  the same arguments). The result has the times both hold, the points
  of `region.cut_out` (`points.region` marks the regional ones) and each store's
  missing times.

  Raises:
    UserError: the stores share no time, or the region is not one (`region.cut_out`).
  """
  points, outer_kept, inner_kept = region_lib.cut_out(outer.points, inner.points, box,
                                                      inner.path)
  times = np.intersect1d(outer.times, inner.times)
  if times.size == 0:
    raise UserError(
        f"The regional store {inner.path} ({inner.times[0]} .. {inner.times[-1]}) and the "
        f"global store {outer.path} ({outer.times[0]} .. {outer.times[-1]}) share no time "
        f"at the model's {outer.time_step_hours} h step: a cut-out reads both at the same "
        "times.")
  parts = [(outer, outer_kept, np.searchsorted(outer.times, times)),
           (inner, inner_kept, np.searchsorted(inner.times, times))]
  statics = set(variables_lib.STATIC_VARIABLES)
  views = {name: ts.concat([_points_view(store, name, kept, None if name in statics else at)
                            for store, kept, at in parts], axis=-1)
           for name in outer.views}
  missing = None
  if outer.missing is not None or inner.missing is not None:
    missing = np.zeros(times.size, bool)
    for store, _, at in parts:
      if store.missing is not None:
        missing |= store.missing[at]
  return store_lib.WeatherStore(
      f"{outer.path} with the cut-out {inner.path}", outer.variables, outer.levels,
      outer.time_step_hours, times, points, 1,
      np.arange(outer.level_indices.size, dtype=np.int64), {}, views,
      forcings=outer.forcings, missing=missing)


def _points_view(store: store_lib.WeatherStore, name: str, kept: np.ndarray,
                 at: np.ndarray | None) -> ts.TensorStore:
  """`store`'s view of `name` at its model times `at` (None: a static field), on its
  configured levels, at the points `kept` (internal order): `[time, [level,] kept]`."""
  view = store.views[name]
  if at is not None:
    native = at * store.time_stride
    atmospheric = variables_lib.is_atmospheric(name)
    view = view.oindex[native, store.level_indices] if atmospheric else view.oindex[native]
  leading = (slice(None),) * (view.rank - (1 if store.points.field_shape is None else 2))
  if store.points.field_shape is None:
    index = (kept,)
  else:
    index = np.unravel_index(kept, store.points.field_shape)
  # Vectorized indexing puts the points' dimension first: moved back to the end.
  return view.vindex[leading + tuple(index)][ts.d[0].transpose[-1]]


# Chosen by a regional store named beside the store (`data.regional_path`), never by a
# store's layout: any two grid stores may be cut together.
FORMAT = StoreFormat("regional cut-out", recognises=None, open=open_cutout, composes=True)
