"""How a graph shard gets the sender rows it does not own (runs inside `shard_map`).

Both exchanges return a *sender table*: the rows that the shard's edge sender
indices point into (see `wnscale.sharding.partition`). Their gradients move no
more data than the forward: the transpose of `all_gather` is `psum_scatter`,
and the transpose of a halo `ppermute` is the reverse `ppermute` followed by a
scatter-add into the owner's rows, so plain autodiff is already optimal.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from wnscale.sharding.mesh import GRAPH


class AllGatherExchange:
  """Every shard sees every sender row: one `all_gather` along `graph`."""

  def _all_rows(self, nodes):
    return jax.lax.all_gather(nodes, GRAPH, axis=0, tiled=True)

  grid_to_mesh = mesh = mesh_to_grid = mesh_neighbours = _all_rows


class HaloExchange:
  """Each shard receives only the rows its edges read, one `ppermute` per shard offset.

  Args:
    offsets: per edge set name, the shard offsets k with traffic (shard s sends
      to s + k).
    send_indices: per edge set name, per offset, `[rows]` local row indices this
      shard sends.
    num_shards: size of the `graph` axis.
  """

  def __init__(self, offsets: dict, send_indices: dict, num_shards: int):
    self._offsets = offsets
    self._send_indices = send_indices
    self._num_shards = num_shards

  def _table(self, name, nodes):
    parts = [nodes]
    for k, indices in zip(self._offsets[name], self._send_indices[name]):
      pairs = [(s, (s + k) % self._num_shards) for s in range(self._num_shards)]
      parts.append(jax.lax.ppermute(nodes[indices], GRAPH, pairs))
    return jnp.concatenate(parts, axis=0)

  def grid_to_mesh(self, grid_latents):
    return self._table("grid_to_mesh", grid_latents)

  def mesh(self, mesh_latents):
    return self._table("mesh", mesh_latents)

  def mesh_to_grid(self, mesh_latents):
    return self._table("mesh_to_grid", mesh_latents)

  def mesh_neighbours(self, mesh_latents):
    return self._table("mesh_neighbours", mesh_latents)
