"""Rematerialization lowers compiled temporary memory (direction only; figures in bench/)."""

import pytest

from problems import compile_loss_and_grad, synthetic_problem
from wnscale import config as config_lib
from wnscale.graphs import grid
from wnscale.graphs.points import PointSet
from wnscale.planner.xla_stats import compiled_stats


def config_with(**model):
  config = config_lib.default_config()
  config.model.update(dict(latent_size=32, mesh_levels=3, message_passing_steps=4), **model)
  return config_lib.validate(config)


@pytest.fixture(scope="module")
def problem():
  points = PointSet.regular(*grid.regular_grid(2.8125, include_poles=True))
  return synthetic_problem(config_with(), points, batch_size=1, abstract=True)


def temp_bytes(problem, **model):
  return compiled_stats(compile_loss_and_grad(config_with(**model), *problem))["temp_bytes"]


def test_remat_reduces_temporary_memory(problem):
  none = temp_bytes(problem)
  processor = temp_bytes(problem, remat_mesh_gnn=True)
  everything = temp_bytes(problem, remat_grid_to_mesh_gnn=True, remat_mesh_gnn=True,
                          remat_mesh_to_grid_gnn=True, edge_chunks=4)
  assert processor < none
  assert everything < 0.6 * none, (none, processor, everything)
