"""Rematerialization: where the model checkpoints, under a policy of
`wnscale.model.remat_policies` (the values it may save are tagged with the names
declared there).
"""

from __future__ import annotations

from typing import Callable

import jax
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from wnscale.model.remat_policies import PROCESSOR_CARRY


def checkpointed(module: nnx.Module, fn: Callable, enabled: bool, policy: Callable | None):
  """`fn(module, *args)` as a function of `*args`, under `jax.checkpoint` if enabled.

  The module's state is passed to the checkpointed function explicitly (split and
  merged), so no Flax object crosses the JAX transform boundary.
  """
  if not enabled:
    return lambda *args: fn(module, *args)
  graphdef, state = nnx.split(module)

  def pure(state, *args):
    return fn(nnx.merge(graphdef, state), *args)

  checkpointed_pure = jax.checkpoint(pure, policy=policy)
  return lambda *args: checkpointed_pure(state, *args)


def scan_layers(apply_layer: Callable, carry, stacked_state, *, checkpoint: bool, every: int,
                policy: Callable | None, scan: bool = True):
  """Applies layers whose parameters are stacked on a leading `[num_layers]` axis, in order.

  With `checkpoint`, the layers run in groups of `every`, each group under one
  `jax.checkpoint` with `policy` (the last group may be smaller). A group's input is
  tagged `PROCESSOR_CARRY`: a policy may keep it (in host memory, say). The processors
  (mesh GNN and mesh transformer) both run this way.

  With `scan`, the layers (or the full groups) are one `jax.lax.scan`: compiled once,
  but what the backward pass keeps of each iteration is written into stacked arrays and
  sliced out again. Without, a Python loop: each layer is compiled on its own and its
  saved values stay separate arrays (no copies).

  Args:
    apply_layer: `(carry, layer_state) -> carry`, one layer.
    carry: what the layers update (a pytree of arrays).
    stacked_state: the layers' `nnx.State`, every leaf `[num_layers, ...]`.
  """
  num_layers = jax.tree.leaves(stacked_state)[0].shape[0]
  rows = lambda start, stop: jax.tree.map(lambda x: x[start:stop], stacked_state)

  def layers(carry, states):
    if scan:
      return jax.lax.scan(lambda c, s: (apply_layer(c, s), None), carry, states)[0]
    for index in range(jax.tree.leaves(states)[0].shape[0]):
      carry = apply_layer(carry, jax.tree.map(lambda x: x[index], states))
    return carry

  if not checkpoint:
    return layers(carry, stacked_state)
  group = jax.checkpoint(
      lambda carry, states: layers(checkpoint_name(carry, PROCESSOR_CARRY), states),
      policy=policy)
  per_group = min(every, num_layers)
  if not scan:
    for start in range(0, num_layers, per_group):
      carry = group(carry, rows(start, start + per_group))
    return carry
  num_groups, remainder = divmod(num_layers, per_group)
  grouped = jax.tree.map(
      lambda x: x[:num_groups * per_group].reshape((num_groups, per_group) + x.shape[1:]),
      stacked_state)
  carry, _ = jax.lax.scan(lambda c, s: (group(c, s), None), carry, grouped)
  if remainder:
    carry = group(carry, rows(num_groups * per_group, num_layers))
  return carry
