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


@pytest.mark.parametrize("conditioned", [False, True])
def test_decoder_edge_sums_equal_messages_and_sum(conditioned):
  """The summed messages of `k` edges per receiver, by one kernel per block of receivers
  (Pallas's interpreter on a CPU, 37 receivers in blocks of 16: padding rows), equal
  `EncoderDecoderEdges`' messages summed by `aggregation.sum_to_receivers`: values, and
  gradients of every parameter (a noise-conditioned norm's too), of the projected
  senders (through the gather) and of the projected receivers."""
  k, num_receivers, num_senders, latent, edge_size, conditioning_size = 3, 37, 11, 16, 8, 3
  edges = EncoderDecoderEdges(latent, edge_size,
                              conditioning_size=conditioning_size if conditioned else 0,
                              dtype=jnp.float32, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(edges)
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

  def loss(fused, state, sender_table, receiver_table):
    edges = nnx.merge(graphdef, state)
    if fused:
      interaction = edges.interaction
      sums = fused_decoder.decoder_edge_sums(
          fused_decoder.mlp_params(edges.embedder, conditioning, jnp.float32),
          fused_decoder.mlp_params(interaction.edge_mlp, conditioning, jnp.float32),
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
  gradient = lambda fused: jax.value_and_grad(functools.partial(loss, fused),
                                              argnums=(0, 1, 2), has_aux=True)
  (_, want_sums), want = gradient(False)(*arguments)
  (_, got_sums), got = jax.jit(gradient(True))(*arguments)
  np.testing.assert_allclose(got_sums, want_sums, rtol=1e-5, atol=1e-6)
  for path, g, w in zip(jax.tree_util.tree_flatten_with_path(want)[0],
                        jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * float(np.abs(w).max()),
                               err_msg=jax.tree_util.keystr(path[0]))
