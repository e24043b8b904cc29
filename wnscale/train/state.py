"""The training state: one explicit pytree, saved and restored as a whole."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


class TrainState(NamedTuple):
  """Everything a training run carries from step to step.

  Attributes:
    step: int32 scalar, optimizer steps taken.
    params: the model parameters (`nnx.State` of float32 arrays).
    opt_state: the optax state.
    nonfinite_step: int32 scalar, the first step whose loss was NaN or inf, -1
      if none: checked on the host only when it syncs anyway (logs, checkpoints).
    ema: the exponential moving average of `params` (`train.ema_decay`), the
      same tree, or None without one.
  """

  step: jax.Array
  params: Any
  opt_state: Any
  nonfinite_step: jax.Array
  ema: Any = None


def initial_state(params, optimizer, ema: bool = False) -> TrainState:
  """Step 0 of `params`; with `ema`, an average that starts at `params`."""
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=optimizer.init(params),
                    nonfinite_step=jnp.full((), -1, jnp.int32),
                    ema=jax.tree.map(jnp.copy, params) if ema else None)
