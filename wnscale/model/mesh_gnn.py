"""GraphCast's processor: interaction networks on the multi-mesh.

`model.message_passing_steps` interaction networks, parameters stacked on a leading
layer axis; the mesh edge latents are embedded once from the static edge
features and carry over from step to step. Shapes: mesh latents
`[num_mesh_nodes, latent]`, edge latents `[num_mesh_edges, latent]`.

With `model.mesh_edge_chunks > 1` every step runs its edge MLP over that many
blocks of mesh edges, each under its own checkpoint (`scan_edge_blocks`): a
step's backward pass then keeps one block's edge activations, not four or so
`[num_mesh_edges, latent]` arrays per layer of a checkpointed group. The edge
latents are kept in blocks `[chunks, edges / chunks, latent]` through all steps.
With one chunk, the receiver side (each edge's receiver row, each receiver's
sum) is `model.aggregation`'s (`wnscale.model.aggregation`): by index, or by
matrix products on the mesh edges' receiver blocks, or ("fused") with the whole
edge step in one kernel per block (`wnscale.model.fused_edges`).
"""

from __future__ import annotations

from flax import nnx

from wnscale.graphs.features import EDGE_FEATURES
from wnscale.graphs.graph import Graphs
from wnscale.graphs.receiver_blocks import ReceiverBlocks
import jax

from wnscale.model import aggregation, remat, remat_policies
from wnscale.model.blocks import split_rows
from wnscale.model.manual_axis_types import vary_like
from wnscale.model.message_passing import (InteractionNetwork, interaction_flops,
                                           scan_edge_blocks)
from wnscale.model.mlp import MLP, mlp_flops
from wnscale.model.processor_interface import ProcessorCost, ProcessorImplementation
from wnscale.specs import ModelSpec


class MeshGNN(nnx.Module):
  """The interaction-network processor (`model.processor = 'interaction_network'`)."""

  def __init__(self, spec: ModelSpec, *, dtype, rngs: nnx.Rngs):
    self.spec = spec
    self.dtype = dtype
    latent = spec.latent_size
    conditioning = spec.conditioning_size  # 0: plain layer norms
    self.edge_embedder = MLP(EDGE_FEATURES, latent, latent, conditioning_size=conditioning,
                             dtype=dtype, rngs=rngs)

    @nnx.split_rngs(splits=spec.processor.message_passing_steps)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def stacked_layers(rngs):
      return InteractionNetwork(latent, conditioning_size=conditioning, dtype=dtype, rngs=rngs)

    self.layers = stacked_layers(rngs)
    self.policy = remat_policies.resolve_policy(spec.remat.remat_policy).checkpoint_policy

  def __call__(self, graphs: Graphs, mesh, exchange, conditioning=None):
    """`[num_mesh_nodes, latent]` mesh latents after the message-passing steps.

    `conditioning`: the `[conditioning_size]` vector the norms are conditioned on, else None.
    """
    spec, edges, num_mesh = self.spec, graphs.edges["mesh"], mesh.shape[0]
    chunks, method = spec.remat.mesh_edge_chunks, spec.processor.aggregation
    # Padding edges (a last block filled up) send from node 0 to no node: dropped.
    if chunks == 1:
      receivers = aggregation.receivers_of(edges, method)
      by_blocks = isinstance(receivers, ReceiverBlocks)
      # With receiver blocks, the senders by their windows (`aggregation.gather_senders`).
      senders, receivers = jax.tree.map(lambda x: x[None], (
          edges.sender_windows if by_blocks else edges.senders, receivers))
    else:
      by_blocks = False
      senders = split_rows(edges.senders, chunks)
      receivers = split_rows(edges.receivers, chunks, fill=num_mesh)
    fused = by_blocks and aggregation.resolve(method) == "fused"
    edge_latents = split_rows(
        self.edge_embedder(edges.features.astype(self.dtype), conditioning), chunks)
    graphdef, stacked_state = nnx.split(self.layers)

    def edge_block(edge_latents, senders, receivers, layer_state, sender_table,
                   receiver_table, conditioning):
      """One block's summed messages `[num_mesh, latent]` (float32) and updated edges."""
      layer = nnx.merge(graphdef, layer_state)
      if fused:
        # In a scan over the layers the old edges are copied into the stacked residuals
        # anyway; in a Python loop, written over, they would be copied for that alone.
        return layer.fused_edge_step(edge_latents, sender_table, senders, receiver_table,
                                     receivers, conditioning,
                                     write_over_edges=spec.remat.scan_layers)
      messages = layer.messages(edge_latents, sender_table, receiver_table, senders,
                                receivers, conditioning)
      # The edge residual comes after the node update, which saw only the messages.
      return (aggregation.sum_to_receivers(messages, receivers, num_mesh),
              edge_latents + messages)

    def one_layer(carry, layer_state):
      mesh, edge_latents = carry
      layer = nnx.merge(graphdef, layer_state)
      tables = (layer_state, exchange("mesh", layer.project_senders(mesh)),
                layer.project_receivers(mesh), conditioning)
      summed, edge_latents = scan_edge_blocks(edge_block, (edge_latents, senders, receivers),
                                              tables, num_mesh, mesh.shape[-1])
      return layer.update_nodes(mesh, summed.astype(mesh.dtype), conditioning), edge_latents

    carry = (vary_like(mesh, edge_latents), vary_like(edge_latents, mesh))
    return remat.scan_layers(one_layer, carry, stacked_state,
                             checkpoint=spec.remat.remat_mesh_gnn,
                             every=spec.remat.mesh_remat_every, policy=self.policy,
                             scan=spec.remat.scan_layers,
                             saved=spec.remat.mesh_layers_saved)[0]


def _cost(m: ModelSpec, graphs: Graphs) -> ProcessorCost:
  d, mesh, edges = m.latent_size, graphs.num_nodes("mesh"), graphs.num_edges("mesh")
  steps = m.processor.message_passing_steps
  forward = mlp_flops(edges, EDGE_FEATURES, d, d) + steps * (
      interaction_flops(edges, mesh, mesh, d, d) + mlp_flops(mesh, 2 * d, d, d))
  # With mesh edge blocks, each redoes its edge MLP (node projections stay outside).
  blocks = steps * mlp_flops(edges, d, d, d) if m.remat.mesh_edge_chunks > 1 else 0.0
  # The GNN carries its mesh-edge latents too.
  return ProcessorCost(forward, blocks, steps, mesh + edges)


# Its entry's implementation (`wnscale.model.processors.PROCESSORS`): no edge sets or masks
# beyond GraphCast's.
IMPLEMENTATION = ProcessorImplementation(MeshGNN, edge_sets=lambda m: {},
                                         masks=lambda *_: {}, cost=_cost)
