"""The training losses: GraphCast's MSE, or an FGN ensemble's fair CRPS.

MSE of the predicted states against the targets, measured in units of the std
of differences over one model step (`data.time_step_hours`), weighted per grid
node (cell area, mean 1) and per channel (variable weight, shared across levels
by pressure), summed over channels and averaged over grid nodes, examples and lead times. The CRPS
(`train.loss='crps'`, `wnscale.model.ensemble`) weighs absolute errors the same way.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

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


def loss_sum(model: GraphCast, constants: Constants, batch, *, loss: str = "mse",
             remat_steps: bool = False, exchange=local_exchange, remote_members=None):
  """The batch's loss summed over examples, lead times and grid nodes (a scalar).

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

