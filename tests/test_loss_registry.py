"""A loss is one entry of `wnscale.model.loss_registry.LOSSES`: its settings (keys of the
`train` section, their defaults, checks and meanings) and its sums, which the trainer's loss
asks it for. This file registers one more (half the MSE) and changes no library file.
"""

import dataclasses
from typing import ClassVar

import numpy as np
import pytest
from flax import nnx

from problems import station_problem
from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.errors import UserError
from wnscale.graphs import grid
from wnscale.graphs.points import PointSet
from wnscale.model import ensemble, loss_registry, setup
from wnscale.model import loss as loss_lib
from wnscale.specs import LossSpec

POINTS = PointSet.regular(*grid.regular_grid(10.0, include_poles=True))
STATIONS = ("stations", "synthetic", ("2m_temperature",), ("2m_temperature",), 0.5)


@dataclasses.dataclass(frozen=True)
class HalfSpec(LossSpec):
  """Half the MSE: no settings of its own."""

  name: ClassVar[str] = "half_mse"


HALF = loss_registry.Loss(HalfSpec, check=lambda specs: None, implementation=lambda: (
    loss_lib.LossImplementation(
        grid_sum=lambda *args: loss_lib.MSE.grid_sum(*args) / 2,
        point_sum=lambda *args: loss_lib.MSE.point_sum(*args) / 2)))


def small_config(loss: str, **train):
  config = config_lib.default_config()
  config.model.update(latent_size=16, mesh_levels=1, message_passing_steps=1)
  config.data.modalities = (STATIONS,)
  config.train.update(loss=loss, **train)
  return config


def test_an_unregistered_loss_is_refused_and_a_registered_one_is_its_entrys(monkeypatch):
  with pytest.raises(UserError, match=r"train.loss='half_mse', expected one of "
                     r"\('mse', 'crps', 'diffusion'\)"):
    config_lib.validate(small_config("half_mse"))
  monkeypatch.setitem(loss_registry.LOSSES, HalfSpec.name, HALF)
  specs = specs_lib.from_config(config_lib.validate(small_config("half_mse")))
  assert specs.train.loss == HalfSpec() and specs.train.loss.members == 1
  assert specs.train.section_values()["loss"] == "half_mse"


def loss_terms_of(model, constants, batch, name: str):
  """`loss.loss_terms` of the loss registered as `name`, as the sharded step asks for them."""
  return loss_lib.loss_terms(model, constants, batch,
                             loss=loss_registry.LOSSES[name].implementation())


def test_the_loss_terms_are_the_entrys_sums(monkeypatch):
  monkeypatch.setitem(loss_registry.LOSSES, HalfSpec.name, HALF)
  config = config_lib.validate(small_config("mse"))
  constants, batch, params, _, _ = station_problem(config, POINTS, 2, num_stations=40, seed=3)
  model = nnx.merge(setup.init_model_shapes(specs_lib.from_config(config))[0], params)
  grid_mse, points_mse = loss_terms_of(model, constants, batch, "mse")
  grid_half, points_half = loss_terms_of(model, constants, batch, "half_mse")
  assert float(grid_mse) > 0 and float(points_mse["stations"]) > 0
  np.testing.assert_allclose(float(grid_half), float(grid_mse) / 2, rtol=1e-6)
  np.testing.assert_allclose(float(points_half["stations"]),
                             float(points_mse["stations"]) / 2, rtol=1e-6)


def test_the_crps_owns_its_settings():
  """`train.ensemble_members` and `train.members_on_data` are `CRPSSpec`'s: their defaults,
  bounds and meanings come from it, and the members a run draws from the spec."""
  config = config_lib.default_config()
  crps = loss_registry.CRPSSpec
  assert {key: config.train[key] for key in crps.defaults()} == crps.defaults() == {
      "ensemble_members": 2, "members_on_data": False}
  assert specs_lib.from_config(config).train.loss == loss_registry.MSESpec()
  config.model.noise_channels = 4
  config.train.update(loss="crps", ensemble_members=3)
  specs = specs_lib.from_config(config_lib.validate(config))
  assert specs.train.loss == crps(ensemble_members=3, members_on_data=False)
  assert ensemble.training_members(specs).members == 3
  config.train.ensemble_members = 1
  with pytest.raises(UserError, match="train.ensemble_members=1 must be >= 2"):
    config_lib.validate(config)
  config.train.update(ensemble_members=2, loss="crps")
  config.model.noise_channels = 0
  with pytest.raises(UserError, match="train.loss='crps' needs model.noise_channels > 0"):
    config_lib.validate(config)
