"""The graphs laid out over the mesh: partitioned once, and every array placed to match.

`ShardedLayout` partitions the graphs over the mesh's `graph` axis (host side,
once), makes the masks the model's attention reads for that node order
(`Graphs.masks`, given the model's spec), and lays constants and batches out
in the padded, sharded node order:
on devices, as abstract shapes for ahead-of-time compiles, or as global
arrays built from each process's share. What runs on that layout under
`shard_map` is in `wnscale.sharding.sharded_model`.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from wnscale.graphs import receiver_blocks
from wnscale.model import setup, spherical_noise
from wnscale.model.forecast import Constants
from wnscale.sharding import partition as partition_lib
from wnscale.sharding.exchange import MODES
from wnscale.sharding.mesh import DATA, GRAPH
from wnscale.specs import ModelSpec

# Batch arrays (see `model.forecast`): batch on `data`, grid nodes (last axis) on `graph`;
# the optional `globals` `[B, T, F]` have no grid axis: every graph shard holds them whole;
# nor has an FGN's `noise` (`[B, T, K]` for a rollout, `[B, M, T, K]` with M members), nor
# a denoiser's training `noise_levels` `[B]`; its `diffusion_noise` `[B, C_out, G]` has
# (`wnscale.model.diffusion`). A denoiser's forecast: `sampler_keys` `[B, 2]` each row's noise
# key, `grid_nodes` `[B, G]` each slot's grid node (`wnscale.model.sampler.forecast_step`).
BATCH_SPECS = {
    "inputs": P(DATA, None, None, GRAPH),
    "targets": P(DATA, None, None, GRAPH),
    "forcings": P(DATA, None, None, GRAPH),
    "statics": P(DATA, None, GRAPH),
    "globals": P(DATA, None, None),
    "noise": P(DATA),
    "noise_levels": P(DATA),
    "diffusion_noise": P(DATA, None, GRAPH),
    "sampler_keys": P(DATA),
    "grid_nodes": P(DATA, GRAPH),
}
# A modality's `<name>/inputs` and `<name>/targets`: its points (last axis) on `graph`.
POINTS_SPEC = P(DATA, None, None, GRAPH)
# Constants (see `ShardedLayout.constants`): graph arrays and node and point weights on
# `graph`, the rest replicated.
CONSTANT_SPECS = Constants(graphs=P(GRAPH), residual_scale=P(), node_weights=P(GRAPH),
                           channel_weights=P(), point_weights=P(GRAPH), first_guesses=P())
_GRID_AXIS = -1


def batch_spec(key: str) -> P:
  """How batch array `key` lies on the mesh (`BATCH_SPECS`, `POINTS_SPEC`)."""
  return POINTS_SPEC if "/" in key else BATCH_SPECS[key]


def batch_specs(batch: dict) -> dict:
  """`batch_spec` of the keys `batch` has (`globals` only when the config has some)."""
  return {key: batch_spec(key) for key in batch}


def _node_set(key: str) -> str | None:
  """The node set along batch array `key`'s last axis (`grid`, a modality's), or None."""
  if "/" in key:
    return key.split("/")[0]
  return "grid" if BATCH_SPECS[key][_GRID_AXIS] == GRAPH else None


def _block_sizes(model: ModelSpec | None) -> receiver_blocks.BlockSizes:
  """The interaction network's sizes of its mesh edges' blocks; other processors (and no
  model) keep the defaults."""
  processor = None if model is None else model.processor
  default = receiver_blocks.BlockSizes()
  return receiver_blocks.BlockSizes(
      getattr(processor, "edge_block_slots", default.slots),
      getattr(processor, "sender_window_margin", default.sender_margin))


class ShardedLayout:
  """The graphs partitioned over a mesh's `graph` axis, and how arrays are laid out on it."""

  def __init__(self, mesh: Mesh, graphs, positions: dict, exchange: str,
               model: ModelSpec | None = None):
    """`positions`: per node set, `[num_nodes, 3]` (`build.node_positions`); `model`: the
    spec of the model to run, whose processor's masks are made for this node order and the
    mesh's platform (`setup.with_masks`; None: no masks)."""
    self.mesh = mesh
    self.num_shards = mesh.shape[GRAPH]
    partitioned = partition_lib.partition_graphs(
        graphs, positions, self.num_shards, exchange, _block_sizes(model),
        grid_blocks=1 if model is None else model.remat.grid_blocks)
    if model is not None:
      one_shard = jax.tree.map(lambda x: x[0], partitioned.graphs)
      masks = setup.with_masks(model, one_shard, mesh.devices.flat[0].platform,
                               self.num_shards).masks
      partitioned = partitioned._replace(graphs=partitioned.graphs._replace(
          masks=jax.tree.map(lambda x: x[None], masks)))  # the shard axis
    self.partitioned = partitioned
    self.num_grid_nodes = graphs.num_nodes("grid")
    # A denoiser's spherical white noise needs the grid as rows and columns.
    self.spherical_grid = spherical_noise.grid_of_positions(positions["grid"])

  @property
  def grid(self) -> partition_lib.NodePartition:
    """Where the grid nodes lie, the batches' grid axis."""
    return self.partitioned.nodes["grid"]

  @property
  def grid_slots(self) -> np.ndarray:
    """`[num_shards * per_shard]` the grid node in each slot of a batch's grid axis, -1: padding.

    A source in this order (`WeatherExampleSource.in_layout`) yields batches
    ready for `global_batch`.
    """
    return self.grid.node_of_slot

  @property
  def point_slots(self) -> dict[str, np.ndarray]:
    """Per modality's node set, `[num_shards * per_shard]` its point in each slot of a
    batch's point axis, -1: padding (`grid_slots`' counterpart)."""
    return {name: part.node_of_slot for name, part in self.partitioned.nodes.items()
            if name not in ("grid", "mesh")}

  def sharding(self, spec: P) -> NamedSharding:
    return NamedSharding(self.mesh, spec)

  def halo_indices(self) -> dict:
    """Host arrays the exchange needs: per edge set whose plan has any, a tuple of
    `[num_shards, rows]` arrays (none in all_gather mode); placed on `graph`."""
    return {name: plan.device_arrays() for name, plan in self.partitioned.plans.items()
            if plan.device_arrays()}

  def _laid_out_constants(self, constants: Constants):
    """`(host arrays, shardings)`: graph arrays and node weights on `graph`, the rest replicated.

    Both are `(Constants, halo_indices)` (`halo_indices()`).
    """
    part = self.partitioned
    host = Constants(graphs=part.graphs, residual_scale=constants.residual_scale,
                     node_weights=self.grid.to_slots(constants.node_weights, 0),
                     channel_weights=constants.channel_weights,
                     point_weights={name: part.nodes[name].to_slots(weights, 0)
                                    for name, weights in constants.point_weights.items()},
                     first_guesses=constants.first_guesses)
    # Every leaf of a field gets the field's spec (the graphs: all on `graph`).
    shardings = Constants(*(jax.tree.map(lambda _, spec=spec: self.sharding(spec), field)
                            for field, spec in zip(host, CONSTANT_SPECS)))
    halo_indices = self.halo_indices()
    on_graph = self.sharding(P(GRAPH))
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
    """Sharded `jax.ShapeDtypeStruct`s of a global batch with `shapes` (grid axis: all nodes;
    a modality's point axis: all its points)."""
    abstract = {}
    for key, shape in shapes.items():
      dims = list(shape.shape)
      if _node_set(key):
        dims[_GRID_AXIS] = self.num_shards * self.partitioned.nodes[_node_set(key)].per_shard
      abstract[key] = jax.ShapeDtypeStruct(tuple(dims), shape.dtype,
                                           sharding=self.sharding(batch_spec(key)))
    return abstract

  def host_batch(self, batch: dict) -> dict:
    """Reorders a host batch's grid axis (and each modality's point axis) into the padded,
    sharded node order; a modality's padding points are NaN (missing)."""
    def laid_out(key, value):
      if not _node_set(key):
        return value
      part = self.partitioned.nodes[_node_set(key)]
      slots = part.to_slots(value, _GRID_AXIS)
      if _node_set(key) != "grid":
        slots[..., part.node_of_slot < 0] = np.nan
      return slots
    return {key: laid_out(key, value) for key, value in batch.items()}

  def global_batch(self, local_batch: dict, global_batch_size: int, dtype=None) -> dict:
    """Global device arrays from this process's share of a batch (any process count).

    `local_batch` holds this process's data group's examples (see
    `mesh.process_data_group`), or all `global_batch_size` rows (then each
    device takes its own rows), grid axis already in `grid_slots` order (all
    slots); each process contributes the block of rows and grid slots its
    devices hold, via `jax.make_array_from_process_local_data`, cast to
    `dtype` on the host (None: as they are) so only that many bytes move.
    """
    arrays = {}
    for key, value in local_batch.items():
      sharding = self.sharding(batch_spec(key))
      global_shape = (global_batch_size,) + value.shape[1:]
      if _node_set(key):  # this process's block of grid (or point) slots
        blocks = sharding.addressable_devices_indices_map(global_shape).values()
        start = min(index[-1].start or 0 for index in blocks)
        stop = max(index[-1].stop or value.shape[-1] for index in blocks)
        value = value[..., start:stop]
      if dtype is not None:
        value = value.astype(dtype)
      arrays[key] = jax.make_array_from_process_local_data(sharding, value, global_shape)
    return arrays

  def exchange(self, halo_indices):
    """The exchange of a shard, given its `halo_indices` (inside `shard_map`)."""
    local = {name: tuple(i[0] for i in indices) for name, indices in halo_indices.items()}
    return MODES[self.partitioned.exchange](self.partitioned.plans, local, self.num_shards)
