"""A synthetic station network: random land-biased points, grid fields read there with noise.

What the tests (and later `make_dataset --stations`) observe a grid with: `N`
points on the sphere, a share of them on land (a station network is mostly
there), and values of the grid's fields interpolated to them (inverse-distance
over the nearest grid nodes) plus Gaussian noise, a fraction missing (NaN).
"""

from __future__ import annotations

import numpy as np
from scipy import spatial

from wnscale.graphs import grid
from wnscale.graphs.points import PointSet

NEIGHBOURS = 4  # grid nodes an interpolated value is read from


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
  distance, nearest = spatial.cKDTree(grid_points.xyz()).query(points.xyz(), NEIGHBOURS)
  weights = 1.0 / np.maximum(distance, 1e-9)
  weights /= weights.sum(axis=1, keepdims=True)
  return np.einsum("...pk,pk->...p", np.asarray(values)[..., nearest], weights)


def observe(values: np.ndarray, grid_points: PointSet, points: PointSet, *, noise: float,
            missing: float, seed: int = 0) -> np.ndarray:
  """`values` `[..., G]` observed at `points`: interpolated, plus `noise` x a standard
  normal, and a fraction `missing` of them NaN; float32 `[..., P]`."""
  rng = np.random.default_rng(seed)
  observed = interpolate(values, grid_points, points)
  observed = observed + noise * rng.standard_normal(observed.shape)
  observed[rng.random(observed.shape) < missing] = np.nan
  return observed.astype(np.float32)
