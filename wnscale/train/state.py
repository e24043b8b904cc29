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
  """

  step: jax.Array
  params: Any
  opt_state: Any
  nonfinite_step: jax.Array


def initial_state(params, optimizer) -> TrainState:
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=optimizer.init(params),
                    nonfinite_step=jnp.full((), -1, jnp.int32))
