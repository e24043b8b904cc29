"""Graph sharding: the partitioner, both exchanges, and equality with the single-device model."""

import jax
import numpy as np
import pytest

from problems import compile_loss_and_grad, loss_and_grad_fn, synthetic_problem
from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.graphs import grid
from wnscale.graphs.build import EdgeSet
from wnscale.model import setup
from wnscale.planner.xla_stats import compiled_stats
from wnscale.sharding import mesh as mesh_lib
from wnscale.sharding import partition as partition_lib
from wnscale.sharding import sharded_model
from wnscale.sharding.layout import ShardedLayout

# 19 x 36 = 684 grid nodes and 162 mesh nodes: neither divides 4 or 8 shards.
LATITUDE, LONGITUDE = grid.regular_grid(10.0, include_poles=True)


def small_config(**model):
  config = config_lib.default_config()
  config.model.update(dict(latent_size=16, mesh_levels=2, message_passing_steps=3), **model)
  return config_lib.validate(config)


@pytest.fixture(scope="module")
def problem():
  config = small_config()
  constants, batch, params = synthetic_problem(config, LATITUDE, LONGITUDE, batch_size=2,
                                               seed=3)
  return constants, batch, params, setup.node_positions(specs_lib.from_config(config).model,
                                                        LATITUDE, LONGITUDE)


def reference_loss_and_grads(config, constants, batch, params):
  return jax.jit(loss_and_grad_fn(config, constants, batch))(params)


def sharded_loss_and_grads(config, constants, batch, params, positions, data, graph, exchange):
  config.mesh.data, config.mesh.graph = data, graph
  mesh = mesh_lib.make_mesh(config.mesh, jax.devices()[:data * graph])
  layout = ShardedLayout(mesh, constants.graphs, *positions, exchange)
  device_constants, halo_indices = layout.constants(constants)
  graphdef, _ = setup.init_model_shapes(specs_lib.from_config(config))
  fn = jax.jit(jax.value_and_grad(sharded_model.loss_fn(layout, graphdef)))
  return fn(params, device_constants, halo_indices, layout.batch(batch))


def assert_same(result, reference):
  np.testing.assert_allclose(result[0], reference[0], rtol=1e-5)
  for g, r in zip(jax.tree.leaves(result[1]), jax.tree.leaves(reference[1]), strict=True):
    np.testing.assert_allclose(g, r, rtol=2e-4, atol=1e-5 * float(np.abs(r).max()))


@pytest.fixture(scope="module")
def reference(problem):
  constants, batch, params, _ = problem
  return reference_loss_and_grads(small_config(), constants, batch, params)


REMAT = dict(remat_grid_to_mesh_gnn=True, remat_mesh_gnn=True, remat_mesh_to_grid_gnn=True,
             mesh_remat_every=2, edge_chunks=3, grid_blocks=5, mesh_edge_chunks=3)
CASES = [(1, 1, "all_gather", {})] + [
    (1, g, mode, {}) for g in (2, 4, 8) for mode in partition_lib.EXCHANGE_MODES] + [
    (2, 4, mode, {}) for mode in partition_lib.EXCHANGE_MODES] + [
    (1, 4, mode, REMAT) for mode in partition_lib.EXCHANGE_MODES]


@pytest.mark.parametrize("data, graph, exchange, remat", CASES,
                         ids=[f"{d}x{g}-{m}{'-remat' if r else ''}" for d, g, m, r in CASES])
def test_sharded_matches_single_device(problem, reference, data, graph, exchange, remat):
  constants, batch, params, positions = problem
  result = sharded_loss_and_grads(small_config(**remat), constants, batch, params, positions,
                                  data, graph, exchange)
  assert_same(result, reference)


def test_shards_without_edges_of_a_kind(problem):
  """Decoder edges only into the northern hemisphere: southern shards have none."""
  constants, batch, params, positions = problem
  graphs = constants.graphs
  node_lat, _ = grid.grid_lat_lon(LATITUDE, LONGITUDE)
  keep = node_lat[graphs.mesh_to_grid.receivers] > 0
  graphs = graphs._replace(mesh_to_grid=EdgeSet(*(a[keep] for a in graphs.mesh_to_grid)))
  constants = constants._replace(graphs=graphs)
  reference = reference_loss_and_grads(small_config(), constants, batch, params)
  for exchange in partition_lib.EXCHANGE_MODES:
    result = sharded_loss_and_grads(small_config(), constants, batch, params, positions,
                                    1, 8, exchange)
    assert_same(result, reference)
  part = partition_lib.partition_graphs(graphs, *positions, 8, "halo")
  edges_per_shard = (part.graphs.mesh_to_grid.receivers < part.grid.per_shard).sum(axis=1)
  assert (edges_per_shard == 0).any()


@pytest.mark.parametrize("exchange", partition_lib.EXCHANGE_MODES)
@pytest.mark.parametrize("num_shards", [3, 8])
def test_sender_tables_hold_the_right_rows(problem, exchange, num_shards):
  """Simulates both exchanges in numpy: every edge reads its true sender and receiver."""
  constants, _, _, positions = problem
  graphs = constants.graphs
  part = partition_lib.partition_graphs(graphs, *positions, num_shards, exchange)
  for name, senders_part, receivers_part in [("grid_to_mesh", part.grid, part.mesh),
                                             ("mesh", part.mesh, part.mesh),
                                             ("mesh_to_grid", part.mesh, part.grid)]:
    node_ids = senders_part.node_of_slot.reshape(num_shards, -1)  # [S, per_shard]
    stacked = getattr(part.graphs, name)
    found = []
    for shard in range(num_shards):
      if exchange == "all_gather":
        table = senders_part.node_of_slot
      else:
        halo = part.halos[name]
        blocks = [node_ids[shard]] + [
            node_ids[(shard - k) % num_shards][indices[(shard - k) % num_shards]]
            for k, indices in zip(halo.offsets, halo.send_indices)]
        table = np.concatenate(blocks)
      real = stacked.receivers[shard] < receivers_part.per_shard
      receivers = receivers_part.node_of_slot[shard * receivers_part.per_shard
                                              + stacked.receivers[shard][real]]
      senders = table[stacked.senders[shard][real]]
      assert np.all(senders >= 0)
      assert np.all(np.diff(stacked.receivers[shard]) >= 0)  # receiver-sorted per shard
      found.append(np.stack([senders, receivers], 1))
    edges = getattr(graphs, name)
    expected = np.stack([edges.senders, edges.receivers], 1)
    found = np.concatenate(found)
    assert len(found) == len(expected)
    np.testing.assert_array_equal(np.unique(found, axis=0), np.unique(expected, axis=0))


def test_partition_is_balanced_and_round_trips(problem):
  positions = problem[3]
  part = partition_lib.partition_nodes(positions[0], 8)
  sizes = (part.node_of_slot.reshape(8, -1) >= 0).sum(axis=1)
  assert sizes.max() - sizes.min() <= 1 and sizes.sum() == 684
  values = np.random.default_rng(0).normal(size=(2, 684, 3))
  np.testing.assert_array_equal(part.from_slots(part.to_slots(values, 1), 1), values)


def test_halo_moves_less_than_all_gather_on_a_finer_graph():
  config = small_config(mesh_levels=4)
  latitude, longitude = grid.regular_grid(2.0, include_poles=True)
  graphs = setup.graphs_for_grid(specs_lib.from_config(config).model, latitude, longitude)
  positions = setup.node_positions(specs_lib.from_config(config).model, latitude, longitude)
  part = partition_lib.partition_graphs(graphs, *positions, 8, "halo")
  # all_gather brings every shard the whole sender array (minus its own rows).
  assert part.halos["mesh"].rows_received() < 0.5 * graphs.num_mesh_nodes * 7 / 8
  assert part.halos["grid_to_mesh"].rows_received() < 0.25 * graphs.num_grid_nodes * 7 / 8


def test_mesh_shape_errors():
  config = config_lib.default_config()
  config.mesh.data, config.mesh.graph = -1, 4
  assert mesh_lib.mesh_shape(config.mesh, 8) == (2, 4)
  config.mesh.data, config.mesh.graph = 2, -1
  assert mesh_lib.mesh_shape(config.mesh, 8) == (2, 4)
  config.mesh.data, config.mesh.graph = -1, 3
  with pytest.raises(ValueError, match="8 devices cannot be split into groups of 3"):
    mesh_lib.mesh_shape(config.mesh, 8)
  config.mesh.data, config.mesh.graph = 2, 2
  with pytest.raises(ValueError, match="does not match the 8 available devices"):
    mesh_lib.mesh_shape(config.mesh, 8)


def test_four_graph_shards_use_much_less_memory_per_device():
  config = small_config(latent_size=32, mesh_levels=3)
  latitude, longitude = grid.regular_grid(2.8125, include_poles=True)
  constants, batch, params = synthetic_problem(config, latitude, longitude, batch_size=1,
                                               abstract=True)
  graphs = constants.graphs
  single = compiled_stats(compile_loss_and_grad(config, constants, batch, params))
  config.mesh.data, config.mesh.graph = 1, 4
  mesh = mesh_lib.make_mesh(config.mesh, jax.devices()[:4])
  positions = setup.node_positions(specs_lib.from_config(config).model, latitude, longitude)
  layout = ShardedLayout(mesh, graphs, *positions, "halo")
  device_constants, halo_indices = layout.abstract_constants(constants)
  batch = layout.abstract_batch(batch)
  graphdef, _ = setup.init_model_shapes(specs_lib.from_config(config))
  compiled = jax.jit(jax.value_and_grad(sharded_model.loss_fn(layout, graphdef))).lower(
      params, device_constants, halo_indices, batch).compile()
  sharded = compiled_stats(compiled)
  assert sharded["temp_bytes"] < 0.45 * single["temp_bytes"], (sharded, single)
