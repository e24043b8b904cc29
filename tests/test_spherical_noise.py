"""GenCast's spherical white noise (`wnscale.model.spherical_noise`): the field of given
coefficients equals GenCast's own (`fixtures/gencast_noise`, made with its
`samplers_utils.sample` on dinosaur's transform), every degree carries power 1 / L at every
node (flat spectrum, isotropic, variance 1), the Legendre recurrence holds where float32 alone
would underflow (0.25 deg), and which grids it is drawn on.
"""

import os

import jax
import numpy as np
import pytest

from wnscale.errors import UserError
from wnscale.graphs import grid as grid_lib
from wnscale.graphs import points as points_lib
from wnscale.model import sampler, spherical_noise
from wnscale.specs import SamplerSpec

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "gencast_noise", "noise.npz")


def regular(resolution, include_poles=True):
  lat, lon = grid_lib.regular_grid(resolution, include_poles)
  return spherical_noise.SphericalGrid(np.sin(np.deg2rad(lat)), len(lon))


@pytest.mark.parametrize("name", ["deg12", "deg6", "deg4_no_poles"])
def test_the_field_of_given_coefficients_is_gencasts(name):
  """GenCast's `sample` (flat power, its coefficient layout and scale) from the same standard
  normal draws, to float32 rounding (its values ~1)."""
  fixture = np.load(FIXTURE)
  grid = spherical_noise.SphericalGrid(np.sin(np.deg2rad(fixture[f"{name}/lat"])),
                                       len(fixture[f"{name}/lon"]))
  coefficients = fixture[f"{name}/coefficients"]
  assert coefficients.shape[1:] == (grid.wavenumbers, 2 * grid.wavenumbers - 1)
  field = spherical_noise.synthesize(coefficients * spherical_noise.coefficient_scale(grid),
                                     grid)
  expected = fixture[f"{name}/noise"].reshape(field.shape)
  np.testing.assert_allclose(field, expected, atol=5e-5)
  assert np.abs(expected).max() > 2  # not a field of zeros


def unit_fields(grid, degrees):
  """`[degree, n_lat * n_lon]` the variance each degree of `degrees` gives each node: the sum
  of squares of the fields of its scaled unit coefficients."""
  slots = 2 * grid.wavenumbers - 1
  units = np.zeros((len(degrees), slots, grid.wavenumbers, slots), np.float32)
  for i, l in enumerate(degrees):
    units[i, np.arange(slots), l, np.arange(slots)] = 1
  fields = spherical_noise.synthesize(units * spherical_noise.coefficient_scale(grid), grid)
  return np.square(np.asarray(fields, np.float64)).sum(1)


@pytest.mark.parametrize("resolution, include_poles, degrees", [
    (10.0, True, None), (6.0, False, None), (2.0, True, [0, 45, 89])],
    ids=["10deg", "6deg_no_poles", "2deg_some_degrees"])
def test_every_degree_has_power_one_over_l_at_every_node(resolution, include_poles, degrees):
  """Var f(node) restricted to degree l = 1 / L at every node, by the addition theorem: the
  expected angular power spectrum is flat, the field isotropic and of variance 1 at every
  node (pole rows and the highest orders included); a wrong normalization, order layout or
  Legendre value anywhere fails it."""
  grid = regular(resolution, include_poles)
  degrees = range(grid.wavenumbers) if degrees is None else degrees
  variance = unit_fields(grid, list(degrees))
  np.testing.assert_allclose(variance, 1 / grid.wavenumbers, rtol=2e-4)


def test_the_recurrence_holds_below_float32s_range():
  """At 0.25 deg, P_l^m(sin lat) of order m = 200 starts (l = m) below 1e-38 on 322 rows
  and grows back to O(1) by l = 719 on some: the field of one coefficient (l = 719, m = 200,
  cosine) equals a float64 recurrence's."""
  grid = regular(0.25)
  m, l = 200, grid.wavenumbers - 1
  coefficients = np.zeros((1, grid.wavenumbers, 2 * grid.wavenumbers - 1), np.float32)
  coefficients[0, l, 2 * m - 1] = 1
  field = np.asarray(spherical_noise.synthesize(coefficients, grid)).reshape(
      len(grid.sin_latitude), grid.num_lon)
  x = grid.sin_latitude
  p_before, p = 0.0, np.sqrt(0.5) * np.prod(np.sqrt(1 + 1 / (2 * np.arange(1, m + 1))))
  p = p * (-np.sqrt(1 - x * x)) ** m
  for degree in range(m + 1, l + 1):
    a = np.sqrt((4 * degree ** 2 - 1) / (degree ** 2 - m ** 2))
    b = np.sqrt(((degree - 1) ** 2 - m ** 2) / (4 * (degree - 1) ** 2 - 1))
    p_before, p = p, a * (x * p - b * p_before)
  expected = p[:, None] * np.cos(m * 2 * np.pi * np.arange(grid.num_lon) / grid.num_lon)
  expected /= np.sqrt(np.pi)
  assert np.abs(expected).max() > 0.3  # the values that matter
  tiny_start = np.abs(np.sqrt(1 - x * x)) ** m < 1e-38
  assert np.abs(p[tiny_start]).max() > 1  # rows whose start underflows float32 grow back
  np.testing.assert_allclose(field, expected, atol=2e-4)


def test_white_noise_is_a_function_of_its_key():
  grid = regular(10.0)
  draw = lambda seed: np.asarray(spherical_noise.white_noise(  # noqa: E731
      jax.random.key(seed), grid, 3))
  first = draw(0)
  assert first.shape == (3, grid.num_nodes)
  np.testing.assert_array_equal(draw(0), first)
  assert not np.allclose(draw(1), first)
  assert not np.allclose(first[0], first[1])  # channels are independent fields


def test_regular_grids_are_found_from_node_positions():
  for resolution, poles in ((10.0, True), (6.0, False), (1.0, True)):
    lat, lon = grid_lib.regular_grid(resolution, poles)
    lat2d, lon2d = np.meshgrid(lat, lon, indexing="ij")
    found = spherical_noise.grid_of_positions(
        grid_lib.lat_lon_to_xyz(lat2d.reshape(-1), lon2d.reshape(-1)))
    assert found is not None and found.num_lon == len(lon)
    np.testing.assert_allclose(found.sin_latitude, np.sin(np.deg2rad(lat)), atol=1e-9)
  healpix = points_lib.healpix(4)
  assert spherical_noise.grid_of_positions(
      grid_lib.lat_lon_to_xyz(healpix.latitude, healpix.longitude)) is None
  lat, lon = grid_lib.regular_grid(10.0, True)
  lat2d, lon2d = np.meshgrid(lat, lon, indexing="ij")
  lon2d = lon2d + np.where(np.arange(lon.size) == 3, 1.0, 0.0)  # one column moved
  assert spherical_noise.grid_of_positions(
      grid_lib.lat_lon_to_xyz(lat2d.reshape(-1), lon2d.reshape(-1))) is None


def test_the_setting_chooses_the_noise_and_says_where_it_cannot_be_drawn():
  grid = regular(10.0)
  assert sampler.noise_grid(SamplerSpec(), grid) is grid  # GenCast's default
  assert sampler.noise_grid(SamplerSpec(spherical_noise=False), grid) is None
  with pytest.raises(UserError, match="^model.sampler_spherical_noise: .*set it False"):
    sampler.noise_grid(SamplerSpec(), None)
