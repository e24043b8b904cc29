"""WeatherNext 2's processor: k-hop neighbour lists, sparse attention, and the spine tests.

The transformer with every remat option, and with the graph split over 2 and 4
devices in both exchange modes, gives the loss and gradients of the plain
single-device transformer; attention over the neighbour list equals dense
attention with the k-hop mask.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

from problems import (assert_same, loss_and_grad_fn, sharded_layout, sharded_loss_and_grads,
                      synthetic_problem)
from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.data import forcings as forcings_lib
from wnscale.graphs import grid, icosahedron, neighbourhoods
from wnscale.graphs.points import PointSet
from wnscale.model import remat_policies, setup
from wnscale.model.sparse_attention import neighbour_attention
from wnscale.sharding import partition as partition_lib

# 19 x 36 = 684 grid nodes and 162 mesh nodes: neither divides 4 shards.
POINTS = PointSet.regular(*grid.regular_grid(10.0, include_poles=True))


GLOBAL_FORCINGS = ("year_progress_sin", "year_progress_cos")


def small_config(**model):
  """A small transformer with WeatherNext 2's encoder (no receiver part in its edge MLP,
  summed messages / 4) and global inputs (year progress)."""
  config = config_lib.default_config()
  config.model.update(dict(processor="transformer", latent_size=16, mesh_levels=2,
                           transformer_layers=3, transformer_heads=2, transformer_ffw_size=32,
                           transformer_k_hop=2, grid_to_mesh_gather_from_receivers=False,
                           grid_to_mesh_aggregate_normalization=4.0), **model)
  config.data.global_forcings = GLOBAL_FORCINGS
  return config_lib.validate(config)


def perturbed(params, seed):
  """`params` plus noise: the zero-initialised output projections would hide every other
  gradient of a block (a fresh block is the identity)."""
  leaves, treedef = jax.tree.flatten(params)
  rng = np.random.default_rng(seed)
  return jax.tree.unflatten(treedef, [
      x + 0.3 * rng.standard_normal(x.shape).astype(np.float32) for x in leaves])


@pytest.fixture(scope="module")
def problem():
  config = small_config()
  constants, batch, params = synthetic_problem(config, POINTS, batch_size=2,
                                               seed=3)
  return (constants, batch, perturbed(params, 4),
          setup.node_positions(specs_lib.from_config(config).model, POINTS))


def single_device(config, problem):
  constants, batch, params, _ = problem
  return jax.jit(loss_and_grad_fn(config, constants, batch))(params)


def sharded(config, problem, graph, exchange):
  constants, batch, params, positions = problem
  layout = sharded_layout(config, constants, positions, 1, graph, exchange)
  return sharded_loss_and_grads(config, layout, constants, batch, params)


@pytest.fixture(scope="module")
def reference(problem):
  return single_device(small_config(), problem)


# --- neighbour lists -------------------------------------------------------------------

@pytest.mark.parametrize("level, k", [(1, 0), (1, 1), (2, 3), (3, 5)])
def test_k_hop_edges_are_the_mask_of_adjacency_plus_identity_to_the_k(level, k):
  """WeatherNext 2's mask: (A + I)^k on the finest mesh."""
  mesh = icosahedron.mesh_hierarchy(level)[-1]
  adjacency = neighbourhoods.mesh_adjacency(mesh)
  senders, receivers = neighbourhoods.k_hop_edges(adjacency, k)
  n = len(mesh.vertices)
  step = (adjacency + sp.identity(n, dtype=np.int32)).toarray() > 0
  mask = np.eye(n, dtype=bool)
  for _ in range(k):
    mask = (mask.astype(np.int32) @ step.astype(np.int32)) > 0
  expected_receivers, expected_senders = np.nonzero(mask)  # row-major: by receiver, sender
  np.testing.assert_array_equal(receivers, expected_receivers)
  np.testing.assert_array_equal(senders, expected_senders)
  assert senders.dtype == receivers.dtype == np.int32


def test_neighbourhood_sizes_grow_as_hexagonal_rings():
  """1 + 3k(k + 1) nodes within k hops, except near the 12 five-neighbour vertices."""
  senders, receivers = neighbourhoods.build_neighbourhoods(4, 3)
  counts = np.bincount(receivers)
  assert len(counts) == 2562 and counts.max() == 1 + 3 * 3 * 4
  assert np.mean(counts == 37) > 0.9
  # Cached: the second call reads the file and gives the same lists.
  again = neighbourhoods.build_neighbourhoods(4, 3)
  np.testing.assert_array_equal(again[0], senders)
  np.testing.assert_array_equal(again[1], receivers)


def test_graphs_of_the_transformer_carry_the_neighbour_lists():
  graphs = setup.graphs_for_grid(specs_lib.from_config(small_config(transformer_k_hop=1)).model,
                                 POINTS)
  counts = graphs.counts()
  # 162 nodes: 12 with 5 neighbours, 150 with 6, each itself too.
  assert counts["mesh_neighbour_edges"] == 12 * 6 + 150 * 7
  assert graphs.edges["mesh_neighbours"].features.shape == (counts["mesh_neighbour_edges"], 0)
  gnn = config_lib.default_config()
  gnn_graphs = setup.graphs_for_grid(specs_lib.from_config(gnn).model, POINTS)
  assert "mesh_neighbour_edges" not in gnn_graphs.counts()


# --- attention -------------------------------------------------------------------------

def dense_masked_attention(queries, keys, values, mask):
  """Reference: `[N, H, D]` softmax attention over all nodes, masked logits -inf."""
  logits = jnp.einsum("nhd,mhd->hnm", queries, keys)
  weights = jax.nn.softmax(jnp.where(mask[None], logits, -jnp.inf), axis=-1)
  return jnp.einsum("hnm,mhd->nhd", weights, values)


@pytest.mark.parametrize("edges_per_block", [0, 97, 700])
def test_neighbour_attention_equals_dense_masked_attention(edges_per_block):
  mesh = icosahedron.mesh_hierarchy(2)[-1]
  senders, receivers = neighbourhoods.k_hop_edges(neighbourhoods.mesh_adjacency(mesh), 2)
  n = len(mesh.vertices)
  mask = np.zeros((n, n), bool)
  mask[receivers, senders] = True
  rng = np.random.default_rng(0)
  # Large logits: a softmax without its maximum subtracted would overflow.
  queries, keys, values = (jnp.asarray(5 * rng.standard_normal((n, 3, 4)), jnp.float32)
                           for _ in range(3))
  cotangent = jnp.asarray(rng.standard_normal((n, 3, 4)), jnp.float32)

  def sparse(q, k, v):
    return neighbour_attention(q, k, v, senders, receivers, edges_per_block)

  def dense(q, k, v):
    return dense_masked_attention(q, k, v, mask)

  np.testing.assert_allclose(sparse(queries, keys, values), dense(queries, keys, values),
                             rtol=1e-5, atol=1e-4)
  grads = [jax.grad(lambda *a, f=f: jnp.sum(f(*a) * cotangent), argnums=(0, 1, 2))(
      queries, keys, values) for f in (sparse, dense)]
  for g, r in zip(*grads):
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * float(np.abs(r).max()))


def test_bfloat16_inputs_attend_in_float32():
  mesh = icosahedron.mesh_hierarchy(1)[-1]
  senders, receivers = neighbourhoods.k_hop_edges(neighbourhoods.mesh_adjacency(mesh), 1)
  rng = np.random.default_rng(1)
  inputs = [jnp.asarray(rng.standard_normal((42, 2, 8)), jnp.bfloat16) for _ in range(3)]
  attended = neighbour_attention(*inputs, senders, receivers)
  exact = neighbour_attention(*(x.astype(jnp.float32) for x in inputs), senders, receivers)
  assert attended.dtype == jnp.float32
  np.testing.assert_allclose(attended, exact, rtol=1e-5, atol=1e-5)


def test_padding_edges_and_receivers_without_edges_stay_finite():
  """Padding edges (receiver N) are ignored; a receiver with no edge gets 0, not NaN."""
  queries = jnp.ones((3, 1, 2))
  keys = values = jnp.arange(8.0).reshape(4, 1, 2)
  senders = jnp.array([0, 1, 3, 2, 0])
  receivers = jnp.array([0, 0, 2, 3, 3])  # receiver 1: none; two padding edges
  out, grad = jax.value_and_grad(lambda q: jnp.sum(neighbour_attention(
      q, keys, values, senders, receivers)))(queries)
  assert np.isfinite(out) and np.all(np.isfinite(grad))
  attended = neighbour_attention(queries, keys, values, senders, receivers)
  np.testing.assert_array_equal(attended[1], 0.0)
  np.testing.assert_allclose(attended[2], values[3])


# --- remat and sharding: the spine ---------------------------------------------------------

ALL_STAGES = dict(remat_grid_to_mesh_gnn=True, remat_mesh_gnn=True, remat_mesh_to_grid_gnn=True)
NAMES = f"save_only_these_names:{remat_policies.ATTENTION_OUTPUT},{remat_policies.FFW_OUTPUT}"
# Each named policy rides on one way of checkpointing (a case's time is mostly its
# compile); nothing_saveable is the sharded remat case's, and everything_saveable, which
# recomputes nothing, is covered by test_remat.py.
REMAT_VARIANTS = {
    "processor_dots_no_batch": dict(remat_mesh_gnn=True,  # one checkpoint per block
                                    remat_policy="dots_with_no_batch_dims_saveable"),
    "processor_offload_dots": dict(remat_mesh_gnn=True, remat_policy="offload_dots"),
    # 3 blocks: a group of 2 plus a remainder of 1, in a Python loop (not a scan).
    "every_2_dots_loop": dict(remat_mesh_gnn=True, mesh_remat_every=2,
                              remat_policy="dots_saveable", scan_layers=False),
    # The transformer's own checkpoint names.
    "all_three_names": dict(ALL_STAGES, remat_policy=NAMES),
    # 97 divides no shard's edge count: the last block is padded.
    "edge_blocks_every_2_offload_carries": dict(remat_mesh_gnn=True, mesh_remat_every=2,
                                                transformer_edges_per_block=97,
                                                remat_policy="offload_carries"),
}


@pytest.mark.parametrize("name", REMAT_VARIANTS)
def test_remat_matches_plain_transformer(name, problem, reference):
  assert_same(single_device(small_config(**REMAT_VARIANTS[name]), problem), reference)


def test_gradients_reach_every_parameter(reference):
  for path, g in jax.tree_util.tree_flatten_with_path(reference[1])[0]:
    assert np.abs(g).max() > 0, jax.tree_util.keystr(path)


# Both exchange modes, the halo at 2 and 4 shards (all_gather's sender table does not
# depend on the shard count); at 4 with halo, remat and edge blocks on as well.
SHARDED = [(2, "halo", {}), (4, "all_gather", {}),
           (4, "halo", dict(ALL_STAGES, mesh_remat_every=2, transformer_edges_per_block=97))]


@pytest.mark.parametrize("graph, exchange, remat_settings", SHARDED,
                         ids=[f"{g}-{m}{'-remat' if r else ''}" for g, m, r in SHARDED])
def test_sharded_matches_single_device(problem, reference, graph, exchange, remat_settings):
  assert_same(sharded(small_config(**remat_settings), problem, graph, exchange), reference)


def test_halo_of_k_hop_neighbourhoods_is_smaller_than_all_gather():
  config = small_config(mesh_levels=4, transformer_k_hop=4)
  points = PointSet.regular(*grid.regular_grid(2.0, include_poles=True))
  graphs = setup.graphs_for_grid(specs_lib.from_config(config).model, points)
  positions = setup.node_positions(specs_lib.from_config(config).model, points)
  part = partition_lib.partition_graphs(graphs, positions, 8, "halo")
  # all_gather brings every shard the other 7/8 of the mesh.
  assert part.plans["mesh_neighbours"].rows_received() < 0.5 * graphs.num_nodes("mesh") * 7 / 8


# --- the WeatherNext 2 shape: narrow edge latents, global inputs -------------------------

def test_edge_latent_size_sets_the_encoder_and_decoder_edge_width():
  params = setup.init_model_shapes(specs_lib.from_config(small_config(edge_latent_size=4)))[1]
  for edges in (params["grid_to_mesh_edges"], params["mesh_to_grid_edges"]):
    assert edges["embedder"]["out"]["kernel"].shape == (4, 4)
    mlp = edges["interaction"]["edge_mlp"]
    assert mlp["hidden"]["kernel"].shape == (4, 16)
    assert mlp["out"]["kernel"].shape == (16, 16)  # messages: latent wide


def test_global_forcings_are_year_progress():
  # Half a tropical year (365.24219 days / 2) after 1970-01-01.
  times = np.array(["1970-01-01T00:00:00", "1970-07-02T14:54:22"], dtype="datetime64[s]")
  values = forcings_lib.compute_global_forcings(times, ("year_progress_cos",
                                                        "year_progress_sin"))
  assert values.shape == (2, 2) and values.dtype == np.float32
  np.testing.assert_allclose(values[0], [1.0, 0.0], atol=1e-7)
  np.testing.assert_allclose(values[1], [-1.0, 0.0], atol=1e-6)


def test_global_forcings_reach_grid_and_mesh_embedders(problem, reference):
  batch = problem[1]
  assert batch["globals"].shape == (2, 3, 2)
  with_globals = setup.init_model_shapes(specs_lib.from_config(small_config()))[1]
  without = small_config()
  without.data.global_forcings = ()
  without = setup.init_model_shapes(specs_lib.from_config(without))[1]
  # (input_steps + 1) times x 2 forcings, on every grid and every mesh node.
  kernel = lambda p, name: p[name]["hidden"]["kernel"].shape[0]
  assert kernel(with_globals, "grid_embedder") == kernel(without, "grid_embedder") + 6
  assert kernel(with_globals, "mesh_embedder") == kernel(without, "mesh_embedder") + 6 == 9
  # The loss depends on them through both: their first-layer weights have gradients.
  grads = reference[1]
  grid_rows = grads["grid_embedder"]["hidden"]["kernel"][-9:-3]  # then the 3 node features
  mesh_rows = grads["mesh_embedder"]["hidden"]["kernel"][3:]
  for rows in (grid_rows, mesh_rows):
    assert np.all(np.abs(rows).max(axis=1) > 0)


def test_config_errors_name_the_problem():
  with pytest.raises(ValueError, match="transformer_heads=3 must divide"):
    small_config(transformer_heads=3)
  with pytest.raises(ValueError, match="model.processor='gnn'"):
    small_config(processor="gnn")
  config = small_config()
  config.data.global_forcings = ("co2",)
  with pytest.raises(ValueError, match="unknown 'co2'"):
    config_lib.validate(config)
