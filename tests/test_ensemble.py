"""FGN ensembles: noise-conditioned norms, member noise, and the fair CRPS loss.

The spine again: the CRPS loss and its gradients with remat, with the graph
split over devices, and with the members laid out along the data axis equal
the plain single-device computation.
"""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from problems import (assert_same, device_batch, loss_and_grad_fn, sharded_layout,
                      sharded_loss_and_grads, spread_members, synthetic_problem)
from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.graphs import grid
from wnscale.graphs.points import PointSet
from wnscale.model import ensemble, forecast, setup
from wnscale.sharding import mesh as mesh_lib
from wnscale.sharding.layout import ShardedLayout
from wnscale.train import optimizer as optimizer_lib
from wnscale.train import trainer
from wnscale.train import step as step_lib
from wnscale.train.state import initial_state
from tiny_runs import REPO, RUN_FLAGS, losses, process_env

# 19 x 36 = 684 grid nodes: does not divide 4 graph shards.
POINTS = PointSet.regular(*grid.regular_grid(10.0, include_poles=True))
NOISE = 4


def small_config(processor="interaction_network", loss="crps", **model):
  config = config_lib.default_config()
  config.model.update(dict(latent_size=16, mesh_levels=1, message_passing_steps=2,
                           transformer_layers=2, transformer_ffw_size=32, noise_channels=NOISE,
                           processor=processor), **model)
  config.train.loss = loss
  return config_lib.validate(config)


def _leaves(params) -> dict:
  return {jax.tree_util.keystr(path): leaf
          for path, leaf in jax.tree_util.tree_leaves_with_path(params)}


@pytest.mark.parametrize("processor", ["interaction_network", "transformer"])
def test_fresh_fgn_is_the_deterministic_model(processor):
  """With noise_channels > 0 at init, every member equals the deterministic model."""
  fgn_config = small_config(processor, loss="mse")
  plain_config = small_config(processor, loss="mse", noise_channels=0)
  constants, batch, plain_params = synthetic_problem(plain_config, POINTS,
                                                     batch_size=2, seed=2)
  fgn_graphdef, fgn_params = setup.init_model(specs_lib.from_config(fgn_config))
  plain_graphdef, _ = setup.init_model_shapes(specs_lib.from_config(plain_config))
  # The FGN with the deterministic model's parameters wherever both have one.
  plain = _leaves(plain_params)
  fgn_leaves = _leaves(fgn_params)
  conditioning = [path for path in fgn_leaves if path not in plain]
  assert conditioning and all("conditioning" in p or "noise_embedding" in p
                              for p in conditioning)
  assert sum("conditioning" in p for p in conditioning) == 2 * sum(
      p.endswith("['scale'].value") for p in plain)  # each norm: kernel and bias
  merged = jax.tree_util.tree_map_with_path(
      lambda path, x: plain.get(jax.tree_util.keystr(path), x), fgn_params)
  def rollout(graphdef):  # jitted: op by op, each of the rollout's ops would compile
    return jax.jit(lambda params, batch: forecast.rollout(nnx.merge(graphdef, params),
                                                          constants, batch))

  expected = rollout(plain_graphdef)(plain_params, batch)
  noise = np.random.default_rng(0).standard_normal((2, 1, NOISE)).astype(np.float32)
  fgn_rollout = rollout(fgn_graphdef)
  members = fgn_rollout(merged, dict(batch, noise=noise))
  np.testing.assert_allclose(members, expected, rtol=1e-5, atol=1e-5)
  # ... but the conditioning is live: widened, it moves the forecast.
  widened = fgn_rollout(spread_members(merged), dict(batch, noise=noise))
  assert np.abs(np.asarray(widened) - np.asarray(expected)).max() > 1e-2
  with pytest.raises(ValueError, match="noise_channels=4 but noise was not given"):
    fgn_rollout(merged, batch)


def test_member_noise_depends_only_on_its_indices():
  key = ensemble.noise_key(7)
  big = ensemble.member_noise(key, 3, np.arange(3), np.arange(5), np.arange(4), NOISE)
  small = ensemble.member_noise(key, 3, np.array([2]), np.array([1, 4]), np.array([3]), NOISE)
  np.testing.assert_array_equal(small[0, :, 0], big[2, [1, 4], 3])
  assert big.shape == (3, 5, 4, NOISE)
  assert np.unique(np.asarray(big).reshape(-1, NOISE), axis=0).shape[0] == 3 * 5 * 4
  other_step = ensemble.member_noise(key, 4, np.arange(3), np.arange(5), np.arange(4), NOISE)
  assert not np.allclose(other_step, big)
  np.testing.assert_allclose(np.std(np.asarray(big)), 1.0, atol=0.2)


def test_fair_crps_by_hand():
  """The fair CRPS of a few numbers, and the same total when members sit on other devices."""
  rng = np.random.default_rng(0)
  members, examples, channels, nodes = 3, 2, 2, 5
  predictions = rng.standard_normal((members, examples, 1, channels, nodes)).astype(np.float32)
  targets = rng.standard_normal((examples, 1, channels, nodes)).astype(np.float32)
  constants = forecast.Constants(graphs=None, residual_scale=np.array([0.5, 2.0], np.float32),
                                 node_weights=rng.uniform(0.5, 1.5, nodes).astype(np.float32),
                                 channel_weights=np.array([1.0, 0.1], np.float32))
  x = predictions / constants.residual_scale[:, None]
  y = targets / constants.residual_scale[:, None]
  skill = np.mean(np.abs(x - y), axis=0)
  spread = sum(np.abs(x[i] - x[j]) for i in range(members) for j in range(members) if i != j)
  crps = skill - spread / (2 * members * (members - 1))
  expected = np.einsum("etcg,c,g->etg", crps, constants.channel_weights,
                       constants.node_weights)
  together = ensemble.fair_crps_sums(predictions, targets, constants, members)
  np.testing.assert_allclose(together, expected, rtol=1e-5, atol=1e-6)
  # One member per device: each counts its own terms against the other two.
  apart = sum(ensemble.fair_crps_sums(predictions[i:i + 1], targets, constants, members,
                                      [predictions[j] for j in range(members) if j != i])
              for i in range(members))
  np.testing.assert_allclose(apart, expected, rtol=1e-5, atol=1e-6)
  # Two equal members: the CRPS is their absolute error.
  same = ensemble.fair_crps_sums(np.stack([predictions[0]] * 2), targets, constants, 2)
  np.testing.assert_allclose(same, np.einsum("etcg,c,g->etg", np.abs(x[0] - y),
                                             constants.channel_weights,
                                             constants.node_weights), rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def problem():
  config = small_config()
  constants, batch, params = synthetic_problem(config, POINTS, batch_size=2,
                                               seed=3)
  return (constants, batch, spread_members(params),
          setup.node_positions(specs_lib.from_config(config).model, POINTS))


@pytest.fixture(scope="module")
def reference(problem):
  constants, batch, params, _ = problem
  return jax.jit(loss_and_grad_fn(small_config(), constants, batch))(params)


REMAT = dict(remat_grid_to_mesh_gnn=True, remat_mesh_gnn=True, remat_mesh_to_grid_gnn=True,
             edge_chunks=3, grid_blocks=5, mesh_edge_chunks=3)


def test_crps_with_remat_matches_plain(problem, reference):
  constants, batch, params, _ = problem
  assert_same(jax.jit(loss_and_grad_fn(small_config(**REMAT), constants, batch))(params),
              reference)


# (data, graph, exchange, members on data, remat: the model's and the rollout's)
SHARDED = [(2, 2, "all_gather", False, False), (2, 1, "all_gather", True, False),
           (4, 2, "halo", True, True)]


@pytest.mark.parametrize("data, graph, exchange, on_data, remat", SHARDED, ids=[
    f"{d}x{g}-{m}{'-members_on_data' if o else ''}{'-remat' if r else ''}"
    for d, g, m, o, r in SHARDED])
def test_sharded_crps_matches_single_device(problem, reference, data, graph, exchange, on_data,
                                            remat):
  constants, batch, params, positions = problem
  config = small_config(**(REMAT if remat else {}))
  layout = sharded_layout(config, constants, positions, data, graph, exchange)
  members = config.train.ensemble_members
  if on_data:  # 2 members x 2 examples = 4 rows: data=2, one member per shard; data=4: one row
    batch = ensemble.members_on_rows(batch)
  assert_same(sharded_loss_and_grads(config, layout, constants, batch, params, loss="crps",
                                     members_on_data=members if on_data else 0,
                                     remat_steps=remat), reference)


def test_train_step_draws_noise_from_the_step_alone(problem):
  """The train step is a function of (state, batch): continuing from a copy of the state
  after step 1 (what a checkpoint restores) repeats step 2; the noise changes with the step;
  members on 2 data shards give the loss of members vmapped on one device."""
  constants, batch, params, positions = problem
  del batch["noise"]  # the step draws it
  config = small_config()
  graphdef, _ = setup.init_model_shapes(specs_lib.from_config(config))
  optimizer = optimizer_lib.make_optimizer(specs_lib.from_config(config).train)

  def steps(on_data, state_steps):
    config.train.members_on_data = on_data
    config.mesh.data, config.mesh.graph = (2, 1) if on_data else (1, 1)
    specs = specs_lib.from_config(config)
    mesh = mesh_lib.make_mesh(specs.mesh, jax.devices()[:specs.mesh.data])
    layout = ShardedLayout(mesh, constants.graphs, positions, "all_gather")
    device_constants, halo_indices = layout.constants(constants)
    step = step_lib.make_train_step(
        layout, graphdef, optimizer, optimizer_lib.learning_rate_schedule(specs.train),
        device_constants, halo_indices, loss="crps", members=ensemble.training_members(specs))
    rows = ensemble.tile_members(batch, 2) if on_data else batch
    losses = []
    for state_step in state_steps:
      state = initial_state(params, optimizer)._replace(step=np.int32(state_step))
      # Host copies: the step donates the state, and params must outlive it.
      state = jax.device_put(jax.tree.map(np.array, state),
                             layout.sharding(jax.sharding.PartitionSpec()))
      losses.append(float(step(state, device_constants, halo_indices,
                               device_batch(layout, rows))[1]["loss"]))
    return losses

  vmapped = steps(False, [0, 1, 1])
  assert vmapped[1] == vmapped[2]  # the same step's noise, whatever ran before
  assert vmapped[0] != vmapped[1]  # another step, other noise (same parameters and batch)
  np.testing.assert_allclose(steps(True, [0, 1]), vmapped[:2], rtol=1e-5)


# The tiny config as an FGN trained on the fair CRPS, its 2 members along `data`.
MEMBERS_ON_DATA = ["--config.model.noise_channels=4", "--config.train.loss=crps",
                   "--config.train.ensemble_members=2", "--config.train.members_on_data=True",
                   "--config.mesh.data=2", "--config.mesh.graph=1", "--config.train.steps=3",
                   "--config.train.eval_every=0", "--config.train.checkpoint_every=3"]


@pytest.mark.slow
def test_members_on_data_across_two_processes_train_as_one(tmp_path):
  """Members on `data` over 2 processes of one device: each process holds one member of
  every example (and reads every example); the losses are those of one process on 8
  devices (2 data x 4 graph shards)."""
  workdir = str(tmp_path / "two_processes")
  flags = [flag for flag in RUN_FLAGS if "train.steps" not in flag] + MEMBERS_ON_DATA
  launched = subprocess.run(
      [sys.executable, "-m", "launch.local_cluster", "--num_processes=2",
       "--num_cpu_devices=2", "--timeout=300", "--", *flags, f"--workdir={workdir}"],
      cwd=REPO, env=process_env(), capture_output=True, text=True, timeout=400)
  assert launched.returncode == 0, launched.stderr[-3000:]
  # The same run in this process, on its 8 test devices (the flags above, as updates).
  config = config_lib.load(os.path.join(REPO, "configs", "tiny.py"))
  config.model.noise_channels = 4
  config.train.update(loss="crps", ensemble_members=2, members_on_data=True, steps=3,
                      warmup_steps=2, log_every=1, eval_every=0, checkpoint_every=3)
  config.data.update(train_start="2020-01-01", train_end="2020-01-20",
                     eval_start="2020-01-21", eval_end="2020-01-31")
  config.mesh.update(data=2, graph=4)
  one = str(tmp_path / "one_process")
  trainer.train_and_evaluate(config_lib.validate(config), one)
  got, want = losses(workdir), losses(one)
  assert sorted(got) == sorted(want) == [1, 2, 3]
  np.testing.assert_allclose([got[s] for s in sorted(got)], [want[s] for s in sorted(want)],
                             rtol=2e-4)
