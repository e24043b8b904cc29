"""Builds the three graphs of a GraphCast model for a grid, cached on disk.

`build_graphs(latitude, longitude, mesh_levels, ...)` returns `Graphs`, a
pytree of plain arrays that the model takes as an argument (never as a
closed-over constant, so the index arrays are not baked into the HLO).

The graphs are GraphCast's (google-deepmind/graphcast), index for index where
the reference's order is defined: mesh node i is the reference's vertex i, and
grid node `i_lat * num_lon + i_lon` follows the given latitude order. The grid's
latitude and longitude are rounded to float32 first, as the reference does.
"""

from __future__ import annotations

import hashlib
import io
import logging
import time
from typing import NamedTuple

import numpy as np

from wnscale import cache, paths
from wnscale.graphs import connectivity, features, grid, icosahedron


class EdgeSet(NamedTuple):
  """Directed edges, sorted by receiver.

  Attributes:
    senders: `[num_edges]` int32 indices into the sender nodes.
    receivers: `[num_edges]` int32 indices into the receiver nodes.
    features: `[num_edges, 4]` float32 static edge features.
  """

  senders: np.ndarray
  receivers: np.ndarray
  features: np.ndarray


class Graphs(NamedTuple):
  """The grid and mesh nodes and the edge sets of the model.

  Attributes:
    grid_node_features: `[num_grid_nodes, 3]`, grid nodes latitude-major.
    mesh_node_features: `[num_mesh_nodes, 3]`, the finest mesh's vertices.
    grid_to_mesh: encoder edges (senders: grid nodes, receivers: mesh nodes).
    mesh: multi-mesh edges of all refinement levels.
    mesh_to_grid: decoder edges (senders: mesh nodes, receivers: grid nodes).
    mesh_neighbours: the mesh transformer's attention edges (mesh -> mesh, k-hop
      neighbourhoods on the finest mesh, `wnscale.graphs.neighbourhoods`), with
      `[num_edges, 0]` features; None for the interaction-network processor.
  """

  grid_node_features: np.ndarray
  mesh_node_features: np.ndarray
  grid_to_mesh: EdgeSet
  mesh: EdgeSet
  mesh_to_grid: EdgeSet
  mesh_neighbours: EdgeSet | None = None

  @property
  def num_grid_nodes(self) -> int:
    return self.grid_node_features.shape[0]

  @property
  def num_mesh_nodes(self) -> int:
    return self.mesh_node_features.shape[0]

  def counts(self) -> dict[str, int]:
    """Node and edge counts, the keys of `launch.graph_info --json`."""
    counts = {
        "grid_nodes": self.num_grid_nodes,
        "mesh_nodes": self.num_mesh_nodes,
        "grid_to_mesh_edges": len(self.grid_to_mesh.senders),
        "mesh_edges": len(self.mesh.senders),
        "mesh_to_grid_edges": len(self.mesh_to_grid.senders),
    }
    if self.mesh_neighbours is not None:
      counts["mesh_neighbour_edges"] = len(self.mesh_neighbours.senders)
    return counts

  def with_neighbourhoods(self, senders: np.ndarray, receivers: np.ndarray) -> Graphs:
    """These graphs with `mesh_neighbours` set to the given mesh -> mesh edges."""
    return self._replace(mesh_neighbours=EdgeSet(
        senders, receivers, np.zeros((len(senders), 0), np.float32)))


def _edge_set(senders, receivers, sender_lat_lon, receiver_lat_lon,
              normalization=None) -> EdgeSet:
  return EdgeSet(
      senders.astype(np.int32), receivers.astype(np.int32),
      features.edge_features(*sender_lat_lon, *receiver_lat_lon, senders, receivers,
                             normalization))


def _build(latitude, longitude, mesh_levels, radius_fraction,
           mesh_to_grid_normalization) -> Graphs:
  grid_lat_lon = grid.grid_lat_lon(latitude.astype(np.float32), longitude.astype(np.float32))
  grid_xyz = grid.lat_lon_to_xyz(*grid_lat_lon)  # float32
  meshes = icosahedron.mesh_hierarchy(mesh_levels)
  finest = meshes[-1]
  mesh_lat_lon = grid.xyz_to_lat_lon(finest.vertices)  # float32

  # float32 radius, as the reference's: its bits decide ties at the radius.
  radius = connectivity.max_edge_length(finest) * np.float32(radius_fraction)
  g2m_senders, g2m_receivers = connectivity.grid_to_mesh_edges(grid_xyz, finest, radius)
  mesh_senders, mesh_receivers = icosahedron.multi_mesh_edges(meshes)
  m2g_senders, m2g_receivers = connectivity.mesh_to_grid_edges(grid_xyz, finest)
  return Graphs(
      grid_node_features=features.node_features(*grid_lat_lon),
      mesh_node_features=features.node_features(*mesh_lat_lon),
      grid_to_mesh=_edge_set(g2m_senders, g2m_receivers, grid_lat_lon, mesh_lat_lon),
      mesh=_edge_set(mesh_senders, mesh_receivers, mesh_lat_lon, mesh_lat_lon),
      mesh_to_grid=_edge_set(m2g_senders, m2g_receivers, mesh_lat_lon, grid_lat_lon,
                             mesh_to_grid_normalization or None),
  )


def _cache_key(latitude, longitude, mesh_levels, radius_fraction,
               mesh_to_grid_normalization) -> str:
  """A hash of the inputs and of the graph code (a change to it rebuilds)."""
  digest = hashlib.sha256()
  digest.update(f"{cache.source_digest('graphs')}:{mesh_levels}:{radius_fraction!r}:"
                f"{mesh_to_grid_normalization!r}:".encode())
  digest.update(np.ascontiguousarray(latitude, dtype=np.float64).tobytes())
  digest.update(b"|")
  digest.update(np.ascontiguousarray(longitude, dtype=np.float64).tobytes())
  return digest.hexdigest()[:24]


def _flatten(graphs: Graphs) -> dict[str, np.ndarray]:
  flat = {}
  for name, value in graphs._asdict().items():
    if value is None:  # mesh_neighbours: cached on their own (neighbourhoods.py)
      continue
    if isinstance(value, EdgeSet):
      flat.update({f"{name}.{field}": v for field, v in value._asdict().items()})
    else:
      flat[name] = value
  return flat


def _unflatten(flat) -> Graphs:
  def edge_set(name):
    return EdgeSet(*(flat[f"{name}.{field}"] for field in EdgeSet._fields))
  return Graphs(flat["grid_node_features"], flat["mesh_node_features"],
                edge_set("grid_to_mesh"), edge_set("mesh"), edge_set("mesh_to_grid"))


def build_graphs(latitude, longitude, mesh_levels: int, radius_fraction: float = 0.6,
                 mesh_to_grid_normalization: float = 0.0,
                 use_cache: bool = True) -> Graphs:
  """The model's graphs for a latitude/longitude grid (any regular grid, either order).

  Args:
    latitude: `[num_lat]` degrees, ascending or descending, with or without poles.
    longitude: `[num_lon]` degrees.
    mesh_levels: refinements of the icosahedron; the multi-mesh merges levels
      0..mesh_levels (6 gives GraphCast's 40,962 nodes).
    radius_fraction: grid-to-mesh radius as a fraction of the finest mesh's
      longest edge.
    mesh_to_grid_normalization: what mesh-to-grid edge features are divided by;
      0: the longest mesh-to-grid edge (the other edge sets always use theirs).
    use_cache: read and write `<cache dir>/graphs/<key>.npz`, keyed by all
      inputs and the graph code.
  """
  latitude = np.asarray(latitude, dtype=np.float64)
  longitude = np.asarray(longitude, dtype=np.float64)
  grid.check_global(latitude, longitude)
  path = cache.cache_path("graphs", _cache_key(
      latitude, longitude, mesh_levels, radius_fraction,
      float(mesh_to_grid_normalization)) + ".npz")
  start = time.perf_counter()
  if use_cache and paths.exists(path):
    with np.load(io.BytesIO(paths.read_bytes(path))) as cached:
      graphs = _unflatten(dict(cached))
    logging.info("Graphs from the cache %s in %.1f s: %s", path, time.perf_counter() - start,
                 graphs.counts())
    return graphs
  graphs = _build(latitude, longitude, mesh_levels, radius_fraction,
                  float(mesh_to_grid_normalization))
  logging.info("Built graphs in %.1f s: %s", time.perf_counter() - start, graphs.counts())
  if use_cache:  # whole or not at all: a crash never leaves a half file
    buffer = io.BytesIO()
    np.savez(buffer, **_flatten(graphs))
    paths.write_bytes(path, buffer.getvalue())
  return graphs
