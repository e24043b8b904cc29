"""A remat policy is one entry of `wnscale.model.remat_policies.POLICIES`: its checkpoint
policy and what it costs, which the config check, the model and the planner ask it for.
This file registers one more (keep the matmuls and the node latents) and changes no
library file.
"""

import jax
import numpy as np
import pytest

from problems import synthetic_problem
from test_remat import loss_and_grads, small_config
from wnscale import specs as specs_lib
from wnscale.errors import UserError
from wnscale.graphs import grid
from wnscale.graphs.points import PointSet
from wnscale.model import remat_policies
from wnscale.planner import flops

NAME = "dots_and_node_latents_saveable"
DOTS_AND_NODE_LATENTS = remat_policies.RematPolicy(
    jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_saveable,
        jax.checkpoint_policies.save_only_these_names(remat_policies.NODE_LATENTS)),
    recompute_fraction=0.04)


def test_a_registered_policy_is_checked_run_and_costed(monkeypatch):
  every_stage = dict(remat_grid_to_mesh_gnn=True, remat_mesh_gnn=True,
                     remat_mesh_to_grid_gnn=True)
  with pytest.raises(UserError, match=f"Unknown remat policy '{NAME}'"):
    small_config(remat_policy=NAME, **every_stage)
  monkeypatch.setitem(remat_policies.POLICIES, NAME, DOTS_AND_NODE_LATENTS)
  config = small_config(remat_policy=NAME, **every_stage)

  # The model checkpoints under it, and remat changes no number.
  points = PointSet.regular(*grid.regular_grid(10.0, include_poles=False))
  problem = synthetic_problem(small_config(), points, batch_size=1)
  loss, grads = loss_and_grads(config, problem)
  plain_loss, plain_grads = loss_and_grads(small_config(), problem)
  np.testing.assert_allclose(loss, plain_loss, rtol=1e-5)
  for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(plain_grads)):
    np.testing.assert_allclose(g, r, rtol=2e-4, atol=1e-6 * float(np.abs(r).max() + 1e-12))

  # The planner counts its recomputation: 4% of the checkpointed stages' forward FLOPs.
  def recompute(policy):
    specs = specs_lib.from_config(small_config(remat_policy=policy, **every_stage))
    return flops.step_flops(specs, problem[0].graphs, 1)["recompute"]

  nothing, everything = recompute("nothing_saveable"), recompute("everything_saveable")
  assert recompute(NAME) - everything == pytest.approx(0.04 * (nothing - everything))
