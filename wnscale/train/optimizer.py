"""The optimizer of a `TrainSpec`: AdamW, linear warm-up then cosine decay, clipping.

The optimizer works on the parameters raveled into one vector (`optax.flatten`),
so its state is two `[num_params]` moment vectors instead of two copies of the
parameter tree. The math is the same (the clipping norm is global either way),
but a checkpoint of the train state holds ~90 arrays instead of ~250, and
Orbax's per-array bookkeeping is what blocks the training loop during an
asynchronous save (`bench/checkpoint.py`). The price is one parameter-sized
temporary when the gradients are raveled (+136 MiB at GraphCast size).

The learning rate is one schedule over the run, or one per rollout phase
(`train.phase_learning_rates`). Parameters under `train.freeze` prefixes are
left out of the optimizer (`optax.multi_transform`): no update, no moments, and
no part in the clipping norm.
"""

from __future__ import annotations

import jax
import numpy as np
import optax

from wnscale.errors import UserError
from wnscale.specs import TrainSpec

TRAINED, FROZEN = "trained", "frozen"  # the labels of `multi_transform`


def warmup_steps(train: TrainSpec) -> int:
  """`train.warmup_steps`, clipped to leave the run one step of decay."""
  return min(train.warmup_steps, train.steps - 1)


def learning_rate_schedule(train: TrainSpec) -> optax.Schedule:
  """Without `phase_learning_rates`: 0 -> `learning_rate` over `warmup_steps(train)`, then
  half-cosine to `end_learning_rate` at `train.steps`. With them: each phase its own."""
  if not train.phase_learning_rates:
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=train.learning_rate, warmup_steps=warmup_steps(train),
        decay_steps=train.steps, end_value=train.end_learning_rate)
  phases = train.phases(target_steps=1)  # only their steps matter here
  return optax.join_schedules(
      [_phase_schedule(*rate, phase.end_step - phase.first_step)
       for rate, phase in zip(train.phase_learning_rates, phases)],
      [phase.first_step for phase in phases[1:]])


def _phase_schedule(peak: float, warmup: int, end: float, length: int) -> optax.Schedule:
  """A phase's rate, by step within the phase: warm-up to `peak`, half-cosine to `end`."""
  if peak == end:
    if not warmup:  # (optax logs a zero-length linear schedule at every call)
      return optax.constant_schedule(peak)
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup),
                                 optax.constant_schedule(peak)], [warmup])
  return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, length, end)


def path_name(path) -> str:
  """The dotted name of a parameter's tree path (`processor.layers_0.kernel`)."""
  keys = [getattr(key, "key", getattr(key, "idx", None)) for key in path]
  return ".".join(str(key) for key in keys if key is not None)


def freeze_labels(params, prefixes) -> object:
  """`params`' tree of `TRAINED`/`FROZEN`: frozen where the dotted name starts with a prefix.

  Raises:
    UserError: a prefix names no parameter (the message lists the top-level names).
  """
  names = [path_name(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  unknown = [prefix for prefix in prefixes if not any(n.startswith(prefix) for n in names)]
  if unknown:
    tops = sorted({name.split(".")[0] for name in names})
    raise UserError(f"train.freeze: {unknown} name(s) no parameter; parameter paths start "
                    f"with one of {tops} (dotted below: e.g. {names[0]}).")
  return jax.tree_util.tree_map_with_path(
      lambda path, _: FROZEN if path_name(path).startswith(tuple(prefixes)) else TRAINED,
      params)


def frozen_counts(params, prefixes) -> dict[str, int]:
  """`{prefix: parameters it freezes}`, and `TRAINED`: how many are left to train."""
  flat = [(path_name(path), int(np.prod(x.shape)))
          for path, x in jax.tree_util.tree_flatten_with_path(params)[0]]
  freeze_labels(params, prefixes)  # the unknown-prefix error
  counts = {prefix: sum(size for name, size in flat if name.startswith(prefix))
            for prefix in prefixes}
  counts[TRAINED] = sum(size for name, size in flat if not name.startswith(tuple(prefixes)))
  return counts


def make_optimizer(train: TrainSpec) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW with the schedule above, on the raveled parameters
  (the trained ones: `train.freeze`'s get zero updates and no state)."""
  optimizer = optax.flatten(optax.chain(
      optax.clip_by_global_norm(train.grad_clip_norm),
      optax.adamw(learning_rate_schedule(train), b1=train.adam_b1, b2=train.adam_b2,
                  weight_decay=train.weight_decay)))
  if not train.freeze:
    return optimizer
  return optax.multi_transform({TRAINED: optimizer, FROZEN: optax.set_to_zero()},
                               lambda params: freeze_labels(params, train.freeze))
