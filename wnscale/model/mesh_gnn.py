"""GraphCast's processor: interaction networks on the multi-mesh.

`message_passing_steps` interaction networks, parameters stacked on a leading
layer axis; the mesh edge latents are embedded once from the static edge
features and carry over from step to step. Shapes: mesh latents
`[num_mesh_nodes, latent]`, edge latents `[num_mesh_edges, latent]`.
"""

from __future__ import annotations

import ml_collections
from flax import nnx

from wnscale.graphs.build import Graphs
from wnscale.graphs.features import EDGE_FEATURES
from wnscale.model import remat
from wnscale.model.message_passing import InteractionNetwork, sum_by_receiver
from wnscale.model.mlp import MLP
from wnscale.model.varying import vary_like


class MeshGNN(nnx.Module):
  """The interaction-network processor (`model.processor = 'interaction_network'`)."""

  def __init__(self, config: ml_collections.ConfigDict, *, dtype, rngs: nnx.Rngs):
    self.config = config
    self.dtype = dtype
    latent = config.latent_size
    conditioning = config.noise_channels  # 0: plain layer norms
    self.edge_embedder = MLP(EDGE_FEATURES, latent, latent, conditioning_size=conditioning,
                             dtype=dtype, rngs=rngs)

    @nnx.split_rngs(splits=config.message_passing_steps)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def stacked_layers(rngs):
      return InteractionNetwork(latent, conditioning_size=conditioning, dtype=dtype, rngs=rngs)

    self.layers = stacked_layers(rngs)
    self.policy = remat.resolve_policy(config.remat_policy)

  def __call__(self, graphs: Graphs, mesh, exchange):
    """`[num_mesh_nodes, latent]` mesh latents after the message-passing steps."""
    config, edges = self.config, graphs.mesh
    edge_latents = self.edge_embedder(edges.features.astype(self.dtype))
    graphdef, stacked_state = nnx.split(self.layers)

    def one_layer(carry, layer_state):
      mesh, edge_latents = carry
      layer = nnx.merge(graphdef, layer_state)
      messages = layer.messages(
          edge_latents, exchange.mesh(layer.project_senders(mesh)),
          layer.project_receivers(mesh), edges.senders, edges.receivers)
      mesh = layer.update_nodes(mesh, sum_by_receiver(messages, edges.receivers,
                                                      mesh.shape[0]))
      # The edge residual comes after the node update, which saw only the messages.
      return mesh, edge_latents + messages

    carry = (vary_like(mesh, edge_latents), vary_like(edge_latents, mesh))
    return remat.scan_layers(one_layer, carry, stacked_state, checkpoint=config.remat_mesh_gnn,
                             every=config.mesh_remat_every, policy=self.policy)[0]
