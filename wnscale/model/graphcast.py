"""The GraphCast network: encoder (grid -> mesh), processor (mesh), decoder (mesh -> grid).

Shapes (per example; the batch is vmapped):
  grid inputs   [num_grid_nodes, input_channels]
  grid latents  [num_grid_nodes, latent]     mesh latents [num_mesh_nodes, latent]
  edge latents  [num_edges, latent]          outputs      [num_grid_nodes, output_channels]

Rematerialization follows the `model` config (see `wnscale.model.remat`):
each stage may run under `jax.checkpoint` with the named policy; the processor
is a scan over groups of `mesh_remat_every` layers, one checkpoint per group;
the encoder and decoder edges are processed in `edge_chunks` blocks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from wnscale.graphs.build import EdgeSet, Graphs
from wnscale.graphs.features import EDGE_FEATURES, NODE_FEATURES
from wnscale.model import remat
from wnscale.model.blocks import map_row_blocks
from wnscale.model.message_passing import InteractionNetwork, sum_by_receiver, sum_edge_messages
from wnscale.model.mlp import MLP
from wnscale.model.varying import vary_like

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class LocalExchange:
  """Sender tables on one device: each edge set's senders index the node array itself.

  Under `shard_map`, an exchange extends the local node array with the remote
  rows the local edges need (see `wnscale.sharding`); the model code is the same.
  """

  def grid_to_mesh(self, grid_latents):
    return grid_latents

  def mesh(self, mesh_latents):
    return mesh_latents

  def mesh_to_grid(self, mesh_latents):
    return mesh_latents


class EncoderDecoderEdges(nnx.Module):
  """Embeds a bipartite edge set's static features and computes its messages once."""

  def __init__(self, latent_size: int, *, dtype, rngs: nnx.Rngs):
    self.embedder = MLP(EDGE_FEATURES, latent_size, latent_size, dtype=dtype, rngs=rngs)
    self.interaction = InteractionNetwork(latent_size, dtype=dtype, rngs=rngs)

  def __call__(self, features, senders, receivers, projected_senders, projected_receivers):
    """`[E, D]` messages (the updated edge latents are never needed: one step only)."""
    return self.interaction.messages(self.embedder(features), projected_senders,
                                     projected_receivers, senders, receivers)


class GraphCast(nnx.Module):
  """Encoder-processor-decoder GNN predicting normalized residuals on the grid."""

  def __init__(self, input_channels: int, output_channels: int,
               config: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    self.config = config
    latent = config.latent_size
    dtype = DTYPES[config.dtype]
    self.dtype = dtype
    mlp = lambda n_in, n_out, **kw: MLP(n_in, latent, n_out, dtype=dtype, rngs=rngs, **kw)
    # Encoder.
    self.grid_embedder = mlp(input_channels + NODE_FEATURES, latent)
    self.mesh_embedder = mlp(NODE_FEATURES, latent)
    self.grid_to_mesh_edges = EncoderDecoderEdges(latent, dtype=dtype, rngs=rngs)
    self.grid_to_mesh_grid_mlp = mlp(latent, latent)
    # Processor: parameters stacked along a leading [message_passing_steps] axis.
    self.mesh_edge_embedder = mlp(EDGE_FEATURES, latent)

    @nnx.split_rngs(splits=config.message_passing_steps)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def stacked_layers(rngs):
      return InteractionNetwork(latent, dtype=dtype, rngs=rngs)

    self.mesh_layers = stacked_layers(rngs)
    # Decoder.
    self.mesh_to_grid_edges = EncoderDecoderEdges(latent, dtype=dtype, rngs=rngs)
    self.output_mlp = mlp(latent, output_channels, layer_norm=False)
    self.policy = remat.resolve_policy(config.remat_policy)

  def __call__(self, graphs: Graphs, grid_input_parts, exchange=LocalExchange()):
    """`grid inputs [batch, num_grid_nodes, input_channels] -> [batch, num_grid_nodes,
    output_channels]`.

    `grid_input_parts`: arrays `[batch, num_grid_nodes, channels_i]` whose
    channels, concatenated, are the grid inputs (concatenated block by block:
    the whole `[num_grid_nodes, input_channels]` array never exists).
    `graphs` holds the (possibly shard-local) index and feature arrays; outputs
    are float32 whatever the compute dtype.
    """
    def one_example(inputs):
      # Named scopes label the stages' buffers in XLA's reports (planner.buffers).
      with jax.named_scope("encoder"):
        grid, mesh = self.encode(graphs, inputs, exchange)
      with jax.named_scope("processor"):
        mesh = self.process(graphs.mesh, mesh, exchange)
      with jax.named_scope("decoder"):
        return self.decode(graphs.mesh_to_grid, grid, mesh, exchange)

    return jax.vmap(one_example)(tuple(grid_input_parts))

  def encode(self, graphs: Graphs, grid_input_parts, exchange):
    """Embeds grid and mesh nodes and passes messages grid -> mesh once.

    The grid-node work (the embedder, the sender projection, the grid MLP) runs
    in `grid_blocks` blocks of grid nodes, each under its own checkpoint.
    """
    config = self.config

    def embed_grid(model, node_features, *parts):
      """Grid latents `[rows, D]` and their sender projection for the edges."""
      grid = model.grid_embedder(jnp.concatenate(
          [part.astype(self.dtype) for part in parts + (node_features,)], -1))
      return grid, model.grid_to_mesh_edges.interaction.project_senders(grid)

    def update_grid(model, grid):
      return grid + model.grid_to_mesh_grid_mlp(grid)

    def encoder(model, graphs, grid_input_parts):
      grid, projected_grid = map_row_blocks(
          model, embed_grid, config.grid_blocks,
          (graphs.grid_node_features,) + tuple(grid_input_parts))
      mesh = model.mesh_embedder(graphs.mesh_node_features.astype(self.dtype))
      edges, interaction = graphs.grid_to_mesh, model.grid_to_mesh_edges.interaction
      # Projected before the exchange: only local rows are multiplied.
      messages = sum_edge_messages(
          model.grid_to_mesh_edges, EncoderDecoderEdges.__call__, edges.features,
          edges.senders, edges.receivers, exchange.grid_to_mesh(projected_grid),
          interaction.project_receivers(mesh), mesh.shape[0], config.edge_chunks)
      mesh = interaction.update_nodes(mesh, messages)
      grid = map_row_blocks(model, update_grid, config.grid_blocks, (grid,))
      return grid, mesh

    return remat.checkpointed(self, encoder, config.remat_grid_to_mesh_gnn,
                              self.policy)(graphs, tuple(grid_input_parts))

  def process(self, edges: EdgeSet, mesh, exchange):
    """`message_passing_steps` interaction networks on the multi-mesh."""
    config = self.config
    edge_latents = self.mesh_edge_embedder(edges.features.astype(self.dtype))
    graphdef, stacked_state = nnx.split(self.mesh_layers)

    def layers(carry, layer_states):
      """Applies the layers whose stacked parameters are `layer_states`."""
      def one_layer(carry, layer_state):
        mesh, edge_latents = carry
        layer = nnx.merge(graphdef, layer_state)
        messages = layer.messages(
            edge_latents, exchange.mesh(layer.project_senders(mesh)),
            layer.project_receivers(mesh), edges.senders, edges.receivers)
        mesh = layer.update_nodes(mesh, sum_by_receiver(messages, edges.receivers,
                                                        mesh.shape[0]))
        # The edge residual comes after the node update, which saw only the messages.
        return (mesh, edge_latents + messages), None

      return jax.lax.scan(one_layer, carry, layer_states)[0]

    carry = (vary_like(mesh, edge_latents), vary_like(edge_latents, mesh))
    steps = config.message_passing_steps
    if not config.remat_mesh_gnn:
      return layers(carry, stacked_state)[0]

    # One checkpoint per group of K layers: a scan over full groups, then the rest.
    # The group's input is tagged: a policy may keep it (in host memory, say).
    group = jax.checkpoint(
        lambda carry, states: layers(checkpoint_name(carry, remat.PROCESSOR_CARRY), states),
        policy=self.policy)
    per_group = min(config.mesh_remat_every, steps)
    num_groups, remainder = divmod(steps, per_group)
    grouped = jax.tree.map(
        lambda x: x[:num_groups * per_group].reshape((num_groups, per_group) + x.shape[1:]),
        stacked_state)
    carry, _ = jax.lax.scan(lambda c, s: (group(c, s), None), carry, grouped)
    if remainder:
      carry = group(carry, jax.tree.map(lambda x: x[num_groups * per_group:], stacked_state))
    return carry[0]

  def decode(self, edges: EdgeSet, grid, mesh, exchange):
    """Passes messages mesh -> grid once and reads out `[num_grid_nodes, output_channels]`.

    With `grid_blocks > 1` the whole decoder runs per block of grid nodes, each
    under its own checkpoint, with the block's own edges: the mesh-to-grid
    edges come `k` per grid node in grid-node order (GraphCast's graphs: 3,
    the corners of the node's mesh triangle), so a block of rows owns a block
    of edges and `edge_chunks` is not needed there.
    """
    config = self.config

    def decode_rows(model, grid, features, senders, receivers, sender_table, chunks):
      """Output `[rows, C]` of grid rows whose edges point at them (`receivers` < rows)."""
      interaction = model.mesh_to_grid_edges.interaction
      messages = sum_edge_messages(
          model.mesh_to_grid_edges, EncoderDecoderEdges.__call__, features, senders,
          receivers, sender_table, interaction.project_receivers(grid), grid.shape[0], chunks)
      grid = interaction.update_nodes(grid, messages)
      return model.output_mlp(grid).astype(jnp.float32)

    def decoder(model, grid, mesh):
      sender_table = exchange.mesh_to_grid(
          model.mesh_to_grid_edges.interaction.project_senders(mesh))
      if config.grid_blocks == 1:
        return decode_rows(model, grid, edges.features, edges.senders, edges.receivers,
                           sender_table, config.edge_chunks)
      blocked, rows = _receiver_blocks(edges, grid, config.grid_blocks)

      def decode_block(model, grid, features, senders, receivers, block, sender_table):
        return decode_rows(model, grid, features, senders, receivers - block[0] * rows,
                           sender_table, 1)

      return map_row_blocks(model, decode_block, config.grid_blocks, blocked,
                            (sender_table,))[:grid.shape[0]]

    return remat.checkpointed(self, decoder, config.remat_mesh_to_grid_gnn,
                              self.policy)(grid, mesh)


def _receiver_blocks(edges: EdgeSet, grid, num_blocks: int):
  """`(blocked arrays, rows per block)` for `map_row_blocks` over blocks of receivers.

  Grid rows are padded to `num_blocks * rows`; edges (`k` per row, in row
  order) to `k` times that, padding edges pointing past every block (dropped).
  Blocked: grid `[R', D]`, features `[k R', F]`, senders and receivers `[k R']`,
  block index `[num_blocks]`.
  """
  num_rows, num_edges = grid.shape[0], edges.senders.shape[0]
  if num_edges % num_rows:
    raise ValueError(
        f"model.grid_blocks > 1 needs the same number of mesh-to-grid edges for every "
        f"grid node, in grid-node order; {num_edges} edges for {num_rows} grid nodes.")
  per_row = num_edges // num_rows
  rows = -(-num_rows // num_blocks)
  padded_rows = rows * num_blocks
  pad = lambda x, fill: jnp.pad(x, [(0, per_row * (padded_rows - num_rows))]
                                + [(0, 0)] * (x.ndim - 1), constant_values=fill)
  blocked = (jnp.pad(grid, [(0, padded_rows - num_rows), (0, 0)]), pad(edges.features, 0),
             pad(edges.senders, 0), pad(edges.receivers, padded_rows),
             jnp.arange(num_blocks))
  return blocked, rows
