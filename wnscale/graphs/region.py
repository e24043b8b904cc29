"""A limited-area cut-out: a fine regional point set cut into a coarse global one.

The region is a latitude/longitude box (`parse_box`), or, without one, the
convex hull on the sphere of the regional points (`in_hull`). `cut_out` drops
the global points inside the region, keeps the regional points inside it, and
joins them into one `PointSet` (global points first) whose `region` mask marks
the regional ones; its areas are the spherical Voronoi cells of the joined
points (mean 1), so a fine region's cells are small and the loss and the scores
weigh every place by its area.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import spatial

from wnscale.errors import ArgumentError, UserError
from wnscale.graphs import grid
from wnscale.graphs.points import PointSet, voronoi_areas

# `(lat0, lat1, lon0, lon1)` degrees: lat0 <= latitude <= lat1 and longitude from lon0
# eastwards to lon1 (across 0 where lon1 < lon0, e.g. 350 .. 30).
Box = tuple[float, float, float, float]

# Coordinates closer than this (unit-vector distance) are one place: their cell is shared.
SAME_PLACE = 1e-9


def parse_box(text: str, what: str) -> Box | None:
  """The box of "lat0,lat1,lon0,lon1" (degrees); None for "".

  Args:
    what: the config key or argument, e.g. "data.region" (a launcher shows its flag).

  Raises:
    ArgumentError: of `what`: not four numbers, or not -90 <= lat0 < lat1 <= 90.
  """
  if not text.strip():
    return None
  try:
    box = tuple(float(part) for part in text.split(","))
    if len(box) != 4:
      raise ValueError(f"{len(box)} numbers, not 4")
  except ValueError as error:
    raise ArgumentError(what, text, "not a box lat0,lat1,lon0,lon1 in degrees (e.g. "
                        f"40,60,-10,30): {error}.") from None
  lat0, lat1, lon0, lon1 = box
  if not -90 <= lat0 < lat1 <= 90 or lon0 == lon1:
    raise ArgumentError(what, text, "a box lat0,lat1,lon0,lon1 needs -90 <= lat0 < lat1 <= "
                        "90 and lon0 != lon1.")
  return box


def in_box(latitude: np.ndarray, longitude: np.ndarray, box: Box) -> np.ndarray:
  """`[n]` bool: the points (degrees) inside `box`, edges included."""
  return in_latitudes(latitude, box) & in_longitudes(longitude, box)


def in_latitudes(latitude: np.ndarray, box: Box) -> np.ndarray:
  """`[n]` bool: the latitudes (degrees) inside `box`'s, edges included."""
  latitude = np.asarray(latitude, np.float64)
  return (latitude >= box[0]) & (latitude <= box[1])


def in_longitudes(longitude: np.ndarray, box: Box) -> np.ndarray:
  """`[n]` bool: the longitudes (degrees) inside `box`'s (eastwards from lon0)."""
  lon0, lon1 = box[2:]
  width = lon1 - lon0 if lon1 - lon0 >= 360 else np.mod(lon1 - lon0, 360)
  return np.mod(np.asarray(longitude, np.float64) - lon0, 360) <= width + 1e-9


def in_hull(xyz: np.ndarray, hull_xyz: np.ndarray, what: str) -> np.ndarray:
  """`[n]` bool: the unit vectors `xyz [n, 3]` inside the spherical convex hull of
  `hull_xyz [m, 3]`, edges included.

  A gnomonic projection about the hull points' mean direction maps great circles to
  straight lines, so the spherical hull is the planar hull of the projected points.

  Raises:
    UserError: `hull_xyz` (`what`: e.g. the regional store) does not lie within a
      hemisphere, or has fewer than 3 points not on one great circle.
  """
  centre = hull_xyz.mean(axis=0)
  norm = np.linalg.norm(centre)
  if norm < 1e-6 or np.min(hull_xyz @ (centre / norm)) <= 0.05:
    raise UserError(f"The points of {what} do not lie within a hemisphere, so they are not "
                    "a region that a global store can surround: give a regional store, or "
                    "a box (data.region).")
  centre /= norm
  east = np.cross([0.0, 0.0, 1.0], centre)
  east = east / np.linalg.norm(east) if np.linalg.norm(east) > 1e-6 else np.array([1.0, 0, 0])
  north = np.cross(centre, east)

  def project(vectors):
    depth = vectors @ centre
    with np.errstate(divide="ignore", invalid="ignore"):
      return np.stack([vectors @ east / depth, vectors @ north / depth], axis=-1), depth

  plane, _ = project(hull_xyz)
  try:
    hull = spatial.ConvexHull(plane)
  except spatial.QhullError as error:
    raise UserError(f"The {len(hull_xyz)} points of {what} span no area (fewer than 3 "
                    "points off one line): a region needs a patch of points.") from error
  query, depth = project(xyz)
  inside = depth > 0
  # On the inner side of every edge line (`equations`: outward normal, offset).
  sides = query[inside] @ hull.equations[:, :2].T + hull.equations[:, 2]
  inside[inside] = np.all(sides <= 1e-9, axis=-1)
  return inside


def cut_out(outer: PointSet, inner: PointSet, box: Box | None, inner_name: str
            ) -> tuple[PointSet, np.ndarray, np.ndarray]:
  """`outer`'s points outside the region and `inner`'s inside it, as one point set.

  Args:
    outer: the global points.
    inner: the regional points.
    box: the region; None: the spherical convex hull of `inner`'s points.
    inner_name: what `inner` is (e.g. its store's path), for the errors.

  Returns:
    `(points, outer_kept [k], inner_kept [m])`: the joined `PointSet` (`outer`'s kept
    points in their order, then `inner`'s; `region` True on the latter; areas the
    Voronoi cells of all, mean 1) and the indices of the kept points of each.

  Raises:
    UserError: no regional point in the box, or a region that is no region (`in_hull`).
  """
  if box is None:
    inner_kept = np.arange(inner.size)
    replaced = in_hull(outer.xyz(), inner.xyz(), inner_name)
  else:
    inner_kept = np.flatnonzero(in_box(inner.latitude, inner.longitude, box))
    if inner_kept.size == 0:
      raise UserError(
          f"No point of the regional store {inner_name} (latitude {inner.latitude.min():g} .. "
          f"{inner.latitude.max():g}, longitude {inner.longitude.min():g} .. "
          f"{inner.longitude.max():g}) lies in the box {','.join(f'{x:g}' for x in box)} "
          "(data.region): choose a box inside the regional store.")
    replaced = in_box(outer.latitude, outer.longitude, box)
  if inner_kept.size < 3:
    raise UserError(f"The regional store {inner_name} has {inner_kept.size} point(s) in the "
                    "region; a cut-out needs a patch of points.")
  outer_kept = np.flatnonzero(~replaced)
  latitude = np.concatenate([outer.latitude[outer_kept], inner.latitude[inner_kept]])
  longitude = np.concatenate([outer.longitude[outer_kept], inner.longitude[inner_kept]])
  region = np.concatenate([np.zeros(outer_kept.size, bool), np.ones(inner_kept.size, bool)])
  points = PointSet.from_points(
      latitude, longitude, shared_voronoi_areas(latitude, longitude),
      f"cut-out: {inner_kept.size:,} regional points in {outer.name} "
      f"({latitude.size:,} points)")
  return dataclasses.replace(points, region=region), outer_kept, inner_kept


def shared_voronoi_areas(latitude: np.ndarray, longitude: np.ndarray) -> np.ndarray:
  """`[n]` Voronoi cell areas (`points.voronoi_areas`) where points at one place (a
  regular grid's pole rows, a regional point on a global one) share their cell."""
  xyz = grid.lat_lon_to_xyz(latitude, longitude)
  _, first, inverse, counts = np.unique(np.round(xyz / SAME_PLACE), axis=0, return_index=True,
                                        return_inverse=True, return_counts=True)
  inverse = inverse.reshape(-1)
  area = voronoi_areas(latitude[first], longitude[first])
  return area[inverse] / counts[inverse]
