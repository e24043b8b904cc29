"""The GraphCast network: encoder (grid -> mesh), processor (mesh), decoder (mesh -> grid).

The processor is the `processors.PROCESSORS` entry `model.processor` names:
GraphCast's interaction networks on the multi-mesh (`mesh_gnn.MeshGNN`) or
WeatherNext 2's transformer with attention within k-hop neighbourhoods of the
finest mesh (`mesh_transformer.MeshTransformer`); encoder and decoder are the
same for both.

Shapes (per example; the batch is vmapped):
  grid inputs   channel-major parts [channels_i, num_grid_nodes] (the batch's layout),
                made node-major by the encoder block by block
  grid latents  [num_grid_nodes, latent]     mesh latents [num_mesh_nodes, latent]
  edge latents  [num_edges, edge_latent]     outputs      [num_grid_nodes, output_channels]

Modalities (`PointModality`, from `data.modalities`): named point sets beside the
grid (e.g. stations), on the same mesh. Each has its own embedder (its inputs,
their presence masks and its points' node features), and, with inputs, its own
encoder edges `<name>_to_mesh`; the mesh latents take the sum of every
modality's messages, the grid's included, in one encoder step (the grid
encoder's node MLP). With targets it has its own decoder edges `mesh_to_<name>`
and output MLP, predicting a change on the grid's predicted state at its points
(`forecast.point_first_guess`), as the grid's outputs are a change on its inputs.
A missing input (NaN) enters as 0 with a mask channel of 0; a point missing every
input sends no message. Their parameters are made after all of the grid model's, so a model
without modalities is the grid model, parameter for parameter.

Rematerialization follows the `ModelSpec` (see `wnscale.model.remat`):
each stage may run under `jax.checkpoint` with the named policy; the processor
is a scan over groups of `mesh_remat_every` layers, one checkpoint per group;
the encoder and decoder edges are processed in `edge_chunks` blocks.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from wnscale.graphs.features import EDGE_FEATURES, NODE_FEATURES
from wnscale.graphs.graph import EdgeSet, Graphs
from wnscale.model import aggregation, processors, remat, remat_policies
from wnscale.model.blocks import map_row_blocks, slot_major_row_blocks
from wnscale.model.dtypes_and_activations import DTYPES, OUTPUT_ACTIVATIONS
from wnscale.model.message_passing import InteractionNetwork, sum_edge_messages
from wnscale.model.mlp import MLP
from wnscale.specs import ModelSpec

class PointModality(NamedTuple):
  """A modality as the network sees it (`setup.build_model` makes it from a `ModalitySpec`).

  Attributes:
    name: its node set (its point inputs' key, its edge sets' prefix or suffix).
    input_channels: embedder inputs per point and step: values and masks (0: none).
    output_channels: predicted channels per point (0: not a target).
  """

  name: str
  input_channels: int
  output_channels: int


@jax.tree_util.register_pytree_node_class
class LocalExchange:
  """The sender table of an edge set on one device: its senders index the rows themselves.

  Under `shard_map`, an exchange (`wnscale.sharding.exchange`) extends the
  local rows with the remote rows the local edges need; the model code is the same.
  A pytree without leaves, as those are pytrees.
  """

  def __call__(self, edge_set: str, rows):
    del edge_set
    return rows

  def tree_flatten(self):
    return (), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls()


local_exchange = LocalExchange()


class EncoderDecoderEdges(nnx.Module):
  """Embeds a bipartite edge set's static features and computes its messages once.

  Edge latents are `edge_size` wide (hidden layer too); messages `latent_size`.
  """

  def __init__(self, latent_size: int, edge_size: int, *, conditioning_size: int = 0,
               gather_from_receivers: bool = True, dtype, rngs: nnx.Rngs):
    self.embedder = MLP(EDGE_FEATURES, edge_size, edge_size,
                        conditioning_size=conditioning_size, dtype=dtype, rngs=rngs)
    self.interaction = InteractionNetwork(latent_size, edge_size=edge_size,
                                          conditioning_size=conditioning_size,
                                          gather_from_receivers=gather_from_receivers,
                                          dtype=dtype, rngs=rngs)

  def __call__(self, features, senders, receivers, projected_senders, projected_receivers,
               conditioning=None):
    """`[E, D]` messages (the updated edge latents are never needed: one step only)."""
    return self.interaction.messages(self.embedder(features, conditioning), projected_senders,
                                     projected_receivers, senders, receivers, conditioning)


class GraphCast(nnx.Module):
  """Encoder-processor-decoder network predicting normalized residuals on the grid.

  Args:
    input_channels: grid input channels per node (global inputs included).
    output_channels: predicted channels per grid node.
    spec: the model's settings (`wnscale.specs.ModelSpec`), kept in the graphdef.
    global_channels: global inputs per example (no position: e.g. year
      progress) that the mesh embedder sees too, broadcast to every mesh node.
    output_activations: `(output channel, activation name, offset)` triples: that
      channel of the normalized outputs becomes `activation(output + offset)`
      (`OUTPUT_ACTIVATIONS`; WeatherNext 2's cyclone probability: sigmoid, -2).
    modalities: `PointModality`s beside the grid; each adds `<name>_embedder`,
      with inputs `<name>_to_mesh_edges`, with targets `<name>_mlp` (the
      points' update, as the grid's), `mesh_to_<name>_edges` and
      `<name>_output_mlp`.

  With `spec.noise_channels > 0` the network is WeatherNext 2's functional
  generative network (FGN): each call takes a standard-normal noise vector
  per example (one ensemble member), a bias-free linear layer embeds it
  (`[noise_channels] -> [noise_channels]`), and every layer norm of encoder,
  processor and decoder is conditioned on that embedding (`norm.layer_norm`),
  passed to each stage as its `conditioning` argument. With
  `spec.denoiser.noise_frequencies > 0` it is the network of GenCast's denoiser
  (`wnscale.model.denoiser`): the layer norms are conditioned the same way on a
  vector each call is given outright (`conditioning`, the noise-level encoding),
  and there is no noise embedding.
  """

  def __init__(self, input_channels: int, output_channels: int,
               spec: ModelSpec, *, global_channels: int = 0,
               output_activations: tuple = (), modalities: tuple = (), rngs: nnx.Rngs):
    self.spec = spec
    latent = spec.latent_size
    dtype = DTYPES[spec.dtype]
    self.dtype = dtype
    conditioning = spec.conditioning_size  # 0: the deterministic model, plain norms
    mlp = lambda n_in, n_out, **kw: MLP(n_in, latent, n_out, conditioning_size=conditioning,
                                        dtype=dtype, rngs=rngs, **kw)
    edge_size = spec.edge_size
    edges = lambda **kw: EncoderDecoderEdges(latent, edge_size, conditioning_size=conditioning,
                                             dtype=dtype, rngs=rngs, **kw)
    # Encoder.
    self.grid_embedder = mlp(input_channels + NODE_FEATURES, latent)
    self.mesh_embedder = mlp(NODE_FEATURES + global_channels, latent)
    self.grid_to_mesh_edges = edges(
        gather_from_receivers=spec.grid_to_mesh_gather_from_receivers)
    self.grid_to_mesh_grid_mlp = mlp(latent, latent)
    # Processor: parameters stacked along a leading layer axis.
    self.processor = processors.implementation(spec).module(spec, dtype=dtype, rngs=rngs)
    # Decoder.
    self.mesh_to_grid_edges = edges()
    self.output_mlp = mlp(latent, output_channels, layer_norm=False)
    # Made last, so a deterministic model's other parameters draw the same random numbers.
    self.noise_embedding = (nnx.Linear(conditioning, conditioning, use_bias=False, rngs=rngs)
                            if spec.noise_channels else None)
    self.output_activations = tuple(output_activations)
    self.policy = remat_policies.resolve_policy(spec.remat.remat_policy).checkpoint_policy
    # After everything else: the grid model's parameters draw what they draw without.
    self.modalities = tuple(PointModality(*m) for m in modalities)
    for m in self.modalities:
      setattr(self, f"{m.name}_embedder", mlp(m.input_channels + NODE_FEATURES, latent))
      if m.input_channels:
        setattr(self, f"{m.name}_to_mesh_edges", edges(
            gather_from_receivers=spec.grid_to_mesh_gather_from_receivers))
      if m.output_channels:
        setattr(self, f"{m.name}_mlp", mlp(latent, latent))
        setattr(self, f"mesh_to_{m.name}_edges", edges())
        setattr(self, f"{m.name}_output_mlp", mlp(latent, m.output_channels,
                                                  layer_norm=False))

  def __call__(self, graphs: Graphs, grid_input_parts, exchange=local_exchange,
               global_inputs: jax.Array | None = None, noise: jax.Array | None = None,
               point_inputs: dict | None = None, conditioning: jax.Array | None = None):
    """`grid inputs [batch, input_channels, num_grid_nodes] -> [batch, num_grid_nodes,
    output_channels]` (`predict`'s grid outputs)."""
    return self.predict(graphs, grid_input_parts, exchange, global_inputs, noise,
                        point_inputs, conditioning)[0]

  def predict(self, graphs: Graphs, grid_input_parts, exchange=local_exchange,
              global_inputs: jax.Array | None = None, noise: jax.Array | None = None,
              point_inputs: dict | None = None, conditioning: jax.Array | None = None):
    """`(grid outputs [batch, num_grid_nodes, output_channels], {modality: [batch,
    num_points, output_channels]} of the target modalities)`.

    `grid_input_parts`: channel-major arrays `[batch, channels_i, num_grid_nodes]`
    (the batch's layout) whose channels, concatenated, are the grid inputs; the
    encoder makes them node-major and concatenates them block by block (with
    `grid_blocks > 1` neither a node-major copy nor the whole
    `[num_grid_nodes, input_channels]` array ever exists).
    `graphs` holds the (possibly shard-local) index and feature arrays;
    `global_inputs` `[batch, global_channels]` (if any) reach the mesh embedder
    (the grid input parts already hold them); `noise` `[batch, noise_channels]`
    (an FGN's, required then) conditions every layer norm; outputs are float32
    whatever the compute dtype. `point_inputs`: per input modality, `[batch,
    input_steps * inputs, num_points]` channel-major, NaN where missing; a
    modality left out is missing everywhere. `conditioning` `[batch,
    conditioning_size]`: a denoiser's noise-level encoding (required then), what
    the layer norms are conditioned on.
    """
    if (noise is None) != (self.noise_embedding is None):
      raise ValueError(f"model.noise_channels={self.spec.noise_channels} but noise was "
                       f"{'not ' if noise is None else ''}given.")
    denoiser = self.spec.denoiser.noise_frequencies > 0
    if (conditioning is not None) != denoiser:
      raise ValueError(f"model.denoiser_noise_frequencies={self.spec.denoiser.noise_frequencies}"
                       f" but a conditioning vector was {'not ' if denoiser else ''}given.")

    point_inputs = self._all_point_inputs(graphs, point_inputs,
                                          jax.tree.leaves(grid_input_parts)[0].shape[0])

    def one_example(inputs, global_inputs, noise, point_inputs, conditioning):
      if noise is not None:
        conditioning = self.noise_embedding(noise)
      # Named scopes label the stages' buffers in XLA's reports (planner.buffers).
      with jax.named_scope("encoder"):
        grid, mesh, points = self.encode(graphs, inputs, exchange, global_inputs,
                                         conditioning, point_inputs)
      with jax.named_scope("processor"):
        mesh = self.processor(graphs, mesh, exchange, conditioning)
      with jax.named_scope("decoder"):
        outputs = self.decode(graphs.edges["mesh_to_grid"], grid, mesh, exchange, conditioning)
        point_outputs = {name: self.decode(graphs.edges[f"mesh_to_{name}"], latents, mesh,
                                           exchange, conditioning, f"mesh_to_{name}",
                                           f"{name}_output_mlp")
                         for name, latents in points.items()}
      for channel, activation, offset in self.output_activations:
        outputs = outputs.at[:, channel].set(
            OUTPUT_ACTIVATIONS[activation](outputs[:, channel] + offset))
      return outputs, point_outputs

    return jax.vmap(one_example)(tuple(grid_input_parts), global_inputs, noise, point_inputs,
                                 conditioning)

  def _all_point_inputs(self, graphs: Graphs, point_inputs, batch: int) -> dict:
    """`point_inputs` with every input modality's entry (all NaN: missing, where left out)."""
    point_inputs = dict(point_inputs or {})
    for m in self.modalities:
      if m.input_channels and m.name not in point_inputs:
        point_inputs[m.name] = jnp.full((batch, m.input_channels // 2,
                                         graphs.num_nodes(m.name)), jnp.nan, jnp.float32)
    return point_inputs

  def encode(self, graphs: Graphs, grid_input_parts, exchange, global_inputs=None,
             conditioning=None, point_inputs=None):
    """Embeds grid, mesh and modality nodes and passes messages to the mesh once.

    The grid-node work (the embedder, the sender projection, the grid MLP) runs
    in `grid_blocks` blocks of grid nodes, each under its own checkpoint, and so
    does each modality's point work. `conditioning`: the `[conditioning_size]`
    vector the layer norms are conditioned on (an FGN's noise embedding, a
    denoiser's noise-level encoding), else None. `point_inputs`: per input modality, `[C, P]`.

    Returns `(grid latents, mesh latents, {target modality: point latents [P, D]})`.
    """
    spec = self.spec

    def embed_grid(model, node_features, *parts_and_conditioning):
      """Grid latents `[rows, D]` and their sender projection for the edges."""
      *parts, conditioning = parts_and_conditioning
      grid = model.grid_embedder(jnp.concatenate(
          [part.astype(self.dtype) for part in parts + [node_features]], -1), conditioning)
      return grid, model.grid_to_mesh_edges.interaction.project_senders(grid)

    def update_grid(model, grid, conditioning):
      return grid + model.grid_to_mesh_grid_mlp(grid, conditioning)

    def encoder(model, graphs, grid_input_parts, global_inputs, conditioning, point_inputs):
      grid, projected_grid = map_row_blocks(
          model, embed_grid, spec.remat.grid_blocks, (graphs.nodes["grid"].features,),
          (conditioning,),
          columns=tuple(grid_input_parts))
      mesh_inputs = graphs.nodes["mesh"].features.astype(self.dtype)
      if global_inputs is not None:  # the same for every mesh node
        mesh_inputs = jnp.concatenate([mesh_inputs, jnp.broadcast_to(
            global_inputs.astype(self.dtype), mesh_inputs.shape[:1] + global_inputs.shape)], -1)
      mesh = model.mesh_embedder(mesh_inputs, conditioning)
      edges, interaction = graphs.edges["grid_to_mesh"], model.grid_to_mesh_edges.interaction
      # Projected before the exchange: only local rows are multiplied.
      messages = sum_edge_messages(
          model.grid_to_mesh_edges, EncoderDecoderEdges.__call__, edges.features,
          edges.senders, edges.receivers, exchange("grid_to_mesh", projected_grid),
          interaction.project_receivers(mesh), mesh.shape[0], spec.remat.edge_chunks, conditioning)
      points = {}
      for m in model.modalities:
        latents, point_messages = model._encode_points(m, graphs, point_inputs.get(m.name),
                                                       mesh, exchange, conditioning)
        if point_messages is not None:  # one sum over every modality's edges
          messages = messages + point_messages
        if m.output_channels:
          points[m.name] = map_row_blocks(model, lambda model, x, c, name=m.name: x + getattr(
              model, f"{name}_mlp")(x, c), spec.remat.grid_blocks, (latents,), (conditioning,))
      if spec.grid_to_mesh_aggregate_normalization != 1:  # WeatherNext 2's: sums / 4
        messages = messages / jnp.asarray(spec.grid_to_mesh_aggregate_normalization,
                                          messages.dtype)
      mesh = interaction.update_nodes(mesh, messages, conditioning)
      grid = map_row_blocks(model, update_grid, spec.remat.grid_blocks, (grid,), (conditioning,))
      return grid, mesh, points

    return remat.checkpointed(self, encoder, spec.remat.remat_grid_to_mesh_gnn, self.policy)(
        graphs, tuple(grid_input_parts), global_inputs, conditioning, dict(point_inputs or {}))

  def _encode_points(self, modality: PointModality, graphs: Graphs, values, mesh, exchange,
                     conditioning):
    """`(point latents [P, D], their summed messages to the mesh [M, D] or None)`.

    `values`: `[C, P]` channel-major inputs, NaN where missing (None: no inputs).
    """
    name, spec = modality.name, self.spec
    node_features = graphs.nodes[name].features
    if values is None:  # a target-only modality: its points' positions alone
      return map_row_blocks(self, lambda model, x, c: getattr(model, f"{name}_embedder")(
          x.astype(self.dtype), c), spec.remat.grid_blocks, (node_features,), (conditioning,)), None
    present = ~jnp.isnan(values)
    filled, mask = jnp.where(present, values, 0), present.astype(values.dtype)
    edge_set = f"{name}_to_mesh"

    def embed(model, node_features, filled, mask, conditioning):
      latents = getattr(model, f"{name}_embedder")(jnp.concatenate(
          [part.astype(self.dtype) for part in (filled, mask, node_features)], -1), conditioning)
      return latents, getattr(model, f"{edge_set}_edges").interaction.project_senders(latents)

    latents, projected = map_row_blocks(self, embed, spec.remat.grid_blocks, (node_features,),
                                        (conditioning,), columns=(filled, mask))
    edges_module = getattr(self, f"{edge_set}_edges")
    edges = graphs.edges[edge_set]
    # A point with no value at any input time sends nothing.
    sends = jnp.any(present, axis=0).astype(projected.dtype)[:, None]
    messages = sum_edge_messages(
        edges_module, EncoderDecoderEdges.__call__, edges.features, edges.senders,
        edges.receivers, exchange(edge_set, projected),
        edges_module.interaction.project_receivers(mesh), mesh.shape[0], spec.remat.edge_chunks,
        conditioning, sender_mask=exchange(edge_set, sends)[:, 0])
    return latents, messages

  def decode(self, edges: EdgeSet, grid, mesh, exchange, conditioning=None,
             edge_set: str = "mesh_to_grid", output_mlp: str = "output_mlp"):
    """Passes messages mesh -> grid once and reads out `[num_grid_nodes, output_channels]`.

    A target modality's decoder is the same on its points (`edge_set`
    `mesh_to_<name>`, its `edges`, its `output_mlp`), `grid` its point latents.

    With `grid_blocks > 1` the whole decoder runs per block of grid nodes, each
    under its own checkpoint, with the block's own edges: the mesh-to-grid
    edges come `k` per grid node (GraphCast's graphs: 3, the corners of the
    node's mesh triangle), in grid-node order as built, slot-major as laid out
    on a device (`aggregation.FixedInDegree`), so a block of rows owns its
    edges and `edge_chunks` is not needed there.
    """
    spec = self.spec

    def decode_rows(model, grid, features, senders, receivers, sender_table, chunks,
                    conditioning):
      """Output `[rows, C]` of grid rows whose edges point at them (`receivers` < rows)."""
      edges_module = getattr(model, f"{edge_set}_edges")
      interaction = edges_module.interaction
      messages = sum_edge_messages(
          edges_module, EncoderDecoderEdges.__call__, features, senders,
          receivers, sender_table, interaction.project_receivers(grid), grid.shape[0], chunks,
          conditioning)
      grid = interaction.update_nodes(grid, messages, conditioning)
      return getattr(model, output_mlp)(grid).astype(jnp.float32)

    def decoder(model, grid, mesh, conditioning):
      sender_table = exchange(
          edge_set, getattr(model, f"{edge_set}_edges").interaction.project_senders(mesh))
      receivers, num_blocks = aggregation.receivers_of(edges), spec.remat.grid_blocks
      if num_blocks == 1:
        return decode_rows(model, grid, edges.features, edges.senders, receivers,
                           sender_table, spec.remat.edge_chunks, conditioning)
      if isinstance(receivers, aggregation.FixedInDegree):  # each block its rows' k slots
        blocked = (grid, *(slot_major_row_blocks(x, receivers.k, num_blocks)
                           for x in (edges.features, edges.senders)))
        return map_row_blocks(
            model, lambda model, grid, features, senders, sender_table, conditioning:
            decode_rows(model, grid, features, senders, receivers, sender_table, 1,
                        conditioning), num_blocks, blocked, (sender_table, conditioning))
      blocked, rows = _receiver_blocks(edges, grid, num_blocks)

      def decode_block(model, grid, features, senders, receivers, block, sender_table,
                       conditioning):
        return decode_rows(model, grid, features, senders, receivers - block[0] * rows,
                           sender_table, 1, conditioning)

      return map_row_blocks(model, decode_block, spec.remat.grid_blocks, blocked,
                            (sender_table, conditioning))[:grid.shape[0]]

    return remat.checkpointed(self, decoder, spec.remat.remat_mesh_to_grid_gnn,
                              self.policy)(grid, mesh, conditioning)


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
