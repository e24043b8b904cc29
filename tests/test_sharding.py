"""Graph sharding: the partitioner, both exchanges, and equality with the single-device model."""

import functools

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from problems import (assert_same, compile_loss_and_grad, loss_and_grad_fn, sharded_layout,
                      sharded_loss_and_grads, synthetic_problem)
from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.data.making import stations as stations_lib
from wnscale.graphs import build, grid, receiver_blocks
from wnscale.graphs import region as region_lib
from wnscale.graphs.edge_sets import EdgeSetSpec, WithinRadius, graphcast_edge_sets
from wnscale.graphs.points import PointSet, named_grid
from wnscale.model import blocks, setup
from wnscale.planner.xla_stats import compiled_stats
from wnscale.sharding import mesh as mesh_lib
from wnscale.sharding import partition as partition_lib
from wnscale.sharding import sharded_model
from wnscale.sharding.exchange import MODES
from wnscale.sharding.layout import ShardedLayout

# 19 x 36 = 684 grid nodes and 162 mesh nodes: neither divides 4 or 8 shards.
POINTS = PointSet.regular(*grid.regular_grid(10.0, include_poles=True))


def small_config(**model):
  config = config_lib.default_config()
  config.model.update(dict(latent_size=16, mesh_levels=2, message_passing_steps=3), **model)
  return config_lib.validate(config)


# The grids the equality tests run on: a regular one, and the points of a reduced
# Gaussian grid (1,600 points, rows of 20 to 80).
GRIDS = {"regular": POINTS, "O16": named_grid("O16")}
# A limited-area cut-out: a 2.5 deg box (30-50 N, 0-30 E, 96 points) in place of POINTS'
# points inside it (pole rows sharing their cells), the region weighed 3 times in the loss
# and its mesh refined twice more.
CUTOUT = region_lib.cut_out(POINTS, PointSet.regular(np.arange(31.25, 50, 2.5),
                                                     np.arange(1.25, 30, 2.5)),
                            None, "a 2.5 deg box")[0]


def points_of(grid: str) -> PointSet:
  return CUTOUT if grid == "cutout" else GRIDS[grid]


def config_on(grid: str):
  config = small_config()
  if grid == "cutout":
    config.data.regional_path, config.data.regional_loss_weight = "box.zarr", 3.0
    config.model.regional_mesh_levels = 2
  return config


@functools.cache
def problem_on(grid: str):
  config = config_on(grid)
  constants, batch, params = synthetic_problem(config, points_of(grid), batch_size=2, seed=3)
  return constants, batch, params, setup.node_positions(specs_lib.from_config(config).model,
                                                        points_of(grid))


def test_the_cut_out_problem_has_its_region_weighed_and_refined():
  specs = specs_lib.from_config(config_on("cutout"))
  graphs = setup.graphs_for_grid(specs.model, CUTOUT)
  positions = setup.node_positions(specs.model, CUTOUT)
  assert graphs.num_nodes("mesh") == len(positions["mesh"]) > 162
  constants = setup.make_constants(specs.data, graphs, CUTOUT, np.ones(1))
  np.testing.assert_allclose(constants.node_weights,
                             np.where(CUTOUT.region, 3.0, 1.0) * CUTOUT.area, rtol=1e-6)


@functools.cache
def reference_on(grid: str):
  constants, batch, params, _ = problem_on(grid)
  return reference_loss_and_grads(small_config(), constants, batch, params)


@pytest.fixture(scope="module")
def problem():
  return problem_on("regular")


def reference_loss_and_grads(config, constants, batch, params):
  return jax.jit(loss_and_grad_fn(config, constants, batch))(params)


def sharded_result(config, constants, batch, params, positions, data, graph, exchange):
  """The sharded model's `(loss, grads)` on `data` x `graph` devices."""
  layout = sharded_layout(config, constants, positions, data, graph, exchange)
  return sharded_loss_and_grads(config, layout, constants, batch, params)


@pytest.fixture(scope="module")
def reference():
  return reference_on("regular")


REMAT = dict(remat_grid_to_mesh_gnn=True, remat_mesh_gnn=True, remat_mesh_to_grid_gnn=True,
             mesh_remat_every=2, edge_chunks=3, grid_blocks=5, mesh_edge_chunks=3)
# all_gather's sender table does not depend on the shard count: 4 shards cover it; the
# halo's offsets do, so it runs at 2, 4 and 8. Data and graph shards together carry the
# remat options (a case's time is mostly its compile); so they do on the reduced Gaussian
# grid, with either exchange.
# The mesh edges' sums and receiver rows by matrix products on each shard's receiver
# blocks (the reference: by index, on one device).
MATMUL = dict(aggregation="matmul")
FUSED = dict(aggregation="fused")  # the edge step as one kernel per block (interpreted)
# Blocks of 128 edges, sender windows 8 rows past their receivers: most senders far.
SMALL_BLOCKS = dict(aggregation="matmul", edge_block_slots=128, sender_window_margin=8)
# By matrix products under remat: the grid decoded in blocks, each block's senders' gradient
# by its `BlockSenders`.
REMAT_MATMUL = dict(REMAT, aggregation="matmul")
CASES = [(1, 1, "all_gather", {}, "regular"), (1, 2, "halo", FUSED, "regular"),
         (1, 8, "halo", MATMUL, "regular"), (1, 4, "all_gather", SMALL_BLOCKS, "regular")] + [
    (2, 4, mode, REMAT, grid) for grid in GRIDS for mode in tuple(MODES)] + [
    (2, 4, "halo", REMAT, "cutout"), (2, 4, "all_gather", REMAT_MATMUL, "O16")]


@pytest.mark.parametrize("data, graph, exchange, options, grid", CASES, ids=[
    f"{d}x{g}-{m}{'-remat' if o.get('grid_blocks') else ''}"
    f"{'-' + o['aggregation'] if o.get('aggregation') else ''}"
    f"{'-small_blocks' if o is SMALL_BLOCKS else ''}"
    f"{'' if grid == 'regular' else '-' + grid}" for d, g, m, o, grid in CASES])
def test_sharded_matches_single_device(data, graph, exchange, options, grid):
  constants, batch, params, positions = problem_on(grid)
  result = sharded_result(small_config(**options), constants, batch, params, positions,
                          data, graph, exchange)
  assert_same(result, reference_on(grid))


def test_shards_without_edges_of_a_kind(problem):
  """Decoder edges only into the northern hemisphere: southern shards have none."""
  constants, batch, params, positions = problem
  graphs = constants.graphs
  node_lat = POINTS.latitude
  m2g = graphs.edges["mesh_to_grid"]
  keep = node_lat[m2g.receivers] > 0
  graphs = graphs._replace(edges=dict(graphs.edges, mesh_to_grid=m2g.replace(
      senders=m2g.senders[keep], receivers=m2g.receivers[keep], features=m2g.features[keep])))
  constants = constants._replace(graphs=graphs)
  reference = reference_loss_and_grads(small_config(), constants, batch, params)
  for exchange in tuple(MODES):
    result = sharded_result(small_config(), constants, batch, params, positions,
                                    1, 8, exchange)
    assert_same(result, reference)
  part = partition_lib.partition_graphs(graphs, positions, 8, "halo")
  edges_per_shard = (part.graphs.edges["mesh_to_grid"].receivers
                     < part.nodes["grid"].per_shard).sum(axis=1)
  assert (edges_per_shard == 0).any()


@pytest.mark.parametrize("exchange", tuple(MODES))
@pytest.mark.parametrize("num_shards", [3, 8])
def test_sender_tables_hold_the_right_rows(exchange, num_shards):
  """Simulates both exchanges in numpy: every edge reads its true sender and receiver,
  a station modality's (in, out and its first guess from the grid) too."""
  modality = specs_lib.ModalitySpec("stations", "synthetic", ("2m_temperature",),
                                    ("2m_temperature",))
  stations = {"stations": stations_lib.random_land_biased_points(
      90, POINTS, POINTS.latitude > 30)}
  m = specs_lib.from_config(small_config()).model
  graphs = setup.graphs_for_grid(m, POINTS, modalities=(modality,), point_sets=stations)
  positions = setup.node_positions(m, POINTS, stations)
  part = partition_lib.partition_graphs(graphs, positions, num_shards, exchange)
  assert list(part.graphs.edges) == ["grid_to_mesh", "mesh", "mesh_to_grid",
                                     "stations_to_mesh", "mesh_to_stations",
                                     "grid_to_stations"]
  for name, stacked in part.graphs.edges.items():
    senders_part = part.nodes[stacked.sender_set]
    receivers_part = part.nodes[stacked.receiver_set]
    node_ids = senders_part.node_of_slot.reshape(num_shards, -1)  # [S, per_shard]
    found = []
    for shard in range(num_shards):
      if exchange == "all_gather":
        table = senders_part.node_of_slot
      else:
        halo = part.plans[name]
        blocks = [node_ids[shard]] + [
            node_ids[(shard - k) % num_shards][indices[(shard - k) % num_shards]]
            for k, indices in zip(halo.offsets, halo.send_indices)]
        table = np.concatenate(blocks)
      # Padding edges point past the shard's rows, or (a fixed in-degree) at padding rows.
      slots = shard * receivers_part.per_shard + np.minimum(stacked.receivers[shard],
                                                            receivers_part.per_shard - 1)
      real = ((stacked.receivers[shard] < receivers_part.per_shard)
              & (receivers_part.node_of_slot[slots] >= 0))
      receivers = receivers_part.node_of_slot[slots[real]]
      senders = table[stacked.senders[shard][real]]
      assert np.all(senders >= 0)
      if stacked.in_degree:  # slot-major: row r's j-th edge at j R + r
        np.testing.assert_array_equal(stacked.receivers[shard], np.tile(
            np.arange(receivers_part.per_shard), stacked.in_degree))
      else:
        assert np.all(np.diff(stacked.receivers[shard]) >= 0)  # receiver-sorted per shard
      found.append(np.stack([senders, receivers], 1))
    edges = graphs.edges[name]
    expected = np.stack([edges.senders, edges.receivers], 1)
    found = np.concatenate(found)
    assert len(found) == len(expected)
    np.testing.assert_array_equal(np.unique(found, axis=0), np.unique(expected, axis=0))


def test_a_new_edge_set_is_one_entry_of_data():
  """docs/design.md's example: a second, wider grid-to-mesh edge set, built, sharded, exchanged.

  Under `shard_map` over 4 graph shards, each shard's sender table (the exchange
  of its own grid rows) read at its edges' senders gives, in both modes, the
  rows an unsharded gather gives for the same (receiver, sender) edges.
  """
  edge_sets = dict(graphcast_edge_sets(),
                   grid_to_mesh_wide=EdgeSetSpec("grid", "mesh", WithinRadius(1.0)))
  graphs = build.build_graphs(POINTS, mesh_levels=2, edge_sets=edge_sets)
  wide = graphs.edges["grid_to_mesh_wide"]
  assert graphs.counts()["grid_to_mesh_wide_edges"] > 2 * graphs.num_edges("grid_to_mesh")
  rows = np.random.default_rng(0).standard_normal((graphs.num_nodes("grid"), 5), np.float32)
  expected = np.concatenate([wide.receivers[:, None], rows[wide.senders]], 1)
  config = small_config()
  config.mesh.data, config.mesh.graph = 1, 4
  mesh = mesh_lib.make_mesh(specs_lib.from_config(config).mesh, jax.devices()[:4])
  positions = build.node_positions(POINTS, mesh_levels=2)
  for mode in MODES:
    layout = ShardedLayout(mesh, graphs, positions, mode)
    stacked, halo_indices = jax.device_put(
        (layout.partitioned.graphs, layout.halo_indices()),
        layout.sharding(P(mesh_lib.GRAPH)))

    def gather(graphs, halo_indices, rows):
      edges = graphs.edges["grid_to_mesh_wide"]
      table = layout.exchange(halo_indices)("grid_to_mesh_wide", rows)
      return table[edges.senders[0]][None]

    gathered = np.asarray(jax.jit(jax.shard_map(
        gather, mesh=mesh, in_specs=P(mesh_lib.GRAPH), out_specs=P(mesh_lib.GRAPH)))(
            stacked, halo_indices, layout.grid.to_slots(rows, 0)))
    receivers_part = layout.partitioned.nodes["mesh"]
    local = layout.partitioned.graphs.edges["grid_to_mesh_wide"].receivers
    real = local < receivers_part.per_shard
    shard_of_edge = np.broadcast_to(np.arange(4)[:, None], local.shape)
    receivers = receivers_part.node_of_slot[shard_of_edge[real] * receivers_part.per_shard
                                            + local[real]]
    found = np.concatenate([receivers[:, None], gathered[real]], 1)
    np.testing.assert_array_equal(np.unique(found, axis=0), np.unique(expected, axis=0),
                                  err_msg=mode)
    assert len(found) == len(expected)


def test_partition_is_balanced_and_round_trips(problem):
  positions = problem[3]
  part = partition_lib.partition_nodes(positions["grid"], 8)
  sizes = (part.node_of_slot.reshape(8, -1) >= 0).sum(axis=1)
  assert sizes.max() - sizes.min() <= 1 and sizes.sum() == 684
  values = np.random.default_rng(0).normal(size=(2, 684, 3))
  np.testing.assert_array_equal(part.from_slots(part.to_slots(values, 1), 1), values)


@pytest.mark.parametrize("num_shards", [1, 3])
def test_mesh_to_grid_edges_are_laid_out_three_slots_per_grid_row(problem, num_shards):
  """Every grid row r, padding rows too, owns mesh-to-grid slots r, R + r and 2 R + r; the
  real rows' edges are the graph's, the padding rows' read sender 0 with zero features."""
  config = small_config()
  points = points_of("regular")
  graphs = setup.graphs_for_grid(specs_lib.from_config(config).model, points)
  positions = setup.node_positions(specs_lib.from_config(config).model, points)
  part = partition_lib.partition_graphs(graphs, positions, num_shards, "all_gather")
  edges, grid = part.graphs.edges["mesh_to_grid"], part.nodes["grid"]
  assert edges.in_degree == 3 and graphs.edges["mesh_to_grid"].in_degree == 0
  assert part.graphs.edges["grid_to_mesh"].in_degree == 0  # 4..n edges per mesh node
  np.testing.assert_array_equal(
      edges.receivers, np.tile(np.arange(grid.per_shard), (num_shards, 3)))
  node = grid.node_of_slot.reshape(num_shards, grid.per_shard)
  original = graphs.edges["mesh_to_grid"]
  for shard in range(num_shards):
    for row in range(grid.per_shard):
      slots = row + grid.per_shard * np.arange(3)
      if node[shard, row] < 0:
        assert np.all(edges.senders[shard, slots] == 0)
        assert np.all(edges.features[shard, slots] == 0)
        continue
      mine = original.receivers == node[shard, row]
      np.testing.assert_array_equal(np.sort(edges.features[shard, slots], axis=0),
                                    np.sort(original.features[mine], axis=0))


@pytest.mark.parametrize("num_shards, grid_blocks", [(1, 4), (3, 5), (2, 1)])
def test_mesh_to_grid_block_senders_read_each_blocks_senders(num_shards, grid_blocks):
  """With the grid decoded in blocks (its rows a shard whole blocks), each block's
  `BlockSenders` (all of one shape) read the senders of that block's slots
  (`slot_major_row_blocks`' cut), through rows that are distinct and few: no more than the
  block's distinct senders, padded to the largest. So do its `KernelSenders` (one block
  too) per kernel block of rows: each edge's entry of its kernel block's list is its
  sender, and a list holds the kernel block's distinct senders once each."""
  config = small_config()
  points = points_of("regular")
  graphs = setup.graphs_for_grid(specs_lib.from_config(config).model, points)
  positions = setup.node_positions(specs_lib.from_config(config).model, points)
  part = partition_lib.partition_graphs(graphs, positions, num_shards, "all_gather",
                                        grid_blocks=grid_blocks)
  edges = part.graphs.edges["mesh_to_grid"]
  assert part.graphs.edges["grid_to_mesh"].block_senders is None
  assert part.graphs.edges["grid_to_mesh"].kernel_senders is None
  # The grid's rows a shard are whole blocks of whole tiles: no block is padded.
  per_shard = part.nodes["grid"].per_shard
  if grid_blocks > 1:
    assert per_shard == blocks.block_rows(per_shard, grid_blocks) * grid_blocks
    assert per_shard % (blocks.ROW_ALIGN * grid_blocks) == 0
  assert part.nodes["mesh"].per_shard == -(-graphs.num_nodes("mesh") // num_shards)
  by_block, kernel = edges.block_senders, edges.kernel_senders
  assert (by_block is None) == (grid_blocks == 1)
  kernel_rows = receiver_blocks.DECODER_KERNEL_ROWS
  assert kernel.rows.shape[:2] == (num_shards, grid_blocks)
  assert kernel.rows.shape[-1] % receiver_blocks.KERNEL_SENDERS_ALIGN == 0
  for shard in range(num_shards):
    cut = blocks.slot_major_row_blocks(edges.senders[shard], 3, grid_blocks).reshape(
        grid_blocks, 3, -1)
    for block in range(grid_blocks):
      if by_block is not None:
        rows, indices = by_block.rows[shard, block], by_block.senders.indices[shard, block]
        np.testing.assert_array_equal(rows[indices], cut[block].reshape(-1))
        distinct = np.unique(cut[block])
        np.testing.assert_array_equal(rows[:len(distinct)], distinct)
      lists, local = kernel.rows[shard, block], kernel.local[shard, block]
      num_rows = cut.shape[-1]
      assert local.shape == (-(-num_rows // kernel_rows), 3, kernel_rows)
      picked = np.take_along_axis(lists, local.reshape(len(lists), -1), axis=1)
      np.testing.assert_array_equal(
          picked.reshape(-1, 3, kernel_rows).transpose(1, 0, 2).reshape(3, -1)[:, :num_rows],
          cut[block])
      for start, entries in zip(range(0, num_rows, kernel_rows), lists):
        distinct = np.unique(cut[block][:, start:start + kernel_rows])
        np.testing.assert_array_equal(entries[:len(distinct)], distinct)


def _assert_sender_blocks_hold_each_edge(layout, senders, receivers, features, num_senders,
                                        num_receivers):
  """Each real edge (receiver < `num_receivers`) in one slot of `layout` (one shard's
  `SenderBlocks`), where its sender is its block's row, its receiver its list's entry and
  its features the slot's; padding slots pick nothing and hold zero features; the blocks
  of rows ascend and cover the table; a list holds its kernel block's receivers once each,
  ascending."""
  num_blocks, slots = layout.edges.shape
  width, block_rows = layout.receiver_rows.shape[1], layout.block_rows
  edge = layout.edges.reshape(-1)
  real = edge < len(senders)
  np.testing.assert_array_equal(np.sort(edge[real]), np.flatnonzero(receivers < num_receivers))
  window = np.repeat(layout.window, slots)
  sender_local, receiver_local = layout.sender_local.reshape(-1), layout.receiver_local.reshape(-1)
  np.testing.assert_array_equal(window[real] * block_rows + sender_local[real], senders[edge[real]])
  picked = np.take_along_axis(layout.receiver_rows, np.minimum(
      layout.receiver_local[:, 0], width - 1), axis=1).reshape(-1)
  np.testing.assert_array_equal(picked[real], receivers[edge[real]])
  np.testing.assert_array_equal(layout.features[:, real].T, features[edge[real]])
  assert not np.any(layout.features[:, ~real])
  assert np.all(sender_local[~real] == block_rows) and np.all(receiver_local[~real] == width)
  assert np.all(np.diff(layout.window) >= 0)
  assert set(layout.window) == set(range(-(-num_senders // block_rows)))
  for rows, local in zip(layout.receiver_rows, layout.receiver_local[:, 0]):
    used = np.unique(local[local < width])
    np.testing.assert_array_equal(used, np.arange(len(used)))
    assert np.all(np.diff(rows[:len(used)]) > 0)


@pytest.mark.parametrize("num_shards", [1, 3])
def test_grid_to_mesh_sender_blocks_hold_each_edge_once(num_shards):
  """The encoder's `SenderBlocks` (every shard's of one shape): each of a shard's edges
  in one slot, read from its block of sender rows and its kernel block's receiver list;
  a block of rows with more edges than the slots (a crowd of senders, as around the
  poles) in several kernel blocks, one after the other."""
  config = small_config()
  points = points_of("regular")
  graphs = setup.graphs_for_grid(specs_lib.from_config(config).model, points)
  positions = setup.node_positions(specs_lib.from_config(config).model, points)
  part = partition_lib.partition_graphs(graphs, positions, num_shards, "all_gather")
  edges = part.graphs.edges["grid_to_mesh"]
  assert part.graphs.edges["mesh_to_grid"].sender_blocks is None
  layout = edges.sender_blocks
  assert layout.edges.shape[0] == num_shards
  assert layout.slots % receiver_blocks.ENCODER_SLOTS_ALIGN == 0
  assert layout.receiver_rows.shape[-1] % receiver_blocks.KERNEL_SENDERS_ALIGN == 0
  table_rows = part.nodes["grid"].per_shard + part.plans["grid_to_mesh"].rows_received()
  for shard in range(num_shards):
    _assert_sender_blocks_hold_each_edge(
        jax.tree.map(lambda x: x[shard], layout), edges.senders[shard],
        edges.receivers[shard], edges.features[shard], table_rows,
        part.nodes["mesh"].per_shard)
  # A crowd: 40 senders of 20 edges each, 8 rows a block, 128 slots a kernel block.
  rng = np.random.default_rng(0)
  senders = np.concatenate([np.repeat(np.arange(8, 48), 20), rng.integers(0, 100, 60)])
  receivers = rng.integers(0, 30, len(senders))
  features = rng.standard_normal((len(senders), 4)).astype(np.float32)
  crowded = receiver_blocks.sender_blocks(senders, receivers, features, 100, 30, block_rows=8,
                                          slots=128)
  kernel_blocks = np.bincount(crowded.window)
  np.testing.assert_array_equal(kernel_blocks, np.maximum(1, -(-np.bincount(
      senders // 8, minlength=13) // 128)))
  assert kernel_blocks.max() == 2
  _assert_sender_blocks_hold_each_edge(crowded, senders, receivers, features, 100, 30)


def test_halo_moves_less_than_all_gather_on_a_finer_graph():
  config = small_config(mesh_levels=4)
  points = PointSet.regular(*grid.regular_grid(2.0, include_poles=True))
  graphs = setup.graphs_for_grid(specs_lib.from_config(config).model, points)
  positions = setup.node_positions(specs_lib.from_config(config).model, points)
  part = partition_lib.partition_graphs(graphs, positions, 8, "halo")
  # all_gather brings every shard the whole sender array (minus its own rows).
  assert part.plans["mesh"].rows_received() < 0.5 * graphs.num_nodes("mesh") * 7 / 8
  assert part.plans["grid_to_mesh"].rows_received() < 0.25 * graphs.num_nodes("grid") * 7 / 8


def test_mesh_shape_errors():
  def mesh(data, graph):
    return specs_lib.MeshSpec(data=data, graph=graph, exchange="all_gather")

  assert mesh_lib.mesh_shape(mesh(-1, 4), 8) == (2, 4)
  assert mesh_lib.mesh_shape(mesh(2, -1), 8) == (2, 4)
  with pytest.raises(ValueError, match="8 devices cannot be split into groups of 3"):
    mesh_lib.mesh_shape(mesh(-1, 3), 8)
  with pytest.raises(ValueError, match="does not match the 8 available devices"):
    mesh_lib.mesh_shape(mesh(2, 2), 8)


def test_four_graph_shards_use_much_less_memory_per_device():
  config = small_config(latent_size=32, mesh_levels=3)
  points = PointSet.regular(*grid.regular_grid(2.8125, include_poles=True))
  constants, batch, params = synthetic_problem(config, points, batch_size=1,
                                               abstract=True)
  graphs = constants.graphs
  single = compiled_stats(compile_loss_and_grad(config, constants, batch, params))
  config.mesh.data, config.mesh.graph = 1, 4
  mesh = mesh_lib.make_mesh(specs_lib.from_config(config).mesh, jax.devices()[:4])
  positions = setup.node_positions(specs_lib.from_config(config).model, points)
  layout = ShardedLayout(mesh, graphs, positions, "halo")
  device_constants, halo_indices = layout.abstract_constants(constants)
  batch = layout.abstract_batch(batch)
  graphdef, _ = setup.init_model_shapes(specs_lib.from_config(config))
  compiled = jax.jit(sharded_model.loss_and_grad_fn(layout, graphdef)).lower(
      params, device_constants, halo_indices, batch).compile()
  sharded = compiled_stats(compiled)
  assert sharded["temp_bytes"] < 0.45 * single["temp_bytes"], (sharded, single)
