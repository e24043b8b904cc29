"""GenCast's sampler: DPM-Solver++ 2S with stochastic churn, from noise to a forecast.

The noise levels (`schedule`) descend from `max` to `min` as the quantiles of
(min^(1/rho) + q (max^(1/rho) - min^(1/rho)))^rho at q = 1 .. 0, then 0. Step `i`
takes the noisy targets `x` from level `s_i` to `s_{i+1}` (Karras et al. 2022's
churn, Lu et al. 2022's 2nd-order single-step solver with the geometric midpoint):

  x <- x + s_0 n_init                            (i = 0 only: x starts at 0)
  s <- s_i (1 + r_i);  x <- x + sqrt(s^2 - s_i^2) inflation n_i    (churn)
  m = sqrt(s s_{i+1})
  x_mid = (m / s) x + (1 - m / s) D(x; s)
  x <- (s_{i+1} / s) x + (1 - s_{i+1} / s) D(x_mid; m),   or D(x; s) when s_{i+1} = 0

with `r_i` the churn rate (`churn_rate / levels` where `churn_min <= s_i <= churn_max`,
`churn_max` 0 meaning no maximum, at most sqrt(2) - 1, else 0) and `D` the denoiser (`wnscale.model.denoiser`). The
noise fields `n_init` and `n_i` are given, so a sample is a pure function of them. Levels
and rates are float32, as GenCast casts them. Shapes: `x`, each noise field `[B, C, G]`
(the denoiser's noisy-target layout); `D` returns `[B, C, G]` here.

A forecast (`forecast_step`) samples the normalized residual of each lead time and adds it to
the state as GenCast does (`forecast.from_residuals`), autoregressively. Its noise fields are
drawn from the run's seed: row `b`'s key depends on (seed, initial time, member, lead) alone
(`forecast_keys`) and field `f` (0: `n_init`, `i + 1`: step `i`'s churn) alone
(`field_noise`): GenCast's spherical white noise (`wnscale.model.spherical_noise`), the
whole grid's field drawn from the key and each slot's node taken from it; or, with
`spherical_noise` False (any grid), independent noise whose value at a grid node depends on
the node's index (`node_noise`). A resumed forecast draws what the first one drew, member `k`
is the same whatever the ensemble size, and every layout of members and grid nodes over
devices draws the same numbers. Either has variance 1 at every node (as the diffusion
loss's, `wnscale.model.diffusion`).
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from wnscale.errors import UserError
from wnscale.graphs.graph import Graphs
from wnscale.model import forecast, spherical_noise
from wnscale.model.graphcast import local_exchange
from wnscale.specs import SamplerSpec

# Folded into the seed so a forecast's noise never coincides with other uses of the seed.
_FORECAST_STREAM_TAG = 0x47454E  # "GEN"


class Schedule(NamedTuple):
  """`levels` `[N + 1]` (descending, the last 0) and `churn_rates` `[N]`, float32."""

  levels: np.ndarray
  churn_rates: np.ndarray


def level_quantiles(min_level: float, max_level: float, rho: float, quantiles):
  """The noise levels at `quantiles` (in [0, 1], numpy or JAX, any shape) of GenCast's rho
  distribution on [min_level, max_level]: (min^(1/rho) + q (max^(1/rho) - min^(1/rho)))^rho.
  The sampler's schedule and the training levels (`wnscale.model.diffusion`) draw from it."""
  power = 1 / rho
  return (min_level ** power + quantiles * (max_level ** power - min_level ** power)) ** rho


def schedule(spec: SamplerSpec) -> Schedule:
  """The noise levels and per-step churn rates of `spec` (computed in float64)."""
  levels = np.append(level_quantiles(spec.min_noise_level, spec.max_noise_level, spec.rho,
                                     np.linspace(1, 0, spec.noise_levels)), 0.0)
  rate = min(spec.churn_rate / spec.noise_levels, np.sqrt(2) - 1)
  highest = spec.churn_max_noise_level or np.inf  # 0: no maximum
  churning = (spec.churn_min_noise_level <= levels[:-1]) & (levels[:-1] <= highest)
  return Schedule(levels.astype(np.float32), (churning * rate).astype(np.float32))


def sample(denoise: Callable[[jax.Array, jax.Array], jax.Array], init_noise: jax.Array,
           churn_noise: Callable[[jax.Array], jax.Array], spec: SamplerSpec) -> jax.Array:
  """The sampled targets `[B, C, G]` (the module docstring's loop).

  Args:
    denoise: `(x [B, C, G], noise levels [B]) -> D(x) [B, C, G]`.
    init_noise: `[B, C, G]` standard-normal fields, scaled by the first level.
    churn_noise: `step i (traced) -> [B, C, G]` standard-normal fields of step `i`'s churn.
    spec: the sampler's settings.
  """
  levels, rates = (jnp.asarray(a) for a in schedule(spec))
  inflation = jnp.float32(spec.noise_level_inflation)
  batch = init_noise.shape[0]
  at = lambda level: jnp.full((batch,), level, jnp.float32)

  def step(i, x):
    x = x + levels[0] * init_noise * (i == 0).astype(jnp.float32)
    level = levels[i] * (1 + rates[i])
    added = jnp.sqrt(jnp.maximum(level ** 2 - levels[i] ** 2, 0))
    x = x + churn_noise(i) * (added * inflation)
    following = levels[i + 1]
    middle = jnp.sqrt(level * following)
    denoised = denoise(x, at(level))
    x_mid = (middle / level) * x + (1 - middle / level) * denoised
    x_next = (following / level) * x + (1 - following / level) * denoise(x_mid, at(middle))
    return jnp.where(following == 0, denoised, x_next)

  return jax.lax.fori_loop(0, len(levels) - 1, step, jnp.zeros_like(init_noise))


def noise_grid(spec: SamplerSpec, grid: spherical_noise.SphericalGrid | None):
  """The grid a denoiser's noise fields are drawn on (`field_noise`): `grid` (a layout's
  `spherical_grid`, None where the grid has no rows and columns) with `spec.spherical_noise`,
  else None (noise per grid node)."""
  if not spec.spherical_noise:
    return None
  if grid is None:
    raise UserError("model.sampler_spherical_noise: GenCast's spherical white noise needs a "
                    "regular latitude/longitude grid with an even number of longitudes; "
                    "on this grid set it False (independent noise per grid node).")
  return grid


def field_noise(key: jax.Array, grid_slots: jax.Array, channels: int,
                grid: spherical_noise.SphericalGrid | None) -> jax.Array:
  """`[channels, G_slots]` float32 noise of variance 1 at grid nodes `grid_slots` (-1,
  padding: 0): spherical white noise on `grid` (`noise_grid`) drawn from `key`, or with
  `grid` None `node_noise`."""
  if grid is None:
    return node_noise(key, grid_slots, channels)
  field = spherical_noise.white_noise(key, grid, channels)  # [channels, n_lat * n_lon]
  return jnp.where(grid_slots >= 0, field[:, jnp.maximum(grid_slots, 0)], 0)


def node_noise(key: jax.Array, grid_slots: jax.Array, channels: int) -> jax.Array:
  """`[channels, G_slots]` float32 standard-normal noise: slot `s`'s values depend on `key`
  and its grid node `grid_slots[s]` alone (-1, padding: 0)."""
  field = jax.vmap(lambda node: jax.random.normal(jax.random.fold_in(key, node),
                                                  (channels,), jnp.float32))(
      jnp.maximum(grid_slots, 0))  # [G_slots, channels]
  return jnp.where(grid_slots[:, None] >= 0, field, 0).T


@functools.partial(jax.jit, static_argnums=0)
def forecast_keys(seed: int, init_hours: jax.Array, members: jax.Array, lead) -> jax.Array:
  """`[B, 2]` uint32 key data (`jax.random.key_data`) of the rows' noise at lead index
  `lead`: row `b` member `members[b]` of the initial time `init_hours[b]` (hours since 1970,
  `[B]` int32), from the run's `seed`."""
  base = jax.random.fold_in(jax.random.key(seed), _FORECAST_STREAM_TAG)

  def row(hours, member):
    return jax.random.key_data(jax.random.fold_in(
        jax.random.fold_in(jax.random.fold_in(base, hours), member), lead))

  return jax.vmap(row)(init_hours, members)


def forecast_noise(keys: jax.Array, field, grid_slots: jax.Array, channels: int,
                   grid: spherical_noise.SphericalGrid | None) -> jax.Array:
  """`[B, channels, G_slots]` noise field `field` (0: the initial noise, `i + 1`: sampler
  step `i`'s churn; may be traced) of the rows with key data `keys` `[B, 2]`
  (`forecast_keys`), at grid nodes `grid_slots` `[G_slots]` (-1, padding: 0), on `grid`
  (`field_noise`)."""
  return jax.vmap(lambda key: field_noise(
      jax.random.fold_in(jax.random.wrap_key_data(key), field), grid_slots, channels,
      grid))(keys)


def forecast_step(denoiser, graphs: Graphs, residual_scale: jax.Array, history, forcings,
                  statics, keys: jax.Array, grid_slots: jax.Array, spec: SamplerSpec,
                  grid: spherical_noise.SphericalGrid | None, exchange=local_exchange,
                  global_forcings=None) -> jax.Array:
  """The next normalized outputs `[B, C_out, G]` (the state, then target-only channels) of
  one lead time: the residual sampled (`sample`) with `denoiser`
  (`wnscale.model.denoiser.Denoiser`) given the inputs, added to the last state.

  Args:
    graphs, residual_scale: `forecast.Constants`' (this shard's graphs under `shard_map`).
    history, forcings, statics, global_forcings: as `forecast.one_step`'s.
    keys: `[B, 2]` the rows' noise keys at this lead (`forecast_keys`).
    grid_slots: `[G]` the grid node of each slot of the grid axis (-1: padding).
    grid: where the noise is drawn (`noise_grid`).
  """
  parts, global_inputs = forecast.grid_input_parts(history, forcings, statics, global_forcings)
  channels = residual_scale.shape[0]

  def denoise(noisy, levels):
    return jnp.swapaxes(denoiser(graphs, parts, noisy, levels, exchange, global_inputs), 1, 2)

  noise = lambda field: forecast_noise(keys, field, grid_slots, channels, grid)  # noqa: E731
  residuals = sample(denoise, noise(0), lambda i: noise(i + 1), spec)
  return forecast.from_residuals(history, residuals, residual_scale)
