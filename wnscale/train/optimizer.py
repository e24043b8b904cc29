"""The optimizer from the config: AdamW, linear warm-up then cosine decay, clipping."""

from __future__ import annotations

import ml_collections
import optax


def learning_rate_schedule(train: ml_collections.ConfigDict) -> optax.Schedule:
  """0 -> `learning_rate` over `warmup_steps`, then half-cosine to `end_learning_rate`."""
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=train.learning_rate, warmup_steps=train.warmup_steps,
      decay_steps=train.steps, end_value=train.end_learning_rate)


def make_optimizer(train: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Global-norm clipping, then AdamW with the schedule above."""
  return optax.chain(
      optax.clip_by_global_norm(train.grad_clip_norm),
      optax.adamw(learning_rate_schedule(train), b1=train.adam_b1, b2=train.adam_b2,
                  weight_decay=train.weight_decay))
