"""Rematerialization: where the model checkpoints, under a policy of
`wnscale.model.remat_policies` (the values it may save are tagged with the names
declared there).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
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
                policy: Callable | None, scan: bool = True, saved: int = 0):
  """Applies layers whose parameters are stacked on a leading `[num_layers]` axis, in order.

  With `checkpoint`, the layers run in groups of `every`, each group under one
  `jax.checkpoint` with `policy` (the last group may be smaller). A group's input is
  tagged `PROCESSOR_CARRY`: a policy may keep it (in host memory, say). The last `saved`
  layers run outside the checkpoints: the backward pass keeps what they need rather than
  recomputing it (it reaches them first, so that memory is held the shortest). The
  processors (mesh GNN and mesh transformer) both run this way.

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

  def layers(carry, states):
    if scan:
      return jax.lax.scan(lambda c, s: (apply_layer(c, s), None), carry, states)[0]
    for layer_state in _unstacked(states, jnp.unstack):
      carry = apply_layer(carry, layer_state)
    return carry

  if not checkpoint or saved >= num_layers:
    return layers(carry, stacked_state)
  if saved:
    checkpointed, kept = _unstacked(stacked_state,
                                    lambda x: jnp.split(x, [num_layers - saved]))
    carry = scan_layers(apply_layer, carry, checkpointed, checkpoint=True, every=every,
                        policy=policy, scan=scan)
    return layers(carry, kept)
  group = jax.checkpoint(
      lambda carry, states: layers(checkpoint_name(carry, PROCESSOR_CARRY), states),
      policy=policy)
  per_group = min(every, num_layers)
  if not scan:
    starts = list(range(per_group, num_layers, per_group))
    for group_state in _unstacked(stacked_state, lambda x: jnp.split(x, starts)):
      carry = group(carry, group_state)
    return carry
  num_groups, remainder = divmod(num_layers, per_group)
  grouped = jax.tree.map(
      lambda x: x[:num_groups * per_group].reshape((num_groups, per_group) + x.shape[1:]),
      stacked_state)
  carry, _ = jax.lax.scan(lambda c, s: (group(c, s), None), carry, grouped)
  if remainder:
    carry = group(carry, jax.tree.map(lambda x: x[num_groups * per_group:], stacked_state))
  return carry


def _unstacked(stacked_state, split: Callable) -> list:
  """`stacked_state` cut along its leading axis by `split` (`x -> [pieces]`), as one state
  per piece. One split per leaf, not a slice per piece: its gradient is one stack or
  concatenate of the pieces' gradients, where slices would each pad theirs to the whole
  `[num_layers, ...]` and add them up."""
  leaves, treedef = jax.tree.flatten(stacked_state)
  pieces = [split(leaf) for leaf in leaves]
  return [treedef.unflatten([leaf_pieces[index] for leaf_pieces in pieces])
          for index in range(len(pieces[0]))]
