"""The training losses' sums: GraphCast's MSE, an FGN ensemble's fair CRPS, or GenCast's
diffusion loss of a denoiser (`wnscale.model.diffusion`) (`train.loss` names one,
`wnscale.model.loss_registry.LOSSES`).

MSE of the predicted states against the targets, measured in units of the std
of differences over one model step (`data.time_step_hours`), weighted per grid
node (cell area, mean 1) and per channel (variable weight, shared across levels
by pressure), summed over channels and averaged over grid nodes, examples and lead times. The CRPS
(`train.loss='crps'`, `wnscale.model.ensemble`) weighs absolute errors the same way.

Each target modality (`data.modalities`) adds `loss_weight` x its MSE (an FGN's CRPS:
its fair CRPS) in normalized units over the values present (NaN targets are left out,
never zero-filled),
weighted per point (its cell area, mean 1) and scaled by its number of target
variables: with nothing missing, summed over variables and averaged over points,
examples and lead times, as the grid's.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from wnscale.model import ensemble, forecast, rollout_loss
from wnscale.model.forecast import Constants
from wnscale.model.graphcast import GraphCast, local_exchange


class LossImplementation(NamedTuple):
  """What a loss of `loss_registry.LOSSES` computes (local sums under shard_map, which
  `mean_loss` turns into the mean).

  Attributes:
    grid_sum: `(predictions [M, B, T, C, G], targets [B, T, C, G], constants, remote) ->
      scalar`: the sum over examples, lead times and grid nodes of `M` members'
      predictions (normalized); `remote`: the predictions `[B, T, C, G]` of the members
      other devices hold (`specs.LossSpec.on_data`), a list, empty otherwise.
    point_sum: `(predictions [M, B, T, C_t, P], targets [B, T, C_t, P], point weights [P])
      -> scalar`: a target modality's sum over its present (not NaN) values.
    terms: `(model, constants, batch, exchange) -> scalar`: the whole grid sum of a loss
      that calls the model itself (the diffusion loss: a denoiser of noisy targets,
      `wnscale.model.diffusion`), or None: the sums above, of a forecaster's rollout.
  """

  grid_sum: Callable | None
  point_sum: Callable | None
  terms: Callable | None = None


def weighted_squared_error(predictions, targets, constants: Constants):
  """Per-node weighted error summed over channels, `[B, T, G]`, before averaging.

  `predictions`, `targets`: `[B, T, C, G]` normalized.
  """
  with jax.named_scope("loss"):
    error = (predictions - targets) / constants.residual_scale[:, None]
    per_node = jnp.sum(constants.channel_weights[:, None] * jnp.square(error), axis=-2)
    return per_node * constants.node_weights


def point_error_sum(predictions, targets, point_weights):
  """The sum of w_p (prediction - target)^2 over a modality's present values: `predictions`
  `[M, B, T, C_t, P]` (M members; their mean squared error), `targets` `[B, T, C_t, P]`
  normalized (NaN: missing), `point_weights` `[P]` (0 on padding points). `mean_loss`
  divides it by the modality's `point_weight_sums`."""
  present = ~jnp.isnan(targets)
  weights = _present_weights(targets, point_weights)
  error = jnp.where(present, predictions - jnp.where(present, targets, 0), 0)
  return jnp.sum(weights * jnp.square(error)) / predictions.shape[0]


def point_crps_sum(predictions, targets, point_weights):
  """The sum of w_p x fair CRPS over a modality's present values, of its members
  `predictions` `[M, B, T, C_t, P]` (`point_error_sum`'s arguments otherwise): the fair CRPS
  of `wnscale.model.ensemble`, per value, in normalized units."""
  present = ~jnp.isnan(targets)
  crps = ensemble.fair_crps(predictions, jnp.where(present, targets, 0),
                            lambda a, b: jnp.abs(a - b))
  return jnp.sum(_present_weights(targets, point_weights) * jnp.where(present, crps, 0))


def _present_weights(targets, point_weights):
  """`[B, T, C_t, P]`: `point_weights` `[P]` where `targets` are present (not NaN), else 0."""
  return jnp.where(jnp.isnan(targets), 0, point_weights.astype(jnp.float32))


def _grid_error_sum(predictions, targets, constants: Constants, remote):
  """The members' mean of the weighted squared error, summed over examples, lead times and
  grid nodes (`LossImplementation.grid_sum`)."""
  del remote  # each device runs all members of its examples (CRPSSpec.members_on_data)
  return jnp.sum(weighted_squared_error(predictions, targets[None], constants)) / (
      predictions.shape[0])


def _grid_crps_sum(predictions, targets, constants: Constants, remote):
  """The fair CRPS over the members, here and `remote`, summed over examples, lead times
  and grid nodes (`LossImplementation.grid_sum`)."""
  return jnp.sum(ensemble.fair_crps_sums(predictions, targets, constants,
                                         predictions.shape[0] + len(remote), remote))


# The implementations of the entries of `loss_registry.LOSSES`.
MSE = LossImplementation(grid_sum=_grid_error_sum, point_sum=point_error_sum)
CRPS = LossImplementation(grid_sum=_grid_crps_sum, point_sum=point_crps_sum)


def point_weight_sums(batch, point_weights: dict) -> dict:
  """`{target modality: the sum of w_p over its present target values}` of a batch (its
  `<name>/targets` `[B, T, C_t, P]`; `point_weights`: `Constants.point_weights`): what
  `mean_loss` divides each modality's `LossImplementation.point_sum` by. Local sums under
  shard_map,
  like `loss_terms`'; they depend on the targets only, never on the parameters."""
  return {key.removesuffix("/targets"): jnp.sum(_present_weights(
      value, point_weights[key.removesuffix("/targets")]))
          for key, value in batch.items() if key.endswith("/targets")}


def loss_terms(model: GraphCast, constants: Constants, batch, *, loss: LossImplementation,
               remat_steps: bool = False, exchange=local_exchange, remote_members=None):
  """`(the grid's loss summed over examples, lead times and grid nodes, {target modality:
  its point sum})` of a batch, for `loss` (the implementation of an entry of
  `loss_registry.LOSSES`: `MSE`, `CRPS`, `diffusion.IMPLEMENTATION`); local sums (under
  shard_map, of this shard's rows), turned into the mean by `mean_loss`.

  Divide the grid's by examples x lead times x grid nodes for its mean. A batch with
  `noise` `[B, M, T, K]` (an FGN's) runs `M` members per example: "mse" averages their
  MSE, "crps" is the fair CRPS over them, at the grid's nodes and each modality's points.
  `remote_members` (members laid out on other devices; the grid only): `prediction
  [B, T, C, G] -> the other members' predictions of the same examples`, a list.
  `remat_steps` (`train.remat_rollout`): each rollout step computes its own share of the
  sums, and the backward pass keeps one state a step (`rollout_loss`).
  """
  if loss.terms is not None:  # the diffusion loss: one step, the grid alone
    return loss.terms(model, constants, batch, exchange), {}
  targets = batch["targets"]
  point_targets = {key.removesuffix("/targets"): value for key, value in batch.items()
                   if key.endswith("/targets")}
  rows, members = ensemble.members_as_batch(batch) if "noise" in batch else (batch, 1)
  by_member = lambda x: x.reshape((members, -1) + x.shape[1:])  # [M, B, ...]

  def sums(constants, predictions, point_predictions, targets, point_targets):
    """The loss sums of `predictions` `[M B, T', C, G]` (and each target modality's) against
    `targets` `[B, T', C, G]` (and `point_targets`), T' leads."""
    predictions = by_member(predictions)
    remote = remote_members(predictions[0]) if remote_members is not None else []
    grid = loss.grid_sum(predictions, targets, constants, remote)
    return grid, {name: loss.point_sum(by_member(values), point_targets[name],
                                       constants.point_weights[name])
                  for name, values in point_predictions.items()}

  if not remat_steps:
    predictions, point_predictions = forecast.rollout_with_points(model, constants, rows,
                                                                  exchange=exchange)
    return sums(constants, predictions, point_predictions, targets, point_targets)

  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def step(params, data, history, lead):  # reads nothing but its arguments (rollout_loss)
    constants, rows, targets, point_targets, rest, exchange = data
    prediction, point_prediction = forecast.step_at_lead(
        nnx.merge(graphdef, params, rest), constants, rows, history, lead, exchange)
    at_lead = lambda x: jax.lax.dynamic_slice_in_dim(x, lead, 1, axis=1)
    step_sums = sums(constants, prediction[:, None],
                     {name: values[:, None] for name, values in point_prediction.items()},
                     at_lead(targets), {name: at_lead(values) for name, values in
                                        point_targets.items()})
    return prediction[:, :history.shape[2]].astype(history.dtype), step_sums

  inputs = rows["inputs"]
  return rollout_loss.summed_over_steps(
      step, params, (constants, rows, targets, point_targets, rest, exchange), inputs,
      rows["forcings"].shape[1] - inputs.shape[1])


def mean_loss(grid_sum, grid_count, point_sums: dict, point_counts: dict,
              modalities) -> jax.Array:
  """The mean loss: `grid_sum / grid_count` plus each target modality's (`ModalitySpec`)
  `loss_weight` x targets x its weighted mean over present values (`point_sums`: name ->
  its point sum; `point_counts`: name -> its `point_weight_sums`).

  Linear in the sums for given counts: with the whole batch's counts (summed over every
  shard), the means of its parts (shards, micro-batches) add up to the batch's mean.
  """
  total = grid_sum / grid_count
  for modality in modalities:
    if modality.name in point_sums:
      total = total + (modality.loss_weight * len(modality.targets) * point_sums[modality.name]
                       / jnp.maximum(point_counts[modality.name], jnp.finfo(jnp.float32).tiny))
  return total
