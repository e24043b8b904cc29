"""Opens a forecast, its truth, a climatology and a baseline for scoring, and checks they fit.

A forecast is in WeatherBench2's forecast layout: variables on `time` (the
initial time), `prediction_timedelta`, [`level`,] `latitude`, `longitude`,
optionally an ensemble `number`; a truth store is in WeatherBench2's layout
(`time`, [`level`,] `latitude`, `longitude`), or an anemoi-datasets store
(`store_formats.open_dataset`). Dims are selected by name, and latitude may run either
way: every dataset here is returned with latitude ascending. On a point set, one
dim `values` takes the place of `(latitude, longitude)`, with `latitude(values)`
and `longitude(values)` coordinates; the scores weigh each point by its cell's
area (`weights`). A forecast written by `launch.forecast` lists its finished
initial times in its attributes; only those are scored.

The checks raise UserError (a ValueError) naming the problem: a forecast variable or level
the truth (or climatology) lacks, grids that differ, a valid time the truth
does not hold (the first one).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import xarray as xr
from scipy import spatial

from wnscale import outputs
from wnscale.data import units as units_lib
from wnscale.data import variables as variables_lib
from wnscale.data.reading import store as store_lib
from wnscale.data.reading import store_formats
from wnscale.errors import ArgumentError, UserError
from wnscale.evaluation import metrics
from wnscale.evaluation.metrics import LATITUDE, LONGITUDE
from wnscale.graphs import grid as grid_lib
from wnscale.graphs import region as region_lib
from wnscale.graphs.points import PointSet

INIT = "time"  # the forecast layout's initial-time dim
LEAD = "prediction_timedelta"  # the forecast layout's lead-time dim
ENSEMBLE = "number"  # an ensemble forecast's member dim
COMPLETED_ATTR = "wnscale_completed_inits"  # indices of the finished initial times
GRID_TOLERANCE = 1e-3  # degrees
CUTOUT = "cutout"  # `restricted`'s region of that mask


@dataclasses.dataclass
class Forecast:
  """An opened forecast store (lazy: nothing is read until `at_init`).

  Attributes:
    path: the store.
    dataset: the store's variables, latitude ascending, finished initial times only.
    variables: the scored variables (catalogue names).
  Properties: `init_times` (the finished ones), `leads`, `levels`.
  """

  path: str
  dataset: xr.Dataset
  variables: tuple[str, ...]

  @property
  def init_times(self) -> pd.DatetimeIndex:
    return pd.DatetimeIndex(self.dataset[INIT].values)

  @property
  def leads(self) -> pd.TimedeltaIndex:
    return pd.TimedeltaIndex(self.dataset[LEAD].values)

  @property
  def levels(self) -> list[int]:
    if "level" not in self.dataset.dims:
      return []
    return [int(level) for level in self.dataset["level"].values]

  def at_init(self, index: int) -> xr.Dataset:
    """All variables at initial time `index`, loaded as float64 (`LEAD` first)."""
    return self.dataset.isel({INIT: index}).load().astype(np.float64)

  def select(self, init_times, leads, variables=None) -> Forecast:
    """This forecast restricted to `init_times`, `leads` and `variables` (all held)."""
    variables = tuple(variables or self.variables)
    return dataclasses.replace(
        self, dataset=self.dataset[list(variables)].sel({INIT: init_times, LEAD: leads}),
        variables=variables)


def open_forecast(path: str) -> Forecast:
  """Opens a forecast store; its variables are the catalogue variables it holds."""
  dataset = store_lib.open_metadata(path)
  if INIT not in dataset.dims or LEAD not in dataset.dims:
    raise UserError(f"{path} is not in the forecast layout: it has dims "
                     f"{dict(dataset.sizes)}; expected {INIT!r} (initial time) and {LEAD!r}.")
  variables = tuple(str(name) for name in dataset.data_vars if name in variables_lib.VARIABLES)
  if not variables:
    raise UserError(f"Forecast {path} holds none of the catalogue variables "
                     f"{sorted(variables_lib.VARIABLES)}; it has {sorted(dataset.data_vars)}")
  completed = dataset.attrs.get(COMPLETED_ATTR)
  if completed is not None:
    if not completed:
      raise UserError(f"Forecast {path} has no finished initial time yet.")
    dataset = dataset.isel({INIT: sorted(int(i) for i in completed)})
  return Forecast(path, canonical_grid(dataset[list(variables)]), variables)


def initial_times_in(forecast: Forecast, start: str | None, end: str | None) -> Forecast:
  """`forecast` at its initial times in [start, end] (`store.time_range`; a range
  reaching past its initial times is an `ArgumentError` of `init_start` / `init_end`)."""
  times = forecast.init_times.values
  try:
    first, count = store_lib.time_range(times, start, end, forecast.path)
  except store_lib.TimeRangeError as error:
    raise ArgumentError(f"init_{error.side}", error.value,
                        f"{error.where('initial time')} of the forecast {forecast.path}, "
                        f"which {error.coverage}.") from error
  if count == 0:
    raise UserError(f"The forecast {forecast.path} has no initial time in {start} .. {end}; "
                    f"it has {[str(t) for t in forecast.init_times]}.")
  return forecast.select(times[first:first + count], forecast.leads)


# A variable's `(scale, offset)` into the catalogue's units (`units.conversion`), which
# `at_times` applies as it loads it.
CONVERT_ATTR = "wnscale_units_conversion"


def open_truth(path: str) -> xr.Dataset:
  """A WeatherBench2-layout or anemoi-datasets store, lazy, latitude ascending; a
  variable whose `units` differ from the catalogue's by an affine conversion (degC, hPa)
  is marked for `at_times` to convert (and said: `units.read_as`), any other mismatch is a
  `UserError`."""
  found = outputs.identify(path)
  if found in (outputs.CLIMATOLOGY, outputs.FORECAST, outputs.OBSERVATIONS):
    raise ArgumentError("truth", path, f"is {found.noun}, not a store of states over time "
                        "(the truth a forecast is scored against): give `truth` a dataset "
                        "store, e.g. the one the run trained on.")
  dataset = store_formats.open_dataset(path)
  # Valid times are looked up in it: a time out of order or twice would give wrong rows.
  store_lib.check_times(dataset["time"].values, path, evenly=False)
  for name in dataset.data_vars:
    if name in variables_lib.VARIABLES:
      convert = units_lib.read_as(str(name), dataset[name].attrs.get("units"),
                                  variables_lib.VARIABLES[name].units, path)
      if convert is not None:
        dataset[name].attrs[CONVERT_ATTR] = convert
  return canonical_grid(dataset)


def open_climatology(path: str) -> xr.Dataset:
  """A climatology store (`make_climatology`), lazy, latitude ascending."""
  climatology = store_lib.open_metadata(path)
  for dim in ("hour", "dayofyear"):
    if dim not in climatology.dims:
      raise UserError(f"{path} is not a climatology: it has no {dim!r} dim (dims "
                       f"{dict(climatology.sizes)}); make one with python -m "
                       "launch.make_climatology.")
  return canonical_grid(climatology)


def canonical_grid(dataset: xr.Dataset) -> xr.Dataset:
  """A regular grid's `dataset` with latitude ascending and longitude ascending in [0,
  360), whatever the store's conventions (-180 .. 180, latitude from the north), so that
  a forecast and a truth of other conventions compare; points stay in their own order."""
  if LATITUDE not in dataset.dims:  # points: in their own order
    return dataset
  latitude = dataset[LATITUDE].values
  if latitude[0] > latitude[-1]:
    dataset = dataset.isel({LATITUDE: slice(None, None, -1)})
  longitude = np.mod(np.asarray(dataset[LONGITUDE].values, np.float64), 360.0)
  order = np.argsort(longitude, kind="stable")
  if np.array_equal(longitude[order], dataset[LONGITUDE].values):
    return dataset
  return dataset.isel({LONGITUDE: order}).assign_coords({LONGITUDE: longitude[order]})


def restricted(forecast: Forecast, region: str) -> tuple[Forecast, xr.DataArray]:
  """The forecast at its points in `region`, and the scores' weights there.

  Args:
    region: `CUTOUT`: a cut-out forecast's regional points (its `store.REGION` mask); or a
      box "lat0,lat1,lon0,lon1" (`graphs.region.parse_box`): the points or grid cells
      inside it.

  Returns:
    `(forecast, weights)`: on a regular grid the rows' latitude weights; on points
    the forecast's `cell_area` (a cut-out's: the model's) where it has one, else the
    Voronoi cells of all its points, in the region.
  """
  data = forecast.dataset
  box = None if region == CUTOUT else region_lib.parse_box(region, "region")
  if store_lib.spatial_dims(data) == store_lib.STATIC_DIMS:
    if box is None:
      raise ArgumentError("region", region, f"the forecast {forecast.path} is on a regular "
                          "grid, not a cut-out's points: give a box lat0,lat1,lon0,lon1.")
    rows = region_lib.in_latitudes(data[LATITUDE].values, box)
    columns = region_lib.in_longitudes(data[LONGITUDE].values, box)
    weights = metrics.latitude_weights(data).isel({LATITUDE: rows})
    data = data.isel({LATITUDE: rows, LONGITUDE: columns})
  else:
    latitude, longitude = data[LATITUDE].values, data[LONGITUDE].values
    if box is not None:
      inside = region_lib.in_box(latitude, longitude, box)
    elif store_lib.REGION in data.coords:
      inside = data[store_lib.REGION].values.astype(bool)
    else:
      raise ArgumentError("region", region, f"the forecast {forecast.path} has no "
                          f"{store_lib.REGION!r} mask (it is no cut-out's, "
                          "data.regional_path): give a box lat0,lat1,lon0,lon1.")
    area = (data[store_lib.CELL_AREA].values if store_lib.CELL_AREA in data.coords
            else PointSet.from_points(latitude, longitude).area)
    weights = metrics.point_weights(area[inside])
    data = data.isel({store_lib.POINT_DIM: inside})
  if any(data.sizes[dim] == 0 for dim in store_lib.spatial_dims(data)):
    raise ArgumentError("region", region, f"no point of the forecast {forecast.path} lies "
                        "in it.")
  return dataclasses.replace(forecast, dataset=data), weights


def on_forecast_points(forecast: Forecast, other: xr.Dataset, other_path: str,
                       what: str) -> xr.Dataset:
  """`other` at the forecast's points (or, on a regular grid, its rows and columns), found
  by their coordinates (to `GRID_TOLERANCE`): e.g. a regional store as the truth of a
  cut-out forecast's region (`restricted`). A regular `other` serves points too.

  Raises:
    UserError: a forecast point `other` does not hold.
  """
  regular = store_lib.spatial_dims(forecast.dataset) == store_lib.STATIC_DIMS
  if regular:  # rows and columns, each matched on its own axis
    if store_lib.spatial_dims(other) != store_lib.STATIC_DIMS:
      check_same_grid(forecast.dataset, forecast.path, other, other_path)
    try:
      other = other.sel({dim: forecast.dataset[dim].values for dim in (LATITUDE, LONGITUDE)},
                        method="nearest", tolerance=GRID_TOLERANCE)
    except KeyError as error:
      raise UserError(f"The {what} {other_path} lacks grid rows or columns of the forecast "
                      f"{forecast.path} ({error}); score against a store that holds them."
                      ) from error
    return other.assign_coords(grid_coords(forecast.dataset))
  if store_lib.spatial_dims(other) == store_lib.STATIC_DIMS:  # every grid cell a point
    latitude, longitude = grid_lib.grid_lat_lon(other[LATITUDE].values,
                                                other[LONGITUDE].values)
    other = other.stack({store_lib.POINT_DIM: (LATITUDE, LONGITUDE)}).drop_vars(
        [store_lib.POINT_DIM, LATITUDE, LONGITUDE])
  else:
    latitude, longitude = other[LATITUDE].values, other[LONGITUDE].values
  here = (forecast.dataset[LATITUDE].values, forecast.dataset[LONGITUDE].values)
  chord, index = spatial.cKDTree(grid_lib.lat_lon_to_xyz(latitude, longitude)).query(
      grid_lib.lat_lon_to_xyz(*here))
  far = np.flatnonzero(chord > np.deg2rad(GRID_TOLERANCE))
  if far.size:
    raise UserError(f"The {what} {other_path} has no point at latitude {here[0][far[0]]:g}, "
                    f"longitude {here[1][far[0]]:g} of the forecast {forecast.path} "
                    f"({far.size} of its {here[0].size} points are not in it); score against "
                    "a store that holds them (a cut-out's region: its regional store).")
  other = other.isel({store_lib.POINT_DIM: index})
  return other.drop_vars([LATITUDE, LONGITUDE], errors="ignore").assign_coords(
      grid_coords(forecast.dataset))


def fitted(forecast: Forecast, other: xr.Dataset, other_path: str, what: str,
           by_coordinates: bool = False) -> xr.Dataset:
  """`other` (the truth or a climatology) checked against the forecast, on its grid.

  It must hold every forecast variable and level, on the same grid (to
  `GRID_TOLERANCE`); it is returned with the forecast's coordinates, so that
  arithmetic between them aligns. `by_coordinates`: `other` may be on any grid that
  holds the forecast's points (`on_forecast_points`), e.g. for a region's scores.
  """
  for name in forecast.variables:
    if name not in other:
      raise UserError(f"Forecast variable {name!r} is not in the {what} {other_path}; it "
                       f"has {sorted(str(n) for n in other.data_vars)}.")
    if "level" in forecast.dataset[name].dims:
      held = [int(level) for level in other["level"].values] if "level" in other.dims else []
      absent = [level for level in forecast.levels if level not in held]
      if absent:
        raise UserError(f"The {what} {other_path} lacks level(s) {absent} hPa of forecast "
                         f"variable {name!r}; it has {held}.")
  if by_coordinates:
    return on_forecast_points(forecast, other, other_path, what)
  check_same_grid(forecast.dataset, forecast.path, other, other_path)
  return other.assign_coords(grid_coords(forecast.dataset))


def grid_coords(dataset: xr.Dataset) -> dict:
  """`dataset`'s latitude and longitude, for `assign_coords` of another on its grid."""
  space = store_lib.spatial_dims(dataset)
  if space == (store_lib.POINT_DIM,):
    return {name: (space, dataset[name].values) for name in (LATITUDE, LONGITUDE)}
  return {dim: dataset[dim].values for dim in (LATITUDE, LONGITUDE)}


def weights(forecast: Forecast, truth: xr.Dataset, truth_path: str) -> xr.DataArray:
  """The scores' area weights: a regular grid's latitude bands (`metrics.latitude_weights`),
  or the truth's points' cell areas (`store.dataset_points`: the store's `cell_area`, else
  the points' spherical Voronoi cells')."""
  if store_lib.spatial_dims(forecast.dataset) == store_lib.STATIC_DIMS:
    return metrics.latitude_weights(forecast.dataset)
  return metrics.point_weights(store_lib.dataset_points(truth, truth_path).area)


def check_same_grid(a: xr.Dataset, a_path: str, b: xr.Dataset, b_path: str):
  """Raises a `UserError` unless `a` and `b` are on the same grid or the same points."""
  def describe(dataset, path):
    lat, lon = dataset[LATITUDE].values, dataset[LONGITUDE].values
    size = (f"{lat.size} points" if store_lib.spatial_dims(dataset) != store_lib.STATIC_DIMS
            else f"{len(lat)} x {len(lon)}")
    return (f"{path}: {size} (latitude {lat.min():g}..{lat.max():g}, "
            f"longitude {lon.min():g}..{lon.max():g})")

  space = store_lib.spatial_dims(a)
  if space != store_lib.spatial_dims(b) or any(a.sizes[dim] != b.sizes[dim] for dim in space):
    same = False
  elif space == store_lib.STATIC_DIMS:
    same = all(np.allclose(a[dim].values, b[dim].values, atol=GRID_TOLERANCE)
               for dim in (LATITUDE, LONGITUDE))
  else:  # the same points in the same order, longitudes equal modulo 360
    turn = np.mod(a[LONGITUDE].values - b[LONGITUDE].values + 180, 360) - 180
    same = (np.allclose(a[LATITUDE].values, b[LATITUDE].values, atol=GRID_TOLERANCE)
            and np.allclose(turn, 0, atol=GRID_TOLERANCE))
  if not same:
    raise UserError(f"Grids differ: {describe(a, a_path)}; {describe(b, b_path)}. Regrid one "
                     "to the other's grid first.")


def check_valid_times(forecast: Forecast, truth: xr.Dataset, truth_path: str):
  """The truth holds every valid time, and every initial time (for persistence)."""
  held = pd.DatetimeIndex(truth[INIT].values)
  for init in forecast.init_times:
    for lead in [pd.Timedelta(0)] + list(forecast.leads):
      if init + lead not in held:
        raise UserError(
            f"The truth {truth_path} has no data at {init + lead} (initial time {init} + "
            f"lead {lead}); it covers {held[0]} .. {held[-1]}, all valid times of the initial "
            f"times {held[0]} .. {held[-1] - forecast.leads[-1]}. Score initial times in "
            "that range, or use a truth store that covers them.")


def at_times(dataset: xr.Dataset, variables, levels, times, dim: str = LEAD) -> xr.Dataset:
  """`variables` of `dataset` at `times` (and `levels`), stacked along `dim`, as float64."""
  selected = dataset[list(variables)].sel({INIT: xr.DataArray(pd.DatetimeIndex(times),
                                                              dims=dim)})
  if levels and "level" in selected.dims:
    selected = selected.sel(level=levels)
  selected = selected.drop_vars(INIT).load().astype(np.float64)
  for name in selected.data_vars:  # a truth in degC or hPa: in the catalogue's units
    convert = selected[name].attrs.get(CONVERT_ATTR)
    if convert is not None:
      selected[name] = selected[name] * convert[0] + convert[1]
  return selected


def channel_names(dataset: xr.Dataset) -> list[tuple[str, str, int | None]]:
  """`[(channel, variable, level or None)]` of a dataset's variables, e.g. `temperature@850`."""
  channels = []
  for name in dataset.data_vars:
    if "level" in dataset[name].dims:
      channels += [(f"{name}@{int(level)}", str(name), int(level))
                   for level in dataset["level"].values]
    else:
      channels.append((str(name), str(name), None))
  return channels
