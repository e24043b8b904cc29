"""Edges between the grid and the mesh.

* grid -> mesh: every (grid node, mesh node) pair closer than a radius, so each
  mesh node gathers the grid around it (the encoder's receptive field);
* mesh -> grid: each grid node to the 3 vertices of the finest-mesh triangle
  that contains it (the decoder interpolates from them).

Distances are chords between unit vectors, as in GraphCast.
"""

from __future__ import annotations

import numpy as np
from scipy import spatial

from wnscale.errors import UserError
from wnscale.graphs.icosahedron import TriangularMesh


def max_edge_length(mesh: TriangularMesh) -> float:
  """Longest chord of any face edge of `mesh`."""
  v = mesh.vertices
  f = mesh.faces
  lengths = [np.linalg.norm(v[f[:, i]] - v[f[:, (i + 1) % 3]], axis=1) for i in range(3)]
  return float(np.max(lengths))


def grid_to_mesh_edges(grid_xyz: np.ndarray, mesh: TriangularMesh, radius: float):
  """All (grid node, mesh node) pairs within `radius`, sorted by receiver.

  Args:
    grid_xyz: `[num_grid_nodes, 3]` unit vectors.
    mesh: the finest mesh; its vertices are the receivers.
    radius: chord length.

  Returns:
    `(senders [num_edges] grid indices, receivers [num_edges] mesh indices)`.

  Raises:
    ValueError: if some mesh node has no grid node within the radius.
  """
  mesh_tree = spatial.cKDTree(mesh.vertices)
  grid_tree = spatial.cKDTree(grid_xyz)
  pairs = mesh_tree.sparse_distance_matrix(grid_tree, radius, output_type="ndarray")
  receivers = pairs["i"].astype(np.int64)
  senders = pairs["j"].astype(np.int64)
  covered = np.bincount(receivers, minlength=len(mesh.vertices))
  if np.any(covered == 0):
    lonely = int(np.sum(covered == 0))
    raise UserError(
        f"The mesh is too fine for the grid: {lonely} of {len(covered)} mesh nodes have "
        f"no grid node within the grid-to-mesh radius ({radius:.4f} chord). Use fewer "
        "mesh refinements (model.mesh_levels) or a finer grid, or raise "
        "model.radius_fraction.")
  order = np.lexsort((senders, receivers))
  return senders[order], receivers[order]


def mesh_to_grid_edges(grid_xyz: np.ndarray, mesh: TriangularMesh,
                       candidates: int = 8, block: int = 262144):
  """Each grid node to the 3 vertices of the mesh face that contains it.

  The containing face is found among the `candidates` faces whose centroids are
  nearest (a KD-tree query), by testing the point against the three great-circle
  planes of each candidate face.

  Returns:
    `(senders [3 * num_grid_nodes] mesh indices, receivers [3 * num_grid_nodes]
    grid indices)`, sorted by receiver.
  """
  vertices, faces = mesh.vertices, mesh.faces
  corners = vertices[faces]  # [num_faces, 3, 3]
  # Outward normals of the planes through the origin and each face edge: a point
  # is inside a (counter-clockwise) face when it is on the inner side of all three.
  edge_normals = np.cross(corners, np.roll(corners, -1, axis=1))  # [num_faces, 3, 3]
  centroid_tree = spatial.cKDTree(corners.mean(axis=1))
  containing = np.empty(len(grid_xyz), dtype=np.int64)
  for start in range(0, len(grid_xyz), block):
    points = grid_xyz[start:start + block]
    _, nearest = centroid_tree.query(points, k=candidates)
    # [points, candidates, 3]: signed distance of each point to each edge plane.
    sides = np.einsum("pkej,pj->pke", edge_normals[nearest], points)
    inside = np.all(sides >= -1e-12, axis=-1)
    if not np.all(inside.any(axis=1)):
      raise RuntimeError("A grid node lies in none of its nearest mesh faces; "
                         "raise `candidates`.")
    containing[start:start + block] = nearest[np.arange(len(points)), inside.argmax(axis=1)]
  senders = faces[containing].reshape(-1)
  receivers = np.repeat(np.arange(len(grid_xyz)), 3)
  return senders, receivers
