"""The forecast loss with the graph split over devices: the three GNN stages under `shard_map`.

Host side, `ShardedLayout` partitions the graphs once and lays constants and
batches out in the padded, sharded node order. Device side, `loss(params,
constants, batch)` runs the model's rollout inside `jax.shard_map` over the
`(data, graph)` mesh: every collective is explicit (the exchange's
`all_gather` / `ppermute`, and one `psum` of the loss). Parameters are
replicated; taking `jax.grad` outside the `shard_map` reduces their gradients
over both axes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from wnscale.model import forecast
from wnscale.model.forecast import Constants
from wnscale.sharding import partition as partition_lib
from wnscale.sharding.exchange import AllGatherExchange, HaloExchange
from wnscale.sharding.mesh import DATA, GRAPH
from wnscale.train import loss as loss_lib

# Batch arrays (`[B, ..., G]`, see `model.forecast`): batch on `data`, grid nodes on `graph`.
BATCH_SPECS = {
    "inputs": P(DATA, None, None, GRAPH),
    "targets": P(DATA, None, None, GRAPH),
    "forcings": P(DATA, None, None, GRAPH),
    "statics": P(DATA, None, GRAPH),
}
_GRID_AXIS = -1


class ShardedLayout:
  """The graphs partitioned over a mesh's `graph` axis, and how arrays are laid out on it."""

  def __init__(self, mesh: Mesh, graphs, grid_xyz, mesh_xyz, exchange: str):
    self.mesh = mesh
    self.num_shards = mesh.shape[GRAPH]
    self.partitioned = partition_lib.partition_graphs(graphs, grid_xyz, mesh_xyz,
                                                      self.num_shards, exchange)
    self.num_grid_nodes = graphs.num_grid_nodes

  @property
  def grid_slots(self) -> np.ndarray:
    """`[num_shards * per_shard]` the grid node in each slot of a batch's grid axis, -1: padding.

    Pipelines built with it (`data.pipeline`'s `grid_slots`) yield batches in
    this layout, ready for `global_batch`.
    """
    return self.partitioned.grid.node_of_slot

  def sharding(self, spec: P) -> NamedSharding:
    return NamedSharding(self.mesh, spec)

  def _laid_out_constants(self, constants: Constants):
    """`(host arrays, shardings)`: graph arrays and node weights on `graph`, the rest replicated.

    Both are `(Constants, halo_indices)`; `halo_indices` is a dict (empty in
    all_gather mode) of per-edge-set tuples of `[num_shards, rows]` arrays.
    """
    part = self.partitioned
    on_graph, replicated = self.sharding(P(GRAPH)), self.sharding(P())
    host = Constants(graphs=part.graphs, residual_scale=constants.residual_scale,
                     node_weights=part.grid.to_slots(constants.node_weights, 0),
                     channel_weights=constants.channel_weights)
    shardings = Constants(graphs=jax.tree.map(lambda _: on_graph, part.graphs),
                          residual_scale=replicated, node_weights=on_graph,
                          channel_weights=replicated)
    halo_indices = {name: halo.send_indices for name, halo in (part.halos or {}).items()}
    return (host, halo_indices), (shardings, jax.tree.map(lambda _: on_graph, halo_indices))

  def constants(self, constants: Constants):
    """Device `(Constants, halo_indices)` laid out on the mesh."""
    host, shardings = self._laid_out_constants(constants)
    return jax.device_put(host, shardings)

  def abstract_constants(self, constants: Constants):
    """`jax.ShapeDtypeStruct`s of `constants(...)`: for AOT compiles, nothing allocated."""
    host, shardings = self._laid_out_constants(constants)
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype,
                                                          sharding=s), host, shardings)

  def abstract_batch(self, shapes: dict) -> dict:
    """Sharded `jax.ShapeDtypeStruct`s of a global batch with `shapes` (grid axis: all nodes)."""
    slots = self.num_shards * self.partitioned.grid.per_shard
    abstract = {}
    for key, shape in shapes.items():
      dims = list(shape.shape)
      dims[_GRID_AXIS] = slots
      abstract[key] = jax.ShapeDtypeStruct(tuple(dims), shape.dtype,
                                           sharding=self.sharding(BATCH_SPECS[key]))
    return abstract

  def host_batch(self, batch: dict) -> dict:
    """Reorders a host batch's grid axis into the padded, sharded node order."""
    return {k: self.partitioned.grid.to_slots(v, _GRID_AXIS) for k, v in batch.items()}

  def batch(self, batch: dict) -> dict:
    """A global host batch as device arrays on the mesh (single process)."""
    return {k: jax.device_put(v, self.sharding(BATCH_SPECS[k]))
            for k, v in self.host_batch(batch).items()}

  def global_batch(self, local_batch: dict, global_batch_size: int) -> dict:
    """Global device arrays from this process's share of a batch (any process count).

    `local_batch` holds this process's data group's examples (see
    `mesh.process_data_group`), grid axis already in `grid_slots` order (all
    slots); each process contributes the block of rows and grid slots its
    devices hold, via `jax.make_array_from_process_local_data`.
    """
    arrays = {}
    for key, value in local_batch.items():
      sharding = self.sharding(BATCH_SPECS[key])
      global_shape = (global_batch_size,) + value.shape[1:]
      blocks = sharding.addressable_devices_indices_map(global_shape).values()
      start = min(index[-1].start or 0 for index in blocks)
      stop = max(index[-1].stop or value.shape[-1] for index in blocks)
      arrays[key] = jax.make_array_from_process_local_data(sharding, value[..., start:stop],
                                                           global_shape)
    return arrays

  def _exchange(self, halo_indices):
    if self.partitioned.exchange == "all_gather":
      return AllGatherExchange()
    offsets = {name: halo.offsets for name, halo in self.partitioned.halos.items()}
    local = {name: tuple(i[0] for i in indices) for name, indices in halo_indices.items()}
    return HaloExchange(offsets, local, self.num_shards)

  def _shard_mapped(self, fn, out_specs, extra_in_specs=()):
    """`fn(params, local constants, exchange, local batch, *extra)` under shard_map."""
    def body(params, constants, halo_indices, batch, *extra):
      local_graphs = jax.tree.map(lambda x: x[0], constants.graphs)  # drop the shard axis
      return fn(params, constants._replace(graphs=local_graphs),
                self._exchange(halo_indices), batch, *extra)

    constant_specs = Constants(graphs=P(GRAPH), residual_scale=P(), node_weights=P(GRAPH),
                               channel_weights=P())
    return jax.shard_map(body, mesh=self.mesh,
                         in_specs=(P(), constant_specs, P(GRAPH), BATCH_SPECS)
                         + tuple(extra_in_specs),
                         out_specs=out_specs)

  def loss_fn(self, graphdef, *, remat_steps: bool = False):
    """`loss(params, constants, halo_indices, batch) -> scalar`, the global mean loss."""
    def local_loss(params, constants, exchange, batch):
      predictions = forecast.rollout(nnx.merge(graphdef, params), constants, batch,
                                     remat_steps=remat_steps, exchange=exchange)
      errors = loss_lib.weighted_squared_error(predictions, batch["targets"], constants)
      num_examples = errors.shape[0] * self.mesh.shape[DATA]
      count = num_examples * errors.shape[1] * self.num_grid_nodes  # real nodes only
      return jax.lax.psum(jnp.sum(errors), (DATA, GRAPH)) / count

    return self._shard_mapped(local_loss, out_specs=P())

  def error_sums_fn(self, graphdef):
    """`(params, constants, halo_indices, batch, std [C]) -> [C]` area-weighted squared errors.

    Errors are scaled by `std` (normalized -> physical units) and summed over
    examples, lead times and real grid nodes; used for evaluation RMSE.
    """
    def local_error_sums(params, constants, exchange, batch, std):
      predictions = forecast.rollout(nnx.merge(graphdef, params), constants, batch,
                                     exchange=exchange)
      squared = jnp.square((predictions - batch["targets"]) * std[:, None])
      per_channel = jnp.einsum("btcg,g->c", squared, constants.node_weights)
      return jax.lax.psum(per_channel, (DATA, GRAPH))

    return self._shard_mapped(local_error_sums, out_specs=P(), extra_in_specs=(P(),))
