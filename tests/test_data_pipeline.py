"""The Grain pipeline: order, process shares, exact resume, global batches."""

import grain
import jax
import numpy as np
import pytest
from problems import data_spec

from wnscale import specs as specs_lib
from wnscale.data import pipeline
from wnscale.data.making import synthetic

LEVELS = (500, 1000)
VARIABLES = ("temperature", "2m_temperature")


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("pipeline") / "era.zarr")
  return synthetic.write_synthetic_store(path, start="2020-01-01",
                                         end="2020-01-03", levels=LEVELS,
                                         variables=VARIABLES)


def _data(store_path, worker_count=0):
  """The data spec whose train split is the whole store."""
  return data_spec(path=store_path, variables=VARIABLES, pressure_levels=LEVELS,
                   train_start="", train_end="", worker_count=worker_count)


def _pipeline(store_path, worker_count=0, source=None):
  return pipeline.make_pipeline(_data(store_path, worker_count), "train", batch_size=2, seed=3,
                                process_index=0, process_count=1, source=source)


def _take(iterator, count):
  return [next(iterator) for _ in range(count)]


def _assert_same_batches(got, expected):
  assert len(got) == len(expected)
  for a, b in zip(got, expected):
    assert set(a) == {"inputs", "targets", "forcings", "statics"}
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])


def test_batch_shapes(store_path):
  batch = next(_pipeline(store_path).iterator)
  assert batch["inputs"].shape == (2, 2, 3, 32 * 64)
  assert batch["targets"].shape == (2, 1, 3, 32 * 64)
  assert batch["forcings"].shape == (2, 3, 5, 32 * 64)
  assert batch["statics"].shape == (2, 2, 32 * 64)


@pytest.mark.parametrize("worker_count", [0, 2])
def test_restored_iterator_yields_the_same_batches(store_path, worker_count):
  original = _pipeline(store_path, worker_count).iterator
  _take(original, 2)
  state = original.get_state()
  expected = _take(original, 5)  # crosses the 9-example epoch boundary
  restored = _pipeline(store_path, worker_count).iterator
  restored.set_state(state)
  _assert_same_batches(_take(restored, 5), expected)
  if worker_count:
    original.close()
    restored.close()


def test_orbax_checkpoint_of_the_iterator(store_path, tmp_path):
  ocp = pytest.importorskip("orbax.checkpoint")
  original = _pipeline(store_path).iterator
  _take(original, 3)
  manager = ocp.CheckpointManager(tmp_path / "ckpt")
  manager.save(3, args=ocp.args.Composite(
      data=grain.checkpoint.CheckpointSave(original)))
  manager.wait_until_finished()
  expected = _take(original, 2)
  restored = _pipeline(store_path).iterator
  manager.restore(3, args=ocp.args.Composite(
      data=grain.checkpoint.CheckpointRestore(restored)))
  _assert_same_batches(_take(restored, 2), expected)
  manager.close()


def test_process_shares_are_disjoint_and_cover_the_epoch():
  examples = list(range(10))
  shares = []
  for process_index in range(2):
    dataset = pipeline.make_dataset(examples, seed=7, num_epochs=1,
                                    process_index=process_index,
                                    process_count=2)
    shares.append(list(dataset))
  assert len(shares[0]) == len(shares[1]) == 5
  assert not set(shares[0]) & set(shares[1])
  assert sorted(shares[0] + shares[1]) == examples


def test_every_epoch_is_a_new_permutation():
  dataset = pipeline.make_dataset(list(range(8)), seed=1)
  order = [dataset[i] for i in range(16)]
  assert sorted(order[:8]) == sorted(order[8:]) == list(range(8))
  assert order[:8] != order[8:] and order[:8] != list(range(8))


def test_batch_size_errors(store_path):
  with pytest.raises(ValueError, match="not divisible by the 2 processes"):
    pipeline.make_pipeline(_data(store_path), "train", batch_size=3, seed=3, process_index=0,
                           process_count=2)
  share = pipeline.make_dataset(list(range(7)), num_epochs=1,
                                process_index=1, process_count=2)
  assert len(share) == 3
  with pytest.raises(ValueError, match="share has 3 example.*batch of 4"):
    pipeline.make_iterator(list(range(7)), share, batch_size=4)


def test_layout_ordered_batches_become_global_arrays(store_path):
  """A pipeline in a mesh's grid-slot order gives the arrays of the reordered batch."""
  from wnscale import config as config_lib
  from wnscale.model import setup
  from wnscale.sharding import mesh as mesh_lib
  from wnscale.sharding.layout import ShardedLayout

  config = config_lib.load("configs/tiny.py")
  config.mesh.update(data=1, graph=4)
  model = specs_lib.from_config(config).model
  natural = _pipeline(store_path)
  points = natural.source.store.points
  layout = ShardedLayout(mesh_lib.make_mesh(specs_lib.from_config(config).mesh, jax.devices()[:4]),
                         setup.graphs_for_grid(model, points),
                         setup.node_positions(model, points), "halo")
  assert (layout.grid_slots != np.arange(len(layout.grid_slots))).any()  # a real reordering
  slotted = _pipeline(store_path, source=natural.source.in_layout(layout.grid_slots))
  expected, batch = layout.host_batch(next(natural.iterator)), next(slotted.iterator)
  arrays = layout.global_batch(batch, 2)
  for key, value in expected.items():
    np.testing.assert_array_equal(batch[key], value, err_msg=key)
    np.testing.assert_array_equal(np.asarray(arrays[key]), value, err_msg=key)
    assert arrays[key].sharding.spec[-1] == "graph"


def test_from_config_train_and_eval(store_path):
  data = data_spec(path=store_path, variables=VARIABLES, pressure_levels=LEVELS,
                   train_start="2020-01-01", train_end="2020-01-02", eval_start="2020-01-03",
                   eval_end="2020-01-03")
  train = pipeline.make_pipeline(data, "train", batch_size=2, seed=0, process_index=0,
                                 process_count=1)
  assert len(train.source) == 8 - 3 + 1
  assert next(train.iterator)["inputs"].shape == (2, 2, 3, 32 * 64)
  evaluation = pipeline.make_pipeline(data, "eval", batch_size=2, seed=0, process_index=0,
                                      process_count=1)
  assert len(evaluation.source) == 2
  batches = list(evaluation.iterator)
  assert len(batches) == 1  # one pass, in order
  np.testing.assert_array_equal(batches[0]["inputs"][0],
                                evaluation.source[0]["inputs"])
  with pytest.raises(ValueError, match="split must be 'train' or 'eval'"):
    pipeline.make_pipeline(data, "test", batch_size=2, seed=0)


def test_a_rollout_phase_change_continues_the_stream_with_longer_targets(store_path):
  """A source indexed for 3 targets yields the same examples with 1 or 3 (the curriculum's
  phases): a 3-target pipeline set to the 1-target one's state continues at its example,
  whose first target is the 1-target example's, and the inputs are the same."""
  data = _data(store_path)
  source = pipeline.make_source(data, "train", indexed_target_steps=3)
  assert len(source) == len(pipeline.make_source(data, "train")) - 2
  short, long = source.with_target_steps(1), source.with_target_steps(3)
  assert len(short) == len(long) == len(source)
  uninterrupted = _take(_pipeline(store_path, source=short).iterator, 4)
  first_phase = _pipeline(store_path, source=short).iterator
  _take(first_phase, 2)
  second_phase = _pipeline(store_path, source=long)
  second_phase.restore(first_phase.get_state())
  for got, want in zip(_take(second_phase.iterator, 2), uninterrupted[2:]):
    assert got["targets"].shape[1] == 3 and got["forcings"].shape[1] == 2 + 3
    np.testing.assert_array_equal(got["inputs"], want["inputs"])
    np.testing.assert_array_equal(got["targets"][:, :1], want["targets"])
  with pytest.raises(ValueError, match="indexed_target_steps"):
    source.with_target_steps(4)
