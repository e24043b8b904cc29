"""Builds the graphs of a GraphCast model for a grid, cached on disk.

`build_graphs(points, mesh_levels, edge_sets)` returns `Graphs`
(`wnscale.graphs.graph`) with the node sets `grid` (the `points.PointSet`'s points)
and `mesh` and one edge set
per entry of `edge_sets` (`wnscale.graphs.edge_sets`; GraphCast's three by
default).

The graphs are GraphCast's (google-deepmind/graphcast), index for index where
the reference's order is defined: mesh node i is the reference's vertex i, and
grid node i is the point set's point i (a regular grid's `i_lat * num_lon + i_lon`,
in its latitude order). The points' latitude and longitude are rounded to float32
first, as the reference does. The grid-to-mesh radius query and the mesh-to-grid
containing triangle work on the unit vectors of any points.
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import time

import numpy as np

from wnscale import cache, paths
from wnscale.errors import UserError
from wnscale.graphs import features, grid, icosahedron
from wnscale.graphs import region as region_lib
from wnscale.graphs.points import PointSet
from wnscale.graphs.edge_sets import EdgeSetSpec, Geometry, graphcast_edge_sets
from wnscale.graphs.graph import EdgeSet, Graphs, NodeSet

# Bumped when the cached file's layout changes, so an old file is never misread.
CACHE_FORMAT = 2


def _node_lat_lon(points: PointSet, meshes,
                  point_sets: dict[str, PointSet]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Per node set, float32 latitude and longitude of its nodes (degrees)."""
  lat_lon = lambda p: (p.latitude.astype(np.float32), p.longitude.astype(np.float32))
  return {"grid": lat_lon(points), "mesh": grid.xyz_to_lat_lon(meshes[-1].vertices),
          **{name: lat_lon(p) for name, p in point_sets.items()}}


def _build_edge_set(spec: EdgeSetSpec, geometry: Geometry, lat_lon: dict,
                    use_cache: bool) -> EdgeSet:
  senders, receivers, *own = spec.connect(geometry, spec.senders, spec.receivers, use_cache)
  senders, receivers = (a.astype(np.int32, copy=False) for a in (senders, receivers))
  if spec.features:
    edge_features = features.edge_features(
        geometry.xyz[spec.senders], geometry.xyz[spec.receivers], *lat_lon[spec.receivers],
        senders, receivers, spec.normalization or None)
  elif own:  # the connectivity's (e.g. interpolation weights)
    edge_features = own[0]
  else:
    edge_features = np.zeros((len(senders), 0), np.float32)
  return EdgeSet(senders, receivers, edge_features, spec.senders, spec.receivers)


def _cache_key(points: PointSet, mesh_levels, edge_sets: dict[str, EdgeSetSpec],
               point_sets: dict[str, PointSet], regional_mesh_levels: int = 0) -> str:
  """A hash of the inputs and of the graph code (a change to it rebuilds)."""
  digest = hashlib.sha256()
  digest.update(f"{CACHE_FORMAT}:{cache.source_digest('graphs')}:{mesh_levels}:"
                f"{sorted(edge_sets.items())!r}:".encode())
  digest.update(points.digest())
  for name, point_set in sorted(point_sets.items()):  # none: the grid's key of before
    digest.update(name.encode() + b":" + point_set.digest())
  if regional_mesh_levels:  # the mesh depends on the region too
    digest.update(f"regional {regional_mesh_levels}:".encode() + points.region.tobytes())
  return digest.hexdigest()[:24]


def meshes_on(points: PointSet, mesh_levels: int, regional_mesh_levels: int = 0):
  """The icosahedral hierarchy of the graphs on `points`, finest last: `mesh_levels`
  refinements, then `regional_mesh_levels` more of the faces inside a cut-out's region
  (the spherical convex hull of its regional points, `region.in_hull`).

  Raises:
    UserError: regional levels without a region.
  """
  if not regional_mesh_levels:
    return icosahedron.mesh_hierarchy(mesh_levels)
  if points.region is None:
    raise UserError(f"model.regional_mesh_levels={regional_mesh_levels} refines the mesh in a "
                    f"cut-out's region, and {points.name} has none: set data.regional_path "
                    "(or model.regional_mesh_levels=0).")
  region_xyz = points.xyz()[points.region]
  return icosahedron.mesh_hierarchy(
      mesh_levels, lambda xyz: region_lib.in_hull(xyz, region_xyz, "the region"),
      regional_mesh_levels)


def _flatten(graphs: Graphs) -> dict[str, np.ndarray]:
  flat = {f"nodes/{name}/features": nodes.features for name, nodes in graphs.nodes.items()}
  for name, edges in graphs.edges.items():
    flat.update({f"edges/{name}/{field}": getattr(edges, field)
                 for field in ("senders", "receivers", "features")})
  return flat


def _unflatten(flat, edge_sets: dict[str, EdgeSetSpec]) -> Graphs:
  def edge_set(name, spec):
    return EdgeSet(*(flat[f"edges/{name}/{field}"] for field in ("senders", "receivers",
                                                                 "features")),
                   spec.senders, spec.receivers)
  nodes = {key.split("/")[1]: NodeSet(value) for key, value in flat.items()
           if key.startswith("nodes/")}
  return Graphs(nodes, {name: edge_set(name, spec) for name, spec in edge_sets.items()})


def build_graphs(points: PointSet, mesh_levels: int,
                 edge_sets: dict[str, EdgeSetSpec] | None = None,
                 use_cache: bool = True, regional_mesh_levels: int = 0,
                 point_sets: dict[str, PointSet] | None = None) -> Graphs:
  """The model's graphs on a point set that covers the globe.

  Args:
    points: the grid nodes (a regular grid in either latitude order, with or
      without poles, or any points).
    mesh_levels: refinements of the icosahedron; the multi-mesh merges levels
      0..mesh_levels (6 gives GraphCast's 40,962 nodes).
    edge_sets: `{name: EdgeSetSpec}` to build, in this order; None:
      `graphcast_edge_sets()`.
    use_cache: read and write `<cache dir>/graphs/<key>.npz`, keyed by all
      inputs and the graph code (edge sets that are `cached_apart` cache
      themselves).
    regional_mesh_levels: more refinements inside a cut-out's region (`meshes_on`).
    point_sets: more node sets by name (a modality's points, e.g. stations),
      which need not cover the globe; `edge_sets` join them to the mesh.
  """
  edge_sets = graphcast_edge_sets() if edge_sets is None else edge_sets
  point_sets = point_sets or {}
  points.check_global()
  together = {name: spec for name, spec in edge_sets.items() if not spec.connect.cached_apart}
  path = cache.cache_path("graphs", _cache_key(points, mesh_levels, together, point_sets,
                                               regional_mesh_levels) + ".npz")
  start = time.perf_counter()

  @functools.cache
  def geometry():  # `(Geometry, lat_lon)`, only when something is built
    meshes = meshes_on(points, mesh_levels, regional_mesh_levels)
    lat_lon = _node_lat_lon(points, meshes, point_sets)
    return Geometry({name: grid.lat_lon_to_xyz(*ll) for name, ll in lat_lon.items()},
                    meshes, regional_mesh_levels), lat_lon

  if use_cache and paths.exists(path):
    with np.load(io.BytesIO(paths.read_bytes(path))) as cached:
      graphs = _unflatten(dict(cached), together)
    logging.info("Graphs from the cache %s in %.1f s: %s", path, time.perf_counter() - start,
                 graphs.counts())
  else:
    graphs = Graphs({name: NodeSet(features.node_features(*ll))
                     for name, ll in geometry()[1].items()},
                    {name: _build_edge_set(spec, *geometry(), use_cache)
                     for name, spec in together.items()})
    logging.info("Built graphs in %.1f s: %s", time.perf_counter() - start, graphs.counts())
    if use_cache:  # whole or not at all: a crash never leaves a half file
      buffer = io.BytesIO()
      np.savez(buffer, **_flatten(graphs))
      cache.write_bytes(path, buffer.getvalue())
  apart = {name: _build_edge_set(spec, *geometry(), use_cache)
           for name, spec in edge_sets.items() if spec.connect.cached_apart}
  # In the declared order.
  return graphs._replace(edges={name: {**graphs.edges, **apart}[name] for name in edge_sets})


def node_positions(points: PointSet, mesh_levels: int,
                   regional_mesh_levels: int = 0,
                   point_sets: dict[str, PointSet] | None = None) -> dict[str, np.ndarray]:
  """Per node set, `[num_nodes, 3]` unit vectors (float64 grid), for spatial partitioning."""
  return {"grid": points.xyz(),
          "mesh": meshes_on(points, mesh_levels, regional_mesh_levels)[-1].vertices,
          **{name: p.xyz() for name, p in (point_sets or {}).items()}}
