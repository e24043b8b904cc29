"""Message passing: the interaction network and edge-chunked aggregation.

One interaction-network step, GraphCast's (the reference's
`deep_typed_graph_net` with an `InteractionNetwork` and residuals):

  messages = edge_mlp([edges, sender_nodes[senders], receiver_nodes[receivers]])
  nodes'   = nodes + node_mlp([nodes, sum of messages over each receiver's edges])
  edges'   = edges + messages

The sum is over the *messages* (the edge MLP's outputs), not over the
residual-updated edges'. The encoder and decoder use only the node update (their
edges' are never read again); the processor carries edges' to the next layer.
WeatherNext 2's points-to-mesh encoder leaves the receiver out of the edge MLP
(`gather_from_receivers=False`).

The edge MLP's first layer is linear in each part of its input, so the sender
and receiver parts are projected once per *node* and gathered per edge:
`W [e, s, r] = W_e e + (W_s s)[senders] + (W_r r)[receivers]`. Same function,
but no `[num_edges, 3 * latent]` concatenation and a third of the edge matmuls.

Messages are summed in float32 whatever the activation dtype, then cast back:
a bfloat16 sum over a receiver's edges (dozens per mesh node in the encoder)
would lose the low bits of every term. The reference does this in its encoder;
wnscale does it in every stage (the cost is one cast per edge).

Edges are sorted by receiver (an invariant of `wnscale.graphs.Graphs`), so the
aggregation is a sorted segment sum, or, on an edge set laid out in receiver
blocks, matrix products (`wnscale.model.aggregation`): `receivers` below is
either. Where sender rows come from is the caller's business: on one device the
sender table is the sender node array; under `shard_map` it is the array
extended by a collective exchange.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from wnscale.model import aggregation, fused_edges, low_memory_layers, remat_policies
from wnscale.model.blocks import map_row_blocks, slot_major_row_blocks, split_rows
from wnscale.model.manual_axis_types import vary_like
from wnscale.model.mlp import MLP, mlp_flops


class InteractionNetwork(nnx.Module):
  """One message-passing step; node latents and messages are `[num_*, latent_size]`.

  Edge latents are `[num_edges, edge_size]` (default `latent_size`; narrower
  ones need no edge residual: a one-step encoder or decoder).
  """

  def __init__(self, latent_size: int, *, edge_size: int | None = None,
               conditioning_size: int = 0, gather_from_receivers: bool = True, dtype,
               rngs: nnx.Rngs):
    linear = lambda: low_memory_layers.Linear(latent_size, latent_size, use_bias=False, dtype=dtype,
                                 rngs=rngs)
    self.edge_mlp = MLP(edge_size or latent_size, latent_size, latent_size,
                        conditioning_size=conditioning_size, dtype=dtype, rngs=rngs)
    self.sender_projection = linear()  # edge_mlp's first-layer weights for the sender part
    # ... and for the receiver part (None: the edge MLP does not see the receiver)
    self.receiver_projection = linear() if gather_from_receivers else None
    self.node_mlp = MLP(2 * latent_size, latent_size, latent_size,
                        conditioning_size=conditioning_size, dtype=dtype, rngs=rngs)

  def project_senders(self, nodes):
    """`[N, D]` sender nodes' contribution to the edge MLP's first layer."""
    return self.sender_projection(nodes)

  def project_receivers(self, nodes):
    """`[N, D]` receiver nodes' contribution to the edge MLP's first layer (None: none)."""
    return None if self.receiver_projection is None else self.receiver_projection(nodes)

  def messages(self, edges, projected_senders, projected_receivers, senders, receivers,
               conditioning=None):
    """`[E, D]` messages: the edge MLP on each edge's latent, sender and receiver.

    The new edge latents are `edges + messages`; the nodes sum the messages.

    Args:
      edges: `[E, D]` edge latents.
      projected_senders, projected_receivers: `project_senders(sender table)` and
        `project_receivers(receiver table)`, `[num_senders, D]` / `[num_receivers, D]`.
      senders: `[E]` row indices into the sender table, or its sender windows
        (`aggregation.gather_senders`).
      receivers: `[E]` row indices into the receiver table, or its receiver blocks
        (`aggregation.Receivers`).
      conditioning: an FGN's `[conditioning_size]` norm conditioning, else None.
    """
    hidden = self.edge_mlp.hidden(edges) + aggregation.gather_senders(projected_senders,
                                                                      senders)
    if projected_receivers is not None:
      hidden = hidden + aggregation.gather(projected_receivers, receivers)
    return checkpoint_name(self.edge_mlp.finish(hidden, conditioning), remat_policies.EDGE_LATENTS)

  def fused_edge_step(self, edges, projected_senders, senders, projected_receivers,
                      blocks, conditioning=None, write_over_edges=True):
    """`(summed messages [num_receivers, D] float32, edges + messages [E, D])`: what
    `messages` and their sum compute, as one kernel per receiver block
    (`wnscale.model.fused_edges`); the arguments as `messages` takes them, the receivers
    as their `blocks`; `write_over_edges` as `fused_edges.edge_step` takes it."""
    return fused_edges.edge_step(self.edge_mlp.kernel_params(conditioning, edges.dtype), edges,
                                 projected_senders, senders, projected_receivers, blocks,
                                 self.edge_mlp.norm.epsilon, write_over_edges)

  def update_nodes(self, nodes, summed_messages, conditioning=None):
    """`[N, D]` receiver latents after the residual node MLP on their summed messages."""
    summed_messages = checkpoint_name(summed_messages, remat_policies.MESSAGES)
    updated = nodes + self.node_mlp(jnp.concatenate([nodes, summed_messages], -1),
                                    conditioning)
    return checkpoint_name(updated, remat_policies.NODE_LATENTS)


def interaction_flops(edges: int, senders: int, receivers: int, latent_size: int,
                      edge_size: int) -> float:
  """Matmul FLOPs of one `InteractionNetwork`'s messages: the edge MLP, node-level projections."""
  return (mlp_flops(edges, edge_size, latent_size, latent_size)
          + 2.0 * (senders + receivers) * latent_size * latent_size)


def scan_edge_blocks(block_fn: Callable, blocked: tuple, shared: tuple, num_receivers: int,
                     width: int):
  """Runs `block_fn` over blocks of edges, each under a `jax.checkpoint` that saves nothing.

  Only one block's `[edges / num_blocks, D]` intermediates are ever alive, in the
  forward pass and in the backward recomputation; the price is one more forward
  pass of the block's work. One block runs as it is (no scan, no checkpoint).

  Args:
    block_fn: `(*one block of blocked, *shared) -> (sums [num_receivers, width] float32,
      per-edge outputs (a pytree of [edges / num_blocks, ...]))`.
    blocked: pytrees of arrays `[num_blocks, ...]`, e.g. `[num_blocks, edges / num_blocks,
      ...]` (see `blocks.split_rows`).
    shared: arrays every block sees whole (e.g. the node tables).

  Returns:
    `(sums over all blocks [num_receivers, width] float32, per-edge outputs stacked
    [num_blocks, edges / num_blocks, ...])`. The running sum stays float32 across
    blocks too.
  """
  if jax.tree.leaves(blocked)[0].shape[0] == 1:
    sums, per_edge = block_fn(*jax.tree.map(lambda array: array[0], blocked), *shared)
    return sums, jax.tree.map(lambda x: x[None], per_edge)
  block = jax.checkpoint(block_fn, policy=jax.checkpoint_policies.nothing_saveable)

  def add_block(total, rows):
    sums, per_edge = block(*rows, *shared)
    return total + sums, per_edge

  initial = vary_like(jnp.zeros((num_receivers, width), jnp.float32),
                      *jax.tree.leaves((blocked, shared)))
  return jax.lax.scan(add_block, initial, blocked)


def sum_edge_messages(edge_model: nnx.Module, edge_fn: Callable, edge_features, senders,
                      receivers, sender_table, receiver_table, num_receivers: int,
                      num_chunks: int, conditioning=None, sender_mask=None) -> jax.Array:
  """Computes per-edge messages with `edge_fn` and sums them per receiver, in blocks of edges.

  The edges are processed in `num_chunks` blocks, each under its own checkpoint
  when there are several (`scan_edge_blocks`). Padding edges point at receiver
  `num_receivers`, which the segment sum drops.

  Args:
    edge_model: module holding the parameters `edge_fn` uses.
    edge_fn: `(edge_model, features [e, F], senders [e], receivers [e], sender_table,
      receiver_table, conditioning) -> messages [e, D]`.
    edge_features: `[E, F]` static edge features.
    senders: `[E]` indices into the sender table, or their `SortedSenders` or `BlockSenders`
      (`aggregation.gather_senders`; `num_chunks` 1).
    receivers: `[E]` indices into the receiver table, or its `aggregation.FixedInDegree`
      (then the blocks are blocks of receiver rows, each with its rows' edges), or its
      `ReceiverBlocks` (sums and receiver rows by products; `num_chunks` 1).
    sender_table: `[num_senders, D]`; receiver_table: `[num_receivers, D]` or None
      (for an interaction network: the projected node tables).
    conditioning: passed on to `edge_fn` (an FGN's norm conditioning, or None).
    sender_mask: `[num_senders]` 1 or 0 per sender table row: a row of 0 sends no
      message (a modality's point with no value at that time); None: all send.

  Returns:
    `[num_receivers, D]` summed messages (summed in float32, in the messages' dtype).
  """
  if isinstance(receivers, aggregation.FixedInDegree):
    return _sum_fixed_in_degree(edge_model, edge_fn, edge_features, senders, receivers,
                                sender_table, receiver_table, num_receivers, num_chunks,
                                conditioning, sender_mask)
  graphdef, state = nnx.split(edge_model)

  def messages(features, senders, receivers, state, sender_table, receiver_table,
               conditioning, sender_mask):
    per_edge = edge_fn(nnx.merge(graphdef, state), features, senders, receivers,
                       sender_table, receiver_table, conditioning)
    if sender_mask is not None:
      per_edge = per_edge * sender_mask[aggregation.sender_indices(senders)][:, None]
    return aggregation.sum_to_receivers(per_edge, receivers, num_receivers), None

  shared = (state, sender_table, receiver_table, conditioning, sender_mask)
  if isinstance(receivers, aggregation.ReceiverBlocks):
    if num_chunks != 1:
      raise ValueError("Edges in receiver blocks are summed in one chunk.")
    total, _ = messages(edge_features, senders, receivers, *shared)
    return total.astype(sender_table.dtype)
  blocked = (split_rows(edge_features, num_chunks), split_rows(senders, num_chunks),
             split_rows(receivers, num_chunks, fill=num_receivers))
  total, _ = scan_edge_blocks(messages, blocked, shared, num_receivers, sender_table.shape[-1])
  return total.astype(sender_table.dtype)


def _sum_fixed_in_degree(edge_model, edge_fn, edge_features, senders, receivers, sender_table,
                         receiver_table, num_receivers, num_chunks, conditioning, sender_mask):
  """`sum_edge_messages` of a `FixedInDegree` edge set: in `num_chunks` blocks of receiver
  rows (`blocks.map_row_blocks`), each with its rows' k edges, a sum by reshape."""
  k = receivers.k
  # With no receiver table, a width-0 one carries the row count through the blocks.
  rows = (receiver_table if receiver_table is not None
          else jnp.zeros((num_receivers, 0), sender_table.dtype))

  def sum_rows(model, rows, features, senders, sender_table, conditioning, sender_mask):
    per_edge = edge_fn(model, features, senders, receivers, sender_table,
                       rows if rows.shape[-1] else None, conditioning)
    if sender_mask is not None:
      per_edge = per_edge * sender_mask[aggregation.sender_indices(senders)][:, None]
    return aggregation.sum_to_receivers(per_edge, receivers, rows.shape[0])

  blocked = (rows, edge_features, senders)
  if num_chunks > 1:
    blocked = (rows, *(slot_major_row_blocks(x, k, num_chunks) for x in blocked[1:]))
  sums = map_row_blocks(edge_model, sum_rows, num_chunks, blocked,
                        (sender_table, conditioning, sender_mask))
  return sums.astype(sender_table.dtype)
