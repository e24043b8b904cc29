"""Fine-tuning an imported GraphCast: a new run starts from its parameters
(`train.init_from`) with other sharding and remat settings, and trains (the shared
`graphcast_import` and `fine_tuned_import`: `graphcast_runs`).
"""

import copy
import os

import jax
import numpy as np
import pytest

from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.data import pipeline
from wnscale.errors import UserError
from wnscale.model import setup
from wnscale.train import checkpoint, trainer
from problems import mean_loss
from tiny_runs import read_metrics


@pytest.fixture(scope="module")
def imported(graphcast_import):
  """`(imported run, a fine-tuning config)`, shared."""
  return graphcast_import.imported, graphcast_import.config


def newest_params(run, config):
  """`(params, step)` of the newest checkpoint of `run`, on one device."""
  _, shapes = setup.init_model_shapes(specs_lib.from_config(config))
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return checkpoint.restore_params(os.path.join(run, "checkpoints"),
                                   checkpoint.abstract_like(shapes, device))


@pytest.mark.slow
def test_init_from_an_imported_run_with_other_mesh_and_remat(imported, fine_tuned_import):
  run, config = imported
  workdir = fine_tuned_import
  losses = {m["step"]: m["loss"] for m in read_metrics(workdir) if "loss" in m}

  # Step 1's loss is that of the imported parameters on the one example, computed here on
  # one device without remat: the run started from them.
  params, _ = newest_params(run, config)
  specs = specs_lib.from_config(config)
  source = pipeline.make_source(specs.data, "train")
  points = source.store.points
  constants = setup.make_constants(specs.data, setup.graphs_for_grid(
      specs.model, points), points, source.normalization.residual_scale)
  graphdef, _ = setup.init_model_shapes(specs)
  expected = mean_loss(graphdef, params, constants, source.read_batch([0]))
  np.testing.assert_allclose(losses[1], float(expected), rtol=1e-5)
  assert losses[2] < losses[1]  # it trains (same example twice)

  # The run's own checkpoint holds a full train state, its parameters moved on.
  trained, step = newest_params(workdir, config)
  assert step == 2
  moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()),
                       trained, params)
  assert 0 < max(jax.tree.leaves(moved)) < 0.1


def test_an_imported_run_is_not_resumed(imported):
  """Training in the imported directory itself: an error saying to use init_from (the
  workdir's data settings differ: said before the store is read)."""
  run, config = imported
  config = copy.deepcopy(config)
  config.train.init_from = ""
  config.mesh.update(data=1, graph=8)
  # The library names the setting (`train.init_from=...`); the launcher shows its flag.
  with pytest.raises(UserError, match="other data .*`train.init_from="):
    trainer.train_and_evaluate(config_lib.validate(config), run)
  assert not os.path.exists(os.path.join(run, "metrics.jsonl"))


def test_init_from_another_model_is_refused(imported, tmp_path):
  run, config = imported
  config = copy.deepcopy(config)
  config.model.latent_size = 16
  config.mesh.update(data=1, graph=8)
  differs = r"parameters of another model .*float32\[32\], this run float32\[16\]"
  with pytest.raises(checkpoint.CheckpointMismatchError, match=differs):
    trainer.train_and_evaluate(config_lib.validate(config), str(tmp_path / "new"))
  assert not os.path.exists(tmp_path / "new" / "config.json")
