"""Checkpointer restore paths: a good checkpoint restores (with its data iterator state),
a damaged one is skipped and set aside, one written for another train state is a clear
error and is left in place."""

import os

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from wnscale.errors import UserError
from wnscale.graphs.points import PointSet
from wnscale.train import checkpoint


def _state(width=4):
  return {"params": {"kernel": jnp.arange(3 * width, dtype=jnp.float32).reshape(3, width),
                     "bias": jnp.ones((width,))},
          "step": jnp.array(7, jnp.int32)}


def _iterator():
  iterator = iter(grain.MapDataset.range(10).to_iter_dataset())
  next(iterator)
  return iterator


def _save(directory, steps, state):
  saver = checkpoint.Checkpointer(directory, max_to_keep=5)
  for step in steps:
    saver.save(step, state, _iterator(), {"step": step})
  saver.close()


def _abstract(state):
  return checkpoint.abstract_like(state, jax.sharding.SingleDeviceSharding(jax.devices()[0]))


def _restore(directory, state, read_data_state=lambda metadata: True):
  saver = checkpoint.Checkpointer(directory, max_to_keep=5)
  try:
    restored = saver.restore_latest(_abstract(state), read_data_state)
    return restored.state, restored.metadata, restored.data_state
  finally:
    saver.close()


def test_restores_the_newest_checkpoint(tmp_path):
  _save(str(tmp_path), [1, 2], _state())
  state, metadata, data_state = _restore(str(tmp_path), _state())
  assert metadata == {"step": 2}
  jax.tree.map(np.testing.assert_array_equal, state, _state())
  # The iterator's state as saved; applying it is the caller's business.
  assert data_state == _iterator().get_state()
  iterator = iter(grain.MapDataset.range(10).to_iter_dataset())
  iterator.set_state(data_state)
  assert next(iterator) == 1
  assert _restore(str(tmp_path), _state(), lambda metadata: False)[2] is None


def test_unreadable_data_state_falls_back_and_is_set_aside(tmp_path):
  _save(str(tmp_path), [1, 2], _state())
  os.remove(os.path.join(tmp_path, "2", "data", "process_0-of-1.json"))
  _, metadata, data_state = _restore(str(tmp_path), _state())
  assert metadata == {"step": 1} and data_state is not None
  assert any(name.startswith("2.damaged-") for name in os.listdir(tmp_path))


def test_unreadable_newest_checkpoint_falls_back_and_is_set_aside(tmp_path, caplog):
  _save(str(tmp_path), [1, 2], _state())
  os.remove(os.path.join(tmp_path, "2", "state", "_METADATA"))
  _, metadata, _ = _restore(str(tmp_path), _state())
  assert metadata == {"step": 1}
  assert f"Skipping checkpoint {tmp_path / '2'}" in caplog.text
  assert any(name.startswith("2.damaged-") for name in os.listdir(tmp_path))


@pytest.mark.parametrize("other, named", [
    (lambda: _state(width=5), "params.kernel: checkpoint float32[3, 4], this run float32[3, 5]"),
    (lambda: {**_state(), "extra": jnp.zeros(())}, "extra: checkpoint absent, this run float32[]"),
    (lambda: {"params": _state()["params"]}, "step: checkpoint int32[], this run absent"),
], ids=["shape", "extra array", "missing array"])
def test_a_different_train_state_is_an_error_not_damage(tmp_path, other, named):
  _save(str(tmp_path), [1], _state())
  with pytest.raises(checkpoint.CheckpointMismatchError) as error:
    _restore(str(tmp_path), other())
  assert named in str(error.value)
  assert str(tmp_path / "1") in str(error.value)
  assert "a new `workdir`" in str(error.value) and "--" not in str(error.value)
  assert sorted(os.listdir(tmp_path)) == ["1"]  # nothing moved aside



# The mean losses these runs gave at 422f098 (tests/fixtures/runs_422f098/README.md).
LOSSES_AT_422F098 = {"deterministic": 70.7808837890625, "fgn": 70.72689819335938}


@pytest.mark.parametrize("run", sorted(LOSSES_AT_422F098))
def test_a_run_written_before_the_specs_restores_and_computes_the_same_loss(run):
  """A run directory written at 422f098 restores into today's model, every array where it
  was, and gives the loss it gave then. The model's graphdef holds its frozen `ModelSpec`
  (hashable, as `jax.jit` wants of a static argument)."""
  from problems import mean_loss, random_batch, synthetic_problem  # noqa: PLC0415
  from wnscale import config as config_lib  # noqa: PLC0415
  from wnscale import specs as specs_lib  # noqa: PLC0415
  from wnscale.graphs import grid  # noqa: PLC0415
  from wnscale.model import setup  # noqa: PLC0415

  directory = os.path.join(os.path.dirname(__file__), "fixtures", "runs_422f098", run)
  with open(os.path.join(directory, "config.json")) as file:
    config = config_lib.from_json(file.read())
  points = PointSet.regular(*grid.regular_grid(5.625, include_poles=False))
  constants, _, _ = synthetic_problem(config, points, batch_size=1, abstract=True)
  batch = random_batch(config, constants.graphs.num_nodes("grid"), 1)
  specs = specs_lib.from_config(config)
  graphdef, abstract = setup.init_model_shapes(specs)
  assert nnx.merge(graphdef, abstract).spec == specs.model
  hash(graphdef)
  params, step = checkpoint.restore_params(os.path.join(directory, "checkpoints"), abstract)
  assert step == 2
  loss = jax.jit(lambda p: mean_loss(graphdef, p, constants, batch))(params)
  assert float(loss) == pytest.approx(LOSSES_AT_422F098[run], rel=1e-6)


RUN_AT_E289331 = os.path.join(os.path.dirname(__file__), "fixtures", "runs_e289331")
# Where the station modality's modules were at e289331, the model's own attributes.
NAMES_AT_E289331 = {"modalities.stations.embedder": "stations_embedder",
                    "modalities.stations.to_mesh_edges": "stations_to_mesh_edges",
                    "modalities.stations.update_mlp": "stations_mlp",
                    "modalities.stations.from_mesh_edges": "mesh_to_stations_edges",
                    "modalities.stations.output_mlp": "stations_output_mlp"}


def _sums_by_old_name(kind: str, params) -> dict:
  """`{f"{kind}:{name at e289331}": [sum, sum of squares]}` of `params`' leaves."""
  from wnscale.train.optimizer import path_name  # noqa: PLC0415

  sums = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = path_name(path)
    for new, old in NAMES_AT_E289331.items():
      if name.startswith(new + "."):
        name = old + name[len(new):]
    leaf = np.asarray(leaf, np.float64)
    sums[f"{kind}:{name}"] = [float(leaf.sum()), float((leaf ** 2).sum())]
  return sums


def test_a_run_with_modality_modules_outside_their_container_restores():
  """A stations run written at e289331, when a modality's modules were the model's attributes
  (`stations_embedder`, ...), restores into today's model, whose container
  `GraphCast.modalities` holds them (`param_layouts.modalities_in_a_container`): every
  parameter, its EMA and both of Adam's moments where they were
  (tests/fixtures/runs_e289331/sums.json, written then), resumed and read alone."""
  import json  # noqa: PLC0415

  from jax.flatten_util import ravel_pytree  # noqa: PLC0415

  from wnscale import config as config_lib  # noqa: PLC0415
  from wnscale import specs as specs_lib  # noqa: PLC0415
  from wnscale.model import setup  # noqa: PLC0415
  from wnscale.train import optimizer as optimizer_lib  # noqa: PLC0415
  from wnscale.train import param_layouts  # noqa: PLC0415
  from wnscale.train.state import initial_state  # noqa: PLC0415

  run = os.path.join(RUN_AT_E289331, "stations")
  with open(os.path.join(RUN_AT_E289331, "sums.json")) as file:
    expected = json.load(file)
  with open(os.path.join(run, "config.json")) as file:
    specs = specs_lib.from_config(config_lib.from_json(file.read()))
  _, abstract_params = setup.init_model_shapes(specs)
  abstract_state = _abstract(jax.eval_shape(
      lambda params: initial_state(params, optimizer_lib.make_optimizer(specs.train), ema=True),
      abstract_params))

  saver = checkpoint.Checkpointer(os.path.join(run, "checkpoints"), max_to_keep=5)
  try:
    restored = saver.restore_latest(abstract_state, lambda metadata: False,
                                    param_layouts.train_state_layouts(abstract_state))
  finally:
    saver.close()
  state = restored.state
  _, unravel = ravel_pytree(state.params)
  (adam,) = [part for part in state.opt_state[1] if hasattr(part, "mu")]
  sums = {**_sums_by_old_name("params", state.params), **_sums_by_old_name("ema", state.ema),
          **_sums_by_old_name("mu", unravel(adam.mu)), **_sums_by_old_name("nu", unravel(adam.nu))}
  assert sums.keys() == expected.keys()
  for name, value in expected.items():
    np.testing.assert_allclose(sums[name], value, rtol=1e-12, err_msg=name)

  for which in ("raw", "ema"):
    params, step = checkpoint.restore_params(os.path.join(run, "checkpoints"),
                                             abstract_state.params, which=which)
    assert step == 2
    jax.tree.map(np.testing.assert_array_equal, params,
                 state.params if which == "raw" else state.ema)


def test_run_directory_keeps_its_config_history_and_names_what_is_missing(tmp_path):
  """`RunDirectory`: the config and a dated copy per start, the finished steps only, and a
  directory that is no run said as the problem, as the argument that named it if any."""
  from wnscale import config as config_lib
  from wnscale.errors import ArgumentError, UserError
  from wnscale.train.run_directory import RunDirectory

  run = RunDirectory(str(tmp_path / "run"))
  with pytest.raises(UserError, match=f"^{run.path}: not a run directory: it holds no "
                                      "config.json"):
    run.read_config()
  with pytest.raises(ArgumentError, match=f"^workdir={run.path}: not a run directory: it holds "
                                          "no checkpoints/"):
    RunDirectory(run.path, argument="workdir").restore_params({})
  config = config_lib.default_config()
  config.train.steps = 7
  run.write_config(config_lib.to_json(config))
  config.train.steps = 8
  run.write_config(config_lib.to_json(config), history=False)  # an import's: no start to record
  assert run.read_config().train.steps == 8
  (history,) = os.listdir(os.path.join(run.path, "configs"))
  assert history.startswith("config-") and history.endswith("Z.json")
  assert config_lib.from_json(open(os.path.join(run.path, "configs", history)).read()
                              ).train.steps == 7
  for name in ("5", "12", "3", "13.orbax-checkpoint-tmp", "4.damaged-1700000000"):
    os.makedirs(os.path.join(run.checkpoints, name))
  assert run.saved_steps() == [3, 5, 12]
  assert run.checkpoint(5) == os.path.join(run.path, "checkpoints", "5")


def test_the_moving_average_is_checkpointed_and_read_by_default(tmp_path):
  """A train state with an EMA restores whole; `restore_params` reads the EMA unless asked
  for the raw parameters, and asking a run without one for it is an error naming why."""
  with_ema = dict(_state(), ema={"kernel": -_state()["params"]["kernel"],
                                 "bias": jnp.full((4,), 0.5)})
  _save(str(tmp_path / "ema"), [3], with_ema)
  state, _, _ = _restore(str(tmp_path / "ema"), with_ema)
  jax.tree.map(np.testing.assert_array_equal, state, with_ema)
  abstract = _abstract(_state()["params"])
  for which, want in [(None, "ema"), ("ema", "ema"), ("raw", "params")]:
    params, step = checkpoint.restore_params(str(tmp_path / "ema"), abstract, which=which)
    assert step == 3
    jax.tree.map(np.testing.assert_array_equal, params,
                 with_ema[want] if want == "ema" else with_ema["params"])
  _save(str(tmp_path / "plain"), [3], dict(_state(), ema=None))
  params, _ = checkpoint.restore_params(str(tmp_path / "plain"), abstract)
  jax.tree.map(np.testing.assert_array_equal, params, _state()["params"])
  with pytest.raises(UserError, match=r"^params=ema: the checkpoint .* holds no moving average .*train.ema_decay=0"):
    checkpoint.restore_params(str(tmp_path / "plain"), abstract, which="ema")
