"""Gradient accumulation (`train.accumulation_steps`): a batch run as micro-batches, one
after another inside the step, gives the whole batch's loss and gradient.

The spine again (problems.py): the plain single-device model on the whole batch is the
reference. Each device splits its own examples, and the gradients are summed over the
mesh once, after the micro-batches. (A training run with micro-batches resumed exactly:
test_training.py's rollout curriculum; the planner: test_planner.py.)
"""

import functools

import jax
import numpy as np
import pytest
from jax.extend import core as jax_core

from problems import (assert_same, device_batch, loss_and_grad_fn, sharded_layout,
                      sharded_loss_and_grads, spread_members, station_problem,
                      synthetic_problem)
from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.errors import UserError
from wnscale.graphs import grid
from wnscale.graphs.points import PointSet
from wnscale.model import accumulation, ensemble, setup
from wnscale.sharding import mesh as mesh_lib
from wnscale.sharding import sharded_model

# 19 x 36 = 684 grid nodes, 162 mesh nodes, 150 stations: none divides 4 graph shards.
POINTS = PointSet.regular(*grid.regular_grid(10.0, include_poles=True))
STATIONS = ("stations", "synthetic", ("2m_temperature", "mean_sea_level_pressure"),
            ("2m_temperature", "mean_sea_level_pressure"), 0.5)
BATCH = 4


def small_config(modalities=(), loss="mse", target_steps=1, **model):
  config = config_lib.default_config()
  config.model.update(dict(latent_size=16, mesh_levels=2, message_passing_steps=2), **model)
  config.data.update(modalities=modalities, target_steps=target_steps)
  config.train.update(batch_size=BATCH, loss=loss)
  return config_lib.validate(config)


@functools.cache
def station_mse():
  """MSE, stations with a fifth of their values missing (unevenly over the examples)."""
  config = small_config((STATIONS,))
  constants, batch, params, _, positions = station_problem(config, POINTS, BATCH,
                                                           num_stations=150, seed=7)
  return config, constants, batch, params, positions


@functools.cache
def station_fgn():
  """An FGN trained with the CRPS over 2 members, stations beside the grid, 2 lead times."""
  config = small_config((STATIONS,), loss="crps", target_steps=2, noise_channels=4)
  constants, batch, params, _, positions = station_problem(config, POINTS, BATCH,
                                                           num_stations=150, seed=8)
  return config, constants, batch, spread_members(params), positions


def test_micro_batches_on_one_device_give_the_whole_batch_with_its_missing_values():
  """Micro-batches of one example (and of two) give the whole batch's loss and gradient,
  stations' missing values included: each micro-batch's share is normalized by the whole
  batch's counts, not its own. Here the first example has few station targets, far off:
  the mean of the micro-batches' own means would be another loss."""
  config, constants, batch, params, positions = station_mse()
  targets = batch["stations/targets"].copy()
  targets[0, ..., np.arange(targets.shape[-1]) % 10 != 0] = np.nan
  targets[0] += 3.0
  batch = dict(batch, **{"stations/targets": targets})
  want = jax.jit(loss_and_grad_fn(config, constants, batch))(params)
  layout = sharded_layout(config, constants, positions, 1, 1, "all_gather")
  for micro_batches in (4, 2):
    assert_same(sharded_loss_and_grads(config, layout, constants, batch, params,
                                       micro_batches=micro_batches), want)
  own_means = [jax.jit(loss_and_grad_fn(config, constants, example))(params)[0]
               for example in ({k: v[i:i + 1] for k, v in batch.items()} for i in range(BATCH))]
  assert abs(np.mean(own_means) - want[0]) > 1e-2 * abs(want[0])


# (data, graph, exchange, the model's remat, the rollout's remat)
SHARDED = [(2, 4, "halo", {}, True),
           (2, 2, "all_gather", dict(remat_mesh_gnn=True, edge_chunks=3, grid_blocks=3), False)]


@pytest.mark.parametrize("data, graph, exchange, remat, remat_rollout", SHARDED, ids=[
    f"{d}x{g}-{m}{'-remat' if r else ''}{'-remat_rollout' if rr else ''}"
    for d, g, m, r, rr in SHARDED])
def test_micro_batches_on_data_and_graph_shards_give_the_whole_batch_of_an_fgn(
    data, graph, exchange, remat, remat_rollout):
  """An FGN's fair CRPS with stations, 2 lead times, on data x graph shards: each data
  shard's 2 examples as 2 micro-batches equal the plain model on one device (the noise is
  the whole batch's, drawn before the split)."""
  config, constants, batch, params, positions = station_fgn()
  want = jax.jit(loss_and_grad_fn(config, constants, batch))(params)
  config = small_config((STATIONS,), loss="crps", target_steps=2, noise_channels=4, **remat)
  layout = sharded_layout(config, constants, positions, data, graph, exchange)
  assert_same(sharded_loss_and_grads(config, layout, constants, batch, params, loss="crps",
                                     remat_steps=remat_rollout, micro_batches=2), want)


def test_micro_batches_with_the_members_on_the_data_axis_give_the_whole_batch():
  """The members of an FGN laid out along `data` (2 members x 4 examples = 8 rows, a
  member's 4 examples over 2 shards): each shard splits its 2 rows, and the shards holding
  an example's other member hold it in the same micro-batch."""
  config = small_config(loss="crps", noise_channels=4)
  constants, batch, params = synthetic_problem(config, POINTS, BATCH, seed=9)
  params = spread_members(params)
  want = jax.jit(loss_and_grad_fn(config, constants, batch))(params)
  positions = setup.node_positions(specs_lib.from_config(config).model, POINTS)
  layout = sharded_layout(config, constants, positions, 4, 1, "all_gather")
  assert_same(sharded_loss_and_grads(config, layout, constants, ensemble.members_on_rows(batch),
                                     params, loss="crps", members_on_data=2,
                                     micro_batches=2), want)


def _collectives(jaxpr, inside_scan=False, found=None):
  """`[(primitive name, its mesh axes, whether inside a scan)]` of every collective in
  `jaxpr` and the jaxprs it holds."""
  found = [] if found is None else found
  for eqn in jaxpr.eqns:
    axes = eqn.params.get("axes", eqn.params.get("axis_name"))
    if eqn.primitive.name in ("psum", "psum_invariant", "ppermute", "all_gather",
                              "all_gather_invariant", "reduce_scatter", "all_to_all"):
      found.append((eqn.primitive.name, tuple(np.atleast_1d(axes)), inside_scan))
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else [value]:
        sub = sub.jaxpr if isinstance(sub, jax_core.ClosedJaxpr) else sub
        if isinstance(sub, jax_core.Jaxpr):
          _collectives(sub, inside_scan or eqn.primitive.name == "scan", found)
  return found


def test_the_micro_batches_exchange_only_the_graphs_rows_and_the_gradients_are_summed_once():
  """On 2 x 4 devices (halo), the step's program: inside the loop over micro-batches the
  devices exchange only the graph's halo rows (over `graph`; nothing over `data`, no sum),
  and after it the sums of the gradients and the loss over the whole mesh."""
  config = small_config()
  constants, batch, params = synthetic_problem(config, POINTS, BATCH, seed=10)
  positions = setup.node_positions(specs_lib.from_config(config).model, POINTS)
  layout = sharded_layout(config, constants, positions, 2, 4, "halo")
  device_constants, halo_indices = layout.constants(constants)
  graphdef, _ = setup.init_model_shapes(specs_lib.from_config(config))
  step = sharded_model.loss_and_grad_fn(layout, graphdef, micro_batches=2)
  jaxpr = jax.make_jaxpr(step)(params, device_constants, halo_indices,
                               device_batch(layout, batch)).jaxpr
  found = _collectives(jaxpr)
  in_loop = {(name, axes) for name, axes, inside in found if inside}
  assert in_loop == {("ppermute", (mesh_lib.GRAPH,))}, in_loop
  sums = {axes for name, axes, inside in found if name.startswith("psum") and not inside}
  assert sums == {(mesh_lib.DATA, mesh_lib.GRAPH)}, sums


def test_split_takes_consecutive_rows():
  batch = {"inputs": np.arange(12).reshape(6, 2), "noise": np.arange(6)}
  split = accumulation.split(batch, 3)
  assert split["inputs"].shape == (3, 2, 2)
  np.testing.assert_array_equal(split["noise"], [[0, 1], [2, 3], [4, 5]])
  np.testing.assert_array_equal(split["inputs"][1], [[4, 5], [6, 7]])


def test_a_data_shard_whose_examples_do_not_split_is_one_clear_line():
  """8 examples over 4 data shards are 2 a shard: not 4 micro-batches. (A count that does
  not split the batch itself: test_configs.py, test_cli.py.)"""
  mesh = specs_lib.MeshSpec(data=4, graph=1, exchange="all_gather")
  with pytest.raises(UserError, match=r"train.batch_size=8 gives each of the 4 data shards 2 "
                     r"example\(s\), which do not split into train.accumulation_steps=4 "
                     r"micro-batches .* a multiple of 16") as error:
    mesh_lib.check_batch_size(mesh_lib.make_mesh(mesh, jax.devices()[:4]), 8, 4)
  assert "\n" not in str(error.value)
  mesh_lib.check_batch_size(mesh_lib.make_mesh(mesh, jax.devices()[:4]), 8, 2)
