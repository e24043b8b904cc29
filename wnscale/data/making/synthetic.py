"""Synthetic, weather-like zarr stores in the WeatherBench2 layout.

The fields are analytic functions of (time, level, latitude, longitude) whose
random parameters come from `seed`, so a store is deterministic, can be written
in time blocks, and a 1-hourly store sampled every 6 hours equals the 6-hourly
one. Each variable is a smooth climatology (plausible magnitudes per level and
latitude, with a seasonal and, near the surface, a diurnal cycle) plus zonal
waves advected eastward by the jet. A pure travelling wave obeys
`x(t+1) = 2 cos(w) x(t) - x(t-1)`, so the next state is predictable from the
previous two: a model has something to learn.

Layout: dims `time, level, latitude, longitude` with latitude descending
(90 -> -90), as ERA5 and WeatherBench2's 0.25 and 1 deg stores hold them;
longitude ascending from 0; levels in hPa; WeatherBench2's names; one time step
per chunk; statics `geopotential_at_surface` and `land_sea_mask` on
`latitude, longitude`. (WeatherBench2's low-resolution regridded stores, e.g.
64 x 32 and 240 x 121, are longitude-major instead: `time, level, longitude,
latitude`, latitude ascending.) Also `toa_incident_solar_radiation` as ERA5
stores it, J m^-2 accumulated over the hour (here the instantaneous proxy of
`forcings.py` x the solar constant x 3600 s), for configs that read it
(`data.stored_forcings`).

On other points (`grid_name`, e.g. the octahedral reduced Gaussian "O32"): the
same fields at each point, in the point layout of `weatherbench2_zarr` (a `values`
dimension in place of `latitude, longitude`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import tensorstore as ts
import xarray as xr
import zarr

from wnscale import outputs, paths
from wnscale.data import forcings
from wnscale.data import variables as variables_lib
from wnscale.data.making import writer
from wnscale.data.reading import store as store_lib
from wnscale.errors import UserError
from wnscale.graphs import grid
from wnscale.graphs import points as points_lib
from wnscale.graphs import region as region_lib
from wnscale.graphs.points import PointSet
from wnscale.progress import WriteProgress

# Forcings written like a surface variable, as ERA5 stores hold them.
STORED_FORCINGS = ("toa_incident_solar_radiation",)
SOLAR_CONSTANT = 1361.0  # W m^-2
GRAVITY = 9.80665  # m s^-2
EARTH_RADIUS = 6.371e6  # m
SCALE_HEIGHT = 7.5e3  # m, of pressure: z(p) = H ln(p0 / p)
NUM_WAVES = 6
# Time steps written per `to_zarr` call: bounds memory, keeps calls few.
TIME_BLOCK_BYTES = 64 * 2**20


# What a synthetic store holds unless asked for other variables: GraphCast's catalogue.
DEFAULT_VARIABLES = tuple(v.name for v in variables_lib.ATMOSPHERIC_VARIABLES
                          + variables_lib.SURFACE_VARIABLES)


def store_times(start: str, end: str, time_step_hours: int) -> np.ndarray:
  """`[num_times]` datetime64[ns] from `start` 00:00 to `end` 23:00 every `time_step_hours`."""
  try:
    first, final = pd.Timestamp(start), pd.Timestamp(end)
  except ValueError as error:
    raise UserError(f"Cannot read the dates start={start!r}, end={end!r} ({error}); write "
                    "them as YYYY-MM-DD.") from error
  times = pd.date_range(first, final + pd.Timedelta(hours=23), freq=f"{time_step_hours}h")
  return times.values.astype("datetime64[ns]")


def store_coordinates(resolution: float, include_poles: bool | None = None):
  """Latitude (descending, as the stores written here hold it) and longitude.

  The grid is `graphs.grid.regular_grid`'s (pole rows at 1 deg and finer by
  default), latitude reversed.

  Returns:
    (latitude [num_lat] descending, longitude [num_lon] ascending from 0).
  """
  latitude, longitude = grid.regular_grid(resolution, include_poles)
  return latitude[::-1].copy(), longitude


def store_points(grid_name: str = "", resolution: float = 5.625,
                 include_poles: bool | None = None, region: str = "") -> PointSet:
  """The points of a synthetic store, in its order: the named grid (`points.named_grid`,
  e.g. "O32"), the regular grid of `store_coordinates`, or with `region`
  ("lat0,lat1,lon0,lon1", `graphs.region.parse_box`) a regional store's: the cell
  centres of `resolution` degrees in that box, latitude descending, longitude
  ascending from lon0."""
  box = region_lib.parse_box(region, "region")
  if box is not None:
    lat0, lat1, lon0, lon1 = box
    width = lon1 - lon0 if lon1 - lon0 >= 360 else np.mod(lon1 - lon0, 360)
    rows, columns = int(round((lat1 - lat0) / resolution)), int(round(width / resolution))
    if grid_name or rows < 1 or columns < 1:
      raise UserError(f"A regional store is a regular box of at least one {resolution:g} deg "
                      f"cell: region={region!r}" + (f" and grid={grid_name!r}: give one of "
                                                    "them" if grid_name else " is smaller"))
    latitude = lat1 - resolution * (np.arange(rows) + 0.5)
    return PointSet.regular(latitude, lon0 + resolution * (np.arange(columns) + 0.5))
  if grid_name:
    return points_lib.named_grid(grid_name)
  return PointSet.regular(*store_coordinates(resolution, include_poles))


class _Waves:
  """Random zonal waves shared by all variables; each variable scales them.

  wave k at level p: a_k(p) * m_k(lat) * cos(n_k * (lon - c(lat, p) t) + phi_k)
  where c is the angular speed of the jet. cos(a - b) is separable into a
  longitude part and a (time, level, latitude) part: on a regular grid the field
  is one matrix product `[time*level*lat, 2K] @ [2K, lon]` instead of K trig
  evaluations on the full grid; on other points, the latitude part of each
  distinct latitude (a reduced Gaussian grid's rows) times each point's
  longitude part, summed over the 2K terms.

  Args:
    lat: `[rows]` degrees, a regular grid's latitudes or each point's.
    lon: `[columns]` degrees, a regular grid's longitudes or each point's.
    regular: a regular grid (`[rows, columns]`), else points (rows = columns).
  """

  def __init__(self, rng: np.random.Generator, lat: np.ndarray,
               lon: np.ndarray, regular: bool):
    if not regular:  # the distinct latitudes, and each point's
      lat, self.row_of_point = np.unique(lat, return_inverse=True)
      self.first_of_row = np.unique(self.row_of_point, return_index=True)[1]
    self.zonal_numbers = rng.integers(1, 7, NUM_WAVES)
    self.phases = rng.uniform(0, 2 * np.pi, NUM_WAVES)
    self.amplitudes = rng.uniform(0.5, 1.0, NUM_WAVES)
    meridional_numbers = rng.integers(1, 4, NUM_WAVES)
    centres = rng.uniform(-60, 60, NUM_WAVES)
    # [K, rows]: envelopes, so waves live in bands like storm tracks.
    self.envelopes = (np.exp(-((lat[None] - centres[:, None]) / 30.0)**2) *
                      np.cos(np.deg2rad(lat[None]) * meridional_numbers[:, None]))
    self.lon = np.deg2rad(lon)
    self.regular = regular

  def field(self, angular_speed: np.ndarray, hours: np.ndarray,
            level_amplitude: np.ndarray, phase_shift: float = 0.0):
    """Sum of waves, `[time, level, lat, lon]` (regular) or `[time, level, points]`.

    Args:
      angular_speed: `[level, rows]` eastward speed, radians per hour.
      hours: `[time]` hours since the epoch.
      level_amplitude: `[level]` amplitude of this variable per level.
      phase_shift: added to every wave's phase (e.g. pi/2 for a v-like field).
    """
    n = self.zonal_numbers
    # Longitude part [2K, columns].
    lon_part = np.concatenate([
        np.cos(n[:, None] * self.lon[None] + (self.phases + phase_shift)[:, None]),
        np.sin(n[:, None] * self.lon[None] + (self.phases + phase_shift)[:, None]),
    ])
    if not self.regular:  # the speed of each distinct latitude
      angular_speed = angular_speed[:, self.first_of_row]
    # Time part [time, level, lat, K].
    shift = (n[None, None, None, :] * angular_speed[None, :, :, None] *
             hours[:, None, None, None])
    weight = (self.amplitudes[None, None, None, :] *
              self.envelopes.T[None, None, :, :] *
              level_amplitude[None, :, None, None])
    coefficients = np.concatenate(
        [weight * np.cos(shift), weight * np.sin(shift)], axis=-1)
    # float32: the product is the one full-size array; halves memory traffic.
    coefficients = coefficients.astype(np.float32)
    lon_part = lon_part.astype(np.float32)
    if not self.regular:  # [time, level, points]
      return np.einsum("tlpk,kp->tlp", coefficients[:, :, self.row_of_point], lon_part)
    out = coefficients.reshape(-1, 2 * NUM_WAVES) @ lon_part
    return out.reshape(coefficients.shape[:3] + (self.lon.size,))


class SyntheticWeather:
  """The analytic fields of one synthetic store (all float32).

  Fields are `[time, level, *space]` or `[time, *space]`, space the points'
  `field_shape` (a regular grid's `lat, lon`) or `[points]`.

  Args:
    points: the store's points (`store_points`), in its order.
    levels: pressure levels in hPa.
    seed: draws the waves and the land/orography.
  """

  def __init__(self, points: PointSet, levels, seed: int = 0):
    rng = np.random.default_rng(seed)
    self.points = points
    self.space = points.field_shape or (points.size,)
    # Broadcastable to the space: a regular grid's `[lat, 1]` and `[1, lon]`, else `[points]`.
    self.lat, self.lon = forcings.spatial_axes(points)
    self.levels = np.asarray(levels, np.float64)
    self.height = SCALE_HEIGHT * np.log(1013.25 / self.levels)  # [level] m
    regular = points.field_shape is not None
    self.waves = _Waves(rng, self.lat.reshape(-1), self.lon.reshape(-1), regular)
    self.land_sea_mask, self.orography = self._land(rng)
    sin2 = np.sin(np.deg2rad(self.lat))**2
    # Jet: westerlies peaking near 35 deg and 250 hPa, easterly trades.
    jet_shape = np.exp(-((np.abs(self.lat) - 35) / 12)**2)
    jet_height = np.exp(-((self.height - 10.5e3) / 5e3)**2)
    self.zonal_wind = (30 * self._per_level(jet_height) * jet_shape[None] + 5 *
                       jet_shape[None] - 6 * np.exp(-(self.lat / 15)**2)[None])
    # Waves are steered by the flow plus a 10 m/s drift (so none stalls),
    # radians per hour.
    coslat = np.maximum(np.cos(np.deg2rad(self.lat)), 0.05)
    self.angular_speed = ((10 + 0.7 * self.zonal_wind) * 3600 /
                          (EARTH_RADIUS * coslat[None]))  # [level, *lat]
    self.surface_temperature = 300 - 45 * sin2  # [*lat] K

  def _per_level(self, values: np.ndarray) -> np.ndarray:
    """`[level]` values as `[level, 1...]`, broadcast over the space."""
    return values.reshape((-1,) + (1,) * self.lat.ndim)

  def _waves(self, angular_speed, hours, level_amplitude, phase_shift: float = 0.0):
    """`_Waves.field` of a `[level, *lat]` speed, `[time, level, *space]`."""
    return self.waves.field(angular_speed.reshape(len(angular_speed), -1), hours,
                            level_amplitude, phase_shift)

  def _land(self, rng):
    """Smooth random continents (mask 0/1) and orography (m) on land."""
    lat = np.deg2rad(self.lat)
    lon = np.deg2rad(self.lon)
    field = np.zeros(self.space)
    for _ in range(8):
      n, m = rng.integers(1, 5, 2)
      field += rng.normal() * np.cos(n * lon + rng.uniform(0, 6.3)) * np.cos(
          m * lat + rng.uniform(0, 6.3))
    mask = (field > np.quantile(field, 0.7)).astype(np.float32)
    orography = np.where(mask > 0, 3000 * (field - field.min()) /
                         (np.ptp(field) + 1e-9), 0.0)
    return mask, orography

  def statics(self) -> dict[str, np.ndarray]:
    """`{name: [*space]}` for `variables.STATIC_VARIABLES`."""
    return {
        "geopotential_at_surface": (GRAVITY * self.orography).astype(np.float32),
        "land_sea_mask": self.land_sea_mask.astype(np.float32),
    }

  def fields(self, times: np.ndarray, names) -> dict[str, np.ndarray]:
    """`{name: [time, level, *space] or [time, *space]}` float32."""
    hours = (times - np.datetime64("1970-01-01", "s")) / np.timedelta64(1, "h")
    hours = np.asarray(hours, np.float64)
    per_time = (-1,) + (1,) * self.lat.ndim
    year = 2 * np.pi * hours / (24 * 365.25)
    sin_lat = np.sin(np.deg2rad(self.lat))
    # Seasonal cycle: summer in each hemisphere, strongest at high latitudes.
    season = (-np.cos(year - 0.3).reshape(per_time) * sin_lat[None])  # [time, *lat]
    # Local solar time on [time, *lon]; warmest early afternoon.
    local = 2 * np.pi * (hours.reshape(per_time) / 24 + self.lon[None] / 360)
    diurnal = np.cos(local - 2 * np.pi * 14 / 24)
    speed = self.angular_speed
    surface_speed = speed[-1:]
    level_ones = np.ones(len(self.levels))
    out = {}
    for name in names:
      out[name] = self._field(name, hours, season, diurnal, speed,
                              surface_speed, level_ones).astype(np.float32)
    return out

  def _field(self, name, hours, season, diurnal, speed, surface_speed,
             level_ones):
    waves = self._waves
    z = self._per_level(self.height)[None]
    t_surface = (self.surface_temperature[None] + 12 * season)  # [time, *lat]
    if name == "temperature":
      lapse = np.maximum(t_surface[:, None] - 6.5e-3 * z, 215.0)
      return lapse + waves(speed, hours, 6 * level_ones)
    if name == "geopotential":
      colder = 1 - 0.04 * (np.sin(np.deg2rad(self.lat))**2)[None, None]
      return GRAVITY * (z * colder + waves(speed, hours, 60 + 0.01 * self.height))
    if name == "u_component_of_wind":
      return (self.zonal_wind[None] +
              waves(speed, hours, 5 + 4e-4 * self.height, 0.3))
    if name == "v_component_of_wind":
      return waves(speed, hours, 5 + 4e-4 * self.height, np.pi / 2)
    if name == "vertical_velocity":
      return waves(speed, hours, 0.15 * level_ones, np.pi)
    if name == "specific_humidity":
      moisture = 0.018 * self._per_level(np.exp(-self.height / 2.5e3))[None] * (
          np.cos(np.deg2rad(self.lat))**2 + 0.05)[None, None]
      return moisture * (1 + 0.3 * waves(speed, hours, level_ones, 1.0))
    if name == "2m_temperature":
      amplitude = 2 + 6 * self.land_sea_mask[None]
      return (t_surface - 0.0065 * self.orography[None] +
              amplitude * diurnal +
              waves(surface_speed, hours, np.array([4.0]))[:, 0])
    if name in ("10m_u_component_of_wind", "10m_v_component_of_wind"):
      base = "u_component_of_wind" if "_u_" in name else "v_component_of_wind"
      upper = self._field(base, hours, season, diurnal, surface_speed,
                          surface_speed, np.ones(1))
      return 0.7 * upper[:, 0]
    if name == "mean_sea_level_pressure":
      lows = -1500 * np.exp(-((np.abs(self.lat) - 60) / 15)**2)
      return (101325 + lows[None] +
              waves(surface_speed, hours, np.array([1200.0]))[:, 0])
    if name == "toa_incident_solar_radiation":
      seconds = np.round(hours * 3600).astype(np.int64).astype("timedelta64[s]")
      times = np.datetime64("1970-01-01", "s") + seconds
      proxy = forcings.compute_forcings(times, self.points, (name,))
      return SOLAR_CONSTANT * 3600 * proxy.reshape((len(hours),) + self.space)
    if name == "sea_surface_temperature":  # NaN over land, as ERA5's
      sea = np.where(self.land_sea_mask < 0.5, 1.0, np.nan)[None]
      return sea * (np.maximum(t_surface, 271.5)
                    + waves(surface_speed, hours, np.array([0.5]))[:, 0])
    if name in ("100m_u_component_of_wind", "100m_v_component_of_wind"):
      ten_metres = name.replace("100m", "10m")
      return 1.2 * self._field(ten_metres, hours, season, diurnal, speed, surface_speed,
                               level_ones)
    if name.startswith("cyclone_"):  # WeatherNext 2's targets: blobs drifting west in the tropics
      signal = waves(surface_speed, hours, np.array([1.0]), 0.7)[:, 0]
      tropics = np.exp(-((np.abs(self.lat) - 15) / 8)**2)[None]
      blobs = tropics * np.maximum(signal - 1.0, 0.0)
      return blobs if name == "cyclone_exists_gaussian_unit_mode" else 50.0 * blobs
    if name == "total_precipitation_6hr":
      wet = np.exp(-(self.lat / 20)**2)[None]
      signal = waves(surface_speed, hours, np.array([1.5]), 0.5)[:, 0]
      # Softplus keeps it positive and mostly small, like rain.
      return 2e-3 * wet * np.log1p(np.exp(3 * signal - 2)) / 3
    raise UserError(f"No synthetic field for variable {name!r}")


def write_synthetic_store(
    path: str,
    *,
    resolution: float = 5.625,
    start: str = "2020-01-01",
    end: str = "2020-12-31",
    levels=variables_lib.WB2_LEVELS_13,
    variables=None,
    seed: int = 0,
    zarr_format: int = 2,
    time_step_hours: int = 6,
    include_poles: bool | None = None,
    grid_name: str = "",
    region: str = "",
    overwrite: bool = False,
) -> str:
  """Writes a synthetic WeatherBench2-layout zarr store at `path` (a directory or a URL).

  On the regular grid of `resolution` (`include_poles`: see `grid.regular_grid`),
  or with `grid_name` (e.g. "O32", "H16": `points.named_grid`) on those points, in
  the point layout (`weatherbench2_zarr`: a `values` dimension, `latitude`, `longitude`
  and `cell_area` along it; the attribute `grid` names it). With `region`
  ("lat0,lat1,lon0,lon1"): a regional store, the regular grid of `resolution`
  inside that box (`store_points`), for a cut-out (`data.regional_path`).

  Times run from `start` 00:00 to `end` 23:00 at `time_step_hours`. Variables
  default to GraphCast's (`DEFAULT_VARIABLES`) and the solar radiation
  (`STORED_FORCINGS`); WeatherNext 2's others are written when asked for
  (sea-surface temperature NaN over land, as ERA5's); statics are always written. xarray writes the
  layout and the first time step; the rest goes in through tensorstore in time
  blocks of ~64 MiB (zarr-python's per-chunk cost would make it several times
  slower). The store is built under a temporary name and
  appears whole or not at all (`paths.building`); an existing zarr store at
  `path` is replaced only when `overwrite` (`outputs.check`), and stays intact
  until its replacement is whole. A full disk is an `errors.NoSpaceLeft`.

  Returns:
    `path`.
  """
  if zarr_format not in (2, 3):
    raise UserError(f"zarr_format must be 2 or 3, got {zarr_format}")
  if time_step_hours <= 0:
    raise UserError(f"time_step_hours must be positive, got {time_step_hours}")
  path = paths.normalize(path)
  outputs.check(path, outputs.DATASET, argument="path", overwrite=overwrite)
  names = list(variables or DEFAULT_VARIABLES + STORED_FORCINGS)
  for name in names:
    if name not in STORED_FORCINGS:
      variables_lib.lookup(name)
  levels = [int(level) for level in levels]
  times = store_times(start, end, time_step_hours)
  if len(times) == 0:
    raise UserError(f"No times between start={start} and end={end}")
  weather = SyntheticWeather(store_points(grid_name, resolution, include_poles, region),
                             levels, seed)

  with outputs.building(path, overwrite) as where:
    _write_data(where, weather, names, times, levels, grid_name, zarr_format, path)
  return path


def _write_data(path, weather, names, times, levels, grid_name, zarr_format, shown_path):
  """Writes the store at `path` (which does not exist): the layout, then time blocks; the
  progress names `shown_path`, where the store will be."""
  bytes_per_time = 4 * weather.points.size * sum(
      len(levels) if variables_lib.is_atmospheric(n) else 1 for n in names)
  _write_layout(path, weather, names, times, levels, grid_name, zarr_format)
  block = max(1, TIME_BLOCK_BYTES // bytes_per_time)
  driver = "zarr" if zarr_format == 2 else "zarr3"
  # No fsync per chunk: a store cut short is never renamed into place, and is rewritten.
  context = ts.Context({"file_io_sync": False})
  handles = {
      name: ts.open({"driver": driver, "kvstore": paths.kvstore_spec(paths.join(path, name))},
                    write=True, context=context).result() for name in names
  }
  # Time step 0 was written by xarray with the layout. Block k is written in
  # the background while block k+1 is computed.
  progress = WriteProgress(shown_path, len(times), bytes_per_time)
  pending, written = [], 1
  try:
    for first in range(1, len(times), block):
      last = min(first + block, len(times))
      fields = weather.fields(times[first:last], names)
      writer.wait_all(pending)
      progress.done(written)
      pending, written = [handles[name][first:last].write(fields[name]) for name in names], last
  except BaseException:  # every write ends before the store is removed
    writer.wait_all(pending, raise_error=False)
    raise
  writer.wait_all(pending)
  progress.done(written)
  progress.close()


def _write_layout(path, weather, names, times, levels, grid_name, zarr_format):
  """Writes metadata, coordinates, statics and time step 0 with xarray.

  xarray owns the WB2/CF layout (dimension names, time encoding, fill values,
  consolidated metadata); the bulk of the data then goes in through
  tensorstore, which writes one-time-step chunks much faster than zarr-python.
  """
  dataset = _to_dataset(weather.fields(times[:1], names), times[:1], levels, weather.points)
  space = _spatial_dims(weather.points)
  for name, value in weather.statics().items():
    dataset[name] = (space, value)
  if grid_name:
    dataset.attrs[store_lib.GRID_ATTR] = grid_name
  encoding = {name: {"chunks": _chunks(dataset[name])} for name in names}
  start = np.datetime_as_string(times[0], "s")
  encoding["time"] = {"units": f"hours since {start}", "dtype": "int64",
                      "chunks": (len(times),)}
  # Consolidated metadata is what WB2 has for v2; not part of the v3 spec.
  dataset.to_zarr(path, mode="w", encoding=encoding, zarr_format=zarr_format,
                  consolidated=zarr_format == 2)
  # Grow the time axis to its full length, then refresh the consolidated view.
  group = zarr.open_group(path, mode="r+", zarr_format=zarr_format,
                          use_consolidated=False)
  for name in names:
    array = group[name]
    array.resize((len(times),) + array.shape[1:])
  group["time"].resize((len(times),))
  group["time"][:] = ((times - times[0]) // np.timedelta64(1, "h")).astype(
      np.int64)
  if zarr_format == 2:
    zarr.consolidate_metadata(path, zarr_format=zarr_format)


def _chunks(array: xr.DataArray):
  """One time step per chunk, the rest whole (WB2 chunking)."""
  return tuple(1 if dim == "time" else size
               for dim, size in zip(array.dims, array.shape))


def _spatial_dims(points: PointSet) -> tuple[str, ...]:
  """A regular grid's `(latitude, longitude)`, other points' `(values,)`
  (`weatherbench2_zarr`)."""
  return store_lib.STATIC_DIMS if points.field_shape else (store_lib.POINT_DIM,)


def _to_dataset(fields, times, levels, points: PointSet) -> xr.Dataset:
  space = _spatial_dims(points)
  data = {}
  for name, value in fields.items():
    data[name] = ((("time", "level") if value.ndim == 2 + len(space) else ("time",)) + space,
                  value)
  if points.field_shape:
    latitude, longitude = points.axes()
    coords = {"latitude": latitude, "longitude": longitude}
  else:
    coords = {name: (space, values) for name, values in (
        ("latitude", points.latitude), ("longitude", points.longitude),
        (store_lib.CELL_AREA, points.area))}
  return xr.Dataset(data, coords={"time": times, "level": np.asarray(levels, np.int64),
                                  **coords})
