"""GenCast's diffusion training (`train.loss='diffusion'`): the denoising loss of Karras et
al. 2022 (EDM) with GenCast's noise-level distribution and weighting.

Per example `b`, the target `r` `[C_out, G]` is the next state's normalized residual (its
change over one step in units of the change's std; a target-only channel's normalized
value: what GraphCast's `InputsAndResiduals` makes), `sigma_b` a noise level drawn from
GenCast's rho distribution on [min, max] (`sampler.level_quantiles` at a uniform quantile,
`loss_registry.DiffusionSpec`), and `n_b` standard-normal noise per channel and grid node.
The denoiser `D` (`wnscale.model.denoiser`) sees `r + sigma_b n_b`; the loss is

  lambda(sigma_b) sum_c w_c mean_g a_g (D(r + sigma_b n_b; sigma_b) - r)^2,
  lambda(sigma) = (sigma^2 + 1) / sigma^2 = c_out(sigma)^-2

averaged over examples: the MSE loss's weights (`w_c` per channel, `a_g` the cell areas of
mean 1) and EDM's weighting with the targets' std 1 (GenCast's `_loss_weighting`). One step,
no rollout: GenCast trains its 12 h step alone.

Levels and noise are pure functions of `(seed, train step, example, grid node)`
(`training_noise`), drawn by the train step for the whole batch before it is split over
devices or micro-batches: a resumed run draws what the uninterrupted run drew, and every
layout of the grid over devices the same noise at each node. The fields are GenCast's
spherical white noise, as its training draws them, or independent per grid node
(`sampler.field_noise`, `model.sampler_spherical_noise`); variance 1 either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from wnscale.model import forecast
from wnscale.model.graphcast import local_exchange
from wnscale.model.loss import LossImplementation
from wnscale.model.sampler import field_noise, level_quantiles
from wnscale.model.spherical_noise import SphericalGrid

if TYPE_CHECKING:  # the registry imports this module for its entry's implementation
  from wnscale.model.loss_registry import DiffusionSpec

# Folded into the seed so these draws never coincide with other uses of the seed.
_STREAM_TAG = 0x444946  # "DIF"


class TrainingNoise(NamedTuple):
  """What a train step draws a diffusion batch's noise from.

  Attributes:
    seed: the run's `seed`.
    spec: the loss's settings (the levels' distribution).
    channels: the output channels `C_out`.
    grid_slots: `[G_slots]` the grid node of each slot of the batch's grid axis, -1 for
      padding (`ShardedLayout.grid_slots`).
    grid: the spherical white noise's grid (`sampler.noise_grid`); None: noise per node.
  """

  seed: int
  spec: DiffusionSpec
  channels: int
  grid_slots: np.ndarray
  grid: SphericalGrid | None


def training_noise(noise: TrainingNoise, step, examples: int) -> tuple[jax.Array, jax.Array]:
  """`(levels [examples] float32, noise fields [examples, C_out, G_slots] float32)` of train
  step `step` (may be traced); example `b`'s depend on `(seed, step, b)` alone, a node's
  field values on its node index (padding slots: 0)."""
  step_key = jax.random.fold_in(jax.random.fold_in(jax.random.key(noise.seed), _STREAM_TAG),
                                step)
  slots = jnp.asarray(noise.grid_slots)
  spec = noise.spec

  def one(example):
    level_key, field_key = jax.random.split(jax.random.fold_in(step_key, example))
    level = level_quantiles(spec.training_min_noise_level, spec.training_max_noise_level,
                            spec.training_noise_level_rho,
                            jax.random.uniform(level_key, (), jnp.float32))
    return level, field_noise(field_key, slots, noise.channels, noise.grid)

  return jax.vmap(one)(jnp.arange(examples))


def with_training_noise(batch: dict, noise: TrainingNoise | None, step, sharding) -> dict:
  """The batch with train step `step`'s `noise_levels` `[B]` and `diffusion_noise`
  `[B, C_out, G_slots]` (as is without `noise`); `sharding(key)`: where batch key `key`
  lies (each device draws its own share)."""
  if noise is None:
    return batch
  levels, fields = training_noise(noise, step, batch["targets"].shape[0])
  return dict(batch, **{key: jax.lax.with_sharding_constraint(value, sharding(key)) for
                        key, value in (("noise_levels", levels), ("diffusion_noise", fields))})


def residual_targets(targets: jax.Array, last_state: jax.Array,
                     residual_scale: jax.Array) -> jax.Array:
  """`[B, C_out, G]` float32 what the denoiser learns to output: the change from
  `last_state` `[B, C, G]` to `targets` `[B, C_out, G]` (the state's first `C` channels; a
  target-only channel's value itself) in units of `residual_scale` `[C_out]` (all
  normalized)."""
  targets = targets.astype(jnp.float32)
  num_state = last_state.shape[1]
  changes = jnp.concatenate([targets[:, :num_state] - last_state.astype(jnp.float32),
                             targets[:, num_state:]], axis=1)
  return changes / residual_scale[:, None]


def loss_weighting(levels: jax.Array) -> jax.Array:
  """EDM's lambda(sigma) = (sigma^2 + 1) / sigma^2 of `levels` (the targets' std 1)."""
  return (jnp.square(levels) + 1) / jnp.square(levels)


def loss_sum(model, constants: forecast.Constants, batch: dict,
             exchange=local_exchange) -> jax.Array:
  """The module docstring's loss summed over examples and grid nodes (not yet divided by
  their count: `loss.mean_loss` does), of the denoiser `model` on a batch with one target
  step and its `noise_levels` and `diffusion_noise` (`with_training_noise`)."""
  inputs = batch["inputs"]  # [B, input_steps, C, G]
  residuals = residual_targets(batch["targets"][:, 0], inputs[:, -1], constants.residual_scale)
  levels = batch["noise_levels"]
  noisy = residuals + levels[:, None, None] * batch["diffusion_noise"]
  parts, global_inputs = forecast.grid_input_parts(inputs, batch["forcings"], batch["statics"],
                                                   batch.get("globals"))
  denoised = jnp.swapaxes(model(constants.graphs, parts, noisy, levels, exchange,
                                global_inputs), 1, 2)  # [B, C_out, G]
  with jax.named_scope("loss"):
    per_node = jnp.sum(constants.channel_weights[:, None] * jnp.square(denoised - residuals),
                       axis=1) * constants.node_weights
    return jnp.sum(loss_weighting(levels)[:, None] * per_node)


# The implementation of `loss_registry.LOSSES['diffusion']`.
IMPLEMENTATION = LossImplementation(grid_sum=None, point_sum=None, terms=loss_sum)
