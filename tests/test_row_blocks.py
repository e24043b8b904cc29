"""Work over blocks of rows (`wnscale.model.blocks`): the blocks' sizes and the equality of
block-by-block work with the work on the whole arrays."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from wnscale.model import blocks


@pytest.mark.parametrize("num_rows, num_blocks, rows", [
    (1038240, 8, 129792),  # 0.25 deg grid: 129,780 rounded up to a multiple of 128
    (1038240, 12, 86528),  # 86,520 rounded up
    (65160, 8, 8192),  # 1 deg
    (1000, 4, 256),
    (25, 3, 9),  # 128 rows a block would leave the last none of its own: not rounded
    (20, 8, 3),
    (37, 1, 37)])
def test_block_rows(num_rows, num_blocks, rows):
  assert blocks.block_rows(num_rows, num_blocks) == rows
  assert rows * num_blocks >= num_rows


class _Scale(nnx.Module):
  def __init__(self):
    self.weight = nnx.Param(jnp.asarray(2.0))


@pytest.mark.parametrize("channel_major", [False, True])
@pytest.mark.parametrize("num_rows, num_blocks", [(1000, 4), (25, 3), (61, 7)])
def test_map_row_blocks_equals_the_whole(num_rows, num_blocks, channel_major):
  """Block by block (rows per block `block_rows`, rounded to 128 or not), with a node array,
  a channel-major one and per-block slot-major edges (`slot_major_row_blocks`), the outputs
  (node-major or channel-major) and the gradients equal the work on the whole arrays."""
  k = 3
  rng = np.random.default_rng(0)
  nodes = jnp.asarray(rng.standard_normal((num_rows, 5)), jnp.float32)
  columns = jnp.asarray(rng.standard_normal((2, num_rows)), jnp.float32)
  edges = jnp.asarray(rng.standard_normal((k * num_rows, 5)), jnp.float32)  # slot-major

  def fn(module, nodes, edges, columns):
    by_slot = edges.reshape(k, nodes.shape[0], -1).sum(0)  # each row's k edges
    return module.weight[...] * jnp.tanh(nodes + by_slot) * columns[:, :1]

  def loss(state, nodes, edges, num_blocks):
    module = nnx.merge(graphdef, state)
    if num_blocks == 1:
      out = fn(module, nodes, edges, columns.T)
    else:
      out = blocks.map_row_blocks(
          module, fn, num_blocks, (nodes, blocks.slot_major_row_blocks(edges, k, num_blocks)),
          columns=(columns,), channel_major=channel_major)
      if channel_major:
        assert out.shape == (5, num_rows)
        out = out.T
    assert out.shape == (num_rows, 5)
    return jnp.sum(out ** 2), out

  graphdef, state = nnx.split(_Scale())
  run = lambda n: jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True),
                          static_argnums=3)(state, nodes, edges, n)
  (_, want), want_grads = run(1)
  (_, got), got_grads = run(num_blocks)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  # 1 - tanh^2 near tanh = 1 cancels: its rounding differs with XLA's fusions, so the
  # tolerance is relative to each gradient's scale.
  for got_grad, want_grad in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads),
                                 strict=True):
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-5,
                               atol=1e-5 * np.abs(want_grad).max())
