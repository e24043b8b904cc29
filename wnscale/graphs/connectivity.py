"""Edges between the grid and the mesh, GraphCast's definition.

* grid -> mesh: every (grid node, mesh node) pair whose straight-line (chord)
  distance is at most a radius, so each mesh node gathers the grid around it
  (the encoder's receptive field). The radius is a fraction of the finest
  mesh's longest edge, in float32 as the reference computes it.
* mesh -> grid: each grid node to the 3 vertices of the finest-mesh face whose
  *flat* triangle is closest to it (what the reference gets from trimesh's
  closest point). Among equally close faces, which happens when the closest
  point lies on an edge or vertex shared by them, the face whose normal points
  most toward the grid node wins. For a grid node off every edge this is the
  face that contains it; for a node exactly on an edge the reference's pick
  depends on float rounding and order and cannot be reproduced.
* grid -> points: each point (e.g. a station) to its nearest grid nodes, with
  inverse-distance weights: the fixed interpolation of grid values to the point.

Positions are float32 unit vectors (the reference's), distances float64.
"""

from __future__ import annotations

import itertools

import numpy as np
from scipy import spatial

from wnscale.errors import UserError
from wnscale.graphs import blocks
from wnscale.graphs.icosahedron import TriangularMesh, faces_to_directed_edges


def max_edge_length(mesh: TriangularMesh) -> np.float32:
  """Longest chord of any face edge of `mesh`, float32 as the reference computes it."""
  senders, receivers = faces_to_directed_edges(mesh.faces)
  return np.linalg.norm(mesh.vertices[senders] - mesh.vertices[receivers], axis=-1).max()


def local_edge_lengths(mesh: TriangularMesh) -> np.ndarray:
  """`[num_vertices]` float32: the longest chord of the faces around each vertex (a
  regionally refined mesh's radius per node: small where its faces are)."""
  senders, receivers = faces_to_directed_edges(mesh.faces)
  length = np.linalg.norm(mesh.vertices[senders] - mesh.vertices[receivers], axis=-1)
  longest = np.zeros(len(mesh.vertices), np.float32)
  faces = np.tile(np.arange(len(mesh.faces)), 3)  # the face of each directed edge
  per_face = np.zeros(len(mesh.faces), np.float32)
  np.maximum.at(per_face, faces, length)
  np.maximum.at(longest, mesh.faces.reshape(-1), np.repeat(per_face, 3))
  return longest


def grid_to_mesh_edges(grid_xyz: np.ndarray, mesh: TriangularMesh, radius):
  """All (grid node, mesh node) pairs at distance <= `radius`, sorted by receiver, then sender.

  The reference's query (`cKDTree(grid).query_ball_point(mesh vertices, radius)`), on
  every core.

  Args:
    grid_xyz: `[num_grid_nodes, 3]` unit vectors.
    mesh: the finest mesh; its vertices are the receivers.
    radius: chord length: one for all, or `[num_vertices]`, each mesh node's own.

  Returns:
    `(senders [num_edges] grid indices, receivers [num_edges] mesh indices)`.

  Raises:
    UserError: if some mesh node has no grid node within the radius.
  """
  radius = np.broadcast_to(np.asarray(radius, np.float64), (len(mesh.vertices),))
  # One sorted list of grid nodes per mesh node, in mesh node order.
  found = spatial.cKDTree(grid_xyz).query_ball_point(mesh.vertices, radius, workers=-1,
                                                     return_sorted=True)
  covered = np.fromiter(map(len, found), np.int64, len(found))
  if np.any(covered == 0):
    lonely = int(np.sum(covered == 0))
    raise UserError(
        f"The mesh is too fine for the grid: {lonely} of {len(covered)} mesh nodes have "
        f"no grid node within the grid-to-mesh radius ({np.max(radius):.4f} chord). Use fewer "
        "mesh refinements (model.mesh_levels) or a finer grid, or raise "
        "model.radius_fraction.")
  senders = np.fromiter(itertools.chain.from_iterable(found), np.int64, covered.sum())
  return senders, np.repeat(np.arange(len(found), dtype=np.int64), covered)


def points_to_mesh_edges(points_xyz: np.ndarray, mesh: TriangularMesh, radius: float):
  """All (point, mesh node) pairs at distance <= `radius`, and each point with none in range
  joined to its nearest mesh node; sorted by receiver. Mesh nodes may receive nothing.

  Args:
    points_xyz: `[num_points, 3]` unit vectors (e.g. stations).
    mesh: the finest mesh; its vertices are the receivers.
    radius: chord length.

  Returns:
    `(senders [num_edges] point indices, receivers [num_edges] mesh indices)`.
  """
  mesh_tree = spatial.cKDTree(mesh.vertices)
  pairs = mesh_tree.sparse_distance_matrix(spatial.cKDTree(points_xyz), float(radius),
                                           output_type="ndarray")
  receivers, senders = pairs["i"].astype(np.int64), pairs["j"].astype(np.int64)
  lonely = np.flatnonzero(np.bincount(senders, minlength=len(points_xyz)) == 0)
  _, nearest = mesh_tree.query(points_xyz[lonely])
  senders = np.concatenate([senders, lonely])
  receivers = np.concatenate([receivers, np.asarray(nearest, np.int64).reshape(-1)])
  order = np.lexsort((senders, receivers))
  return senders[order], receivers[order]


def inverse_distance_edges(senders_xyz: np.ndarray, receivers_xyz: np.ndarray, k: int):
  """Each receiver to its `k` nearest senders, weighted by inverse distance (summing to 1 per
  receiver): a fixed interpolation from the senders' values to the receivers.

  Args:
    senders_xyz: `[num_senders, 3]` unit vectors (e.g. the grid's); at least `k`.
    receivers_xyz: `[num_receivers, 3]` unit vectors (e.g. stations).

  Returns:
    `(senders [R k], receivers [R k] sorted, weights [R k] float64)`.
  """
  distance, nearest = spatial.cKDTree(senders_xyz).query(receivers_xyz, k, workers=-1)
  distance, nearest = np.reshape(distance, (-1, k)), np.reshape(nearest, (-1, k))
  weights = 1.0 / np.maximum(distance, 1e-9)  # a receiver on a sender: that sender alone
  weights /= weights.sum(axis=1, keepdims=True)
  receivers = np.repeat(np.arange(len(receivers_xyz), dtype=np.int64), k)
  return nearest.reshape(-1).astype(np.int64), receivers, weights.reshape(-1)


# How far inside all three edge planes of a face (`_containing_faces`' sides) a point
# must be for that face to be the only one containing it, even with the search's
# tolerance of -1e-12: a thousand times that tolerance.
_CLEARLY_INSIDE = 1e-9


def _containing_faces(points, vertices, faces, candidates: int, block: int, margin: float):
  """`(containing [num_points], near_edge [num_points] bool)`: a face whose spherical
  triangle contains each point, and whether the point's orthogonal projection on that
  face's plane lies outside the flat triangle or within `margin` of an edge (relative to
  the edge's length).

  A point clearly inside one of the faces around its nearest vertex
  (`_CLEARLY_INSIDE`) lies in that face only. Every other point (near an edge) is
  tested against the `candidates` faces with the nearest centroids and takes the first
  that holds it within 1e-12, so a point on an edge gets one of its faces; a point in
  none of them (beside a regionally refined patch's small faces, a big face's centroid
  can be farther) is tested against every face. Blocks of `block` points are worked on
  in threads (`blocks.for_blocks`).

  Args:
    points: `[num_points, 3]` float64 unit vectors.
    vertices: `[num_vertices, 3]` float64; faces: `[num_faces, 3]` counter-clockwise.
  """
  corners = vertices[faces]
  # Outward normals of the planes through the origin and each face edge: a point
  # is inside a (counter-clockwise) face when it is on the inner side of all three.
  edge_normals = np.cross(corners, np.roll(corners, -1, axis=1))  # [num_faces, 3, 3]
  fan = _faces_around_vertices(faces, len(vertices))  # [num_vertices, max degree]
  fan_normals = edge_normals[fan]  # [num_vertices, max degree, 3, 3]
  vertex_tree = spatial.cKDTree(vertices)
  centroid_tree = spatial.cKDTree(corners.mean(axis=1))
  containing = np.empty(len(points), dtype=np.int64)
  near_edge = np.empty(len(points), dtype=bool)

  def search(chunk) -> np.ndarray:  # the first of the nearest centroids' faces holding it
    _, nearest = centroid_tree.query(chunk, k=candidates)
    # [points, candidates, 3]: signed distance of each point to each edge plane.
    sides = np.einsum("pkej,pj->pke", edge_normals[nearest], chunk)
    inside = np.all(sides >= -1e-12, axis=-1)
    found = nearest[np.arange(len(chunk)), inside.argmax(axis=1)]
    for point in np.flatnonzero(~inside.any(axis=1)):
      every = np.all(np.einsum("kej,j->ke", edge_normals, chunk[point]) >= -1e-12, axis=-1)
      if not every.any():
        raise RuntimeError("A grid node lies in no mesh face: the mesh is not closed.")
      found[point] = int(np.argmax(every))
    return found

  def work(rows: slice):
    chunk = points[rows]
    _, nearest_vertex = vertex_tree.query(chunk)
    sides = np.einsum("pkej,pj->pke", fan_normals[nearest_vertex], chunk)
    clearly = np.all(sides > _CLEARLY_INSIDE, axis=-1)  # [points, max degree]
    found = fan[nearest_vertex, clearly.argmax(axis=1)]
    unclear = np.flatnonzero(~clearly.any(axis=1))
    found[unclear] = search(chunk[unclear])
    containing[rows] = found
    near_edge[rows] = ~_foot_inside(chunk, corners[found], margin)

  blocks.for_blocks(len(points), block, work)
  return containing, near_edge


def _foot_inside(points, corners, margin: float) -> np.ndarray:
  """`[n]` bool: the orthogonal projection of each point on its face's plane lies
  inside the flat triangle, at least `margin` (relative to the edge) from every edge.

  Args:
    points: `[n, 3]`; corners: `[n, 3, 3]` each point's triangle.
  """
  normals = np.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0])
  normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
  edges = np.roll(corners, -1, axis=1) - corners  # [n, 3 edges, 3]
  # Distance of the foot from each edge's line, positive inside (counter-clockwise).
  offsets = np.einsum("nej,nj->ne", np.cross(edges, points[:, None] - corners), normals)
  return np.all(offsets > margin * np.linalg.norm(edges, axis=-1), axis=-1)


def closest_points_on_triangles(points: np.ndarray, corners: np.ndarray) -> np.ndarray:
  """`[n, 3]` the point of each flat triangle closest to each point.

  The Voronoi-region test of Ericson (Real-Time Collision Detection, 5.1.5),
  vectorized: vertex regions, then edge regions, else the interior.

  Args:
    points: `[n, 3]`; corners: `[n, 3, 3]` the triangles' vertices.
  """
  a, b, c = corners[:, 0], corners[:, 1], corners[:, 2]
  dot = lambda u, v: np.einsum("nj,nj->n", u, v)
  ab, ac = b - a, c - a
  d1, d2 = dot(ab, points - a), dot(ac, points - a)
  d3, d4 = dot(ab, points - b), dot(ac, points - b)
  d5, d6 = dot(ab, points - c), dot(ac, points - c)
  va, vb, vc = d3 * d6 - d5 * d4, d5 * d2 - d1 * d6, d1 * d4 - d3 * d2
  with np.errstate(divide="ignore", invalid="ignore"):  # unused branches divide by 0
    along_ab = d1 / (d1 - d3)
    along_ac = d2 / (d2 - d6)
    along_bc = (d4 - d3) / ((d4 - d3) + (d5 - d6))
    v, w = vb / (va + vb + vc), vc / (va + vb + vc)
  conditions = [
      (d1 <= 0) & (d2 <= 0), (d3 >= 0) & (d4 <= d3), (d6 >= 0) & (d5 <= d6),
      (vc <= 0) & (d1 >= 0) & (d3 <= 0), (vb <= 0) & (d2 >= 0) & (d6 <= 0),
      (va <= 0) & (d4 - d3 >= 0) & (d5 - d6 >= 0)]
  choices = [a, b, c, a + along_ab[:, None] * ab, a + along_ac[:, None] * ac,
             b + along_bc[:, None] * (c - b)]
  return np.select([k[:, None] for k in conditions], choices,
                   default=a + v[:, None] * ab + w[:, None] * ac)


def _faces_around_vertices(faces: np.ndarray, num_vertices: int) -> np.ndarray:
  """`[num_vertices, max_degree]` faces incident to each vertex (a short row repeats its first)."""
  vertex = faces.reshape(-1)
  face = np.repeat(np.arange(len(faces)), 3)
  order = np.argsort(vertex, kind="stable")
  vertex, face = vertex[order], face[order]
  degree = np.bincount(vertex, minlength=num_vertices)
  start = np.concatenate([[0], np.cumsum(degree)[:-1]])
  slot = np.arange(len(vertex)) - start[vertex]
  table = np.repeat(face[start][:, None], degree.max(), axis=1)
  table[vertex, slot] = face
  return table


def _candidate_distances(points, guesses, vertices, faces):
  """`(candidates [n, k], corners [n, k, 3, 3], offsets [n, k, 3], squared [n, k])`: the
  faces touching a vertex of each point's guessed face, and each point's offset from
  (and squared distance to) the closest point of each."""
  around = _faces_around_vertices(faces, len(vertices))
  candidates = around[faces[guesses]].reshape(len(points), -1)  # [n, 3 * max_degree]
  corners = vertices[faces[candidates]]  # [n, k, 3, 3]
  repeated = np.repeat(points, candidates.shape[1], axis=0)
  closest = closest_points_on_triangles(repeated, corners.reshape(-1, 3, 3))
  offsets = (repeated - closest).reshape(candidates.shape + (3,))
  return candidates, corners, offsets, np.einsum("nkj,nkj->nk", offsets, offsets)


def _closest_faces(points, guesses, vertices, faces) -> np.ndarray:
  """`[n]` the closest flat face to each point, searched around its guessed face.

  Candidates are the faces touching a vertex of the guess. Faces within float
  rounding of the smallest distance are equally close; among them the one whose
  unit normal has the largest dot product with the unit vector from the closest
  point to the point wins.
  """
  candidates, corners, offsets, squared = _candidate_distances(points, guesses, vertices,
                                                               faces)
  nearest = squared.min(axis=1, keepdims=True)
  equal = squared <= nearest * (1 + 1e-9)
  normals = np.cross(corners[..., 1, :] - corners[..., 0, :],
                     corners[..., 2, :] - corners[..., 0, :])
  normals /= np.linalg.norm(normals, axis=-1, keepdims=True)
  with np.errstate(divide="ignore", invalid="ignore"):  # a point on the mesh: 0 / 0
    facing = np.einsum("nkj,nkj->nk", normals, offsets) / np.sqrt(squared)
  facing = np.where(equal & np.isfinite(facing), facing, -np.inf)
  best = np.where(np.isfinite(facing).any(axis=1), facing.argmax(axis=1),
                  squared.argmin(axis=1))
  return candidates[np.arange(len(points)), best]


def mesh_to_grid_edges(grid_xyz: np.ndarray, mesh: TriangularMesh,
                       candidates: int = 8, block: int = 65536):
  """Each grid node to the 3 vertices of the closest flat mesh face (see module doc).

  The face containing a grid node (on the sphere) is found first. When the
  node's orthogonal projection on that face's plane lies inside the flat
  triangle, the face is the closest: the mesh is convex, so no other face comes
  nearer than that plane. Only the few nodes near an edge, whose projection
  falls near or outside the triangle, get the full search among the faces around.

  Returns:
    `(senders [3 * num_grid_nodes] mesh indices, receivers [3 * num_grid_nodes]
    grid indices)`, sorted by receiver; each node's senders in face order.
  """
  vertices, faces = mesh.vertices.astype(np.float64), mesh.faces
  points = grid_xyz.astype(np.float64)
  chosen, near_edge = _containing_faces(points, vertices, faces, candidates, block, 1e-9)
  if near_edge.any():  # a few stations may have none
    chosen[near_edge] = _closest_faces(points[near_edge], chosen[near_edge], vertices, faces)
  senders = faces[chosen].reshape(-1)
  receivers = np.repeat(np.arange(len(grid_xyz)), 3)
  return senders, receivers
