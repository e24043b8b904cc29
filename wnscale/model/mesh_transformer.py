"""WeatherNext 2's processor: a transformer on the mesh, attending within k-hop neighbourhoods.

`model.transformer_layers` pre-norm blocks, parameters stacked on a leading layer
axis (like the mesh GNN's), then a final layer norm:

  x = x + attention_output(attention(norm(x)))     # over each node's neighbours
  x = x + ffw_down(gelu(ffw_up(norm(x))))

Attention is multi-head, over each mesh node's k-hop neighbourhood on the
finest mesh (itself included), computed one of two ways (`model.transformer_attention`,
resolved by `attention_kind`): from the explicit neighbour edge list
`graphs.edges["mesh_neighbours"]` (`wnscale.model.sparse_attention`), or, where
the graphs carry that edge set's block-sparse mask (`graphs.masks`, made on
the host by `attention_masks`), by the splash attention kernel
(`wnscale.model.splash_attention`): the same numbers. Queries,
keys and values have no bias; the two output projections start at zero, so a
fresh block is the identity (WeatherNext 2's released initialisation: the
other matrices are truncated normal with variance 2 / (layers * fan_in)).
There is no positional encoding: positions reach the mesh latents through the
encoder (the mesh embedder's node features and the grid-to-mesh edge
features), as in WeatherNext 2.

Under `shard_map` keys and values are computed on the local rows, then the
exchange brings the rows of remote neighbours (`exchange("mesh_neighbours", rows)`).
The splash kernel runs with the graph on one device only (its rows are then the
whole mesh); with the graph over several, "auto" computes from the edges.
Shapes: mesh latents `[num_mesh_nodes, width]`, `width = latent_size`.
"""

from __future__ import annotations

import logging

import jax
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from wnscale.errors import UserError
from wnscale.graphs.edge_sets import EdgeSetSpec, KHopNeighbours
from wnscale.graphs.graph import Graphs
from wnscale.model import low_memory_layers, norm, remat, remat_policies
from wnscale.model.processor_interface import ProcessorCost, ProcessorImplementation
from wnscale.model.sparse_attention import neighbour_attention
from wnscale.model.splash_attention import SplashMask, splash_attention, splash_mask
from wnscale.specs import ModelSpec

def attention_kind(m: ModelSpec, platform: str, graph_shards: int) -> str:
  """"edges" or "splash": how the transformer's attention runs on `platform` (a JAX
  platform name, "tpu", "cpu", ...) with the graph over `graph_shards` devices.

  Raises:
    UserError: "splash" with the graph over several devices.
  """
  attention = m.processor.attention
  if attention == "auto":
    return "splash" if platform == "tpu" and graph_shards == 1 else "edges"
  if attention == "splash" and graph_shards > 1:
    raise UserError(f"model.transformer_attention='splash' runs with the graph on one "
                    f"device, not over {graph_shards} (mesh.graph); 'auto' or 'edges' "
                    "compute it from the edges there.")
  return attention


def attention_masks(m: ModelSpec, graphs: Graphs, platform: str, graph_shards: int) -> dict:
  """The masks the attention reads (`Graphs.masks`): `{"mesh_neighbours": SplashMask}`
  where it runs as splash (`attention_kind`), else none. Host work, once per layout.

  Args:
    graphs: the graphs of one shard (`graph_shards` 1: all of them) in their node order.
  """
  kind = attention_kind(m, platform, graph_shards)
  logging.info("Transformer attention: %s (model.transformer_attention=%r, %s, %d graph "
               "shard(s))", kind, m.processor.attention, platform, graph_shards)
  if kind == "edges":
    return {}
  edges = graphs.edges["mesh_neighbours"]
  return {"mesh_neighbours": splash_mask(edges.senders, edges.receivers,
                                         graphs.num_nodes("mesh"), interpret=platform != "tpu")}


class TransformerBlock(nnx.Module):
  """One pre-norm block: neighbourhood attention, then a feed-forward layer, each residual."""

  def __init__(self, width: int, heads: int, ffw_size: int, num_layers: int, *,
               conditioning_size: int = 0, dtype, rngs: nnx.Rngs):
    self.heads = heads
    init = nnx.initializers.variance_scaling(2.0 / num_layers, "fan_in", "truncated_normal")
    zeros = nnx.initializers.zeros_init()
    linear = lambda n_in, n_out, kernel_init, **kw: low_memory_layers.Linear(
        n_in, n_out, kernel_init=kernel_init, dtype=dtype, rngs=rngs, **kw)
    self.attention_norm = norm.layer_norm(width, conditioning_size, rngs=rngs)
    self.query = linear(width, width, init, use_bias=False)
    self.key_value = linear(width, 2 * width, init, use_bias=False)
    self.attention_output = linear(width, width, zeros)
    self.ffw_norm = norm.layer_norm(width, conditioning_size, rngs=rngs)
    self.ffw_up = linear(width, ffw_size, init)
    self.ffw_down = linear(ffw_size, width, zeros)

  def __call__(self, nodes, neighbours, exchange, edges_per_block: int = 0,
               conditioning=None, mask: SplashMask | None = None):
    """`[N, width] -> [N, width]`; `neighbours` is the (shard-local) attention `EdgeSet`;
    `conditioning` the `[conditioning_size]` vector the norms are conditioned on, else None; `mask` its
    `SplashMask` to attend by the splash kernel, else None (from the edges)."""
    num_nodes, width = nodes.shape
    head_shape = (self.heads, width // self.heads)
    normed = self.attention_norm(nodes, conditioning)
    queries = self.query(normed).reshape((num_nodes,) + head_shape) * head_shape[1] ** -0.5
    # Keys and values of the local rows; the exchange adds the remote neighbours' rows.
    keys_values = exchange("mesh_neighbours", self.key_value(normed))
    keys, values = (x.reshape((-1,) + head_shape) for x in
                    (keys_values[:, :width], keys_values[:, width:]))
    if mask is None:
      attended = neighbour_attention(queries, keys, values, neighbours.senders,
                                     neighbours.receivers, edges_per_block)
    else:
      attended = splash_attention(queries, keys, values, mask)
    attended = self.attention_output(attended.reshape(num_nodes, width).astype(nodes.dtype))
    nodes = nodes + checkpoint_name(attended, remat_policies.ATTENTION_OUTPUT)
    ffw = self.ffw_down(jax.nn.gelu(self.ffw_up(self.ffw_norm(nodes, conditioning))))
    return nodes + checkpoint_name(ffw, remat_policies.FFW_OUTPUT)


class MeshTransformer(nnx.Module):
  """The transformer processor (`model.processor = 'transformer'`)."""

  def __init__(self, spec: ModelSpec, *, dtype, rngs: nnx.Rngs):
    self.spec = spec
    own, width = spec.processor, spec.latent_size

    @nnx.split_rngs(splits=own.layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def stacked_layers(rngs):
      return TransformerBlock(width, own.heads, own.ffw_size, own.layers,
                              conditioning_size=spec.conditioning_size, dtype=dtype, rngs=rngs)

    self.layers = stacked_layers(rngs)
    self.final_norm = norm.layer_norm(width, spec.conditioning_size, rngs=rngs)
    self.policy = remat_policies.resolve_policy(spec.remat.remat_policy).checkpoint_policy

  def __call__(self, graphs: Graphs, mesh, exchange, conditioning=None):
    """`[num_mesh_nodes, width]` mesh latents after the blocks and the final norm."""
    spec, neighbours = self.spec, graphs.edges.get("mesh_neighbours")
    attention = spec.processor.attention
    if neighbours is None:
      raise ValueError("The transformer processor needs the edge set mesh_neighbours (the "
                       "k-hop neighbour lists; setup.graphs_for_grid adds them).")
    mask = None if attention == "edges" else graphs.masks.get("mesh_neighbours")
    if mask is None and attention == "splash":
      raise ValueError("model.transformer_attention='splash' needs the graphs' splash mask of "
                       "mesh_neighbours (graphs.masks; setup.with_masks and the sharded "
                       "layout make it).")
    graphdef, stacked_state = nnx.split(self.layers)

    def one_layer(nodes, layer_state):
      return nnx.merge(graphdef, layer_state)(nodes, neighbours, exchange,
                                              spec.processor.edges_per_block, conditioning,
                                              mask)

    mesh = remat.scan_layers(one_layer, mesh, stacked_state,
                             checkpoint=spec.remat.remat_mesh_gnn,
                             every=spec.remat.mesh_remat_every, policy=self.policy,
                             scan=spec.remat.scan_layers,
                             saved=spec.remat.mesh_layers_saved)
    return self.final_norm(mesh, conditioning)


def _attention_flops(m: ModelSpec, graphs: Graphs) -> float:
  """One block's attention over the neighbour edges: q.k and weights x values."""
  return 4.0 * graphs.num_edges("mesh_neighbours") * m.latent_size


def _cost(m: ModelSpec, graphs: Graphs) -> ProcessorCost:
  d, mesh, own = m.latent_size, graphs.num_nodes("mesh"), m.processor
  # Projections q, k, v, output; feed-forward; attention.
  block = 2.0 * mesh * (4 * d * d + 2 * d * own.ffw_size)
  attention = _attention_flops(m, graphs)
  blocks = own.layers * attention if own.edges_per_block else 0.0
  return ProcessorCost(own.layers * (block + attention), blocks, own.layers, mesh)


# Its entry's implementation (`wnscale.model.processors.PROCESSORS`): attention reads the
# k-hop neighbour edges of the finest mesh.
IMPLEMENTATION = ProcessorImplementation(
    MeshTransformer,
    edge_sets=lambda m: {"mesh_neighbours": EdgeSetSpec(
        "mesh", "mesh", KHopNeighbours(m.processor.k_hop), features=False)},
    masks=attention_masks, cost=_cost)
