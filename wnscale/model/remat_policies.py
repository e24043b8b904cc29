"""Rematerialization policies by name: the registry `model.remat_policy` picks from, and the
names of the values a policy may save.

Policy names are data, defined once here (each entry with what it costs in
recomputation); configs refer to them by name. `save_only_these_names:<n1>,<n2>`
saves the values tagged with those `checkpoint_name`s (see `CHECKPOINT_NAMES`) and
recomputes everything else. JAX without Flax: validating a config reads it. The
model's remat settings are a `wnscale.specs.RematSpec`; where the model checkpoints
is `wnscale.model.remat`.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax

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
    offloads_carries: it moves the processor groups' carries (`PROCESSOR_CARRY`) to host
      memory and back, bytes the planner counts.
  """

  checkpoint_policy: Callable
  recompute_fraction: float
  offloads_carries: bool = False


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
        offload_src="device", offload_dst="pinned_host"), 1.0, offloads_carries=True),
}
def also_saving(policy: Callable | None, *names: str) -> Callable:
  """`policy` (None: save nothing), saving the values tagged with `names` as well. (Not
  `save_from_both_policies`, which takes only policies that answer True or False: an
  offloading one answers where to keep a value.)"""
  named = _policies.save_only_these_names(*names)
  policy = policy or _policies.nothing_saveable
  return lambda primitive, *args, **params: (named(primitive, *args, **params)
                                             or policy(primitive, *args, **params))


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
