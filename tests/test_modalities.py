"""Modalities: a station network in and out beside the grid, on one mesh.

The spine test extended: with stations (inputs and targets, some missing), the
loss and gradients equal the plain single-device model's under remat and under
graph sharding in both exchange modes, around either processor.
"""

import functools

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from problems import (assert_same, device_batch, loss_and_grad_fn, sharded_layout,
                      sharded_loss_and_grads, spread_members, station_problem)
from wnscale import assembly
from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.data.making import stations as stations_lib
from wnscale.errors import UserError
from wnscale.graphs import connectivity, grid, icosahedron
from wnscale.graphs.points import PointSet
from wnscale.model import ensemble, forecast, setup
from wnscale.sharding import mesh as mesh_lib
from wnscale.sharding import sharded_model
from wnscale.sharding.layout import ShardedLayout

# 19 x 36 = 684 grid nodes, 162 mesh nodes, 150 stations: none divides 4 or 8 shards.
POINTS = PointSet.regular(*grid.regular_grid(10.0, include_poles=True))
STATIONS = ("stations", "synthetic", ("2m_temperature", "mean_sea_level_pressure"),
            ("2m_temperature", "mean_sea_level_pressure"), 0.5)


def station_config(modalities=(STATIONS,), **model):
  config = config_lib.default_config()
  config.model.update(dict(latent_size=16, mesh_levels=2, message_passing_steps=3), **model)
  config.data.modalities = modalities
  return config_lib.validate(config)


@functools.cache
def problem():
  return station_problem(station_config(), POINTS, batch_size=2, num_stations=150, seed=3)


@functools.cache
def reference():
  constants, batch, params, _, _ = problem()
  return jax.jit(loss_and_grad_fn(station_config(), constants, batch))(params)


REMAT = dict(remat_grid_to_mesh_gnn=True, remat_mesh_gnn=True, remat_mesh_to_grid_gnn=True,
             mesh_remat_every=2, edge_chunks=3, grid_blocks=5, mesh_edge_chunks=3)
# (data, graph, exchange, remat): 1 x 1 is the single-device model with every remat option.
CASES = [(1, 1, None, REMAT), (2, 4, "halo", {}), (2, 4, "all_gather", REMAT)]


@pytest.mark.parametrize("data, graph, exchange, remat", CASES, ids=[
    f"{d}x{g}-{m or 'single'}{'-remat' if r else ''}" for d, g, m, r in CASES])
def test_stations_match_the_plain_model(data, graph, exchange, remat):
  constants, batch, params, _, positions = problem()
  config = station_config(**remat)
  if exchange is None:
    result = jax.jit(loss_and_grad_fn(config, constants, batch))(params)
  else:
    layout = sharded_layout(config, constants, positions, data, graph, exchange)
    per_shard = layout.partitioned.nodes["stations"].per_shard
    assert per_shard == -(-150 // graph)
    abstract = layout.abstract_batch(setup.batch_shapes(
        specs_lib.from_config(config), POINTS.size, 2, {"stations": 150}))
    assert abstract["stations/targets"].shape == (2, 1, 2, graph * per_shard)
    assert abstract["stations/inputs"].sharding.spec == P(mesh_lib.DATA, None, None,
                                                          mesh_lib.GRAPH)
    padded = layout.host_batch(batch)["stations/inputs"]  # padding points: missing
    assert np.isnan(padded[..., layout.partitioned.nodes["stations"].node_of_slot < 0]).all()
    result = sharded_loss_and_grads(config, layout, constants, batch, params)
  assert_same(result, reference())


# WeatherNext 2's processor: a graph transformer over the mesh's k-hop neighbours.
TRANSFORMER = dict(processor="transformer", transformer_layers=2, transformer_heads=2,
                   transformer_ffw_size=32, transformer_k_hop=2)


def test_a_transformer_processor_with_stations_matches_the_plain_model():
  """The stations beside the grid around a transformer processor: split over 4 graph
  shards (halo exchange, every remat option) equals one device."""
  config = station_config(**TRANSFORMER)
  constants, batch, params, _, positions = station_problem(config, POINTS, batch_size=2,
                                                           num_stations=150, seed=4)
  want = jax.jit(loss_and_grad_fn(config, constants, batch))(params)
  sharded = station_config(**TRANSFORMER, **REMAT)
  layout = sharded_layout(sharded, constants, positions, 1, 4, "halo")
  assert_same(sharded_loss_and_grads(sharded, layout, constants, batch, params), want)


def test_an_fgn_with_stations_matches_the_plain_model_and_scores_them_by_the_fair_crps():
  """An FGN trained with the CRPS, stations beside the grid: on 2 x 4 devices (halo) equal
  to one device; the stations' loss term is the fair CRPS of the members (numpy, from
  their predictions) over the present targets, point-weighted. (Remat and the exchanges
  with stations: the tests above; remat with the CRPS: test_ensemble.py.)"""
  config = station_config(noise_channels=4)
  config.train.update(loss="crps", ensemble_members=2)
  constants, batch, params, point_sets, positions = station_problem(
      config_lib.validate(config), POINTS, batch_size=2, num_stations=150, seed=5)
  params = spread_members(params)
  loss, grads = want = jax.jit(loss_and_grad_fn(config, constants, batch))(params)
  layout = sharded_layout(config, constants, positions, 2, 4, "halo")
  assert_same(sharded_loss_and_grads(config, layout, constants, batch, params, loss="crps"),
              want)

  graphdef, _ = setup.init_model_shapes(specs_lib.from_config(config))
  rows, members = ensemble.members_as_batch(batch)
  grid, points = jax.jit(lambda rows: forecast.rollout_with_points(
      nnx.merge(graphdef, params), constants, rows))(rows)
  x = np.asarray(points["stations"]).reshape((members, 2) + points["stations"].shape[1:])
  y = batch["stations/targets"]
  pairs = sum(np.abs(x[i] - x[j]) for i in range(members) for j in range(members) if i != j)
  crps = np.mean(np.abs(x - y), axis=0) - pairs / (2 * members * (members - 1))
  present = ~np.isnan(y)
  weights = np.broadcast_to(point_sets["stations"].area, y.shape)[present]
  station_loss = 0.5 * 2 * np.sum(weights * crps[present]) / np.sum(weights)
  grid_loss = np.sum(ensemble.fair_crps_sums(
      np.asarray(grid).reshape((members, 2) + grid.shape[1:]), batch["targets"], constants,
      members)) / (2 * batch["targets"].shape[1] * POINTS.size)
  np.testing.assert_allclose(loss, grid_loss + station_loss, rtol=1e-5)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))


def test_backpropagation_through_the_rollout_keeping_one_state_a_step_equals_the_plain_one():
  """`train.remat_rollout`: each step computes its own share of the loss, and the rollout's
  VJP keeps one state a step (wnscale/model/rollout_loss.py). Over 3 autoregressive steps
  of an FGN trained with the CRPS, stations beside the grid (their inputs missing from the
  third step on), on one device and on 2 x 4 (halo): the plain rollout's loss and
  gradients."""
  config = station_config(noise_channels=4)
  config.train.update(loss="crps", ensemble_members=2)
  config.data.target_steps = 3
  config = config_lib.validate(config)
  constants, batch, params, _, positions = station_problem(config, POINTS, batch_size=2,
                                                           num_stations=150, seed=6)
  params = spread_members(params)
  want = jax.jit(loss_and_grad_fn(config, constants, batch))(params)
  config.train.remat_rollout = True
  assert_same(jax.jit(loss_and_grad_fn(config, constants, batch))(params), want)
  layout = sharded_layout(config, constants, positions, 2, 4, "halo")
  assert_same(sharded_loss_and_grads(config, layout, constants, batch, params, loss="crps",
                                     remat_steps=True), want)


def test_missing_targets_leave_the_loss_and_missing_points_send_nothing():
  """The loss is the grid's mean plus 0.5 x 2 x the point-weighted MSE over present station
  targets (numpy, from the model's predictions); a station missing every input changes no
  output (its edges dropped give the same), a present one does."""
  constants, batch, params, point_sets, _ = problem()
  specs = specs_lib.from_config(station_config())
  graphdef, _ = setup.init_model_shapes(specs)
  predict = jax.jit(lambda constants: forecast.rollout_with_points(
      nnx.merge(graphdef, params), constants, batch))
  grid_predictions, points = predict(constants)
  targets = batch["stations/targets"]
  assert np.isnan(targets).mean() > 0.15 and np.isnan(targets[..., 1]).all()
  present = ~np.isnan(targets)
  weights = np.broadcast_to(point_sets["stations"].area, targets.shape)[present]
  squared = np.square(np.asarray(points["stations"])[present] - targets[present])
  station_loss = 0.5 * 2 * np.sum(weights * squared) / np.sum(weights)
  error = (np.asarray(grid_predictions) - batch["targets"]) / constants.residual_scale[:, None]
  grid_loss = np.mean(np.sum(constants.channel_weights[:, None] * np.square(error), axis=-2)
                      * constants.node_weights)
  loss, grads = reference()
  np.testing.assert_allclose(loss, grid_loss + station_loss, rtol=1e-5)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))

  edges = constants.graphs.edges["stations_to_mesh"]
  assert np.isnan(batch["stations/inputs"][..., 0]).all()

  def without_station(station):  # its encoder edges point past every mesh node: dropped
    receivers = np.where(edges.senders == station, constants.graphs.num_nodes("mesh"),
                         edges.receivers)
    graphs = constants.graphs
    return predict(constants._replace(graphs=graphs._replace(edges=dict(
        graphs.edges, stations_to_mesh=edges.replace(receivers=receivers)))))[0]

  np.testing.assert_array_equal(without_station(0), grid_predictions)
  present_station = int(np.flatnonzero(~np.isnan(batch["stations/inputs"][0, -1, 0]))[0])
  assert np.abs(np.asarray(without_station(present_station)) - grid_predictions).max() > 1e-6


def test_station_outputs_are_a_change_on_the_grid_forecast_at_the_stations():
  """With its output MLP zeroed, the station forecast is the grid forecast interpolated to
  the stations (`stations.interpolate`, numpy); with statistics the first guess is in the
  stations' units and the residual scaled by the grid's diff std in them."""
  constants, batch, params, point_sets, _ = problem()
  specs = specs_lib.from_config(station_config())
  graphdef, _ = setup.init_model_shapes(specs)
  zeroed = jax.tree.map_with_path(
      lambda path, x: (x * 0 if "['modalities']['stations']['output_mlp']"
                       in jax.tree_util.keystr(path) else x),
      params)
  predict = jax.jit(lambda params: forecast.rollout_with_points(
      nnx.merge(graphdef, params), constants, batch))
  grid_predictions, points = predict(zeroed)
  channels = [specs.data.output_channels.index(name) for name in STATIONS[3]]
  expected = stations_lib.interpolate(np.asarray(grid_predictions)[:, :, channels], POINTS,
                                      point_sets["stations"])
  np.testing.assert_allclose(points["stations"], expected, atol=1e-5)
  assert np.abs(np.asarray(predict(params)[1]["stations"]) - expected).max() > 1e-3

  d = specs_lib.from_config(station_config(modalities=(
      ("obs", "synthetic", (), ("mean_sea_level_pressure", "10m_u_component_of_wind")),))).data
  msl = d.output_channels.index("mean_sea_level_pressure")
  mean, std, scale = (np.arange(len(d.output_channels), dtype=np.float32) + k
                      for k in (1, 2, 3))
  guess = setup.first_guesses(d, scale / std, (mean, std),
                              {"obs": {"mean": np.array([5.0, 0]), "std": np.array([4.0, 1])}})
  np.testing.assert_array_equal(guess["obs"].channels, [msl, 0])  # no 10 m wind on this grid
  np.testing.assert_allclose(guess["obs"].scale, [std[msl] / 4, 0])
  np.testing.assert_allclose(guess["obs"].offset, [(mean[msl] - 5) / 4, 0])
  np.testing.assert_allclose(guess["obs"].residual_scale, [scale[msl] / 4, 1])


def test_a_grid_model_is_unchanged_by_modalities():
  """The grid model's parameters, names and values, are the same with stations beside it."""
  plain = jax.tree.leaves_with_path(setup.init_model(specs_lib.from_config(
      station_config(modalities=())))[1])
  with_stations = dict(jax.tree.leaves_with_path(problem()[2]))
  for path, value in plain:
    np.testing.assert_array_equal(with_stations.pop(path), value)
  names = {tuple(str(getattr(key, "key", key)) for key in path[:3]) for path in with_stations}
  assert names == {("modalities", "stations", module) for module in (
      "embedder", "to_mesh_edges", "update_mlp", "from_mesh_edges", "output_mlp")}


@pytest.mark.parametrize("entry, message", [
    (("grid", "synthetic", ("2m_temperature",), ()), "other than 'grid' and 'mesh'"),
    (("obs", "synthetic", (), ()), "neither inputs nor targets"),
    (("obs", "synthetic", ("temperature",), ()), "are not surface variables"),
    (("obs", "synthetic", (), ("2m_temperature",), -1.0), "loss_weight=-1.0 must be >= 0"),
    (("obs", "synthetic"), r"expected \(name, source, inputs, targets"),
    (("obs", "", ("2m_temperature",), ()), "the source is empty"),
    (("obs", "synthetic:ten", ("2m_temperature",), ()), "synthetic:N needs a station count"),
])
def test_modality_config_errors(entry, message):
  with pytest.raises(UserError, match=message):
    station_config(modalities=(entry,))


def test_members_on_the_data_axis_are_refused_with_modalities():
  config = station_config(noise_channels=4)
  config.train.update(loss="crps", ensemble_members=2, members_on_data=True)
  with pytest.raises(UserError, match="train.members_on_data lays an FGN's members along the "
                     "data axis for the grid only: with data.modalities, set "
                     "train.members_on_data=False"):
    config_lib.validate(config)


def test_the_forecast_step_feeds_the_station_predictions_back():
  """Two forecast steps with stations on 2 x 4 devices (halo) equal two single-device steps
  of the model whose second step reads, at the new time, the first's station predictions
  (the padding points' values too, which change nothing); a modality's input it does not
  predict is missing there, the ones it predicts are taken by name."""
  constants, batch, params, _, positions = problem()
  specs = specs_lib.from_config(station_config())
  graphdef, _ = setup.init_model_shapes(specs)
  model = nnx.merge(graphdef, params)
  window = {"inputs": batch["inputs"], "forcings": batch["forcings"][:, :3],
            "statics": batch["statics"], "stations/inputs": batch["stations/inputs"]}
  history, points = window["inputs"], window["stations/inputs"]
  expected = []
  for _ in range(2):
    grid_out, point_out = jax.jit(forecast.one_step_with_points)(
        model, constants, history, window["forcings"], window["statics"],
        point_history={"stations": points})
    expected.append((np.asarray(grid_out), np.asarray(point_out["stations"])))
    history = forecast.advance_history(history, grid_out)
    points = np.concatenate([points[:, 1:], np.asarray(point_out["stations"])[:, None]], 1)

  config = station_config()
  config.mesh.data, config.mesh.graph = 2, 4
  layout = ShardedLayout(mesh_lib.make_mesh(specs_lib.from_config(config).mesh,
                                            jax.devices()[:8]),
                         constants.graphs, positions, "halo")
  device_constants, halo_indices = layout.constants(constants)
  step = jax.jit(sharded_model.forecast_step_fn(layout, graphdef, specs.data.modalities))
  inputs = device_batch(layout, window)
  stations = layout.partitioned.nodes["stations"]
  for grid_expected, points_expected in expected:
    inputs["inputs"], grid_out, moved, point_out = step(params, device_constants,
                                                       halo_indices, inputs)
    inputs["stations/inputs"] = moved["stations/inputs"]
    np.testing.assert_allclose(layout.grid.from_slots(np.asarray(grid_out), -1),
                               grid_expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(stations.from_slots(np.asarray(point_out["stations"]), -1),
                               points_expected, rtol=1e-4, atol=1e-4)
  assert (stations.node_of_slot < 0).any()  # padding points, fed back too, have no edges

  modality = specs_lib.ModalitySpec("obs", "synthetic", ("2m_temperature",
                                                         "10m_u_component_of_wind",
                                                         "mean_sea_level_pressure"),
                                    ("mean_sea_level_pressure", "2m_temperature"))
  history = np.zeros((1, 2, 3, 4), np.float32)
  predicted = np.arange(8, dtype=np.float32).reshape(1, 2, 4)
  moved = np.asarray(sharded_model.fed_back(modality, history, predicted))
  np.testing.assert_array_equal(moved[:, 0], history[:, 1])
  np.testing.assert_array_equal(moved[0, 1, 0], predicted[0, 1])
  np.testing.assert_array_equal(moved[0, 1, 2], predicted[0, 0])
  assert np.isnan(moved[0, 1, 1]).all()


def test_a_run_without_the_modalitys_points_is_refused():
  """Assembling a run with modalities but without their points (the planner's, a GraphCast
  example prediction's) names what is missing (before any graph is built)."""
  specs = specs_lib.from_config(station_config())
  mesh = mesh_lib.make_mesh(specs.mesh, jax.devices()[:1])
  with pytest.raises(UserError, match=r"data.modalities \['stations'\]: no points"):
    assembly.assemble(specs, POINTS, None, mesh, params=None)


def test_a_point_with_no_mesh_node_in_range_joins_its_nearest():
  """Radius 0: each point's one edge goes to its nearest mesh node; a wide radius gives every
  pair in range, and mesh nodes with no point near stay without edges. The decoder's
  triangles are found for a few points none of which lies near a face's edge."""
  mesh = icosahedron.mesh_hierarchy(2)[-1]
  points = grid.lat_lon_to_xyz(np.array([10.0, 10.5, -60.0]), np.array([20.0, 20.0, 200.0]))
  senders, receivers = connectivity.points_to_mesh_edges(points, mesh, 0.0)
  nearest = np.argmin(np.linalg.norm(points[:, None] - mesh.vertices[None], axis=-1), axis=1)
  np.testing.assert_array_equal(np.sort(senders), [0, 1, 2])
  np.testing.assert_array_equal(receivers[np.argsort(senders)], nearest)
  senders, receivers = connectivity.points_to_mesh_edges(points, mesh, 0.5)
  distance = np.linalg.norm(points[senders] - mesh.vertices[receivers], axis=-1)
  assert np.all(distance <= 0.5) and len(np.unique(receivers)) < len(mesh.vertices)
  assert np.all(np.diff(receivers) >= 0)
  expected = (np.linalg.norm(points[:, None] - mesh.vertices[None], axis=-1) <= 0.5).sum()
  assert len(senders) == expected
  senders, receivers = connectivity.mesh_to_grid_edges(points, mesh)
  np.testing.assert_array_equal(receivers, np.repeat([0, 1, 2], 3))
  assert np.all(np.isin(nearest, senders))
