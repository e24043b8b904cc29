"""Every remat option gives the loss and gradients of the plain model.

The spine of the project: rematerialization may only change memory and time.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from problems import loss_and_grad_fn, synthetic_problem
from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.graphs import grid
from wnscale.graphs.points import PointSet
from wnscale.model import forecast, remat_policies, setup


def small_config(**model_overrides):
  config = config_lib.default_config()
  config.model.latent_size = 16
  config.model.mesh_levels = 2
  config.model.message_passing_steps = 4
  config.model.update(model_overrides)
  return config_lib.validate(config)


@pytest.fixture(scope="module")
def problem():
  points = PointSet.regular(*grid.regular_grid(5.625, include_poles=False))
  return synthetic_problem(small_config(), points, batch_size=2, seed=1)


def loss_and_grads(config, problem):
  constants, batch, params = problem
  return jax.jit(loss_and_grad_fn(config, constants, batch))(params)


@pytest.fixture(scope="module")
def reference(problem):
  return loss_and_grads(small_config(), problem)


ALL_STAGES = dict(remat_grid_to_mesh_gnn=True, remat_mesh_gnn=True, remat_mesh_to_grid_gnn=True)
# Chunk counts that divide neither edge set of the problem (checked below), so the
# last block is padded (one such count covers it; 4 below divides evenly).
ODD_CHUNKS = (7,)
MESH_EDGE_CHUNKS = (7,)  # likewise for the mesh edges (padded to whole receiver blocks)
NAMES = "save_only_these_names:node_latents,messages"
# Every option, each against the plain model. A case's time is mostly its compile, so
# options that act on different parts of the step share a case: each named policy rides
# on one way of checkpointing, and each way of blocking on another case.
VARIANTS = {
    # One stage at a time, each under its own policy.
    "encoder_dots": dict(remat_grid_to_mesh_gnn=True, remat_policy="dots_saveable"),
    # One checkpoint per layer, nothing saved; the mesh edges' receiver side by matrix
    # products on their receiver blocks (model.aggregation).
    "processor_matmul": dict(remat_mesh_gnn=True, aggregation="matmul"),
    "decoder_dots_no_batch_keeps_messages": dict(
        remat_mesh_to_grid_gnn=True, remat_policy="dots_with_no_batch_dims_saveable",
        decoder_keeps_messages=True),
    "all_three_names": dict(ALL_STAGES, remat_policy=NAMES),
    # 4 layers: groups of 2, of 3 plus a remainder of 1, and all 4 in one group.
    "every_2_offload_carries_matmul": dict(remat_mesh_gnn=True, mesh_remat_every=2,
                                           remat_policy="offload_carries",
                                           aggregation="matmul"),
    # The edge step as one kernel per receiver block (Pallas's interpreter here).
    "every_3_dots_fused": dict(remat_mesh_gnn=True, mesh_remat_every=3,
                               remat_policy="dots_saveable", aggregation="fused"),
    # A Python loop over the groups (3, then 1) instead of a scan.
    "every_3_offload_dots_grid_blocks_7_loop": dict(remat_mesh_gnn=True, mesh_remat_every=3,
                                                    remat_policy="offload_dots", grid_blocks=7,
                                                    scan_layers=False),
    "every_4_everything_edge_chunks_4": dict(remat_mesh_gnn=True, mesh_remat_every=4,
                                             remat_policy="everything_saveable",
                                             edge_chunks=4),
    # The layers in a Python loop, no checkpoint.
    "edge_chunks_7_mesh_edge_chunks_7_loop": dict(edge_chunks=ODD_CHUNKS[0],
                                                  mesh_edge_chunks=MESH_EDGE_CHUNKS[0],
                                                  scan_layers=False),
    "all_three_grid_blocks_keeps_messages": dict(ALL_STAGES, grid_blocks=4, edge_chunks=3,
                                                 decoder_keeps_messages=True),
    # The paper's scheme, with the mesh edges in blocks too, the last 2 layers outside the
    # checkpoints (the first 2 in one group).
    "paper_scheme_mesh_edge_chunks_2_saved": dict(ALL_STAGES, mesh_remat_every=3,
                                                  edge_chunks=3, mesh_edge_chunks=4,
                                                  mesh_layers_saved=2),
}


def test_every_option_is_covered():
  """Each policy and each blocking knob appears in some case."""
  used = {key: {str(v[key]) for v in VARIANTS.values() if key in v}
          for key in ("remat_policy", "mesh_remat_every", "edge_chunks", "grid_blocks",
                      "mesh_edge_chunks", "aggregation", "scan_layers",
                      "decoder_keeps_messages", "mesh_layers_saved")}
  assert used["remat_policy"] >= set(remat_policies.POLICIES) - {"nothing_saveable"} | {NAMES}
  assert used["mesh_remat_every"] == {"2", "3", "4"}
  assert {"7", "4"} <= used["edge_chunks"] and "7" in used["grid_blocks"]
  assert "7" in used["mesh_edge_chunks"] and used["aggregation"] == {"matmul", "fused"}
  assert used["scan_layers"] == {"False"} and used["decoder_keeps_messages"] == {"True"}
  assert used["mesh_layers_saved"] == {"2"}


def _compiled_flops(config, problem) -> float:
  constants, batch, params = problem
  cost = jax.jit(loss_and_grad_fn(config, constants, batch)).lower(params).compile(
  ).cost_analysis()
  return (cost[0] if isinstance(cost, list) else cost)["flops"]


@pytest.mark.parametrize("grid_blocks", [1, 4])
def test_decoder_keeps_messages_is_not_recomputed(grid_blocks, problem):
  """With `decoder_keeps_messages` the checkpointed decoder's edge step is not run again
  in the backward pass (each block's checkpoint keeps its messages under `grid_blocks`):
  the compiled step does fewer FLOPs."""
  flops = lambda keeps: _compiled_flops(small_config(
      **ALL_STAGES, grid_blocks=grid_blocks, decoder_keeps_messages=keeps), problem)
  assert flops(True) < flops(False)


def test_saved_processor_layers_are_not_recomputed(problem):
  """Each processor layer run outside the checkpoints (`mesh_layers_saved`) is about one
  layer's forward pass less in the compiled step: 2 of 4 saved, half the recomputation.
  (The layers in a Python loop: XLA counts a scan's body once.)"""
  config = lambda **remat: small_config(scan_layers=False, **remat)
  all_recomputed, two_saved, plain = (
      _compiled_flops(config(**remat), problem)
      for remat in (dict(remat_mesh_gnn=True), dict(remat_mesh_gnn=True, mesh_layers_saved=2),
                    {}))
  assert all_recomputed > two_saved > plain
  assert all_recomputed - two_saved == pytest.approx((all_recomputed - plain) / 2, rel=0.25)


def test_odd_chunk_counts_leave_a_padded_block(problem):
  graphs = problem[0].graphs
  for rows in (graphs.edges["grid_to_mesh"].senders, graphs.edges["mesh_to_grid"].senders,
               graphs.nodes["grid"].features):
    assert all(len(rows) % k for k in ODD_CHUNKS), len(rows)
  mesh_edges = graphs.num_edges("mesh")
  assert all(mesh_edges % k for k in MESH_EDGE_CHUNKS), mesh_edges


@pytest.mark.parametrize("name", VARIANTS)
def test_remat_matches_plain_model(name, problem, reference):
  loss, grads = loss_and_grads(small_config(**VARIANTS[name]), problem)
  reference_loss, reference_grads = reference
  np.testing.assert_allclose(loss, reference_loss, rtol=1e-5)
  flat, ref_flat = jax.tree.leaves(grads), jax.tree.leaves(reference_grads)
  assert len(flat) == len(ref_flat)
  for g, r in zip(flat, ref_flat):
    np.testing.assert_allclose(g, r, rtol=2e-4, atol=1e-6 * float(np.abs(r).max() + 1e-12))


def test_bfloat16_activations_track_float32(problem, reference):
  """bfloat16 activations (float32 parameters) give float32's loss and gradients to
  bfloat16's precision (8 bits of mantissa), and a different result than float32."""
  loss, grads = loss_and_grads(small_config(dtype="bfloat16"), problem)
  reference_loss, reference_grads = reference
  assert loss != reference_loss
  np.testing.assert_allclose(loss, reference_loss, rtol=2e-2)
  flat = np.concatenate([np.ravel(g) for g in jax.tree.leaves(grads)])
  ref_flat = np.concatenate([np.ravel(g) for g in jax.tree.leaves(reference_grads)])
  assert flat.dtype == np.float32
  relative_error = np.linalg.norm(flat - ref_flat) / np.linalg.norm(ref_flat)
  assert 0 < relative_error < 0.05, relative_error


@pytest.fixture(scope="module")
def rollout_problem():
  config = small_config()
  config.data.target_steps = 3
  points = PointSet.regular(*grid.regular_grid(5.625, include_poles=False))
  return config, synthetic_problem(config, points, batch_size=1, seed=5)


def test_rollout_feeds_predictions_back(rollout_problem):
  config, (constants, batch, params) = rollout_problem
  graphdef, _ = setup.init_model_shapes(specs_lib.from_config(config))
  model = nnx.merge(graphdef, params)
  predictions = jax.jit(lambda b: forecast.rollout(model, constants, b))(batch)
  # One compile for the three leads (run op by op, each step would compile its every op).
  one_step = jax.jit(lambda *args: forecast.one_step(model, constants, *args))
  history = batch["inputs"]
  for lead in range(3):
    expected = one_step(history, batch["forcings"][:, lead:lead + 3], batch["statics"])
    np.testing.assert_allclose(predictions[:, lead], expected, rtol=1e-5, atol=1e-5)
    history = np.concatenate([history[:, 1:], np.asarray(expected)[:, None]], axis=1)


def test_rollout_remat_matches(rollout_problem):
  config, (constants, batch, params) = rollout_problem
  results = []
  for remat in (False, True):
    config.train.remat_rollout = remat
    results.append(jax.jit(loss_and_grad_fn(config, constants, batch))(params))
  np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6)
  for a, b in zip(jax.tree.leaves(results[0][1]), jax.tree.leaves(results[1][1])):
    # atol relative to the array, as above: an element near 0 can differ by float32 rounding.
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7 * float(np.abs(b).max() + 1))


def test_also_saving_keeps_the_named_values_and_what_the_policy_keeps(capsys):
  """`remat_policies.also_saving` (the encoder keeps its mesh messages so, whatever the
  policy): under nothing saveable, the named value alone is saved; under dots saveable,
  the dots too; under an offloading policy, the named value."""
  def region(x, w):
    messages = checkpoint_name(jnp.sin(x @ w), remat_policies.MESSAGES)
    return jnp.sum(jnp.cos(messages @ w))

  def saved(policy):
    capsys.readouterr()
    jax.ad_checkpoint.print_saved_residuals(
        jax.checkpoint(region, policy=remat_policies.also_saving(
            policy, remat_policies.MESSAGES)), jnp.ones((4, 3)), jnp.ones((3, 3)))
    return [line for line in capsys.readouterr().out.splitlines()
            if "from the argument" not in line]

  nothing = saved(None)
  assert len(nothing) == 1 and "named 'messages'" in nothing[0], nothing
  dots = saved(jax.checkpoint_policies.dots_saveable)
  assert len(dots) == 3 and sum("named 'messages'" in line for line in dots) == 1, dots
  # A policy that answers where to keep a value (here: nothing to offload) composes too.
  offloading = saved(remat_policies.POLICIES["offload_carries"].checkpoint_policy)
  assert len(offloading) == 1 and "named 'messages'" in offloading[0], offloading
