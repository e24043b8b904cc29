"""GenCast's noise: isotropic white noise on the sphere, through spherical harmonics.

GenCast draws every noise field of its training and its sampler this way
(`samplers_utils.spherical_white_noise_like`, on dinosaur's real spherical harmonics). A
field on a regular grid of `n_lon` equally spaced longitudes (and any latitudes) is

  f(lat, lon) = sum_{l < L} sum_{|m| <= l} sqrt(4 pi / (L (2 l + 1))) z_lm Y_lm(lat, lon)

with `L = n_lon // 2` total wavenumbers (GenCast's truncation for its grids: l and |m| up to
n_lon / 2 - 1), `z_lm` standard normal and `Y_lm` the real spherical harmonics of unit L2
norm on the sphere: `Y_l0 = P_l^0(sin lat) / sqrt(2 pi)`, `Y_lm = P_l^m(sin lat) cos(m lon)
/ sqrt(pi)` and `Y_l,-m = P_l^m(sin lat) sin(m lon) / sqrt(pi)` (m > 0), `P_l^m` the
associated Legendre functions of unit L2 norm on [-1, 1] (with the Condon-Shortley sign).
Each degree `l` carries power 1 / L: the spectrum is flat, and by the addition theorem
(sum_m Y_lm^2 = (2 l + 1) / (4 pi)) every grid point has variance exactly 1. Longitude
`lon` is column `i`'s `2 pi i / n_lon` (the grid's first column at 0; a rotation changes no
statistics).

The coefficients are laid out as GenCast draws them, `[..., L (l), 2 L - 1 (m = 0, 1, -1, 2,
-2, ...)]`, entries with |m| > l unused (`synthesize`). The Legendre functions are not
tabulated (a table would take L x L x n_lat floats: 1.5 GB at 0.25 deg) but recurred on
the device in degree chunks, in float32 with a separate binary exponent per (m, latitude):
P_m^m(sin lat) ~ cos(lat)^m falls far below float32's range near the poles (1e-1700 at
m = 719 on the 0.25 deg pole row's neighbour) and grows back within the truncation.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

# Degrees recurred per chunk: each chunk's Legendre values `[chunk, L, n_lat]` meet the
# coefficients in one batched matmul.
_CHUNK = 16
# The recurrence's values are rescaled by 2^-_RESCALE whenever they exceed 2^_RESCALE; float32
# holds them (and a step's growth) well below its 2^128.
_RESCALE = 64


@dataclasses.dataclass(frozen=True, eq=False)
class SphericalGrid:
  """A regular grid of `sin_latitude` `[n_lat]` rows (ascending) and `num_lon` equally spaced
  columns; grid node `i * num_lon + j` is row `i`, column `j` (wnscale's internal order)."""

  sin_latitude: np.ndarray
  num_lon: int

  @property
  def wavenumbers(self) -> int:
    """L: the total (and longitude) wavenumbers 0 .. L - 1."""
    return self.num_lon // 2

  @property
  def num_nodes(self) -> int:
    return len(self.sin_latitude) * self.num_lon


def grid_of_positions(xyz: np.ndarray, tolerance: float = 1e-6) -> SphericalGrid | None:
  """The `SphericalGrid` of grid nodes at unit vectors `xyz` `[n, 3]` (internal order), or
  None where they are no regular latitude/longitude grid with an even number of columns."""
  xyz = np.asarray(xyz, np.float64)
  lat = np.arcsin(np.clip(xyz[:, 2], -1, 1))
  num_lon = int(np.argmax(np.abs(lat - lat[0]) > tolerance)) or len(lat)
  if num_lon < 2 or num_lon % 2 or len(lat) % num_lon:
    return None
  rows = lat.reshape(-1, num_lon)
  if np.abs(rows - rows[:, :1]).max() > tolerance or np.any(np.diff(rows[:, 0]) <= 0):
    return None
  lon = np.arctan2(xyz[:, 1], xyz[:, 0]).reshape(rows.shape)
  off_pole = np.abs(np.cos(rows[:, 0])) > tolerance  # a pole row's longitudes are all one
  expected = lon[off_pole, :1] + 2 * np.pi * np.arange(num_lon) / num_lon
  gap = np.angle(np.exp(1j * (lon[off_pole] - expected)))
  if gap.size and np.abs(gap).max() > tolerance:
    return None
  return SphericalGrid(np.sin(rows[:, 0]), num_lon)


def _legendre_start(grid: SphericalGrid) -> tuple[np.ndarray, np.ndarray]:
  """`(mantissa [L, n_lat] float32, exponent [L, n_lat] int32)` of P_m^m(sin lat) =
  (-1)^m sqrt(1/2) prod_{i <= m} sqrt(1 + 1 / (2 i)) cos(lat)^m, computed in float64 logs."""
  m = np.arange(grid.wavenumbers)[:, None]
  cos_lat = np.sqrt(np.clip(1 - np.square(grid.sin_latitude), 0, None))[None, :]
  log2_scale = np.cumsum(np.log2(np.sqrt(1 + 1 / (2 * np.maximum(m, 1)))) * (m > 0), axis=0)
  with np.errstate(divide="ignore", invalid="ignore"):  # log2(0) at a pole
    log2_value = log2_scale - 0.5 + np.where(m > 0, m * np.log2(cos_lat), 0)
  zero = ~np.isfinite(log2_value)  # at a pole, m > 0
  exponent = np.where(zero, 0, np.floor(log2_value)).astype(np.int32)
  mantissa = np.where(zero, 0, np.exp2(np.where(zero, 0, log2_value) - exponent))
  return (np.where(m % 2, -mantissa, mantissa).astype(np.float32),
          np.broadcast_to(exponent, mantissa.shape).copy())


def _legendre_synthesis(coefficients: jax.Array, grid: SphericalGrid) -> jax.Array:
  """`[N, 2 L - 1, n_lat]` sum_l P_l^m(sin lat) c[n, l, m] per longitude wavenumber slot
  (GenCast's m order) of `coefficients` `[N, L, 2 L - 1]`."""
  wavenumbers = grid.wavenumbers
  chunks = -(-wavenumbers // _CHUNK)
  degrees = chunks * _CHUNK
  m = jnp.arange(wavenumbers, dtype=jnp.float32)[:, None]  # [L, 1]
  x = jnp.asarray(grid.sin_latitude, jnp.float32)[None, :]  # [1, n_lat]
  mantissa, exponent = _legendre_start(grid)
  # c[n, m + k, slot of m] for k = l - m: the coefficients by order offset, per sign of m.
  k = np.arange(degrees)[:, None]
  orders = np.arange(wavenumbers)[None, :]
  degree = np.minimum(orders + k, wavenumbers - 1)
  inside = (orders + k < wavenumbers).astype(np.float32)
  cosine_slot = np.maximum(2 * orders - 1, 0)  # m = 0 keeps slot 0
  sine_slot = 2 * orders  # m = 0: slot 0 again, masked below
  by_offset = lambda slot, keep: (  # noqa: E731  [chunks, _CHUNK, N, L]
      coefficients[:, degree, slot] * (inside * keep)).transpose(1, 0, 2).reshape(
          chunks, _CHUNK, coefficients.shape[0], wavenumbers)
  cosine = by_offset(cosine_slot, 1.0)
  sine = by_offset(sine_slot, (orders > 0).astype(np.float32))

  def degree_step(carry, k):
    previous, before, exponent = carry
    l = m + k.astype(jnp.float32)
    a = jnp.sqrt((4 * l * l - 1) / jnp.maximum(l * l - m * m, 1))
    b = jnp.sqrt(jnp.maximum((l - 1) ** 2 - m * m, 0) / (4 * (l - 1) ** 2 - 1))
    value = jnp.where(k == 0, previous, a * (x * previous - b * before))
    before = jnp.where(k == 0, before, previous)
    big = jnp.abs(value) > 2.0 ** _RESCALE
    scale = jnp.where(big, 2.0 ** -_RESCALE, 1.0)
    carry = (value * scale, before * scale, exponent + big * _RESCALE)
    # Only the scaled values are float32-safe; their true size may underflow (to 0).
    return carry, value * jnp.exp2(exponent.astype(jnp.float32))

  def chunk_step(carry, inputs):
    first, cos_c, sin_c = inputs
    carry, legendre = jax.lax.scan(degree_step, carry, first + jnp.arange(_CHUNK))
    # legendre [_CHUNK, L, n_lat]; cos_c, sin_c [_CHUNK, N, L]
    product = lambda c: jnp.einsum("kmj,knm->nmj", legendre, c,  # noqa: E731
                                   precision=jax.lax.Precision.HIGHEST)
    return carry, (product(cos_c), product(sin_c))

  start = (jnp.asarray(mantissa), jnp.zeros_like(jnp.asarray(mantissa)),
           jnp.asarray(exponent))
  _, (cos_parts, sin_parts) = jax.lax.scan(
      chunk_step, start, (jnp.arange(chunks) * _CHUNK, cosine, sine))
  cos_sum, sin_sum = cos_parts.sum(0), sin_parts.sum(0)  # [N, L, n_lat]
  # Slots: m = 0, then (cos m, sin m) pairs.
  pairs = jnp.stack([cos_sum[:, 1:], sin_sum[:, 1:]], axis=2).reshape(
      coefficients.shape[0], 2 * wavenumbers - 2, -1)
  return jnp.concatenate([cos_sum[:, :1], pairs], axis=1)


def _fourier_basis(grid: SphericalGrid) -> np.ndarray:
  """`[n_lon, 2 L - 1]` float32: 1 / sqrt(2 pi), then cos(m lon) / sqrt(pi), sin(m lon) /
  sqrt(pi) for m = 1 .. L - 1, at column `i`'s lon = 2 pi i / n_lon (exact angles: m i mod
  n_lon)."""
  n = grid.num_lon
  m = np.arange(1, grid.wavenumbers)
  angle = 2 * np.pi * ((np.arange(n)[:, None] * m[None, :]) % n) / n
  pairs = np.stack([np.cos(angle), np.sin(angle)], axis=2).reshape(n, -1) / np.sqrt(np.pi)
  return np.concatenate([np.full((n, 1), 1 / np.sqrt(2 * np.pi)), pairs], 1).astype(np.float32)


def synthesize(coefficients: jax.Array, grid: SphericalGrid) -> jax.Array:
  """`[..., n_lat * n_lon]` float32 field sum_lm c_lm Y_lm of `coefficients` `[..., L,
  2 L - 1]` (GenCast's layout: degree l, then m = 0, 1, -1, 2, -2, ...; |m| > l ignored),
  in internal node order (row-major `[lat, lon]`)."""
  lead = coefficients.shape[:-2]
  flat = coefficients.reshape((-1,) + coefficients.shape[-2:]).astype(jnp.float32)
  by_order = _legendre_synthesis(flat, grid)  # [N, 2L - 1, n_lat]
  field = jnp.einsum("im,nmj->nji", _fourier_basis(grid), by_order,
                     precision=jax.lax.Precision.HIGHEST)
  return field.reshape(lead + (grid.num_nodes,))


def coefficient_scale(grid: SphericalGrid) -> np.ndarray:
  """`[L, 2 L - 1]` float32: sqrt(4 pi / (L (2 l + 1))) where |m| <= l, else 0: the
  flat-spectrum, unit-variance scale of standard-normal coefficients."""
  wavenumbers = grid.wavenumbers
  l = np.arange(wavenumbers)[:, None]
  order = (np.arange(2 * wavenumbers - 1) + 1) // 2  # |m| of each slot
  return np.where(order[None, :] <= l, np.sqrt(4 * np.pi / (wavenumbers * (2 * l + 1))),
                  0).astype(np.float32)


def white_noise(key: jax.Array, grid: SphericalGrid, channels: int) -> jax.Array:
  """`[channels, n_lat * n_lon]` float32 spherical white noise (variance 1 at every node) of
  `key`: the coefficients `[channels, L, 2 L - 1]` standard normal, as GenCast draws them
  (one field per channel)."""
  shape = (channels, grid.wavenumbers, 2 * grid.wavenumbers - 1)
  return synthesize(jax.random.normal(key, shape, jnp.float32) * coefficient_scale(grid), grid)
