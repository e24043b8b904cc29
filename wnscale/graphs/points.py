"""The grid node set: points on the sphere, each with a cell area.

A `PointSet` is where the model's grid nodes are: a regular latitude/longitude
grid (`PointSet.regular`, flattened latitude-major), a store's list of points
(`PointSet.from_points`), or a named grid (`named_grid`: octahedral reduced
Gaussian `O<N>`, HEALPix `H<nside>`). The graphs are built on its points, the
loss weighs nodes by its areas and the partition orders them by their unit
vectors; nothing else about the grid's shape matters to the model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import re
import time

import numpy as np

from wnscale import cache, paths
from wnscale.errors import UserError
from wnscale.graphs import grid

# A point set covers the globe when no place is farther than this many mean spacings
# (sqrt(4 pi / n) radians) from its nearest point: a regular or reduced Gaussian grid's
# farthest place is ~0.7 spacings away, a regional patch's is a hemisphere or so.
COVERAGE_SPACINGS = 2.0
# Places probed for coverage (a Fibonacci lattice): fine enough to find a gap of a few
# spacings between some hundreds of thousands of points.
COVERAGE_PROBES = 100_000


@dataclasses.dataclass(frozen=True, eq=False)
class PointSet:
  """Where the grid nodes are.

  Attributes:
    latitude: `[n]` float64 degrees.
    longitude: `[n]` float64 degrees in [0, 360).
    area: `[n]` float64 cell areas, mean 1 (the loss's and the scores' weights).
    name: a short description for logs, e.g. "regular 5.625 deg (32 x 64)", "O32 (5,248
      points)".
    field_shape: `(num_lat, num_lon)` of a regular grid (node `i * num_lon + j` is row
      i, column j); None for any other point set.
    region: `[n]` bool, the points of a cut-out's regional store (`graphs.region`);
      None: no cut-out.
  """

  latitude: np.ndarray
  longitude: np.ndarray
  area: np.ndarray
  name: str
  field_shape: tuple[int, int] | None = None
  region: np.ndarray | None = None

  def __post_init__(self):
    for array in (self.latitude, self.longitude, self.area, self.region):
      if array is not None:
        array.setflags(write=False)

  @classmethod
  def regular(cls, latitude, longitude) -> PointSet:
    """A regular grid of `latitude [num_lat]` (either order) x `longitude [num_lon]` degrees.

    Flattened latitude-major (`grid.grid_lat_lon`); the areas are the latitude
    bands' (`grid.cell_area_weights`, WeatherBench2's), one per row.
    """
    latitude = np.asarray(latitude, np.float64)
    longitude = np.mod(np.asarray(longitude, np.float64), 360.0)
    node_lat, node_lon = grid.grid_lat_lon(latitude, longitude)
    area = np.repeat(grid.cell_area_weights(latitude), longitude.size)
    spacing = 360.0 / longitude.size
    return cls(node_lat, node_lon, area,
               f"regular {spacing:g} deg ({latitude.size} x {longitude.size})",
               (latitude.size, longitude.size))

  @classmethod
  def from_points(cls, latitude, longitude, area=None, name: str | None = None) -> PointSet:
    """Points `latitude [n]`, `longitude [n]` (degrees) in their own order.

    Args:
      area: `[n]` cell areas (any unit: normalized to mean 1); None: the areas of
        the points' spherical Voronoi cells.
      name: for logs; None: "<n> points".
    """
    latitude = np.asarray(latitude, np.float64).reshape(-1)
    longitude = np.mod(np.asarray(longitude, np.float64).reshape(-1), 360.0)
    if latitude.shape != longitude.shape:
      raise UserError(f"{latitude.size} latitudes for {longitude.size} longitudes: each point "
                      "needs one of each.")
    if area is None:
      area = voronoi_areas(latitude, longitude)
    area = np.asarray(area, np.float64).reshape(-1)
    if area.shape != latitude.shape or not np.all(area > 0):
      raise UserError(f"Cell areas must be one positive number per point ({latitude.size} "
                      f"points); got {area.size} with minimum {area.min():g}.")
    return cls(latitude, longitude, area / area.mean(),
               name or f"{latitude.size:,} points")

  @property
  def size(self) -> int:
    return self.latitude.size

  def axes(self) -> tuple[np.ndarray, np.ndarray]:
    """`(latitude [num_lat], longitude [num_lon])` of a regular grid."""
    if self.field_shape is None:
      raise ValueError(f"{self.name} is not a regular grid: it has no latitude and longitude "
                       "axes")
    return (self.latitude.reshape(self.field_shape)[:, 0],
            self.longitude.reshape(self.field_shape)[0])

  def xyz(self) -> np.ndarray:
    """`[n, 3]` float64 unit vectors (`grid.lat_lon_to_xyz`)."""
    return grid.lat_lon_to_xyz(self.latitude, self.longitude)

  def digest(self) -> bytes:
    """A hash of the coordinates (not the areas: they change no graph)."""
    digest = hashlib.sha256(repr(self.field_shape).encode())
    digest.update(self.latitude.tobytes())
    digest.update(b"|")
    digest.update(self.longitude.tobytes())
    return digest.digest()

  def check_global(self):
    """Raises a `UserError` unless the points cover the globe, as the model's graphs need.

    A regular grid: `grid.check_global` of its axes. Other points: every place
    on the sphere lies within `COVERAGE_SPACINGS` mean spacings of a point; a
    cut-out's spacing is that of its points outside the region (over the area they
    cover), so a dense region does not make the coarse rest look gappy.
    """
    if self.field_shape is not None:
      grid.check_global(*self.axes())
      return
    outside, covered = self.size, 1.0
    if self.region is not None:
      outside = max(int(np.sum(~self.region)), 1)
      covered = float(np.sum(self.area[~self.region]) / np.sum(self.area))
    spacing = np.sqrt(4 * np.pi * covered / outside)  # radians
    probes = fibonacci_sphere(min(COVERAGE_PROBES, max(1000, 4 * self.size)))
    from scipy import spatial  # noqa: PLC0415 (slow to import: a conversion
    # imports this module through data.reading.store, and needs no tree)
    chord, _ = spatial.cKDTree(self.xyz()).query(probes)
    farthest = int(np.argmax(chord))
    gap = 2 * np.arcsin(min(chord[farthest] / 2, 1.0))
    if gap > COVERAGE_SPACINGS * spacing:
      lat, lon = grid.xyz_to_lat_lon(probes[farthest:farthest + 1])
      raise UserError(
          f"The points do not cover the globe: {self.name}, latitude "
          f"{self.latitude.min():g} .. {self.latitude.max():g}, longitude "
          f"{self.longitude.min():g} .. {self.longitude.max():g}; the place at "
          f"({lat[0]:.1f}, {lon[0]:.1f}) deg is {np.rad2deg(gap):.1f} deg from the nearest "
          f"point (mean spacing {np.rad2deg(spacing):.2f} deg). The model's graphs need "
          "points all over the globe: use a global store (a regional one cannot be used).")


def voronoi_areas(latitude: np.ndarray, longitude: np.ndarray) -> np.ndarray:
  """`[n]` float64 areas (steradians) of the points' spherical Voronoi cells.

  Cached on disk (`<cache dir>/areas`), keyed by the points and this code: a large
  grid's take long (docs/benchmarks.md, "Figures behind the code"). The points must be
  distinct (a regular grid's pole rows are not: use `PointSet.regular` for those).
  """
  latitude, longitude = (np.ascontiguousarray(a, np.float64) for a in (latitude, longitude))
  digest = hashlib.sha256(cache.source_digest("graphs/points.py").encode())
  digest.update(latitude.tobytes() + b"|" + longitude.tobytes())
  path = cache.cache_path("areas", digest.hexdigest()[:24] + ".npy")
  if paths.exists(path):
    return np.load(io.BytesIO(paths.read_bytes(path)))
  start = time.perf_counter()
  xyz = grid.lat_lon_to_xyz(latitude, longitude)
  from scipy import spatial  # noqa: PLC0415 (as above)
  try:
    area = spatial.SphericalVoronoi(xyz, radius=1.0, threshold=1e-9).calculate_areas()
  except ValueError as error:
    raise UserError(f"Cannot compute cell areas of {latitude.size:,} points ({error}); give "
                    "the store a cell_area variable, or points without duplicates.") from error
  buffer = io.BytesIO()
  np.save(buffer, area)
  cache.write_bytes(path, buffer.getvalue())  # whole or not at all (or not cached)
  logging.info("Computed the Voronoi cell areas of %s points in %.1f s; cached in %s",
               f"{latitude.size:,}", time.perf_counter() - start, path)
  return area


def fibonacci_sphere(n: int) -> np.ndarray:
  """`[n, 3]` nearly evenly spread unit vectors (a Fibonacci lattice)."""
  i = np.arange(n) + 0.5
  z = 1 - 2 * i / n
  phi = np.pi * (1 + 5**0.5) * i
  r = np.sqrt(1 - z**2)
  return np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=-1)


def octahedral(n: int) -> PointSet:
  """ECMWF's octahedral reduced Gaussian grid `O<n>`: `4 n (n + 9)` points.

  `2 n` Gaussian latitudes (the roots of the Legendre polynomial P_2n), north to
  south; row i counted from the nearer pole (i = 1..n) has `4 i + 16` points from
  longitude 0. A cell's area is its row's Gaussian quadrature weight shared by
  the row's points.
  """
  if n < 1:
    raise UserError(f"O{n}: an octahedral grid needs at least one latitude per hemisphere.")
  roots, weights = np.polynomial.legendre.leggauss(2 * n)  # ascending sin(latitude)
  latitude = np.rad2deg(np.arcsin(roots[::-1]))  # north to south
  weights = weights[::-1]
  from_pole = np.minimum(np.arange(1, 2 * n + 1), np.arange(2 * n, 0, -1))
  counts = 4 * from_pole + 16
  lat = np.repeat(latitude, counts)
  lon = np.concatenate([np.arange(count) * (360.0 / count) for count in counts])
  area = np.repeat(weights / counts, counts)
  return PointSet.from_points(lat, lon, area, f"O{n} ({lat.size:,} points)")


def healpix(nside: int) -> PointSet:
  """HEALPix `H<nside>`, ring scheme: `12 nside^2` equal-area points, north to south."""
  if nside < 1:
    raise UserError(f"H{nside}: HEALPix needs nside >= 1.")
  lat, lon = [], []
  for ring in range(1, 4 * nside):
    if ring < nside:  # north polar cap
      z, count, shift = 1 - ring**2 / (3 * nside**2), 4 * ring, 0.5
    elif ring <= 3 * nside:  # equatorial belt: every other ring shifted by half a pixel
      z, count, shift = 4 / 3 - 2 * ring / (3 * nside), 4 * nside, ((ring - nside + 1) % 2) / 2
    else:  # south polar cap
      south = 4 * nside - ring
      z, count, shift = -(1 - south**2 / (3 * nside**2)), 4 * south, 0.5
    lat.append(np.full(count, np.rad2deg(np.arcsin(z))))
    lon.append((np.arange(count) + shift) * (360.0 / count))
  lat, lon = np.concatenate(lat), np.concatenate(lon)
  return PointSet.from_points(lat, lon, np.ones(lat.size), f"H{nside} ({lat.size:,} points)")


# Named grids: a pattern of the name -> the point set of its number.
NAMED_GRIDS = {
    re.compile(r"O(\d+)"): octahedral,
    re.compile(r"H(\d+)"): healpix,
}


def named_grid(name: str) -> PointSet:
  """The point set of a grid name: "O32" (octahedral reduced Gaussian), "H16" (HEALPix)."""
  make, number = grid_maker(name)
  return make(number)


def grid_maker(name: str):
  """`(make, number)` of a grid name (`NAMED_GRIDS`), without making the grid.

  Raises:
    UserError: no such grid.
  """
  for pattern, make in NAMED_GRIDS.items():
    match = pattern.fullmatch(name)
    if match:
      return make, int(match.group(1))
  raise UserError(f"Unknown grid {name!r}: name an octahedral reduced Gaussian grid O<N> "
                  "(e.g. O32, O96) or a HEALPix grid H<nside> (e.g. H16).")


def standard(grid_name: str, resolution: float) -> PointSet:
  """A config's grid when no store says it: `grid_name` (`named_grid`) if given, else the
  regular grid of `resolution` degrees (`grid.regular_grid`)."""
  if grid_name:
    return named_grid(grid_name)
  return PointSet.regular(*grid.regular_grid(resolution))
