"""Edge sets as data: which node sets an edge set joins, and how its edges are found.

An `EdgeSetSpec` is one entry of a `{name: EdgeSetSpec}` dict that
`build.build_graphs` builds; a new edge set is one more entry, e.g. a second,
wider grid-to-mesh edge set:

  edge_sets = dict(graphcast_edge_sets(),
                   grid_to_mesh_wide=EdgeSetSpec("grid", "mesh", WithinRadius(1.0)))

The connectivities are frozen dataclasses: their repr is part of the graph
cache's key, so a changed parameter builds anew.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
from scipy import spatial

from wnscale.graphs import connectivity, icosahedron
from wnscale.graphs.neighbourhoods import build_neighbourhoods


class Geometry(NamedTuple):
  """What connectivities are computed from.

  Attributes:
    xyz: per node set, `[num_nodes, 3]` float32 unit vectors.
    meshes: the icosahedral hierarchy, finest last; the `mesh` node set is
      the finest mesh's vertices.
    regional_levels: how many of the finest meshes refine a region only
      (`icosahedron.mesh_hierarchy`).
  """

  xyz: dict[str, np.ndarray]
  meshes: list[icosahedron.TriangularMesh]
  regional_levels: int = 0


@dataclasses.dataclass(frozen=True)
class WithinRadius:
  """Every (sender, mesh node) pair closer than `fraction` x the finest mesh's longest edge.

  GraphCast's grid-to-mesh edges (fraction 0.6); the receivers are the mesh. On a
  regionally refined mesh, `fraction` x the longest edge of the faces around each
  mesh node (`connectivity.local_edge_lengths`), so the region's fine nodes gather
  from nearby grid nodes only; at least as far as the node's nearest grid node (a
  fine node at the region's border, where the grid is coarse).
  """

  fraction: float
  cached_apart = False

  def __call__(self, geometry: Geometry, senders: str, receivers: str, use_cache: bool):
    finest = geometry.meshes[-1]
    # float32 radius, as the reference's: its bits decide ties at the radius.
    if geometry.regional_levels:
      nearest, _ = spatial.cKDTree(geometry.xyz[senders]).query(finest.vertices, workers=-1)
      radius = np.maximum(connectivity.local_edge_lengths(finest) * np.float32(self.fraction),
                          nearest.astype(np.float32) * np.float32(1 + 1e-6))
    else:
      radius = connectivity.max_edge_length(finest) * np.float32(self.fraction)
    return connectivity.grid_to_mesh_edges(geometry.xyz[senders], finest, radius)


@dataclasses.dataclass(frozen=True)
class WithinRadiusOrNearest(WithinRadius):
  """As `WithinRadius` (the finest mesh's longest edge), and a sender with no mesh node in
  range joins its nearest one.

  A modality's encoder edges (`modality_edge_sets`): every station sends, wherever
  it is; a mesh node may hear none.
  """

  def __call__(self, geometry: Geometry, senders: str, receivers: str, use_cache: bool):
    finest = geometry.meshes[-1]
    radius = connectivity.max_edge_length(finest) * np.float32(self.fraction)
    return connectivity.points_to_mesh_edges(geometry.xyz[senders], finest, radius)


@dataclasses.dataclass(frozen=True)
class MultiMesh:
  """The edges of every refinement level merged (mesh -> mesh), GraphCast's multi-mesh."""

  cached_apart = False

  def __call__(self, geometry: Geometry, senders: str, receivers: str, use_cache: bool):
    return icosahedron.multi_mesh_edges(geometry.meshes)


@dataclasses.dataclass(frozen=True)
class InMeshTriangle:
  """Each receiver to the 3 vertices of its finest-mesh triangle (the senders: the mesh)."""

  cached_apart = False

  def __call__(self, geometry: Geometry, senders: str, receivers: str, use_cache: bool):
    return connectivity.mesh_to_grid_edges(geometry.xyz[receivers], geometry.meshes[-1])


@dataclasses.dataclass(frozen=True)
class InverseDistance:
  """Each receiver to its `k` nearest senders; the edges' one feature is the sender's
  inverse-distance weight (a receiver's sum to 1): the senders' values interpolated.

  A target modality's first guess (`grid_to_<name>`): the grid's state at its points.
  """

  k: int
  cached_apart = False

  def __call__(self, geometry: Geometry, senders: str, receivers: str, use_cache: bool):
    """`(senders, receivers, weights [num_edges, 1] float32)`."""
    senders, receivers, weights = connectivity.inverse_distance_edges(
        geometry.xyz[senders], geometry.xyz[receivers], self.k)
    return senders, receivers, weights.astype(np.float32)[:, None]


@dataclasses.dataclass(frozen=True)
class KHopNeighbours:
  """Each mesh node's `k`-hop neighbourhood on the finest mesh, itself included.

  Cached on their own (`neighbourhoods.build_neighbourhoods`): at 32 hops they
  are 10^8 edges, shared by every grid.
  """

  k: int
  cached_apart = True

  def __call__(self, geometry: Geometry, senders: str, receivers: str, use_cache: bool):
    return build_neighbourhoods(len(geometry.meshes) - 1, self.k, use_cache=use_cache)


class EdgeSetSpec(NamedTuple):
  """One edge set: its sender and receiver node sets and its connectivity.

  Attributes:
    senders, receivers: node set names (`grid`, `mesh`).
    connect: `(Geometry, senders, receivers, use_cache) -> (sender indices,
      receiver indices[, edge features])` sorted by receiver; `cached_apart`: it
      caches itself.
    features: with GraphCast's 4 edge features (length and displacement in
      the receiver's frame), else the connectivity's own, or none (`[num_edges, 0]`).
    normalization: what the features are divided by; 0: the longest edge.
  """

  senders: str
  receivers: str
  connect: (WithinRadius | WithinRadiusOrNearest | MultiMesh | InMeshTriangle | InverseDistance
            | KHopNeighbours)
  features: bool = True
  normalization: float = 0.0


def graphcast_edge_sets(radius_fraction: float = 0.6,
                        mesh_to_grid_normalization: float = 0.0) -> dict[str, EdgeSetSpec]:
  """GraphCast's encoder, multi-mesh and decoder edge sets.

  Args:
    radius_fraction: grid-to-mesh radius as a fraction of the finest mesh's
      longest edge.
    mesh_to_grid_normalization: what mesh-to-grid edge features are divided by;
      0: the longest mesh-to-grid edge (the other edge sets always use theirs).
  """
  return {
      "grid_to_mesh": EdgeSetSpec("grid", "mesh", WithinRadius(float(radius_fraction))),
      "mesh": EdgeSetSpec("mesh", "mesh", MultiMesh()),
      "mesh_to_grid": EdgeSetSpec("mesh", "grid", InMeshTriangle(),
                                  normalization=float(mesh_to_grid_normalization)),
  }


# Grid nodes a target modality's first guess is interpolated from (`InverseDistance`);
# the synthetic station networks observe the grid through the same nodes
# (`wnscale.data.making.stations.NEIGHBOURS`).
FIRST_GUESS_NEIGHBOURS = 4


def encoder_edge_set(node_set: str) -> str:
  """The name of the edges a node set (the grid, a modality's points) sends to the mesh by."""
  return f"{node_set}_to_mesh"


def decoder_edge_set(node_set: str) -> str:
  """The name of the edges the mesh sends to a node set by, to decode it."""
  return f"mesh_to_{node_set}"


def modality_edge_sets(modalities, radius_fraction: float = 0.6) -> dict[str, EdgeSetSpec]:
  """Each modality's (`specs.ModalitySpec`) encoder edges `<name>_to_mesh` if it has
  inputs; if it has targets, decoder edges `mesh_to_<name>` (containing triangle) and
  first-guess edges `grid_to_<name>` (inverse distance over the nearest grid nodes)."""
  edge_sets = {}
  for modality in modalities:
    if modality.inputs:
      edge_sets[encoder_edge_set(modality.name)] = EdgeSetSpec(
          modality.name, "mesh", WithinRadiusOrNearest(float(radius_fraction)))
    if modality.targets:
      edge_sets[decoder_edge_set(modality.name)] = EdgeSetSpec("mesh", modality.name,
                                                               InMeshTriangle())
      edge_sets[f"grid_to_{modality.name}"] = EdgeSetSpec(
          "grid", modality.name, InverseDistance(FIRST_GUESS_NEIGHBOURS), features=False)
  return edge_sets
