"""The encoder's and decoder's fused edge steps (`wnscale.model.fused_encoder_decoder`) equal the
XLA ones."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from wnscale.graphs.features import EDGE_FEATURES
from wnscale.graphs import receiver_blocks
from wnscale.model import aggregation, blocks, fused_encoder_decoder
from wnscale.model.graphcast import EncoderDecoderEdges


def _edge_set(kind: str, num_receivers: int, num_senders: int, rng):
  """`(senders [E], receivers as the XLA model takes them, receivers as the kernel takes
  them, features [E, EDGE_FEATURES] float32)` of a decoder's edges (3 per receiver,
  slot-major; the kernel's blocks of 16 receivers, the last running past the arrays'
  ends) or an encoder's (0 to 15 per
  receiver, sorted by receiver, a padding edge last; the kernel's `SenderBlocks` of 16
  sender rows (a bfloat16 tile's), the last running past the table's end, a block's
  edges in several kernel blocks of 128 slots, receivers picked from lists as long as the
  block hears)."""
  if kind == "decoder":
    k = 3
    senders = rng.integers(0, num_senders, k * num_receivers)
    return senders, aggregation.FixedInDegree(k), k, _features(k * num_receivers, rng)
  receivers = np.repeat(np.arange(num_receivers), rng.integers(0, 16, num_receivers))
  senders = rng.integers(0, num_senders, len(receivers) + 1)
  receivers = np.concatenate([receivers, [num_receivers]])
  features = _features(len(senders), rng)
  blocks = receiver_blocks.sender_blocks(senders, receivers, features, num_senders,
                                         num_receivers, block_rows=16)
  assert blocks.slots == 128 and set(blocks.window) == {0, 1}
  assert np.max(np.bincount(blocks.window)) >= 2
  return senders, jnp.asarray(receivers, jnp.int32), blocks, features


def _features(num_edges: int, rng):
  return jnp.asarray(rng.standard_normal((num_edges, EDGE_FEATURES)), jnp.float32)


# Plain and noise-conditioned norms in float32; the float32 products in one bfloat16 pass, as
# the kernels make them on a TPU at its default precision (here forced on the CPU's
# interpreter); and bfloat16 activations.
@pytest.mark.parametrize("kind", ["decoder", "encoder"])
@pytest.mark.parametrize("conditioned, products, dtype", [
    (False, "float32", jnp.float32), (True, "float32", jnp.float32),
    (True, "bfloat16", jnp.float32), (False, "float32", jnp.bfloat16)])
def test_edge_sums_equal_messages_and_sum(kind, conditioned, products, dtype, monkeypatch):
  """The summed messages of an edge set, by one kernel per block of receivers (Pallas's
  interpreter on a CPU; `_edge_set`'s decoder and encoder layouts, the decoder's senders
  picked from each block's list, `KernelSenders`; the encoder's by `SenderBlocks`), equal
  `EncoderDecoderEdges`' messages summed by `aggregation.sum_to_receivers` in float32:
  values, and gradients of every parameter (a noise-conditioned norm's too), of the
  projected senders and of the projected receivers. Rounded to
  bfloat16 (activations or products), as close as XLA's own bfloat16 model is."""
  num_receivers, latent, edge_size, conditioning_size = 37, 16, 8, 3
  num_senders = 21 if kind == "encoder" else 11
  # The same parameters (float32) in either activation dtype.
  module = lambda dtype: EncoderDecoderEdges(
      latent, edge_size, conditioning_size=conditioning_size if conditioned else 0,
      dtype=dtype, rngs=nnx.Rngs(0))
  graphdef = lambda dtype: nnx.split(module(dtype))[0]
  _, state = nnx.split(module(jnp.float32))
  rng = np.random.default_rng(0)
  # Parameters away from their initial values, so scales, offsets and the conditioned
  # norm's weights matter.
  state = jax.tree.map(lambda x: x + 0.3 * rng.standard_normal(x.shape).astype(x.dtype), state)
  conditioning = (jnp.asarray(rng.standard_normal(conditioning_size), jnp.float32)
                  if conditioned else None)
  array = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  senders, receivers, kernel_receivers, features = _edge_set(kind, num_receivers,
                                                             num_senders, rng)
  senders = jnp.asarray(senders, jnp.int32)
  sender_table, receiver_table = array(num_senders, latent), array(num_receivers, latent)
  weights = array(num_receivers, latent)

  def loss(fused, dtype, state, sender_table, receiver_table):
    edges = nnx.merge(graphdef(dtype), state)
    sender_table, receiver_table = sender_table.astype(dtype), receiver_table.astype(dtype)
    if fused:
      interaction = edges.interaction
      params = (edges.embedder.kernel_params(conditioning, dtype),
                interaction.edge_mlp.kernel_params(conditioning, dtype))
      epsilon = interaction.edge_mlp.norm.epsilon
      if kind == "decoder":
        k = kernel_receivers
        sums = fused_encoder_decoder.decoder_edge_sums(
            *params, features.reshape(k, num_receivers, -1),
            receiver_blocks.kernel_senders(np.asarray(senders), k, block_rows=16),
            sender_table, receiver_table, epsilon)
      else:
        sums = fused_encoder_decoder.encoder_edge_sums(
            *params, sender_table, receiver_table, kernel_receivers, epsilon)
    else:
      messages = edges(features, senders, receivers, sender_table, receiver_table, conditioning)
      sums = aggregation.sum_to_receivers(messages, receivers, num_receivers)
    assert sums.shape == (num_receivers, latent) and sums.dtype == jnp.float32
    return jnp.sum(jnp.tanh(sums) * weights), sums

  arguments = (state, sender_table, receiver_table)
  run = lambda fused, dtype: jax.jit(jax.value_and_grad(
      functools.partial(loss, fused, dtype), argnums=(0, 1, 2), has_aux=True))(*arguments)
  (_, want_sums), want = run(False, jnp.float32)
  paths = [jax.tree_util.keystr(path) for path, _ in
           jax.tree_util.tree_flatten_with_path(want)[0]]

  def assert_close(result, rtol, relative_atol):
    (_, sums), grads = result
    for name, got, expected in zip(["sums"] + paths, [sums] + jax.tree.leaves(grads),
                                   [want_sums] + jax.tree.leaves(want), strict=True):
      np.testing.assert_allclose(got, expected, rtol=rtol, err_msg=name,
                                 atol=relative_atol * float(np.abs(expected).max()))

  if products == "float32" and dtype == jnp.float32:
    assert_close(run(True, dtype), rtol=1e-5, relative_atol=2e-6)
    return
  if products == "bfloat16":
    # The float32 products in one bfloat16 pass: the same function to bfloat16's rounding
    # (8 bits), a few percent of the largest gradient after two MLPs' backward passes.
    in_float32 = run(True, dtype)[0][1]
    monkeypatch.setattr(aggregation, "float32_products", lambda platform: products)
    fused = run(True, dtype)
    assert not np.array_equal(fused[0][1], in_float32)
    assert_close(fused, rtol=5e-2, relative_atol=3e-2)
    return
  # bfloat16 activations: each result as far from the float32 one as XLA's bfloat16 model's
  # (relative to the largest value: a small bias gradient summed over the edges can be a few
  # percent off in either), within twice that.
  expected = dict(zip(["sums"] + paths, [want_sums] + jax.tree.leaves(want), strict=True))
  error = lambda result: {
      name: float(np.max(np.abs(got - expected[name])) / np.abs(expected[name]).max())
      for name, got in zip(expected, [result[0][1]] + jax.tree.leaves(result[1]))
      if np.abs(expected[name]).max() > 0}  # not the node MLP's: no gradient here
  xla, fused = error(run(False, dtype)), error(run(True, dtype))
  assert max(xla.values()) < 0.1 and 0 < max(fused.values()) and len(fused) > 10
  for name, bound in xla.items():
    assert fused[name] <= 2 * bound + 2e-3, (name, fused[name], bound)


@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_edge_sums_under_vmap(kind):
  """Under the model's batch `vmap` (a grid axis more for the kernels) each example's sums
  and gradients are its own, the parameters' gradients summed over its own blocks only."""
  num_receivers, features, edge_size, latent = 37, EDGE_FEATURES, 8, 16
  num_senders = 21 if kind == "encoder" else 11
  rng = np.random.default_rng(0)
  array = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  mlp_params = lambda inputs, hidden, outputs: (
      array(inputs, hidden), array(hidden), array(hidden, outputs), array(outputs),
      array(outputs), array(outputs))
  embed_params, edge_params = mlp_params(features, edge_size, edge_size), mlp_params(
      edge_size, latent, latent)
  senders_, _, receivers, edge_features = _edge_set(kind, num_receivers, num_senders, rng)
  batch = (array(2, num_senders, latent), array(2, num_receivers, latent),
           array(2, num_receivers, latent))

  def edge_sums(*args):
    if kind == "decoder":
      k = receivers
      senders = receiver_blocks.kernel_senders(senders_, k, block_rows=16)
      return fused_encoder_decoder.decoder_edge_sums(
          *args[:2], edge_features.reshape(k, num_receivers, -1), senders, *args[2:],
          epsilon=1e-5)
    return fused_encoder_decoder.encoder_edge_sums(*args[:2], *args[2:], receivers,
                                                   epsilon=1e-5)

  def gradients(embed_params, edge_params, senders, receiver_table, weights):
    loss = lambda *args: jnp.sum(jnp.tanh(edge_sums(*args)) * weights)
    return jax.grad(loss, argnums=(0, 1, 2, 3))(embed_params, edge_params, senders,
                                                receiver_table)

  batched = jax.jit(jax.vmap(gradients, in_axes=(None, None, 0, 0, 0)))(
      embed_params, edge_params, *batch)
  for example in range(2):
    alone = jax.jit(gradients)(embed_params, edge_params, *(x[example] for x in batch))
    for got, want in zip(jax.tree.leaves(batched), jax.tree.leaves(alone), strict=True):
      # Summed in another order: float32 rounding, relative to the largest value.
      np.testing.assert_allclose(got[example], want, rtol=1e-5,
                                 atol=2e-6 * float(np.abs(want).max()))


@pytest.mark.parametrize("kind", ["decoder", "decoder_kernel_senders", "encoder"])
def test_fused_sums_under_remat_and_row_blocks(kind):
  """`EncoderDecoderEdges.fused_sums` as the model runs it under remat: the decoder's in
  `map_row_blocks` (`model.grid_blocks`; each block under its own checkpoint, its rows' k
  slots `slot_major_row_blocks`' layout, 128 rows a block rounded up, the last padded),
  its senders by index (each edge its own entry of its kernel block's list,
  `kernel_senders_of`) or by each block's `KernelSenders` from the host (each kernel
  block's few senders); the encoder's (`SenderBlocks`) under `jax.checkpoint`; values and
  gradients equal
  the same kernels on the whole arrays without a checkpoint."""
  decoder = kind.startswith("decoder")
  num_receivers, latent, edge_size, num_blocks = 300 if decoder else 40, 16, 8, 3
  num_senders = 11 if decoder else 21
  module = EncoderDecoderEdges(latent, edge_size, dtype=jnp.float32, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(module)
  rng = np.random.default_rng(1)
  array = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  senders, fixed_in_degree, receiver_blocks_, features = _edge_set(
      "decoder" if decoder else kind, num_receivers, num_senders, rng)
  receivers = fixed_in_degree if decoder else receiver_blocks_
  senders = jnp.asarray(senders, jnp.int32)
  sender_table, receiver_table = array(num_senders, latent), array(num_receivers, latent)
  weights = array(num_receivers, latent)

  def sums(state, sender_table, receiver_table, blocked):
    edges = nnx.merge(graphdef, state)
    if not blocked:
      return edges.fused_sums(features, senders, receivers, sender_table, receiver_table)
    if kind == "encoder":
      return jax.checkpoint(lambda edges, *tables: edges.fused_sums(
          features, senders, receivers, *tables))(edges, sender_table, receiver_table)
    k = receivers.k
    by_block = lambda x: blocks.slot_major_row_blocks(x, k, num_blocks)
    fn = lambda edges, rows, features, senders, table: edges.fused_sums(
        features, senders, aggregation.FixedInDegree(k), table, rows)
    if kind == "decoder":
      return blocks.map_row_blocks(edges, fn, num_blocks, (receiver_table, by_block(features),
                                                           by_block(senders)), (sender_table,))
    rows = blocks.slot_major_row_blocks(np.asarray(senders), k, num_blocks).reshape(
        num_blocks, -1)
    kernel_senders = jax.tree.map(lambda *x: np.stack(x), *(
        receiver_blocks.kernel_senders(row, k, block_rows=32) for row in rows))
    assert kernel_senders.rows.shape[1:] == (4, 16)  # 4 kernel blocks, each <= 11 senders
    return blocks.map_row_blocks(edges, fn, num_blocks, (receiver_table, by_block(features)),
                                 (sender_table,), per_block=(kernel_senders,))

  def run(blocked):
    loss = lambda *args: jnp.sum(jnp.tanh(sums(*args, blocked)) * weights)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(state, sender_table,
                                                                 receiver_table)

  want, got = run(False), run(True)
  if decoder:  # 100 rows a block, rounded up to 128: the last block padded
    assert blocks.block_rows(num_receivers, num_blocks) == 128
  for got_leaf, want_leaf in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(got_leaf, want_leaf, rtol=1e-5,
                               atol=2e-6 * float(np.abs(want_leaf).max()))
