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
grid (e.g. stations), on the same mesh, encoded and decoded by the grid's code
with modules of their own (`ModalityModules`, in the container
`GraphCast.modalities`; the grid's are the model's attributes, `NodeSetModules`
names both). Each has its own embedder (its inputs, their presence masks and its
points' node features), and, with inputs, its own encoder edges `<name>_to_mesh`;
the mesh latents take the sum of every node set's messages, the grid's first, in
one encoder step (the grid encoder's node MLP). With targets it has its own
decoder edges `mesh_to_<name>` and output MLP, predicting a change on the grid's
predicted state at its points (`forecast.point_first_guess`), as the grid's
outputs are a change on its inputs. A missing input (NaN) enters as 0 with a mask
channel of 0; a point missing every input sends no message. Their parameters are
made after all of the grid model's, so a model without modalities is the grid
model, parameter for parameter.

Rematerialization follows the `ModelSpec` (see `wnscale.model.remat`):
each stage may run under `jax.checkpoint` with the named policy; the processor
is a scan over groups of `mesh_remat_every` layers, one checkpoint per group;
the encoder and decoder edges are processed in `edge_chunks` blocks (under
`model.aggregation` fused, by one kernel per block of receivers instead:
`wnscale.model.fused_encoder_decoder`).
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from wnscale.graphs.edge_sets import decoder_edge_set, encoder_edge_set
from wnscale.graphs.features import EDGE_FEATURES, NODE_FEATURES
from wnscale.graphs.graph import EdgeSet, Graphs
from wnscale.graphs.receiver_blocks import KernelSenders, SenderBlocks
from wnscale.model import aggregation, fused_encoder_decoder, processors, remat, remat_policies
from wnscale.model.blocks import block_rows, map_row_blocks, slot_major_row_blocks
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

  def fused_sums(self, features, senders, receivers: aggregation.FixedInDegree | SenderBlocks,
                 projected_senders, projected_receivers, conditioning=None):
    """`[R, D]` each receiver's sum of its edges' messages, as `__call__` and
    `aggregation.sum_to_receivers` compute them, by one Pallas kernel per block of edges
    (`fused_encoder_decoder`): a decoder's `k` per receiver, slot-major (`FixedInDegree`:
    `features` `[k R, F]`, `senders` `[k R]`, their `SortedSenders` or their
    `KernelSenders`), or an encoder's by blocks of its sender rows (`receivers` its
    `SenderBlocks`, which hold its senders and features too: `features` and `senders`
    unused)."""
    dtype = projected_senders.dtype
    params = (self.embedder.kernel_params(conditioning, dtype),
              self.interaction.edge_mlp.kernel_params(conditioning, dtype))
    epsilon = self.interaction.edge_mlp.norm.epsilon
    if isinstance(receivers, SenderBlocks):
      sums = fused_encoder_decoder.encoder_edge_sums(
          *params, projected_senders, projected_receivers, receivers, epsilon)
    else:
      k, rows = receivers.k, projected_receivers.shape[0]
      if not isinstance(senders, KernelSenders):
        senders = fused_encoder_decoder.kernel_senders_of(
            aggregation.sender_indices(senders).reshape(k, rows))
      sums = fused_encoder_decoder.decoder_edge_sums(
          *params, features.reshape(k, rows, -1), senders, projected_senders,
          projected_receivers, epsilon)
    return sums.astype(dtype)


class NodeSetModules(NamedTuple):
  """The modules that carry one node set (the grid, a modality's points) into the mesh and
  back; `ModalityModules` has the same attributes.

  Attributes:
    embedder: `[N, inputs + NODE_FEATURES] -> [N, latent]` latents of its nodes.
    to_mesh_edges: its encoder edges' modules (`EncoderDecoderEdges`); None: no inputs.
    update_mlp: `[N, latent] -> [N, latent]`, the latents' residual update after the
      encoder; None: not decoded.
    from_mesh_edges: its decoder edges' modules; None: not decoded.
    output_mlp: `[N, latent] -> [N, outputs]`; None: not decoded.
  """

  embedder: MLP
  to_mesh_edges: EncoderDecoderEdges | None
  update_mlp: MLP | None
  from_mesh_edges: EncoderDecoderEdges | None
  output_mlp: MLP | None


class ModalityModules(nnx.Module):
  """A modality's own modules (`GraphCast.modalities[name]`), `NodeSetModules`' attributes.

  `mlp(inputs, outputs, **kwargs)` and `edges(**kwargs)` make the model's MLPs and
  `EncoderDecoderEdges`.
  """

  def __init__(self, modality: PointModality, latent_size: int, mlp: Callable,
               edges: Callable, *, gather_from_receivers: bool):
    self.modality = modality
    # In this order: the parameters draw the random numbers they drew before the container.
    self.embedder = mlp(modality.input_channels + NODE_FEATURES, latent_size)
    self.to_mesh_edges = (edges(gather_from_receivers=gather_from_receivers)
                          if modality.input_channels else None)
    targets = modality.output_channels > 0
    self.update_mlp = mlp(latent_size, latent_size) if targets else None
    self.from_mesh_edges = edges() if targets else None
    self.output_mlp = (mlp(latent_size, modality.output_channels, layer_norm=False)
                       if targets else None)


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
    modalities: `PointModality`s beside the grid; each adds its `ModalityModules`,
      `modalities[<name>]` (parameters `modalities.<name>.embedder`, ...).

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
    self.modalities = nnx.Dict({
        m.name: ModalityModules(
            PointModality(*m), latent, mlp, edges,
            gather_from_receivers=spec.grid_to_mesh_gather_from_receivers)
        for m in modalities})

  def node_set_modules(self, node_set: str) -> NodeSetModules | ModalityModules:
    """The modules of `node_set`: "grid" (the model's own attributes, the names GraphCast's
    and WeatherNext 2's checkpoints map to) or a modality's."""
    if node_set == "grid":
      return NodeSetModules(self.grid_embedder, self.grid_to_mesh_edges,
                            self.grid_to_mesh_grid_mlp, self.mesh_to_grid_edges, self.output_mlp)
    return self.modalities[node_set]

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
        latents, mesh = self.encode(graphs, inputs, exchange, global_inputs, conditioning,
                                    point_inputs)
      with jax.named_scope("processor"):
        mesh = self.processor(graphs, mesh, exchange, conditioning)
      with jax.named_scope("decoder"):
        outputs = {node_set: self.decode(graphs, node_set, node_latents, mesh, exchange,
                                         conditioning)
                   for node_set, node_latents in latents.items()}
      grid_outputs = outputs.pop("grid")
      for channel, activation, offset in self.output_activations:
        grid_outputs = grid_outputs.at[:, channel].set(
            OUTPUT_ACTIVATIONS[activation](grid_outputs[:, channel] + offset))
      return grid_outputs, outputs

    return jax.vmap(one_example)(tuple(grid_input_parts), global_inputs, noise, point_inputs,
                                 conditioning)

  def _all_point_inputs(self, graphs: Graphs, point_inputs, batch: int) -> dict:
    """`point_inputs` with every input modality's entry (all NaN: missing, where left out)."""
    point_inputs = dict(point_inputs or {})
    for modules in self.modalities.values():
      m = modules.modality
      if m.input_channels and m.name not in point_inputs:
        point_inputs[m.name] = jnp.full((batch, m.input_channels // 2,
                                         graphs.num_nodes(m.name)), jnp.nan, jnp.float32)
    return point_inputs

  def encode(self, graphs: Graphs, grid_input_parts, exchange, global_inputs=None,
             conditioning=None, point_inputs=None):
    """Embeds mesh, grid and modality nodes and passes messages to the mesh once.

    Each node set's work (the embedder, the sender projection, the update MLP) runs
    in `grid_blocks` blocks of its nodes, each under its own checkpoint.
    `conditioning`: the `[conditioning_size]` vector the layer norms are conditioned
    on (an FGN's noise embedding, a denoiser's noise-level encoding), else None.
    `point_inputs`: per input modality, `[C, P]`, NaN where missing.

    Returns `({node set to decode: latents [N, D]}, mesh latents [M, D])`: the grid's
    (first) and each target modality's.
    """
    spec = self.spec

    def encoder(model, graphs, grid_input_parts, global_inputs, conditioning, point_inputs):
      mesh_inputs = graphs.nodes["mesh"].features.astype(self.dtype)
      if global_inputs is not None:  # the same for every mesh node
        mesh_inputs = jnp.concatenate([mesh_inputs, jnp.broadcast_to(
            global_inputs.astype(self.dtype), mesh_inputs.shape[:1] + global_inputs.shape)], -1)
      mesh = model.mesh_embedder(mesh_inputs, conditioning)
      latents, messages = {}, None
      for node_set, parts, sends in model._node_set_inputs(grid_input_parts, point_inputs):
        latents[node_set], node_set_messages = model._encode_node_set(
            node_set, graphs, parts, sends, mesh, exchange, conditioning)
        if node_set_messages is not None:  # one sum over every node set's edges
          messages = node_set_messages if messages is None else messages + node_set_messages
      if spec.grid_to_mesh_aggregate_normalization != 1:  # WeatherNext 2's: sums / 4
        messages = messages / jnp.asarray(spec.grid_to_mesh_aggregate_normalization,
                                          messages.dtype)
      mesh = model.grid_to_mesh_edges.interaction.update_nodes(mesh, messages, conditioning)

      def update(model, node_latents, conditioning, node_set):
        return node_latents + model.node_set_modules(node_set).update_mlp(node_latents,
                                                                          conditioning)

      decoded = {node_set: map_row_blocks(model, functools.partial(update, node_set=node_set),
                                          spec.remat.grid_blocks, (node_latents,),
                                          (conditioning,))
                 for node_set, node_latents in latents.items()
                 if model.node_set_modules(node_set).update_mlp is not None}
      return decoded, mesh

    # The mesh's summed messages (`[M, D]`, small) are kept whatever the policy: remaking
    # them takes the edge MLP's forward pass over every encoder edge (with the fused
    # kernel, all of it), more than the backward pass needs of the edges.
    policy = remat_policies.also_saving(self.policy, remat_policies.MESSAGES)
    return remat.checkpointed(self, encoder, spec.remat.remat_grid_to_mesh_gnn, policy)(
        graphs, tuple(grid_input_parts), global_inputs, conditioning, dict(point_inputs or {}))

  def _node_set_inputs(self, grid_input_parts, point_inputs: dict):
    """`(node set, channel-major input parts [(C_i, N)], senders [N] bool or None)` of the
    grid (every node sends) and of each modality, in the order their messages are summed.

    A modality's values `[C, P]` (NaN where missing) enter as two parts, the values
    (0 where missing) and their presence mask; a point with no value at any input time
    sends nothing. A target-only modality has no parts and sends nothing.
    """
    yield "grid", tuple(grid_input_parts), None
    for name, modules in self.modalities.items():
      if not modules.modality.input_channels:
        yield name, (), None
        continue
      values = point_inputs[name]
      present = ~jnp.isnan(values)
      yield (name, (jnp.where(present, values, 0), present.astype(values.dtype)),
             jnp.any(present, axis=0))

  def _encode_node_set(self, node_set: str, graphs: Graphs, parts: tuple, sends, mesh,
                       exchange, conditioning):
    """`(latents [N, D], their summed messages to the mesh [M, D], or None without inputs)`.

    `parts`: channel-major inputs `[C_i, N]`, concatenated before the nodes' features;
    `sends`: `[N]` whether a node sends (None: all do).
    """
    spec = self.spec

    def embed(model, node_features, *parts_and_conditioning):
      """Latents `[rows, D]` and their sender projection for the encoder edges (None without)."""
      *parts, conditioning = parts_and_conditioning
      modules = model.node_set_modules(node_set)
      latents = modules.embedder(jnp.concatenate(
          [part.astype(self.dtype) for part in parts + [node_features]], -1), conditioning)
      if modules.to_mesh_edges is None:
        return latents, None
      return latents, modules.to_mesh_edges.interaction.project_senders(latents)

    latents, projected = map_row_blocks(self, embed, spec.remat.grid_blocks,
                                        (graphs.nodes[node_set].features,), (conditioning,),
                                        columns=parts)
    if projected is None:
      return latents, None
    edges_module = self.node_set_modules(node_set).to_mesh_edges
    edge_set = encoder_edge_set(node_set)
    edges = graphs.edges[edge_set]
    # Projected before the exchange: only local rows are multiplied.
    sender_table = exchange(edge_set, projected)
    receiver_table = edges_module.interaction.project_receivers(mesh)
    sender_mask = (None if sends is None else
                   exchange(edge_set, sends.astype(projected.dtype)[:, None])[:, 0])
    if sender_mask is None and self._fused(edges.sender_blocks, receiver_table):
      return latents, edges_module.fused_sums(None, None, edges.sender_blocks,
                                              sender_table, receiver_table, conditioning)
    by_blocks = self._by_blocks(edges)
    messages = sum_edge_messages(
        edges_module, EncoderDecoderEdges.__call__, edges.features,
        edges.sorted_senders if by_blocks else edges.senders,
        edges.blocks if by_blocks else edges.receivers, sender_table, receiver_table,
        mesh.shape[0], spec.remat.edge_chunks, conditioning, sender_mask=sender_mask)
    return latents, messages

  def _aggregation(self) -> str:
    """How the processor sums its edges (`model.aggregation`, "auto" resolved; a processor
    without the setting: by index); the encoder and decoder follow it."""
    return aggregation.resolve(getattr(self.spec.processor, "aggregation", "segment_sum"))

  def _by_blocks(self, edges: EdgeSet) -> bool:
    """Whether an encoder or decoder edge set is summed without scatters: its receivers'
    sums and rows by its receiver blocks (an encoder's; a decoder's are reshapes), its
    senders' gradient by its `sorted_senders`. So where the processor sums its own edges
    by blocks (`model.aggregation` matmul or fused), the edges come in one chunk and have
    that layout; else by index."""
    return (self._aggregation() in ("matmul", "fused")
            and self.spec.remat.edge_chunks == 1 and edges.sorted_senders is not None
            and (edges.in_degree > 0 or edges.blocks is not None))

  def _block_senders(self, edges: EdgeSet, num_blocks: int):
    """A decoder's `BlockSenders` for `num_blocks` blocks of its rows where its senders'
    gradient is summed by blocks (`model.aggregation` matmul or fused) and the layout made
    them for that many (the planner compiles other counts on one layout: by index there),
    else None."""
    by_block = edges.block_senders
    if (self._aggregation() in ("matmul", "fused") and by_block is not None
        and by_block.rows.shape[0] == num_blocks):
      return by_block
    return None

  def _kernel_senders(self, edges: EdgeSet, num_blocks: int):
    """A decoder's `KernelSenders` for `num_blocks` blocks of its rows (`[num_blocks, ...]`)
    where the layout made them for that many (the planner compiles other counts on one
    layout: from the indices there), else None."""
    kernel = edges.kernel_senders
    if kernel is not None and kernel.rows.shape[0] == num_blocks:
      return kernel
    return None

  def _fused(self, receivers, projected_receivers) -> bool:
    """Whether an encoder's or decoder's edge step runs as one kernel per block of edges
    (`EncoderDecoderEdges.fused_sums`): where the processor's does (`model.aggregation`
    fused), its edges come `k` per receiver (a decoder's, `FixedInDegree`) or by blocks of
    sender rows (an encoder's `SenderBlocks`), and its edge MLP sees the receivers
    (`projected_receivers`, or the projection making them, is not None). Its edges are
    then never cut into `edge_chunks`: no edge-sized array is made (but a decoder's
    gathered sender rows where its layout has no `KernelSenders`)."""
    return (self._aggregation() == "fused" and projected_receivers is not None
            and isinstance(receivers, (aggregation.FixedInDegree, SenderBlocks)))

  def decode(self, graphs: Graphs, node_set: str, latents, mesh, exchange, conditioning=None):
    """Passes messages mesh -> `node_set` once and reads out `[N, output_channels]`.

    The grid's and each target modality's decoder, with its edges `mesh_to_<node_set>`
    and its `NodeSetModules`; `latents` `[N, D]` its nodes'.

    With `decoder_keeps_messages` its checkpoints keep the summed messages (`MESSAGES`),
    so the backward pass does not run the edge step again. With `grid_blocks > 1` the
    whole decoder runs per block of nodes, each under its own checkpoint, with the
    block's own edges: the decoder edges come `k` per node
    (GraphCast's graphs: 3, the corners of the node's mesh triangle), in node order as
    built, slot-major as laid out on a device (`aggregation.FixedInDegree`), so a block
    of rows owns its edges and `edge_chunks` is not needed there.
    """
    spec = self.spec
    edge_set = decoder_edge_set(node_set)
    edges = graphs.edges[edge_set]
    # What the decoder's checkpoints keep, and its blocks' (nothing, else).
    policy, block_policy = self.policy, None
    if spec.remat.decoder_keeps_messages:
      policy = remat_policies.also_saving(self.policy, remat_policies.MESSAGES)
      block_policy = remat_policies.also_saving(None, remat_policies.MESSAGES)

    def decode_rows(model, latents, features, senders, receivers, sender_table, chunks,
                    conditioning):
      """Output `[rows, C]` of rows whose edges point at them (`receivers` < rows)."""
      modules = model.node_set_modules(node_set)
      interaction = modules.from_mesh_edges.interaction
      receiver_table = interaction.project_receivers(latents)
      if self._fused(receivers, receiver_table):
        messages = modules.from_mesh_edges.fused_sums(features, senders, receivers, sender_table,
                                                      receiver_table, conditioning)
      else:
        messages = sum_edge_messages(
            modules.from_mesh_edges, EncoderDecoderEdges.__call__, features, senders,
            receivers, sender_table, receiver_table, latents.shape[0], chunks, conditioning)
      latents = interaction.update_nodes(latents, messages, conditioning)
      return modules.output_mlp(latents).astype(jnp.float32)

    def decoder(model, latents, mesh, conditioning):
      interaction = model.node_set_modules(node_set).from_mesh_edges.interaction
      sender_table = exchange(edge_set, interaction.project_senders(mesh))
      receivers, num_blocks = aggregation.receivers_of(edges), spec.remat.grid_blocks
      fused = self._fused(receivers, interaction.receiver_projection)
      if num_blocks == 1:
        kernel = self._kernel_senders(edges, 1) if fused else None
        if kernel is not None:
          senders = jax.tree.map(lambda x: x[0], kernel)
        else:  # sorted senders where the edges come whole: by blocks, or into the kernel
          whole = self._by_blocks(edges) or (fused and edges.sorted_senders is not None)
          senders = edges.sorted_senders if whole else edges.senders
        return decode_rows(model, latents, edges.features, senders, receivers,
                           sender_table, spec.remat.edge_chunks, conditioning)
      if isinstance(receivers, aggregation.FixedInDegree):  # each block its rows' k slots
        by_block = self._kernel_senders(edges, num_blocks) if fused else None
        if by_block is None:
          by_block = self._block_senders(edges, num_blocks)
        blocked = (latents, *(slot_major_row_blocks(x, receivers.k, num_blocks)
                              for x in (edges.features,)
                              + ((edges.senders,) if by_block is None else ())))
        # Channel-major, transposed back below: the caller's transpose to the batch's
        # layout cancels it, and each block's output is written as whole tiles.
        return map_row_blocks(
            model, lambda model, latents, features, senders, sender_table, conditioning:
            decode_rows(model, latents, features, senders, receivers, sender_table, 1,
                        conditioning), num_blocks, blocked, (sender_table, conditioning),
            channel_major=True, per_block=() if by_block is None else (by_block,),
            policy=block_policy).T
      blocked, rows = _receiver_blocks(edges, latents, num_blocks)

      def decode_block(model, latents, features, senders, receivers, block, sender_table,
                       conditioning):
        return decode_rows(model, latents, features, senders, receivers - block[0] * rows,
                           sender_table, 1, conditioning)

      return map_row_blocks(model, decode_block, spec.remat.grid_blocks, blocked,
                            (sender_table, conditioning),
                            policy=block_policy)[:latents.shape[0]]

    return remat.checkpointed(self, decoder, spec.remat.remat_mesh_to_grid_gnn,
                              policy)(latents, mesh, conditioning)


def _receiver_blocks(edges: EdgeSet, grid, num_blocks: int):
  """`(blocked arrays, rows per block)` for `map_row_blocks` over blocks of receivers.

  Blocks of `rows = block_rows(R, num_blocks)` grid rows (`map_row_blocks` pads the
  grid to `R' = num_blocks * rows`); edges (`k` per row, in row order) padded to `k R'`,
  padding edges pointing past every block (dropped). Blocked: grid `[R, D]`, features
  `[k R', F]`, senders and receivers `[k R']`, block index `[num_blocks]`.
  """
  num_rows, num_edges = grid.shape[0], edges.senders.shape[0]
  if num_edges % num_rows:
    raise ValueError(
        f"model.grid_blocks > 1 needs the same number of mesh-to-grid edges for every "
        f"grid node, in grid-node order; {num_edges} edges for {num_rows} grid nodes.")
  per_row = num_edges // num_rows
  rows = block_rows(num_rows, num_blocks)
  padded_rows = rows * num_blocks
  pad = lambda x, fill: jnp.pad(x, [(0, per_row * (padded_rows - num_rows))]
                                + [(0, 0)] * (x.ndim - 1), constant_values=fill)
  blocked = (grid, pad(edges.features, 0),
             pad(edges.senders, 0), pad(edges.receivers, padded_rows),
             jnp.arange(num_blocks))
  return blocked, rows
