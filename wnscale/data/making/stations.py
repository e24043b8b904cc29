"""A synthetic station network: random land-biased points, grid fields read there with noise.

What the tests (and later `make_dataset --stations`) observe a grid with: `N`
points on the sphere, a share of them on land (a station network is mostly
there), and values of the grid's fields interpolated to them (inverse-distance
over the nearest grid nodes) plus Gaussian noise, a fraction missing (NaN).
`write_network` writes such a network of a grid store as an observation store
(`wnscale.data.reading.observations` reads it), with `write_observations`, the point
format's writer.
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from scipy import spatial

from wnscale import outputs, paths
from wnscale.data import variables as variables_lib
from wnscale.data.reading import observations
from wnscale.data.reading import store_formats
from wnscale.errors import UserError
from wnscale.graphs import connectivity, edge_sets, grid
from wnscale.graphs.points import PointSet

# Grid nodes an interpolated value is read from: those a target modality's first guess
# reads, so a synthetic network observes what the model's first guess sees.
NEIGHBOURS = edge_sets.FIRST_GUESS_NEIGHBOURS
# `write_network`'s defaults: noise as a fraction of each quantity's std, values missing.
NOISE = 0.1
MISSING = 0.1
TIME_BLOCK = 256  # grid times read at once


def write_observations(path: str, times, station_id, latitude, longitude, values: dict, *,
                       overwrite: bool = False, attrs: dict | None = None) -> str:
  """Writes an observation store at `path` (zarr v2; a directory or a URL).

  Args:
    times: `[T]` datetime64; station_id, latitude, longitude: `[S]`.
    values: `{WeatherBench2 name: [T, S]}`, NaN where missing.
    overwrite: replace a zarr store at `path` (`outputs.check`: never other data); it stays
      intact until the new one is whole (`outputs.building`).

  Returns:
    `path`.
  """
  path = paths.normalize(path)
  outputs.check(path, outputs.OBSERVATIONS, argument="path", overwrite=overwrite)
  for name in values:
    variables_lib.lookup(name)
  dataset = xr.Dataset(
      {name: (observations.DIMS, np.asarray(array, np.float32)) for name, array in values.items()},
      coords={"time": np.asarray(times, "datetime64[ns]"),
              "station_id": ("station", np.asarray(station_id, str)),
              "latitude": ("station", np.asarray(latitude, np.float64)),
              "longitude": ("station", np.asarray(longitude, np.float64))},
      attrs=attrs or {})
  with outputs.building(path, overwrite) as where:
    dataset.to_zarr(where, zarr_format=2, consolidated=True, mode="w")
  return path


def random_land_biased_points(num_points: int, grid_points: PointSet, land: np.ndarray,
                              seed: int = 0, land_share: float = 0.8) -> PointSet:
  """`num_points` random points, about `land_share` of them where `land` `[G]` (bool, per
  grid node of `grid_points`) holds at the nearest grid node (all at random without land)."""
  rng = np.random.default_rng(seed)
  tree = spatial.cKDTree(grid_points.xyz())
  chosen = []
  on_land = int(round(land_share * num_points)) if np.any(land) else 0
  for wanted, want_land in ((on_land, True), (num_points - on_land, False)):
    found = np.zeros((0, 3))
    while len(found) < wanted:  # uniform on the sphere, kept where land is as wanted
      xyz = rng.standard_normal((4 * wanted + 16, 3))
      xyz /= np.linalg.norm(xyz, axis=1, keepdims=True)
      keep = land[tree.query(xyz)[1]] == want_land if np.any(land) else np.ones(len(xyz), bool)
      found = np.concatenate([found, xyz[keep]])
    chosen.append(found[:wanted])
  latitude, longitude = grid.xyz_to_lat_lon(np.concatenate(chosen))
  return PointSet.from_points(latitude, longitude, name=f"{num_points:,} stations")


def interpolate(values: np.ndarray, grid_points: PointSet, points: PointSet) -> np.ndarray:
  """`values` `[..., G]` on the grid's nodes at `points`, `[..., P]` (inverse distance over
  the `NEIGHBOURS` nearest grid nodes)."""
  nearest, _, weights = connectivity.inverse_distance_edges(grid_points.xyz(), points.xyz(),
                                                            NEIGHBOURS)
  return np.einsum("...pk,pk->...p", np.asarray(values)[..., nearest.reshape(-1, NEIGHBOURS)],
                   weights.reshape(-1, NEIGHBOURS))


def observe(values: np.ndarray, grid_points: PointSet, points: PointSet, *, noise: float,
            missing: float, seed: int = 0) -> np.ndarray:
  """`values` `[..., G]` observed at `points`: interpolated, plus `noise` x a standard
  normal, and a fraction `missing` of them NaN; float32 `[..., P]`."""
  rng = np.random.default_rng(seed)
  observed = interpolate(values, grid_points, points)
  observed = observed + noise * rng.standard_normal(observed.shape)
  observed[rng.random(observed.shape) < missing] = np.nan
  return observed.astype(np.float32)


def write_network(grid_path: str, out: str, num_stations: int, *, variables=None,
                  seed: int = 0, noise: float = NOISE, missing: float = MISSING,
                  overwrite: bool = False) -> str:
  """Writes a synthetic station network of the grid store `grid_path` at `out`.

  `num_stations` land-biased points (`random_land_biased_points`, land where the
  store's land-sea mask is above 0.5) observe `variables` (surface variables the
  store holds; None: all of them) at every store time (`observe`: noise
  `noise` x each quantity's std over the store, a fraction `missing` NaN).
  `out` is replaced only with `overwrite` (`write_observations`).

  Returns:
    `out`.
  """
  if num_stations < 1:
    raise UserError(f"A station network needs at least one station, not {num_stations}.")
  if not 0 <= missing < 1 or noise < 0:
    raise UserError(f"missing={missing} must be in [0, 1) and noise={noise} >= 0.")
  with store_formats.open_dataset(grid_path) as dataset:
    held = [v.name for v in variables_lib.SURFACE_VARIABLES if v.name in dataset]
  names = list(variables or held)
  lacking = [name for name in names if name not in held]
  if lacking or not names:
    raise UserError(f"The grid store {grid_path} holds the surface variables {held}, not "
                    f"{lacking or 'any'}: stations observe surface variables the grid has.")
  store = store_formats.open_store(grid_path, names, (),
                               store_formats.native_time_step_hours(grid_path, 6))
  land = store.read_statics(allow_nan=True)[variables_lib.STATIC_VARIABLES.index(
      "land_sea_mask")] > 0.5
  points = random_land_biased_points(num_stations, store.points, land, seed)
  interpolated = np.concatenate([
      interpolate(store.read_state(np.arange(first, min(first + TIME_BLOCK, len(store.times))),
                                   allow_nan=True), store.points, points)
      for first in range(0, len(store.times), TIME_BLOCK)])  # [T, V, S]
  rng = np.random.default_rng(seed)
  values = {}
  for channel, name in enumerate(names):
    series = interpolated[:, channel]
    series = series + noise * np.nanstd(series) * rng.standard_normal(series.shape)
    series[rng.random(series.shape) < missing] = np.nan
    values[name] = series.astype(np.float32)
  station_id = [f"SYN{i:06d}" for i in range(num_stations)]
  return write_observations(
      out, store.times, station_id, points.latitude, points.longitude, values,
      overwrite=overwrite, attrs={"source": f"synthetic network of {store.path}",
                                  "seed": seed, "noise": noise, "missing": missing})
