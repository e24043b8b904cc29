"""The network computes GraphCast's function: checked against a plain numpy transcription.

The numpy code below is the reference's definition written out by hand: each
message-passing step computes messages with the edge MLP on the concatenation
[edge, sender, receiver] (one first-layer matrix, rows in that order), sums the
*messages* per receiver, updates the nodes with the node MLP on [node, summed
messages], and only then adds the residuals to nodes and edges. Layer norms use
epsilon 1e-5 and the two-pass variance.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.graphs import grid, receiver_blocks
from wnscale.graphs.points import PointSet
from wnscale.model import aggregation, setup
from wnscale.model.mlp import MLP
from wnscale.sharding import partition as partition_lib


def np_layer_norm(x, scale, bias, epsilon=1e-5):
  mean = x.mean(-1, keepdims=True)
  variance = np.square(x - mean).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(variance + epsilon) * scale + bias


def weights(linear):
  kernel = np.asarray(linear.kernel[...], np.float64)
  bias = np.asarray(linear.bias[...], np.float64) if linear.bias is not None else 0.0
  return kernel, bias


def np_mlp(mlp, x, first_kernel=None):
  """Linear, swish, Linear, LayerNorm; `first_kernel` replaces the first layer's matrix."""
  kernel, bias = weights(mlp.hidden)
  hidden = x @ (kernel if first_kernel is None else first_kernel) + bias
  hidden = hidden / (1 + np.exp(-hidden))
  kernel, bias = weights(mlp.out)
  y = hidden @ kernel + bias
  if mlp.norm is None:
    return y
  return np_layer_norm(y, np.asarray(mlp.norm.scale[...]), np.asarray(mlp.norm.bias[...]))


def np_interaction_step(net, edges, sender_nodes, receiver_nodes, senders, receivers):
  """`(receiver nodes', edges')` of one step of the reference's interaction network."""
  # The reference's first edge-MLP layer: one [3D, D] matrix on [edge, sender, receiver].
  first_kernel = np.concatenate([weights(net.edge_mlp.hidden)[0],
                                 weights(net.sender_projection)[0],
                                 weights(net.receiver_projection)[0]])
  inputs = np.concatenate([edges, sender_nodes[senders], receiver_nodes[receivers]], -1)
  messages = np_mlp(net.edge_mlp, inputs, first_kernel)
  summed = np.zeros_like(receiver_nodes)
  np.add.at(summed, receivers, messages)
  nodes = receiver_nodes + np_mlp(net.node_mlp, np.concatenate([receiver_nodes, summed], -1))
  return nodes, edges + messages


def np_graphcast(model, graphs, grid_inputs):
  """`[num_grid_nodes, C_in] -> [num_grid_nodes, C_out]`, one example, in float64."""
  g2m, mesh_edges, m2g = (graphs.edges[name] for name in ("grid_to_mesh", "mesh",
                                                          "mesh_to_grid"))
  grid_nodes = np_mlp(model.grid_embedder,
                      np.concatenate([grid_inputs, graphs.nodes["grid"].features], -1))
  mesh_nodes = np_mlp(model.mesh_embedder, graphs.nodes["mesh"].features)
  # Encoder: one step grid -> mesh; the grid nodes get their own residual MLP.
  edges = np_mlp(model.grid_to_mesh_edges.embedder, g2m.features)
  mesh_nodes, _ = np_interaction_step(model.grid_to_mesh_edges.interaction, edges, grid_nodes,
                                      mesh_nodes, g2m.senders, g2m.receivers)
  grid_nodes = grid_nodes + np_mlp(model.grid_to_mesh_grid_mlp, grid_nodes)
  # Processor: the edge latents carry over from step to step.
  edges = np_mlp(model.processor.edge_embedder, mesh_edges.features)
  graphdef, stacked = nnx.split(model.processor.layers)  # [message_passing_steps]-stacked
  for step in range(model.spec.processor.message_passing_steps):
    layer = nnx.merge(graphdef, jax.tree.map(lambda x: x[step], stacked))
    mesh_nodes, edges = np_interaction_step(layer, edges, mesh_nodes, mesh_nodes,
                                            mesh_edges.senders, mesh_edges.receivers)
  # Decoder: one step mesh -> grid, then the output MLP (no LayerNorm).
  edges = np_mlp(model.mesh_to_grid_edges.embedder, m2g.features)
  grid_nodes, _ = np_interaction_step(model.mesh_to_grid_edges.interaction, edges, mesh_nodes,
                                      grid_nodes, m2g.senders, m2g.receivers)
  return np_mlp(model.output_mlp, grid_nodes)


def perturbed(model, seed):
  """`model` with noise on every parameter, so zero biases and unit scales don't hide terms."""
  state = nnx.state(model, nnx.Param)
  leaves, treedef = jax.tree.flatten(state)
  rng = np.random.default_rng(seed)
  noisy = [x + 0.3 * rng.standard_normal(x.shape).astype(np.float32) for x in leaves]
  nnx.update(model, jax.tree.unflatten(treedef, noisy))
  return model


@pytest.mark.parametrize("edge_chunks, grid_blocks, mesh_edge_chunks, laid_out",
                         [(1, 1, 1, False), (3, 1, 1, False), (1, 5, 1, False),
                          (3, 7, 4, False), (3, 1, 1, True), (3, 7, 4, True)])
def test_graphcast_matches_the_reference_definition(edge_chunks, grid_blocks, mesh_edge_chunks,
                                                    laid_out):
  """Also in blocks of edges and of grid nodes (2048 nodes: 5 and 7 leave a padded block)
  and of mesh edges; the inputs arrive channel-major. `laid_out`: the graphs as a device
  gets them (one shard: nodes in space-filling order, the mesh-to-grid edges slot-major,
  summed by `aggregation.FixedInDegree`)."""
  config = config_lib.default_config()
  config.model.update(latent_size=8, mesh_levels=2, message_passing_steps=3,
                      edge_chunks=edge_chunks, grid_blocks=grid_blocks,
                      mesh_edge_chunks=mesh_edge_chunks)
  config_lib.validate(config)
  points = PointSet.regular(*grid.regular_grid(5.625, include_poles=False))
  graphs = setup.graphs_for_grid(specs_lib.from_config(config).model, points)
  model = perturbed(setup.build_model(specs_lib.from_config(config)), seed=4)
  channels = model.grid_embedder.hidden.in_features - 3
  inputs = np.random.default_rng(5).standard_normal((1, graphs.num_nodes("grid"), channels))
  expected = np_graphcast(model, graphs, inputs[0])
  run = jax.jit(lambda g, x: model(g, (x.swapaxes(1, 2).astype(np.float32),)))
  if laid_out:
    positions = setup.node_positions(specs_lib.from_config(config).model, points)
    part = partition_lib.partition_graphs(graphs, positions, 1, "all_gather")
    on_device = jax.tree.map(lambda x: x[0], part.graphs)
    assert on_device.edges["mesh_to_grid"].in_degree == 3
    grid_slots = part.nodes["grid"]
    outputs = grid_slots.from_slots(np.asarray(run(on_device,
                                                   grid_slots.to_slots(inputs, 1))), 1)
  else:
    outputs = run(graphs, inputs)
  np.testing.assert_allclose(outputs[0], expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_layer_norm_is_two_pass_with_epsilon_1e5():
  mlp = MLP(4, 8, 16, rngs=nnx.Rngs(0))
  assert mlp.norm.epsilon == 1e-5  # the two-pass variance is checked by the values below
  rng = np.random.default_rng(0)
  scale, bias = rng.normal(size=16), rng.normal(size=16)
  nnx.update(mlp.norm, nnx.State({"scale": nnx.Param(jnp.asarray(scale, jnp.float32)),
                                  "bias": nnx.Param(jnp.asarray(bias, jnp.float32))}))
  # Small spread (epsilon matters) and a large mean (E[x^2] - E[x]^2 cancels).
  x = np.concatenate([rng.normal(0, 3e-3, (64, 16)), 300 + rng.normal(0, 1, (64, 16)),
                      rng.normal(0, 1, (64, 16))]).astype(np.float32)
  np.testing.assert_allclose(mlp.norm(jnp.asarray(x)), np_layer_norm(x.astype(np.float64),
                                                                    scale, bias),
                             rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("by", ["index", "blocks"])
def test_messages_are_summed_in_float32(by):
  """One message of 1 and 256 of 2^-8 into one receiver: a bfloat16 sum would stay at 1."""
  messages = jnp.concatenate([jnp.ones((1, 2)), jnp.full((256, 2), 2.0**-8)]).astype(jnp.bfloat16)
  receivers = np.zeros(257, np.int32)
  if by == "blocks":  # 257 edges of one receiver in blocks of 64 slots (5 blocks)
    receivers = receiver_blocks.block_edges(receivers, 1, slots=64)
    messages = jnp.pad(messages, [(0, 5 * 64 - 257), (0, 0)])
  summed = aggregation.sum_to_receivers(messages, receivers, 1)
  assert summed.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(summed, np.float32), [[2.0, 2.0]])
