"""The optimizer from the config: AdamW, linear warm-up then cosine decay, clipping.

The optimizer works on the parameters raveled into one vector (`optax.flatten`),
so its state is two `[num_params]` moment vectors instead of two copies of the
parameter tree. The math is the same (the clipping norm is global either way),
but a checkpoint of the train state holds ~90 arrays instead of ~250, and
Orbax's per-array bookkeeping is what blocks the training loop during an
asynchronous save (`bench/checkpoint.py`). The price is one parameter-sized
temporary when the gradients are raveled (+136 MiB at GraphCast size).
"""

from __future__ import annotations

import ml_collections
import optax


def warmup_steps(train: ml_collections.ConfigDict) -> int:
  """`train.warmup_steps`, clipped to leave the run one step of decay."""
  return min(train.warmup_steps, train.steps - 1)


def learning_rate_schedule(train: ml_collections.ConfigDict) -> optax.Schedule:
  """0 -> `learning_rate` over `warmup_steps(train)`, then half-cosine to `end_learning_rate`."""
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=train.learning_rate, warmup_steps=warmup_steps(train),
      decay_steps=train.steps, end_value=train.end_learning_rate)


def make_optimizer(train: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW with the schedule above, on the raveled parameters."""
  return optax.flatten(optax.chain(
      optax.clip_by_global_norm(train.grad_clip_norm),
      optax.adamw(learning_rate_schedule(train), b1=train.adam_b1, b2=train.adam_b2,
                  weight_decay=train.weight_decay)))
