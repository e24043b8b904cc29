"""Regular latitude/longitude grids and spherical coordinates.

Graph builders take the grid as coordinate arrays (it always comes from the
data); the helpers here make the standard grids for configs and tests.
"""

from __future__ import annotations

import numpy as np

from wnscale.errors import UserError


def regular_grid(resolution: float, include_poles: bool | None = None):
  """Latitudes (ascending) and longitudes of a regular grid, in degrees.

  Args:
    resolution: grid spacing in degrees; must divide 360 (and so 180 too, for
      the latitudes).
    include_poles: True gives rows at +-90 (ERA5 0.25 deg: 721 x 1440); False
      puts the rows half a spacing off the poles (WeatherBench2 5.625 deg:
      32 x 64). None: the usual grid at `resolution`, as WeatherBench2
      publishes it: pole rows at 1 deg and finer, none when coarser.

  Returns:
    `(latitude [num_lat], longitude [num_lon])`, float64.
  """
  num_lon = 360.0 / resolution
  if abs(num_lon - round(num_lon)) > 1e-6:
    raise UserError(f"Grid resolution {resolution} deg does not divide 360 deg.")
  num_lon = int(round(num_lon))
  if include_poles is None:
    include_poles = resolution <= 1.0
  longitude = np.arange(num_lon) * resolution
  if include_poles:
    latitude = np.linspace(-90.0, 90.0, num_lon // 2 + 1)
  else:
    latitude = -90.0 + resolution * (np.arange(num_lon // 2) + 0.5)
  return latitude, longitude


def check_global(latitude: np.ndarray, longitude: np.ndarray):
  """Raises a `UserError` unless the grid covers the globe, as the model's graphs need.

  Covering: the longitudes go all the way round at their spacing, and the
  latitudes reach within one spacing of each pole (rows on the poles or half a
  spacing off them). A regional grid would leave mesh nodes with no grid nodes.
  """
  latitude, longitude = np.sort(np.asarray(latitude)), np.sort(np.asarray(longitude))
  lat_step = np.diff(latitude).mean() if latitude.size > 1 else 180.0
  lon_step = np.diff(longitude).mean() if longitude.size > 1 else 360.0
  tolerance = 1e-3  # degrees
  round_the_globe = abs(longitude.size * lon_step - 360.0) <= tolerance * longitude.size
  pole_to_pole = (latitude[0] <= -90.0 + lat_step + tolerance
                  and latitude[-1] >= 90.0 - lat_step - tolerance)
  if not (round_the_globe and pole_to_pole):
    raise UserError(
        f"The grid does not cover the globe: latitude {latitude[0]:g} .. {latitude[-1]:g}, "
        f"longitude {longitude[0]:g} .. {longitude[-1]:g} ({latitude.size} x "
        f"{longitude.size} points, every {lat_step:g} x {lon_step:g} deg); the model's "
        "graphs need a global latitude/longitude grid. Use a global store (a regional one "
        "cannot be used).")


def grid_lat_lon(latitude: np.ndarray, longitude: np.ndarray):
  """Per-node latitude and longitude of the flattened grid, `[num_lat * num_lon]`.

  Nodes are latitude-major: node `i * num_lon + j` is `(latitude[i], longitude[j])`.
  """
  node_lat, node_lon = np.meshgrid(latitude, longitude, indexing="ij")
  return node_lat.reshape(-1), node_lon.reshape(-1)


def lat_lon_to_xyz(lat_deg: np.ndarray, lon_deg: np.ndarray) -> np.ndarray:
  """Unit vectors `[n, 3]` of points given in degrees, in the inputs' float dtype.

  As the reference computes them: from the colatitude theta = 90 - lat and
  lon, `(cos lon sin theta, sin lon sin theta, cos theta)`, all in the input
  precision (float32 for the graphs: the bits decide ties at the grid-to-mesh
  radius).
  """
  lon = np.deg2rad(lon_deg)
  colatitude = np.deg2rad(90 - lat_deg)
  sin_colatitude = np.sin(colatitude)
  return np.stack([np.cos(lon) * sin_colatitude, np.sin(lon) * sin_colatitude,
                   np.cos(colatitude)], axis=-1)


def xyz_to_lat_lon(xyz: np.ndarray):
  """Latitude and longitude in degrees (longitude in [0, 360)) of unit vectors `[n, 3]`.

  In the input's float dtype, via the colatitude `arccos(z)` as the reference does.
  """
  x, y, z = xyz[:, 0], xyz[:, 1], xyz[:, 2]
  lon = np.mod(np.rad2deg(np.arctan2(y, x)), 360)
  lat = 90 - np.rad2deg(np.arccos(np.clip(z, -1, 1)))
  return lat, lon


def cell_area_weights(latitude) -> np.ndarray:
  """`[num_lat]` float64 weights of latitude rows (degrees, any order), mean 1.

  Each row's cell runs half-way to its neighbours, and to +-90 deg at the ends.
  """
  latitude = np.asarray(latitude, np.float64)
  order = np.argsort(latitude)
  ascending = np.deg2rad(latitude[order])
  if np.any(np.diff(ascending) <= 0):
    raise UserError(f"Latitudes must be distinct; got {latitude.tolist()}")
  bounds = np.concatenate([[-np.pi / 2], (ascending[:-1] + ascending[1:]) / 2, [np.pi / 2]])
  area = np.sin(bounds[1:]) - np.sin(bounds[:-1])
  weights = np.empty_like(area)
  weights[order] = area / area.mean()
  return weights
