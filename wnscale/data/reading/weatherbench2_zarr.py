"""The WeatherBench2 zarr format (`FORMAT`, an entry of `store_formats.FORMATS`): stores as
WeatherBench2 publishes them and as wnscale writes them (`launch.make_dataset`, the synthetic
store), opened as a `store.WeatherStore` (`open_weather_store`).

xarray opens metadata and coordinates only; array data is read through
tensorstore, all variables of a batch in flight at once, decoded straight into
the caller's buffer. Works on the synthetic stores and on real WB2 / ARCO-ERA5
stores, local or in a bucket (`gs://...`): zarr v2 or v3; dimensions found by
name, so `(time, level, latitude, longitude)` (ERA5, WB2's 0.25 and 1 deg
stores) and `(time, level, longitude, latitude)` (WB2's low-resolution
regridded stores) alike, any mix per variable; latitude in either order, with
or without pole rows; any time chunking; 1-hourly data subsampled to the
model's step; a subset of the store's levels; extra variables ignored.

Stores on other points (a reduced Gaussian or HEALPix grid, any list of
points) have one spatial dimension `values` in place of `(latitude,
longitude)`, with `latitude(values)` and `longitude(values)` coordinates and
optionally `cell_area(values)` (a coordinate or a variable: the points' own
areas; else their Voronoi cells', `graphs.points`).

Internal order (`store.py`): a regular grid's latitude ascending
(-90 -> 90), longitude ascending in [0, 360) whatever the store's convention (a
-180 .. 180 store's columns rotated), flattened latitude-major; a point store's
points in the store's own order. Each variable gets a tensorstore view in that
order (a transposed and/or latitude-flipped index transform of the stored
array), so reordering happens inside tensorstore's copy. The store's grid
nodes are its `points` (`graphs.points.PointSet`).

What is checked when a store is opened, each a one-line `UserError`: that it is a
store of states over time (not a climatology or a forecast, `outputs.store_kind`);
the variables, levels and their dims; times increasing without duplicates at one
step (naming the first time that is not); each variable's dtype (floating point:
float64 and float16 are read as float32; an integer one, e.g. packed with
`scale_factor`, is refused); each variable's `units` against the catalogue's
(`units.conversion`: degC and hPa are converted on reading, with one log line; another
mismatch is refused). A chunk that cannot be decoded (a truncated or overwritten
file) is a `CorruptChunk` naming the variable and times when it is read.
"""

from __future__ import annotations

import logging

import numpy as np
import tensorstore as ts

from wnscale import outputs, paths
from wnscale.data import variables as variables_lib
from wnscale.data.reading import store as store_lib
from wnscale.data.reading.format_interface import StoreFormat
from wnscale.errors import StoreLacks, UserError
from wnscale.graphs.points import PointSet

# The attribute of a store made by `wnscale.data.making.convert`: its sources and progress.
CONVERSION_ATTR = "conversion"
# Coordinates are compared to a resolution with this tolerance, in degrees.
RESOLUTION_TOLERANCE = 1e-3


def open_weather_store(path: str, variables: tuple[str, ...], levels: tuple[int, ...],
              time_step_hours: int, resolution: float | None, forcings: tuple[str, ...],
              member: int) -> store_lib.WeatherStore:
  """`store_formats.open_store` of a zarr store in WeatherBench2's layout (its arguments
  checked); it has no ensemble members (`member` is not read)."""
  del member
  names = variables + forcings + variables_lib.STATIC_VARIABLES
  _check_kind(path)
  with store_lib.open_metadata(path) as dataset:
    conversion = dataset.attrs.get(CONVERSION_ATTR)
    if conversion and not conversion.get("complete"):
      raise UserError(f"{path} is a conversion cut short ({conversion['times_written']} times "
                      "written); run the make_dataset command that made it again to continue it.")
    points, flip, space, column_order = _grid(dataset, resolution, path)
    dims = _check_variables(dataset, variables + forcings, levels, space, path)
    times, stride = _subsampled_times(dataset, time_step_hours, path)
    store_levels = [int(level) for level in dataset["level"].values
                   ] if "level" in dataset.coords else []
    convert = store_lib.unit_conversions({name: dataset[name].attrs.get("units") for name in names
                                if name in dataset}, names, path)
  if any(variables_lib.lookup(name).atmospheric for name in variables):
    level_indices = np.asarray([store_levels.index(level) for level in levels],
                               np.int64)
  else:  # surface variables only: levels play no part
    level_indices = np.zeros(0, np.int64)
  driver = store_lib.tensorstore_driver(path)
  context = ts.Context()
  handles = {
      name: ts.open({"driver": driver, "kvstore": paths.kvstore_spec(paths.join(path, name))},
                    read=True, context=context).result()
      for name in names
  }
  _check_dtypes(handles, path)
  views = {name: _internal_view(handles[name], dims[name], space, flip, column_order)
           for name in names}
  return store_lib.WeatherStore(path, variables, levels, time_step_hours, times, points,
                      stride, level_indices, handles, views, flip_latitude=flip,
                      forcings=forcings, convert=convert)


_SAID: set = set()  # (store, what) said once in this process


def _check_kind(path: str):
  """A store of states over time: not a climatology or a forecast (one line saying what it is
  instead; an observation store is a point store, `store_formats` tells it apart)."""
  found = outputs.identify(path)
  made_by = {outputs.CLIMATOLOGY: "launch.make_climatology", outputs.FORECAST:
             "launch.forecast"}
  if found not in made_by:
    return
  raise UserError(f"{path} is {found.noun} ({made_by[found]} writes them), not a store of "
                  "states over time: give a dataset "
                  "store (WeatherBench2's layout, an anemoi-datasets store, or one "
                  "launch.make_dataset writes).")


def _check_dtypes(handles: dict, path: str):
  """Floating-point variables only; float64 (or float16) is read as float32 (said once)."""
  cast = []
  for name, handle in handles.items():
    dtype = np.dtype(handle.dtype.numpy_dtype)
    if not np.issubdtype(dtype, np.floating):
      raise UserError(f"Variable {name!r} of store {path} is stored as {dtype}; wnscale reads "
                      "floating-point variables (float32, or float64 read as float32). An "
                      "integer variable packed with scale_factor/add_offset must be "
                      "unpacked: write the store again as float32.")
    if dtype != np.float32:
      handles[name] = ts.cast(handle, ts.float32)
      cast.append(f"{name} ({dtype})")
  if cast and (path, "dtype") not in _SAID:
    _SAID.add((path, "dtype"))
    logging.info("Store %s: %s read as float32.", path, ", ".join(cast))


def time_step_hours(path: str, default: float) -> float:
  """`store_formats.native_time_step_hours` of a zarr store in WeatherBench2's layout."""
  with store_lib.open_metadata(path) as dataset:
    times = dataset["time"].values
  return (times[1] - times[0]) / np.timedelta64(1, "h") if len(times) > 1 else default


def _internal_view(handle: ts.TensorStore, dims: tuple[str, ...], space: tuple[str, ...],
                   flip_latitude: bool, column_order: np.ndarray | None = None):
  """`handle` with its dimensions in internal order (`space` last), latitude ascending,
  longitude ascending in [0, 360) (`column_order`: the store's columns in that order, None:
  as stored), origin 0."""
  order = [dim for dim in ("time", "level") + space if dim in dims]
  view = handle
  if list(dims) != order:
    view = view[ts.d[[dims.index(dim) for dim in order]].transpose[list(range(len(order)))]]
  if flip_latitude:
    view = view[ts.d[order.index("latitude")][::-1]].translate_to[0]
  if column_order is not None:
    view = view[ts.d[order.index("longitude")][column_order]]
  return view


def _check_variables(dataset, variables, levels, space, path) -> dict[str, tuple[str, ...]]:
  """Every required variable present with WB2 dims (any order; `space` in place of
  latitude and longitude); every level present.

  Returns:
    `{name: dims as stored}` of the variables and statics.
  """
  required = variables + variables_lib.STATIC_VARIABLES
  missing = [name for name in required if name not in dataset]
  if missing:
    forcings = [name for name in missing if name in variables_lib.FORCING_CHANNELS]
    hint = (f" ({forcings}: forcings the config reads from the store, data.stored_forcings; "
            "leave them out of it to compute them)" if forcings else "")
    have = str(sorted(str(name) for name in dataset.data_vars))
    raise StoreLacks(path, f"variable(s) {missing}", have, (
        f"Store {path} lacks variable(s) {missing}{hint}; it has {have}. Choose "
        "data.variables among those (the static fields are always needed), or use a store "
        "that has them."))
  dims = {}
  for name in required:
    if name in variables_lib.STATIC_VARIABLES:
      expected = space
    elif variables_lib.is_atmospheric(name):
      expected = ("time", "level") + space
    else:
      expected = ("time",) + space
    dims[name] = tuple(str(dim) for dim in dataset[name].dims)
    if sorted(dims[name]) != sorted(expected):
      raise UserError(f"Variable {name!r} in {path} has dims {dims[name]}; expected "
                      f"{expected} in any order")
  if any(variables_lib.is_atmospheric(name) for name in variables):
    store_levels = [int(level) for level in dataset["level"].values]
    absent = [level for level in levels if level not in store_levels]
    if absent:
      raise StoreLacks(path, f"level(s) {absent} hPa", str(store_levels), (
          f"Level(s) {absent} hPa not in store {path}; it has {store_levels}. Choose "
          "data.pressure_levels among those."))
  return dims


def _subsampled_times(dataset, time_step_hours, path):
  """The store's times every `time_step_hours` and the index stride."""
  times = dataset["time"].values
  if not np.issubdtype(times.dtype, np.datetime64):
    raise UserError(f"Time coordinate of {path} is not datetime-decodable: "
                    f"dtype {times.dtype}")
  if len(times) < 2:
    raise UserError(f"Store {path} has {len(times)} time(s); need at least 2")
  store_lib.check_times(times, path)
  steps = np.diff(times) / np.timedelta64(1, "h")
  step = float(steps[0])
  stride = time_step_hours / step
  if not float(stride).is_integer():
    raise UserError(
        f"Store {path} has a time step of {step:g} h, which does not divide "
        f"time_step_hours={time_step_hours} (the store is too coarse or "
        "misaligned)")
  stride = int(stride)
  return times[::stride].astype("datetime64[ns]"), stride


def _grid(dataset, resolution, path
          ) -> tuple[PointSet, bool, tuple[str, ...], np.ndarray | None]:
  """`(points, flip, spatial dims, column order)`: the store's points (a regular grid's
  latitude ascending, longitude ascending in [0, 360)), whether to flip its latitude, its
  spatial dimensions, and the order of its longitude columns that makes longitude
  ascending in [0, 360) (None: they are)."""
  if store_lib.POINT_DIM in dataset.dims:
    return store_lib.dataset_points(dataset, path), False, (store_lib.POINT_DIM,), None
  latitude = np.asarray(dataset["latitude"].values, np.float64)
  stored = np.asarray(dataset["longitude"].values, np.float64)
  column_order = np.argsort(np.mod(stored, 360.0), kind="stable")
  longitude = np.mod(stored, 360.0)[column_order]
  if np.array_equal(column_order, np.arange(stored.size)):
    column_order = None
  lat_steps, lon_steps = np.diff(latitude), np.diff(longitude)
  if not (np.all(lat_steps > 0) or np.all(lat_steps < 0)):
    raise UserError(f"Latitude of {path} is not monotonic")
  if not np.all(lon_steps > 0):
    raise UserError(f"Longitude of {path} holds a longitude twice (modulo 360 degrees): "
                    f"{longitude[np.flatnonzero(lon_steps <= 0)[0]]:g}")
  if resolution is not None:
    spacing = (np.abs(lat_steps).mean(), lon_steps.mean())
    if any(abs(s - resolution) > RESOLUTION_TOLERANCE for s in spacing):
      raise store_lib.SpacingError(
          f"Store {path} has grid spacing {spacing[0]:g} x {spacing[1]:g} deg "
          f"(lat x lon); the config asks for resolution {resolution:g}", spacing)
  flip = bool(lat_steps[0] < 0)
  return (PointSet.regular(latitude[::-1] if flip else latitude, longitude), flip,
          store_lib.STATIC_DIMS, column_order)


# The format of any store no other entry recognises (opening one says what is wrong).
FORMAT = StoreFormat("zarr (WeatherBench2 layout)", recognises=lambda path: True,
                     open=open_weather_store, dataset=store_lib.open_metadata,
                     time_step_hours=time_step_hours, statistics=None)
