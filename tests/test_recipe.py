"""The training recipe in the jitted train step: the parameters' moving average (EMA) and
frozen parts, on a small model on one device. (The rollout curriculum across a kill -9:
test_training.py; the frozen-parameter optimizer and the phases' learning rates:
test_optimizer.py; the EMA in checkpoints: test_checkpoint.py.) And `remat_policy="auto"`
sizes the longest rollout phase."""

import os

import jax
import numpy as np
import pytest

from problems import device_batch, loss_and_grad_fn, synthetic_problem
from tiny_runs import REPO
from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.graphs import grid
from wnscale.graphs.points import PointSet
from wnscale.model import setup
from wnscale.sharding import mesh as mesh_lib
from wnscale.sharding.layout import ShardedLayout
from wnscale.train import optimizer as optimizer_lib
from wnscale.train import step as step_lib
from wnscale.train import trainer
from wnscale.train.state import initial_state

POINTS = PointSet.regular(*grid.regular_grid(30.0, include_poles=True))
DECAY = 0.75  # far from 1, so that every step shows in the average
STEPS = 3


def test_ema_follows_the_parameters_and_frozen_parts_stay_bitwise():
  """Three train steps with `ema_decay` and `freeze=("processor",)`: the EMA equals its
  recomputation on the host from each step's parameters; the processor's parameters are
  bitwise the initial ones while the rest moved; the optimizer's moments cover only the
  trained parameters, and `grad_norm` is the trained parameters' gradient norm."""
  config = config_lib.default_config()
  config.model.update(latent_size=8, mesh_levels=0, message_passing_steps=1)
  config.train.update(ema_decay=DECAY, freeze=("processor",), warmup_steps=0)
  config.mesh.update(data=1, graph=1)
  config = config_lib.validate(config)
  specs = specs_lib.from_config(config)
  constants, batch, params = synthetic_problem(config, POINTS, batch_size=2)
  layout = ShardedLayout(mesh_lib.make_mesh(specs.mesh, jax.devices()[:1]), constants.graphs,
                         setup.node_positions(specs.model, POINTS), "all_gather")
  device_constants, halo_indices = layout.constants(constants)
  graphdef, _ = setup.init_model_shapes(specs)
  optimizer = optimizer_lib.make_optimizer(specs.train)
  train_step = step_lib.make_train_step(
      layout, graphdef, optimizer, optimizer_lib.learning_rate_schedule(specs.train),
      device_constants, halo_indices, ema_decay=DECAY, freeze=("processor",))
  replicated = layout.sharding(jax.sharding.PartitionSpec())
  initial = jax.tree.map(np.array, params)
  state = jax.device_put(initial_state(params, optimizer, ema=True), replicated)
  ema = initial
  for step in range(STEPS):
    state, metrics = train_step(state, device_constants, halo_indices,
                                device_batch(layout, batch))
    if step == 0:  # the norm the clipping sees: of the trained parameters' gradients only
      loss, grads = jax.jit(loss_and_grad_fn(config, constants, batch))(initial)
      trained = [g for name, g in _by_name(grads).items() if not name.startswith("processor")]
      np.testing.assert_allclose(metrics["loss"], loss, rtol=1e-5)
      np.testing.assert_allclose(metrics["grad_norm"], np.sqrt(sum(
          np.sum(np.square(g, dtype=np.float64)) for g in trained)), rtol=1e-4)
    new = jax.tree.map(np.array, state.params)  # the step donates the state: copies
    ema = jax.tree.map(lambda e, p: np.float32(DECAY) * e + np.float32(1 - DECAY) * p, ema,
                       new)
  jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8),
               jax.tree.map(np.array, state.ema), ema)

  before, after = _by_name(initial), _by_name(state.params)
  for name in before:
    if name.startswith("processor"):
      np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    else:
      assert not np.array_equal(after[name], before[name]), name
  counts = optimizer_lib.frozen_counts(initial, ("processor",))
  moments = [x.size for x in jax.tree.leaves(state.opt_state) if x.ndim == 1]
  assert moments == [counts[optimizer_lib.TRAINED]] * 2 and counts["processor"] > 0


def _by_name(params) -> dict:
  """`{dotted parameter name: host array}`."""
  return {optimizer_lib.path_name(path): np.array(leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}


def test_auto_remat_sizes_the_longest_rollout_phase(tmp_path, monkeypatch):
  """`remat_policy="auto"` chooses for the longest phase's rollout (3 steps here), not for
  `data.target_steps` (1): what it is given to compile has 3 target steps."""
  config = config_lib.load(os.path.join(REPO, "configs", "tiny.py"))
  config.model.remat_policy = "auto"
  config.train.update(steps=12, rollout_schedule=((0, 1), (4, 3)), eval_every=0)
  config.data.update(train_start="2020-01-01", train_end="2020-01-20",
                     eval_start="2020-01-21", eval_end="2020-01-31")
  config.mesh.update(data=2, graph=4)  # the test session's 8 devices
  planned = []

  def chosen(planned_config):
    planned.append(planned_config.data.target_steps)
    raise InterruptedError("planned")  # enough: nothing is compiled

  monkeypatch.setattr(trainer, "_auto_remat", chosen)
  with pytest.raises(InterruptedError, match="planned"):
    trainer.train_and_evaluate(config, str(tmp_path))
  assert planned == [3] and config.data.target_steps == 1
