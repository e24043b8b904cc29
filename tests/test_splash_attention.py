"""The transformer's attention by Pallas' splash kernel equals its attention from the edges.

On a CPU the kernel runs in Pallas' interpret mode (`splash_attention.splash_mask`'s
`interpret`): the kernel's own arithmetic, slowly, so the sizes here are small. Compared
with the edge path (`sparse_attention.neighbour_attention`, itself equal to dense masked
attention in test_transformer.py): attention outputs and gradients, the whole model's loss
and gradients in GraphCast's node order (the plain path), under remat, and laid out on the
devices in the Morton order (the train path; WeatherNext 2's FGN training too); and where
the kernel does not run.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from problems import (assert_same, loss_and_grad_fn, sharded_layout, sharded_loss_and_grads,
                      spread_members, synthetic_problem)
from test_ensemble import small_config as fgn_config
from test_transformer import ALL_STAGES, NAMES, POINTS, perturbed, small_config
from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.errors import UserError
from wnscale.graphs import icosahedron, neighbourhoods
from wnscale.model import ensemble, mesh_transformer, setup, splash_attention
from wnscale.model.sparse_attention import neighbour_attention
from wnscale.sharding import partition as partition_lib

SPLASH = dict(transformer_attention="splash")
EDGES = dict(transformer_attention="edges")  # not "auto": splash on a TPU
# The train path over 2 data shards (8 fake CPU devices; one chip has 1).
two_devices = pytest.mark.skipif(jax.device_count() < 2, reason="needs 2 devices")


def morton_neighbours(level: int, k: int):
  """`(senders, receivers, num_nodes)` of the `k`-hop neighbourhoods of mesh level `level`,
  nodes in the Morton order (as the sharded layout lays them out), sorted by receiver."""
  mesh = icosahedron.mesh_hierarchy(level)[-1]
  senders, receivers = neighbourhoods.k_hop_edges(neighbourhoods.mesh_adjacency(mesh), k)
  num_nodes = len(mesh.vertices)
  position = np.empty(num_nodes, np.int32)
  position[partition_lib.morton_order(mesh.vertices)] = np.arange(num_nodes)
  senders, receivers = position[senders], position[receivers]
  order = np.lexsort((senders, receivers))
  return senders[order], receivers[order], num_nodes


# --- the mask --------------------------------------------------------------------------

def test_neighbour_mask_tiles_hold_the_edges_and_padding_attends_to_itself():
  senders, receivers, n = morton_neighbours(3, 1)  # 642 nodes: 6 x 6 tiles of 128
  # Two padding edges (receiver n), as a partitioned edge set has.
  mask = splash_attention.NeighbourMask(np.append(senders, [0, 0]),
                                        np.append(receivers, [n, n]), n)
  size = mask.shape[0]
  assert size == 768
  dense = np.zeros((size, size), bool)
  dense[receivers, senders] = True
  dense[np.arange(n, size), np.arange(n, size)] = True
  np.testing.assert_array_equal(mask[:, :], dense)
  np.testing.assert_array_equal(mask[128:256, 0:128], dense[128:256, 0:128])
  tiles = dense.reshape(6, 128, 6, 128).any(axis=(1, 3))
  assert mask.tile_fraction == pytest.approx(tiles.mean()) and 0 < mask.tile_fraction < 1
  with pytest.raises(IndexError, match="whole 128 x 128 tiles"):
    mask[0:100, 0:128]  # noqa: B018
  with pytest.raises(ValueError, match="sorted by receiver"):
    splash_attention.NeighbourMask(senders, receivers[::-1], n)


def test_the_mask_is_the_same_object_for_the_same_edges():
  senders, receivers, n = morton_neighbours(2, 1)
  one, two = (splash_attention.NeighbourMask(senders, receivers, n) for _ in range(2))
  assert one == two and hash(one) == hash(two)
  assert one != splash_attention.NeighbourMask(senders[:-1], receivers[:-1], n)


# --- attention -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sparse_problem():
  """Level 3, 2 hops, Morton order: tiles without an edge, which the kernel skips."""
  senders, receivers, n = morton_neighbours(3, 2)
  mask = splash_attention.splash_mask(senders, receivers, n, interpret=True)
  assert np.any(np.asarray(mask.backward.block_mask) == 0)  # skipped tiles
  rng = np.random.default_rng(0)
  # Large logits: a softmax without its maximum subtracted would overflow.
  inputs = [jnp.asarray(5 * rng.standard_normal((n, 3, 8)), jnp.float32) for _ in range(3)]
  return senders, receivers, mask, inputs


def test_splash_attention_equals_attention_from_the_edges(sparse_problem):
  senders, receivers, mask, inputs = sparse_problem
  cotangent = jnp.asarray(np.random.default_rng(1).standard_normal(inputs[0].shape),
                          jnp.float32)

  def splash(*qkv):
    return splash_attention.splash_attention(*qkv, mask)

  def edges(*qkv):
    return neighbour_attention(*qkv, senders, receivers)

  expected = edges(*inputs)
  np.testing.assert_allclose(jax.jit(splash)(*inputs), expected, rtol=1e-5,
                             atol=1e-5 * float(np.abs(expected).max()))
  grads = [jax.jit(jax.grad(lambda *a, f=f: jnp.sum(f(*a) * cotangent), argnums=(0, 1, 2)))(
      *inputs) for f in (splash, edges)]
  for g, r in zip(*grads):
    np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4 * float(np.abs(r).max()))


def test_bfloat16_inputs_round_as_the_edge_path(sparse_problem):
  """Both take bfloat16 q, k, v, compute in float32 and round the output to bfloat16 (the
  edge path where the transformer block casts it)."""
  senders, receivers, mask, inputs = sparse_problem
  inputs = [x.astype(jnp.bfloat16) for x in inputs]
  attended = jax.jit(lambda *a: splash_attention.splash_attention(*a, mask))(*inputs)
  from_edges = neighbour_attention(*inputs, senders, receivers)
  assert attended.dtype == jnp.bfloat16 and from_edges.dtype == jnp.float32
  exact = from_edges.astype(jnp.bfloat16).astype(jnp.float32)
  # Within one bfloat16 rounding of each other (float32 sums in another order).
  np.testing.assert_allclose(attended.astype(jnp.float32), exact, rtol=2 ** -7, atol=1e-3)


# --- the model ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def problem():
  """The transformer's problem of test_transformer.py, with and without the splash mask."""
  constants, batch, params = synthetic_problem(small_config(**EDGES), POINTS, batch_size=2,
                                               seed=3)
  with_mask = setup.with_masks(specs_lib.from_config(small_config(**SPLASH)).model,
                               constants.graphs)
  assert not constants.graphs.masks and "mesh_neighbours" in with_mask.masks
  return (constants, constants._replace(graphs=with_mask), batch, perturbed(params, 4),
          setup.node_positions(specs_lib.from_config(small_config()).model, POINTS))


@pytest.fixture(scope="module")
def reference(problem):
  constants, _, batch, params, _ = problem
  return jax.jit(loss_and_grad_fn(small_config(**EDGES), constants, batch))(params)


SPLASH_VARIANTS = {
    "plain": SPLASH,
    # 3 blocks: a group of 2 plus a remainder of 1, each group recomputed in the backward.
    "processor_every_2_dots": dict(SPLASH, remat_mesh_gnn=True, mesh_remat_every=2,
                                   remat_policy="dots_saveable"),
    "all_three_names": dict(SPLASH, **ALL_STAGES, remat_policy=NAMES),
}


@pytest.mark.parametrize("name", SPLASH_VARIANTS)
def test_the_model_with_splash_attention_equals_it_with_edges(name, problem, reference):
  _, constants, batch, params, _ = problem
  config = small_config(**SPLASH_VARIANTS[name])
  assert_same(jax.jit(loss_and_grad_fn(config, constants, batch))(params), reference)


@two_devices
def test_on_the_devices_in_the_morton_order_and_made_once(problem, reference, monkeypatch):
  """The train path: the layout makes the mask for its node order (Morton), once; the
  step, over 2 data shards, never makes one."""
  constants, _, batch, params, positions = problem
  config = small_config(**SPLASH)
  layout = sharded_layout(config, constants, positions, 2, 1, "all_gather")
  mask = layout.partitioned.graphs.masks["mesh_neighbours"]
  assert mask.forward.block_mask.shape[0] == 1  # the shard axis
  assert dict(mask.options)["interpret"]  # on the CPU (the only platform with 2 devices here)

  def refuse(*args, **kwargs):
    raise AssertionError("a splash mask made in the step")

  monkeypatch.setattr(splash_attention.splash, "make_splash_mha", refuse)
  assert_same(sharded_loss_and_grads(config, layout, constants, batch, params), reference)


@two_devices
def test_an_fgn_trained_as_weathernext2_on_the_devices():
  """WeatherNext 2's training: the CRPS of 2 members, one per data shard, over a 2-step
  rollout differentiated step by step (`train.remat_rollout`'s custom VJP)."""
  def config(**model):
    config = fgn_config("transformer", **model)
    config.data.target_steps = 2
    return config_lib.validate(config)

  constants, batch, params = synthetic_problem(config(), POINTS, batch_size=2, seed=3)
  params = spread_members(params)
  reference = jax.jit(loss_and_grad_fn(config(), constants, batch))(params)
  splash = config(**SPLASH)
  layout = sharded_layout(splash, constants, setup.node_positions(
      specs_lib.from_config(splash).model, POINTS), 2, 1, "all_gather")
  assert "mesh_neighbours" in layout.partitioned.graphs.masks
  assert_same(sharded_loss_and_grads(splash, layout, constants, ensemble.members_on_rows(batch),
                                     params, loss="crps", members_on_data=2, remat_steps=True),
              reference)


# --- where it runs -----------------------------------------------------------------------

def test_auto_is_splash_on_one_tpu_graph_shard_and_edges_elsewhere():
  kind = lambda attention, platform, shards: mesh_transformer.attention_kind(
      specs_lib.from_config(small_config(transformer_attention=attention)).model, platform,
      shards)
  assert [kind("auto", "tpu", 1), kind("auto", "tpu", 2), kind("auto", "cpu", 1),
          kind("auto", "gpu", 1)] == ["splash", "edges", "edges", "edges"]
  assert [kind("edges", "tpu", 1), kind("splash", "cpu", 1)] == ["edges", "splash"]
  with pytest.raises(UserError, match="'splash' runs with the graph on one device, not over 2"):
    kind("splash", "tpu", 2)


def test_auto_on_a_tpu_makes_a_compiled_kernels_mask_and_none_over_graph_shards(problem):
  """The masks a TPU layout gets (made here, not run): the kernel compiled, not
  interpreted; with the graph over 2 devices none, so the model attends from the edges."""
  graphs = problem[0].graphs
  auto = specs_lib.from_config(small_config()).model
  mask = setup.with_masks(auto, graphs, "tpu").masks["mesh_neighbours"]
  assert not dict(mask.options)["interpret"] and mask.num_nodes == 162
  assert setup.with_masks(auto, graphs, "tpu", graph_shards=2).masks == {}
  assert setup.with_masks(auto, graphs, "cpu").masks == {}


@two_devices
def test_splash_over_graph_shards_is_refused(problem):
  constants, _, _, _, positions = problem
  with pytest.raises(UserError, match="'splash' runs with the graph on one device"):
    sharded_layout(small_config(**SPLASH), constants, positions, 1, 2, "all_gather")


def test_splash_without_its_mask_says_what_makes_it(problem):
  constants, _, batch, params, _ = problem
  with pytest.raises(ValueError, match="needs the graphs' splash mask of mesh_neighbours"):
    jax.eval_shape(loss_and_grad_fn(small_config(**SPLASH), constants, batch), params)


def test_config_errors_are_one_line():
  with pytest.raises(UserError, match=r"^Invalid config: model.transformer_attention='flash', "
                     r"expected one of \('auto', 'edges', 'splash'\)\.$"):
    small_config(transformer_attention="flash")
  config = small_config(**SPLASH)
  config.mesh.graph = 4
  with pytest.raises(UserError, match=r"^Invalid config: .*'splash' runs with the graph on "
                     r"one device, not mesh.graph=4[^\n]*$"):
    config_lib.validate(config)
