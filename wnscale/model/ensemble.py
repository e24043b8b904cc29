"""Ensembles of an FGN: members as a `sample` dimension of the batch, their noise, fair CRPS.

An FGN (`model.noise_channels > 0`) forecasts one member per noise draw. A
batch carries the noise of its members as `noise` `[B, M, target_steps, K]`:
`M` members of each of its `B` examples, one `K`-vector per member and lead
time. `members_as_batch` turns that into an ordinary batch of `M * B` rows,
member-major (row `m * B + b` is member `m` of example `b`), which the
network runs like any batch (the batch is vmapped, so the members are too).

Noise is a pure function of `(seed, stream, example, member, lead)`
(`member_noise`): training uses the optimizer step as the stream and the
example's position in the global batch, a forecast its initial time. Nothing
random is carried in the train state: a run resumed from the checkpoint of
step `s` draws, at step `s`, the noise the uninterrupted run drew, and
forecast member `k` is the same whatever the ensemble size.

The fair CRPS of `M` members `x_i` against the target `y`, per grid node and
channel (unbiased for the CRPS of the distribution the members sample):

  CRPS = 1/M sum_i |x_i - y|  -  1/(2 M (M - 1)) sum_{i != j} |x_i - x_j|

weighted like the MSE loss (errors in units of the std of one model step's
difference, channel weights, cell-area node weights).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from wnscale.specs import Specs

# Folded into the seed so noise streams never coincide with other uses of the seed.
_NOISE_STREAM_TAG = 0x464E4E  # "FGN"
# What each member runs on: these, and each input modality's `<name>/inputs`.
ROLLOUT_KEYS = ("inputs", "forcings", "statics", "globals")


class TrainingMembers(NamedTuple):
  """How a train step runs an FGN: `members` per example, each with `channels` noise numbers.

  `on_data`: the batch's rows are members laid out along the `data` axis
  (`members_on_rows`), not examples.
  """

  seed: int
  members: int
  channels: int
  on_data: bool


def training_members(specs: Specs) -> TrainingMembers | None:
  """The FGN settings of a run (None for a deterministic model).

  The loss says how many members of each example it compares (`LossSpec.members`: the
  CRPS `train.ensemble_members`, the MSE one) and where they run.
  """
  if not specs.model.noise_channels:
    return None
  return TrainingMembers(seed=specs.seed, members=specs.train.loss.members,
                         channels=specs.model.noise_channels, on_data=specs.train.loss.on_data)


def with_training_noise(batch: dict, spec: TrainingMembers | None, step) -> dict:
  """The batch with the noise of train step `step` (as is for a deterministic model).

  Rows are examples (noise `[B, M, T, K]`), or with `spec.on_data` members
  laid out as `members_on_rows` does (noise `[M * B, 1, T, K]`, the same numbers).
  """
  if spec is None:
    return batch
  rows, steps = batch["targets"].shape[:2]
  examples = rows // spec.members if spec.on_data else rows
  noise = training_noise(spec.seed, step, examples, spec.members, steps, spec.channels)
  return dict(batch, noise=noise_on_rows(noise) if spec.on_data else noise)


def noise_key(seed: int) -> jax.Array:
  """The base key of every noise draw of a run with `seed`."""
  return jax.random.fold_in(jax.random.key(seed), _NOISE_STREAM_TAG)


def member_noise(key: jax.Array, stream, examples: jax.Array, members: jax.Array,
                 leads: jax.Array, channels: int) -> jax.Array:
  """Standard-normal noise `[len(examples), len(members), len(leads), channels]`.

  Entry `(e, m, l)` depends only on `(key, stream, examples[e], members[m],
  leads[l])`: folded into the key one by one, so no index's draw depends on
  how many others are drawn. `stream` may be traced (the train step's step).
  """
  stream_key = jax.random.fold_in(key, stream)

  def one(example, member, lead):
    folded = stream_key
    for index in (example, member, lead):
      folded = jax.random.fold_in(folded, index)
    return jax.random.normal(folded, (channels,), jnp.float32)

  over_leads = jax.vmap(one, (None, None, 0))
  over_members = jax.vmap(over_leads, (None, 0, None))
  return jax.vmap(over_members, (0, None, None))(examples, members, leads)


@functools.partial(jax.jit, static_argnums=4)
def forecast_noise(key: jax.Array, streams: jax.Array, members: jax.Array, lead,
                   channels: int) -> jax.Array:
  """`[B, channels]`: row `r` is member `members[r]` of stream `streams[r]` at `lead`.

  A forecast's rows: the stream is the initial time, the example index 0.
  """
  def row(stream, member):
    return member_noise(key, stream, jnp.zeros(1, jnp.int32), member[None],
                        jnp.asarray(lead)[None], channels)[0, 0, 0]

  return jax.vmap(row)(streams, members)


def training_noise(seed: int, step, batch_size: int, members: int, target_steps: int,
                   channels: int) -> jax.Array:
  """`[batch_size, members, target_steps, channels]` noise of train step `step`."""
  return member_noise(noise_key(seed), step, jnp.arange(batch_size), jnp.arange(members),
                      jnp.arange(target_steps), channels)


def members_as_batch(batch: dict) -> tuple[dict, int]:
  """`(rollout batch of M * B rows, M)` from a batch with `noise` `[B, M, T, K]`.

  Each member row repeats its example's inputs, forcings, statics (and
  globals, and each modality's inputs), member-major; the noise becomes
  `[M * B, T, K]`. Targets are left out (the loss compares every member with
  its example's targets).
  """
  members = batch["noise"].shape[1]
  rows = tile_members({k: v for k, v in batch.items()
                       if k in ROLLOUT_KEYS or k.endswith("/inputs")}, members)
  rows["noise"] = noise_on_rows(batch["noise"])[:, 0]
  return rows, members


def tile_members(batch: dict, members: int) -> dict:
  """Every `[B, ...]` array repeated `members` times along its first axis, member-major."""
  return {key: jnp.tile(value, (members,) + (1,) * (value.ndim - 1))
          for key, value in batch.items()}


def noise_on_rows(noise: jax.Array) -> jax.Array:
  """`[B, M, T, K] -> [M * B, 1, T, K]`: member `m` of example `b` on row `m * B + b`."""
  num_examples, members = noise.shape[:2]
  return jnp.swapaxes(noise, 0, 1).reshape((members * num_examples, 1) + noise.shape[2:])


def members_on_rows(batch: dict) -> dict:
  """A batch with noise `[B, M, T, K]` as `M * B` member-major rows of one member each.

  The layout of members along the `data` mesh axis (`train.members_on_data`):
  with `mesh.data` a multiple of `M`, each data shard holds rows of one member.
  """
  members = batch["noise"].shape[1]
  rows = tile_members({k: v for k, v in batch.items() if k != "noise"}, members)
  rows["noise"] = noise_on_rows(batch["noise"])
  return rows


def weighted_absolute_error(a: jax.Array, b: jax.Array, constants) -> jax.Array:
  """`[..., T, G]` weighted |a - b| summed over channels; `a`, `b` `[..., T, C, G]` normalized.

  In units of the std of one model step's difference per channel (`residual_scale`), with
  the MSE loss's channel and node weights.
  """
  error = jnp.abs(a - b) / constants.residual_scale[:, None]
  return jnp.sum(constants.channel_weights[:, None] * error, axis=-2) * constants.node_weights


def fair_crps_sums(predictions: jax.Array, targets: jax.Array, constants, num_members: int,
                   remote_members=()) -> jax.Array:
  """The local members' share of the fair CRPS, `[B, T, G]` (weighted, summed over channels).

  Args:
    predictions: `[m, B, T, C, G]` the members held here (`m` of `num_members`).
    targets: `[B, T, C, G]`.
    remote_members: the other `num_members - m` members' predictions of the
      same examples, each `[B, T, C, G]` (members held by other devices: each
      device counts its own members' pairs with them, so the pair sums over
      all devices count every ordered pair once).

  Summed over every device's share, this is the CRPS above per (example,
  lead, node).
  """
  return fair_crps(predictions, targets,
                   lambda a, b: weighted_absolute_error(a, b, constants), num_members,
                   remote_members)


def fair_crps(members, target, distance, num_members: int | None = None, remote_members=()):
  """The fair CRPS (the module docstring's) of `members` against `target`, with
  `distance(a, b)` for `|a - b|` (e.g. weighted and summed over channels).

  `members`: `m` arrays (or an `[m, ...]` array) of `num_members` (default `m`); the
  other members, held elsewhere, in `remote_members`: then this is the local members'
  share (`fair_crps_sums`).
  """
  local = len(members)
  num_members = num_members or local
  skill = sum(distance(members[i], target) for i in range(local))
  # Ordered pairs i != j: local pairs twice (i, j and j, i), remote ones once from here.
  spread = 2 * sum((distance(members[i], members[j]) for i in range(local) for j in range(i)),
                   jnp.zeros_like(skill))
  spread += sum((distance(members[i], other) for i in range(local) for other in remote_members),
                jnp.zeros_like(skill))
  return skill / num_members - spread / (2 * num_members * (num_members - 1))
