"""The decoder's fused edge step (`wnscale.model.fused_decoder`) equals the XLA one."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from wnscale.graphs.features import EDGE_FEATURES
from wnscale.model import aggregation, fused_decoder
from wnscale.model.graphcast import EncoderDecoderEdges


# Plain and noise-conditioned norms in float32; the float32 products in one bfloat16 pass, as
# the kernels make them on a TPU at its default precision (here forced on the CPU's
# interpreter); and bfloat16 activations.
@pytest.mark.parametrize("conditioned, products, dtype", [
    (False, "float32", jnp.float32), (True, "float32", jnp.float32),
    (True, "bfloat16", jnp.float32), (False, "float32", jnp.bfloat16)])
def test_decoder_edge_sums_equal_messages_and_sum(conditioned, products, dtype, monkeypatch):
  """The summed messages of `k` edges per receiver, by one kernel per block of receivers
  (Pallas's interpreter on a CPU; 37 receivers in blocks of 16, the last running past the
  arrays' ends), equal `EncoderDecoderEdges`' messages summed by
  `aggregation.sum_to_receivers` in float32: values, and gradients of every parameter (a
  noise-conditioned norm's too), of the projected senders (through the gather) and of the
  projected receivers. Rounded to bfloat16 (activations or products), as close as XLA's
  own bfloat16 model is."""
  k, num_receivers, num_senders, latent, edge_size, conditioning_size = 3, 37, 11, 16, 8, 3
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
  features = array(k * num_receivers, EDGE_FEATURES)  # slot-major: edge j * R + r
  senders = jnp.asarray(rng.integers(0, num_senders, k * num_receivers), jnp.int32)
  sender_table, receiver_table = array(num_senders, latent), array(num_receivers, latent)
  weights = array(num_receivers, latent)

  def loss(fused, dtype, state, sender_table, receiver_table):
    edges = nnx.merge(graphdef(dtype), state)
    sender_table, receiver_table = sender_table.astype(dtype), receiver_table.astype(dtype)
    if fused:
      interaction = edges.interaction
      sums = fused_decoder.decoder_edge_sums(
          edges.embedder.kernel_params(conditioning, dtype),
          interaction.edge_mlp.kernel_params(conditioning, dtype),
          features.reshape(k, num_receivers, -1),
          sender_table[senders].reshape(k, num_receivers, -1), receiver_table,
          interaction.edge_mlp.norm.epsilon, block_rows=16)
    else:
      receivers = aggregation.FixedInDegree(k)
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
  # Rounded operands: the same function to bfloat16's rounding (8 bits), about 1% of the
  # largest gradient after two MLPs' backward passes, as XLA's bfloat16 model is.
  rounded = dict(rtol=5e-2, relative_atol=3e-2)
  if products == "bfloat16":
    in_float32 = run(True, dtype)[0][1]
    monkeypatch.setattr(aggregation, "float32_products", lambda platform: products)
    fused = run(True, dtype)
    assert not np.array_equal(fused[0][1], in_float32)
  else:  # bfloat16 activations
    assert_close(run(False, dtype), **rounded)
    fused = run(True, dtype)
  assert_close(fused, **rounded)


def test_decoder_edge_sums_under_vmap():
  """Under the model's batch `vmap` (a grid axis more for the kernels) each example's sums
  and gradients are its own, the parameters' gradients summed over its own blocks only."""
  k, num_receivers, features, edge_size, latent = 3, 37, EDGE_FEATURES, 8, 16
  rng = np.random.default_rng(0)
  array = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)
  mlp_params = lambda inputs, hidden, outputs: (
      array(inputs, hidden), array(hidden), array(hidden, outputs), array(outputs),
      array(outputs), array(outputs))
  embed_params, edge_params = mlp_params(features, edge_size, edge_size), mlp_params(
      edge_size, latent, latent)
  edge_features = array(k, num_receivers, features)
  batch = (array(2, k, num_receivers, latent), array(2, num_receivers, latent),
           array(2, num_receivers, latent))

  def gradients(embed_params, edge_params, sender_rows, receiver_table, weights):
    loss = lambda *args: jnp.sum(jnp.tanh(fused_decoder.decoder_edge_sums(
        *args[:2], edge_features, *args[2:], epsilon=1e-5, block_rows=16)) * weights)
    return jax.grad(loss, argnums=(0, 1, 2, 3))(embed_params, edge_params, sender_rows,
                                                receiver_table)

  batched = jax.jit(jax.vmap(gradients, in_axes=(None, None, 0, 0, 0)))(
      embed_params, edge_params, *batch)
  for example in range(2):
    alone = jax.jit(gradients)(embed_params, edge_params, *(x[example] for x in batch))
    for got, want in zip(jax.tree.leaves(batched), jax.tree.leaves(alone), strict=True):
      np.testing.assert_allclose(got[example], want, rtol=1e-5, atol=1e-6)
