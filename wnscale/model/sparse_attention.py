"""Multi-head attention of each node over its neighbours, from an explicit edge list.

Each edge (sender -> receiver) lets the receiver attend to the sender: the
receiver's query meets the sender's key, and the softmax over a receiver's
edges weighs their values. Edges are sorted by receiver (as every edge set in
wnscale), so the softmax is a sorted segment max and segment sum; nothing but
gathers and segment sums, so it runs on any backend, and under `shard_map` the
sender table is whatever the exchange built (local rows and received ones),
exactly as for message passing.

Logits, softmax and the weighted sum are float32 whatever the inputs' dtype
(WeatherNext 2 upcasts its attention to float32 too). The per-receiver
maximum subtracted before `exp` is held constant under differentiation: the
softmax does not depend on it, it only keeps `exp` from overflowing.

With `edges_per_block`, the edges are processed in blocks by a scan, each
block under its own `jax.checkpoint` that saves nothing, so only one block's
`[edges, heads, head_size]` gathers are alive at a time; the softmax is then
accumulated across blocks as in flash attention (a running maximum, and the
running sums rescaled when it grows).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from wnscale.model.blocks import split_rows
from wnscale.model.manual_axis_types import vary_like

# "Minus infinity" for masked logits: finite, so exp(NEGATIVE - max) is 0 without inf - inf.
NEGATIVE = -1e30


def _block(queries, keys, values, senders, receivers, running_max):
  """One block of edges: `(max [N, H], sum of weights [N, H], weighted values [N, H, Dv])`.

  Weights are `exp(logit - max)` with `max` the running maximum updated by this
  block's logits; padding edges (receiver `N`) get weight 0.
  """
  num_receivers = queries.shape[0]
  valid = receivers < num_receivers
  rows = jnp.minimum(receivers, num_receivers - 1)  # padding edges read a real row, then drop
  logits = jnp.einsum("ehd,ehd->eh", queries[rows], keys[senders],
                      preferred_element_type=jnp.float32)
  logits = jnp.where(valid[:, None], logits, NEGATIVE)
  block_max = jax.ops.segment_max(logits, receivers, num_segments=num_receivers,
                                  indices_are_sorted=True)
  new_max = jax.lax.stop_gradient(jnp.maximum(running_max, block_max))
  weights = jnp.exp(logits - new_max[rows])  # [E, H]
  sums = jax.ops.segment_sum(weights, receivers, num_segments=num_receivers,
                             indices_are_sorted=True)
  weighted = jax.ops.segment_sum(weights[..., None] * values[senders].astype(jnp.float32),
                                 receivers, num_segments=num_receivers, indices_are_sorted=True)
  return new_max, sums, weighted


def neighbour_attention(queries, keys, values, senders, receivers,
                        edges_per_block: int = 0) -> jax.Array:
  """Softmax attention of each receiver over the senders of its edges.

  Args:
    queries: `[num_receivers, heads, key_size]`, already scaled (by key_size^-0.5).
    keys: `[num_senders, heads, key_size]` sender table.
    values: `[num_senders, heads, value_size]` sender table.
    senders, receivers: `[num_edges]` indices into the sender table and the
      queries, sorted by receiver; receiver `num_receivers` marks a padding edge.
    edges_per_block: edges per block (see the module docstring); 0: all at once.

  Returns:
    `[num_receivers, heads, value_size]` float32; 0 for a receiver without edges.
  """
  num_receivers, heads = queries.shape[:2]
  start = (jnp.full((num_receivers, heads), NEGATIVE, jnp.float32),
           jnp.zeros((num_receivers, heads), jnp.float32),
           jnp.zeros((num_receivers, heads, values.shape[-1]), jnp.float32))
  num_edges = senders.shape[0]
  if not edges_per_block or edges_per_block >= num_edges:
    _, sums, weighted = _block(queries, keys, values, senders, receivers, start[0])
  else:
    num_blocks = -(-num_edges // edges_per_block)
    blocks = (split_rows(senders, num_blocks), split_rows(receivers, num_blocks, num_receivers))
    block = jax.checkpoint(_block, policy=jax.checkpoint_policies.nothing_saveable)

    def add_block(carry, edges):
      running_max, sums, weighted = carry
      new_max, block_sums, block_weighted = block(queries, keys, values, *edges, running_max)
      rescale = jnp.exp(running_max - new_max)  # <= 1: earlier sums, relative to the new max
      return (new_max, sums * rescale + block_sums,
              weighted * rescale[..., None] + block_weighted), None

    start = tuple(vary_like(x, queries, keys, values, senders) for x in start)
    (_, sums, weighted), _ = jax.lax.scan(add_block, start, blocks)
  return weighted / jnp.where(sums > 0, sums, 1.0)[..., None]
