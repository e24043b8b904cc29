"""The icosahedral multi-mesh: refined icosahedra with all levels' edges merged.

Refining splits every triangle into four; the vertices of a level are kept (with
the same indices) by every finer level, so the nodes of the finest level index
the edges of all levels. The multi-mesh is the union of every level's directed
edges: coarse levels add long-range links to the fine local ones.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class TriangularMesh:
  """A triangulated unit sphere.

  Attributes:
    vertices: `[num_vertices, 3]` unit vectors.
    faces: `[num_faces, 3]` vertex indices, counter-clockwise seen from outside.
  """

  vertices: np.ndarray
  faces: np.ndarray


def icosahedron() -> TriangularMesh:
  """The regular icosahedron (12 vertices, 20 faces) on the unit sphere."""
  phi = (1.0 + np.sqrt(5.0)) / 2.0
  vertices = np.array([
      [-1, phi, 0], [1, phi, 0], [-1, -phi, 0], [1, -phi, 0],
      [0, -1, phi], [0, 1, phi], [0, -1, -phi], [0, 1, -phi],
      [phi, 0, -1], [phi, 0, 1], [-phi, 0, -1], [-phi, 0, 1],
  ], dtype=np.float64)
  vertices /= np.linalg.norm(vertices, axis=1, keepdims=True)
  faces = np.array([
      [0, 11, 5], [0, 5, 1], [0, 1, 7], [0, 7, 10], [0, 10, 11],
      [1, 5, 9], [5, 11, 4], [11, 10, 2], [10, 7, 6], [7, 1, 8],
      [3, 9, 4], [3, 4, 2], [3, 2, 6], [3, 6, 8], [3, 8, 9],
      [4, 9, 5], [2, 4, 11], [6, 2, 10], [8, 6, 7], [9, 8, 1],
  ], dtype=np.int64)
  return TriangularMesh(vertices, _orient_outward(vertices, faces))


def _orient_outward(vertices: np.ndarray, faces: np.ndarray) -> np.ndarray:
  """Flips faces whose normal points into the sphere."""
  a, b, c = (vertices[faces[:, k]] for k in range(3))
  inward = np.einsum("ij,ij->i", np.cross(b - a, c - a), a) < 0
  faces = faces.copy()
  faces[inward] = faces[inward][:, ::-1]
  return faces


def refine(mesh: TriangularMesh) -> TriangularMesh:
  """Splits each face into four, adding one vertex per edge (projected to the sphere)."""
  faces = mesh.faces
  num_vertices = len(mesh.vertices)
  # The three edges of every face, as sorted vertex pairs: [3 * num_faces, 2].
  edges = np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]])
  unique_edges, edge_id = np.unique(np.sort(edges, axis=1), axis=0, return_inverse=True)
  midpoints = mesh.vertices[unique_edges].sum(axis=1)
  midpoints /= np.linalg.norm(midpoints, axis=1, keepdims=True)
  num_faces = len(faces)
  ab, bc, ca = (num_vertices + edge_id.reshape(3, num_faces))
  a, b, c = faces.T
  new_faces = np.concatenate([
      np.stack([a, ab, ca], 1), np.stack([ab, b, bc], 1),
      np.stack([ca, bc, c], 1), np.stack([ab, bc, ca], 1)])
  return TriangularMesh(np.concatenate([mesh.vertices, midpoints]), new_faces)


def mesh_hierarchy(levels: int) -> list[TriangularMesh]:
  """Meshes of refinement 0..levels; the last one is the finest."""
  meshes = [icosahedron()]
  for _ in range(levels):
    meshes.append(refine(meshes[-1]))
  return meshes


def faces_to_directed_edges(faces: np.ndarray):
  """Both directions of every face edge: `(senders [n], receivers [n])`."""
  pairs = np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]])
  pairs = np.concatenate([pairs, pairs[:, ::-1]])
  pairs = np.unique(pairs, axis=0)
  return pairs[:, 0], pairs[:, 1]


def multi_mesh_edges(meshes: list[TriangularMesh]):
  """Directed edges of all levels merged and de-duplicated, sorted by receiver.

  Returns:
    `(senders [num_edges], receivers [num_edges])` indices into the finest
    mesh's vertices.
  """
  all_faces = np.concatenate([m.faces for m in meshes])
  senders, receivers = faces_to_directed_edges(all_faces)
  order = np.lexsort((senders, receivers))
  return senders[order], receivers[order]
