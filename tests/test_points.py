"""Point sets: a regular grid's weights as before, reduced Gaussian and HEALPix grids, the
Voronoi areas of any points, and the check that points cover the globe."""

import os

import numpy as np
import pytest

from wnscale.errors import UserError
from wnscale.graphs import grid
from wnscale.graphs.points import PointSet, named_grid, standard, voronoi_areas


@pytest.mark.parametrize("resolution, poles", [(5.625, False), (1.0, True)])
def test_regular_grid_is_flattened_latitude_major_with_the_band_weights(resolution, poles):
  latitude, longitude = grid.regular_grid(resolution, include_poles=poles)
  points = PointSet.regular(latitude, longitude)
  node_lat, node_lon = grid.grid_lat_lon(latitude, longitude)
  np.testing.assert_array_equal(points.latitude, node_lat)
  np.testing.assert_array_equal(points.longitude, node_lon)
  np.testing.assert_array_equal(points.area,
                                np.repeat(grid.cell_area_weights(latitude), longitude.size))
  assert points.field_shape == (latitude.size, longitude.size)
  np.testing.assert_array_equal(points.axes()[0], latitude)
  assert points.name == f"regular {resolution:g} deg ({latitude.size} x {longitude.size})"


def test_voronoi_areas_of_a_regular_grid_are_the_band_weights(tmp_path, monkeypatch):
  """Measured: 8.0e-4 relative at 5.625 deg (no pole rows), 2.5e-5 at 1 deg. Computed
  once, then read from the cache."""
  monkeypatch.setenv("WNSCALE_CACHE_DIR", str(tmp_path))
  regular = PointSet.regular(*grid.regular_grid(5.625, include_poles=False))
  voronoi = PointSet.from_points(regular.latitude, regular.longitude)
  assert voronoi.field_shape is None and voronoi.name == "2,048 points"
  np.testing.assert_allclose(voronoi.area, regular.area, rtol=1.5e-3)
  assert voronoi.area.mean() == pytest.approx(1.0)
  assert len(os.listdir(tmp_path / "areas")) == 1
  again = PointSet.from_points(regular.latitude, regular.longitude)
  np.testing.assert_array_equal(again.area, voronoi.area)
  assert len(os.listdir(tmp_path / "areas")) == 1


def test_octahedral_and_healpix_grids():
  for name, size in [("O32", 5_248), ("O96", 40_320)]:
    points = named_grid(name)
    assert points.size == size and points.name == f"{name} ({size:,} points)"
  points = named_grid("O32")
  rows, counts = np.unique(points.latitude, return_counts=True)  # ascending
  # 64 Gaussian latitudes, symmetric about the equator; 20 points next to each pole,
  # 4 more a row, 144 at the equator.
  np.testing.assert_allclose(rows, -rows[::-1], atol=1e-12)
  assert rows.size == 64 and counts[0] == counts[-1] == 20 and counts[31] == 144
  np.testing.assert_allclose(np.sin(np.deg2rad(rows)), np.polynomial.legendre.leggauss(64)[0],
                             atol=1e-14)
  assert np.all(points.longitude[points.latitude == rows[0]] == np.arange(20) * 18.0)
  assert np.all(points.area > 0) and points.area.mean() == pytest.approx(1.0)
  # The rows' quadrature weights shared in each row: close to the Voronoi cells' areas
  # (measured: 6.4 % off at most, by the poles).
  voronoi = voronoi_areas(points.latitude, points.longitude)
  np.testing.assert_allclose(points.area, voronoi / voronoi.mean(), rtol=0.07)
  healpix = named_grid("H16")
  assert healpix.size == 12 * 16**2 and np.all(healpix.area == 1.0)
  voronoi = voronoi_areas(healpix.latitude, healpix.longitude)  # equal areas: 4.8 % off
  np.testing.assert_allclose(voronoi / voronoi.mean(), 1.0, rtol=0.05)
  for points in (named_grid("O32"), healpix):
    points.check_global()  # no error
  with pytest.raises(UserError, match="Unknown grid 'N32'.*O<N>.*H<nside>"):
    named_grid("N32")


def test_a_regional_patch_does_not_cover_the_globe():
  points = named_grid("O32")
  patch = (points.latitude > 20) & (points.latitude < 60) & (points.longitude < 60)
  regional = PointSet.from_points(points.latitude[patch], points.longitude[patch])
  with pytest.raises(UserError, match="The points do not cover the globe: 225 points") as error:
    regional.check_global()
  assert "\n" not in str(error.value) and "regional one cannot be used" in str(error.value)
  # A regular grid says it as before, in its own terms.
  latitude, longitude = grid.regular_grid(5.625)
  with pytest.raises(UserError, match=r"The grid does not cover the globe.*\(16 x 64 points"):
    PointSet.regular(latitude[16:], longitude).check_global()


def test_a_configs_grid_without_a_store():
  """`data.grid` names the grid; empty, the regular grid of `data.resolution`."""
  regular = standard("", 5.625)
  assert regular.name == "regular 5.625 deg (32 x 64)"
  np.testing.assert_array_equal(regular.latitude,
                                PointSet.regular(*grid.regular_grid(5.625)).latitude)
  assert standard("O16", 5.625).name == "O16 (1,600 points)"
