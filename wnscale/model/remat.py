"""Rematerialization: checkpoint policies by name, and where values are tagged.

Policy names are data, defined once here (each entry with what it costs in
recomputation); configs refer to them by name. `save_only_these_names:<n1>,<n2>`
saves the values tagged with those `checkpoint_name`s (see `CHECKPOINT_NAMES`) and
recomputes everything else. The model's remat settings are a
`wnscale.specs.RematSpec`.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from wnscale.errors import UserError

# Names given with `jax.ad_checkpoint.checkpoint_name` at the natural save
# points of a message-passing step.
# The edge MLP's output per edge: the message, and the increment of the edge
# latents (which the processor recomputes from it with one addition).
EDGE_LATENTS = "edge_latents"  # [num_edges, latent]
MESSAGES = "messages"  # aggregated messages per receiver, [num_receivers, latent]
NODE_LATENTS = "node_latents"  # updated node latents, [num_nodes, latent]
# ... and of a mesh transformer block: the outputs of its two residual branches.
ATTENTION_OUTPUT = "attention_output"  # attention's output projection, [num_mesh_nodes, width]
FFW_OUTPUT = "ffw_output"  # the feed-forward branch's output, [num_mesh_nodes, width]
# What a checkpointed group of processor layers starts from: mesh latents
# [num_mesh_nodes, latent] (and the GNN's mesh-edge latents [num_mesh_edges, latent]).
# The backward pass needs one per group; GraphCast's 16 layers at 0.25 deg: ~6 GiB
# in bfloat16.
PROCESSOR_CARRY = "processor_carry"
CHECKPOINT_NAMES = (EDGE_LATENTS, MESSAGES, NODE_LATENTS, ATTENTION_OUTPUT, FFW_OUTPUT,
                    PROCESSOR_CARRY)


class RematPolicy(NamedTuple):
  """A registry entry: a checkpoint policy `model.remat_policy` names.

  Attributes:
    checkpoint_policy: the `jax.checkpoint` policy.
    recompute_fraction: the fraction of a checkpointed region's forward FLOPs that the
      backward pass recomputes under it (matmuls dominate; saved dots are not redone),
      for the planner (`wnscale.planner.flops`).
  """

  checkpoint_policy: Callable
  recompute_fraction: float


_policies = jax.checkpoint_policies
POLICIES: dict[str, RematPolicy] = {
    "nothing_saveable": RematPolicy(_policies.nothing_saveable, 1.0),
    "dots_saveable": RematPolicy(_policies.dots_saveable, 0.05),
    "dots_with_no_batch_dims_saveable": RematPolicy(
        _policies.dots_with_no_batch_dims_saveable, 0.05),
    "everything_saveable": RematPolicy(_policies.everything_saveable, 0.0),
    # Keep matmul outputs, but in host memory (pinned_host) where the backend has it.
    "offload_dots": RematPolicy(
        _policies.offload_dot_with_no_batch_dims("device", "pinned_host"), 0.05),
    # Recompute everything, but keep the processor groups' carries in host memory
    # (pinned_host) where the backend has it: the device holds one group's work.
    # On CPU, host and device memory are one: it compiles and changes nothing.
    "offload_carries": RematPolicy(_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=(), names_which_can_be_offloaded=(PROCESSOR_CARRY,),
        offload_src="device", offload_dst="pinned_host"), 1.0),
}
_SAVE_ONLY_PREFIX = "save_only_these_names:"
POLICY_NAMES = tuple(POLICIES) + (_SAVE_ONLY_PREFIX + "<name>,...",)


def resolve_policy(name: str) -> RematPolicy:
  """The policy called `name`; a clear error if there is none. A
  `save_only_these_names:...` policy is taken to recompute everything it does not save."""
  if name in POLICIES:
    return POLICIES[name]
  if name.startswith(_SAVE_ONLY_PREFIX):
    names = [n for n in name[len(_SAVE_ONLY_PREFIX):].split(",") if n]
    unknown = sorted(set(names) - set(CHECKPOINT_NAMES))
    if not names or unknown:
      raise UserError(
          f"Remat policy {name!r} names unknown checkpoint names {unknown or '(none)'}; "
          f"known names: {list(CHECKPOINT_NAMES)}.")
    return RematPolicy(_policies.save_only_these_names(*names), 1.0)
  raise UserError(f"Unknown remat policy {name!r}; known policies: {list(POLICY_NAMES)}.")


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
                policy: Callable | None):
  """Applies layers whose parameters are stacked on a leading `[num_layers]` axis, in order.

  With `checkpoint`, the layers run in groups of `every`, each group under one
  `jax.checkpoint` with `policy`: a scan over the full groups, then the
  remaining layers as one more group. A group's input is tagged
  `PROCESSOR_CARRY`: a policy may keep it (in host memory, say). The
  processors (mesh GNN and mesh transformer) both run this way.

  Args:
    apply_layer: `(carry, layer_state) -> carry`, one layer.
    carry: what the layers update (a pytree of arrays).
    stacked_state: the layers' `nnx.State`, every leaf `[num_layers, ...]`.
  """
  def layers(carry, states):
    return jax.lax.scan(lambda c, s: (apply_layer(c, s), None), carry, states)[0]

  if not checkpoint:
    return layers(carry, stacked_state)
  num_layers = jax.tree.leaves(stacked_state)[0].shape[0]
  group = jax.checkpoint(
      lambda carry, states: layers(checkpoint_name(carry, PROCESSOR_CARRY), states),
      policy=policy)
  per_group = min(every, num_layers)
  num_groups, remainder = divmod(num_layers, per_group)
  grouped = jax.tree.map(
      lambda x: x[:num_groups * per_group].reshape((num_groups, per_group) + x.shape[1:]),
      stacked_state)
  carry, _ = jax.lax.scan(lambda c, s: (group(c, s), None), carry, grouped)
  if remainder:
    carry = group(carry, jax.tree.map(lambda x: x[num_groups * per_group:], stacked_state))
  return carry
