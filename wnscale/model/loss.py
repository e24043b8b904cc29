"""The training losses: GraphCast's MSE, or an FGN ensemble's fair CRPS.

MSE of the predicted states against the targets, measured in units of the std
of differences over one model step (`data.time_step_hours`), weighted per grid
node (cell area, mean 1) and per channel (variable weight, shared across levels
by pressure), summed over channels and averaged over grid nodes, examples and lead times. The CRPS
(`train.loss='crps'`, `wnscale.model.ensemble`) weighs absolute errors the same way.

Each target modality (`data.modalities`) adds `loss_weight` x its MSE in normalized
units over the values present (NaN targets are left out, never zero-filled),
weighted per point (its cell area, mean 1) and scaled by its number of target
variables: with nothing missing, summed over variables and averaged over points,
examples and lead times, as the grid's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from wnscale.model import ensemble, forecast
from wnscale.model.forecast import Constants
from wnscale.model.graphcast import GraphCast, local_exchange


def weighted_squared_error(predictions, targets, constants: Constants):
  """Per-node weighted error summed over channels, `[B, T, G]`, before averaging.

  `predictions`, `targets`: `[B, T, C, G]` normalized.
  """
  with jax.named_scope("loss"):
    error = (predictions - targets) / constants.residual_scale[:, None]
    per_node = jnp.sum(constants.channel_weights[:, None] * jnp.square(error), axis=-2)
    return per_node * constants.node_weights


def point_error_sums(predictions, targets, point_weights):
  """`(sum of w_p (prediction - target)^2 over present values, sum of w_p over them)` of a
  modality: `predictions`, `targets` `[B, T, C_t, P]` normalized (NaN: missing), `point_weights`
  `[P]` (0 on padding points)."""
  present = ~jnp.isnan(targets)
  error = jnp.where(present, predictions - jnp.where(present, targets, 0), 0)
  weights = jnp.where(present, point_weights.astype(jnp.float32), 0)
  return jnp.sum(weights * jnp.square(error)), jnp.sum(weights)


def loss_terms(model: GraphCast, constants: Constants, batch, *, loss: str = "mse",
               remat_steps: bool = False, exchange=local_exchange, remote_members=None):
  """`(loss_sum's grid sum, {target modality: point_error_sums})` of a batch; local sums
  (under shard_map, of this shard's rows), combined by `mean_loss` after any psum."""
  if not constants.point_weights:
    return loss_sum(model, constants, batch, loss=loss, remat_steps=remat_steps,
                    exchange=exchange, remote_members=remote_members), {}
  if loss != "mse" or "noise" in batch:
    raise ValueError("Modalities are trained with train.loss='mse' and no noise (so far).")
  predictions, point_predictions = forecast.rollout_with_points(
      model, constants, batch, remat_steps=remat_steps, exchange=exchange)
  grid = jnp.sum(weighted_squared_error(predictions, batch["targets"], constants))
  return grid, {name: point_error_sums(values, batch[f"{name}/targets"],
                                       constants.point_weights[name])
                for name, values in point_predictions.items()}


def mean_loss(grid_sum, grid_count, point_sums: dict, modalities) -> jax.Array:
  """The mean loss: `grid_sum / grid_count` plus each target modality's (`ModalitySpec`)
  `loss_weight` x targets x its weighted mean squared error over present values
  (`point_sums`: name -> `point_error_sums`, summed over every shard)."""
  total = grid_sum / grid_count
  for modality in modalities:
    if modality.name in point_sums:
      squared, weights = point_sums[modality.name]
      total = total + (modality.loss_weight * len(modality.targets)
                       * squared / jnp.maximum(weights, jnp.finfo(jnp.float32).tiny))
  return total


def loss_sum(model: GraphCast, constants: Constants, batch, *, loss: str = "mse",
             remat_steps: bool = False, exchange=local_exchange, remote_members=None):
  """The batch's grid loss summed over examples, lead times and grid nodes (a scalar).

  Divide by examples x lead times x grid nodes for the mean. A batch with
  `noise` `[B, M, T, K]` (an FGN's) runs `M` members per example: "mse"
  averages their MSE, "crps" is the fair CRPS over them. `remote_members`
  (members laid out on other devices): `prediction [B, T, C, G] -> the other
  members' predictions of the same examples`, a list.
  """
  targets = batch["targets"]
  members = 1
  if "noise" in batch:
    batch, members = ensemble.members_as_batch(batch)
  predictions = forecast.rollout(model, constants, batch, remat_steps=remat_steps,
                                 exchange=exchange)
  predictions = predictions.reshape((members, -1) + predictions.shape[1:])
  if loss == "mse":
    return jnp.sum(weighted_squared_error(predictions, targets[None], constants)) / members
  remote = remote_members(predictions[0]) if remote_members is not None else []
  return jnp.sum(ensemble.fair_crps_sums(predictions, targets, constants,
                                         members + len(remote), remote))

