"""The GraphCast training loss.

MSE of the predicted states against the targets, measured in units of the std
of 6-hour differences, weighted per grid node (cell area, mean 1) and per
channel (variable weight, shared across levels by pressure), summed over
channels and averaged over grid nodes, examples and lead times.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wnscale.model import forecast
from wnscale.model.forecast import Constants


def latitude_weights(latitude_deg: np.ndarray, num_lon: int) -> np.ndarray:
  """Per-node weights `[num_lat * num_lon]` proportional to cell area, mean 1.

  A row's cell spans half a spacing either side (clipped at the poles), so pole
  rows get their small but nonzero cap area instead of cos(90 deg) = 0.
  """
  lat = np.asarray(latitude_deg, dtype=np.float64)
  half = np.abs(np.diff(np.sort(lat))).min() / 2 if len(lat) > 1 else 90.0
  upper = np.deg2rad(np.minimum(lat + half, 90.0))
  lower = np.deg2rad(np.maximum(lat - half, -90.0))
  area = np.sin(upper) - np.sin(lower)
  return np.repeat(area / area.mean(), num_lon).astype(np.float32)


def weighted_squared_error(predictions, targets, constants: Constants):
  """Per-node weighted error summed over channels, `[B, T, G]`, before averaging.

  `predictions`, `targets`: `[B, T, C, G]` normalized.
  """
  with jax.named_scope("loss"):
    error = (predictions - targets) / constants.residual_scale[:, None]
    per_node = jnp.sum(constants.channel_weights[:, None] * jnp.square(error), axis=-2)
    return per_node * constants.node_weights


def loss_fn(predictions: jax.Array, targets: jax.Array, constants: Constants) -> jax.Array:
  """Scalar loss of `[B, T, C, G]` normalized predictions against targets."""
  return jnp.mean(weighted_squared_error(predictions, targets, constants))


def forecast_loss(graphdef, params, constants: Constants, batch, *, remat_steps=False,
                  exchange=None):
  """Loss of the model `nnx.merge(graphdef, params)` on one batch (pure in `params`)."""
  kwargs = {} if exchange is None else {"exchange": exchange}
  predictions = forecast.rollout(nnx.merge(graphdef, params), constants, batch,
                                 remat_steps=remat_steps, **kwargs)
  return loss_fn(predictions, batch["targets"], constants)
