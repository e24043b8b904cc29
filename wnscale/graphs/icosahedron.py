"""The icosahedral multi-mesh: refined icosahedra with all levels' edges merged.

The mesh is GraphCast's, vertex for vertex and face for face, so that a node
index means the same vertex in wnscale and in the reference implementation
(google-deepmind/graphcast), whose parameters and graphs are compared by index:

* level 0 is the regular icosahedron with vertices at the cyclic permutations of
  (+-1, +-phi, 0), rotated about the y axis so that a face (not a vertex) sits
  at each pole; vertices are float32, as the reference builds them;
* refining splits every face (a, b, c) into (a, ab, ca), (ab, b, bc), (ca, bc, c),
  (ab, bc, ca), face by face, where ab is the midpoint of a and b pushed out to
  the sphere, computed in float32. A new vertex is numbered in the order it is
  first needed, walking the faces in order and each face's edges ab, bc, ca;
  the vertices of a level keep their indices in every finer level, so the
  finest level's vertices index the edges of all levels.

The multi-mesh is the union of every level's directed edges: each face (a, b, c)
gives a -> b, b -> c, c -> a, and as faces are oriented consistently every edge
appears once in each direction. Coarse levels add long-range links to the fine
local ones; edges of different levels never coincide.

A limited-area cut-out may refine further inside its region (`mesh_hierarchy`'s
`regional_levels`): only the faces over it split; the multi-mesh takes every edge
once, in both directions.
"""

from __future__ import annotations

import dataclasses

import numpy as np

# The 20 faces of the level-0 icosahedron, counter-clockwise seen from outside,
# in the reference's order (the order fixes every finer level's numbering).
_ICOSAHEDRON_FACES = np.array([
    (0, 1, 2), (0, 6, 1), (8, 0, 2), (8, 4, 0), (3, 8, 2),
    (3, 2, 7), (7, 2, 1), (0, 4, 6), (4, 11, 6), (6, 11, 5),
    (1, 5, 7), (4, 10, 11), (4, 8, 10), (10, 8, 3), (10, 3, 9),
    (11, 10, 9), (11, 9, 5), (5, 9, 7), (9, 3, 7), (1, 6, 5),
], dtype=np.int32)


@dataclasses.dataclass(frozen=True)
class TriangularMesh:
  """A triangulated unit sphere.

  Attributes:
    vertices: `[num_vertices, 3]` float32 unit vectors.
    faces: `[num_faces, 3]` int32 vertex indices, counter-clockwise seen from outside.
  """

  vertices: np.ndarray
  faces: np.ndarray


def _pole_face_rotation() -> np.ndarray:
  """`[3, 3]` rotation about y that turns a face of the icosahedron to each pole.

  The unrotated icosahedron has an edge parallel to y on top; tilting it by half
  of (pi - dihedral angle) lays one of the two faces at that edge flat.
  Applied to row vectors (`vertices @ rotation`).
  """
  phi = (1.0 + np.sqrt(5.0)) / 2.0
  dihedral = 2.0 * np.arcsin(phi / np.sqrt(3.0))
  angle = (np.pi - dihedral) / 2.0
  cos, sin = np.cos(angle), np.sin(angle)
  return np.array([[cos, 0.0, sin], [0.0, 1.0, 0.0], [-sin, 0.0, cos]])


def icosahedron() -> TriangularMesh:
  """The regular icosahedron (12 vertices, 20 faces) on the unit sphere, a face at each pole."""
  phi = (1.0 + np.sqrt(5.0)) / 2.0
  rows = []
  for a, b in ((1.0, phi), (1.0, -phi), (-1.0, phi), (-1.0, -phi)):
    rows += [(a, b, 0.0), (0.0, a, b), (b, 0.0, a)]  # the cyclic permutations
  # The reference's precision: coordinates rounded to float32, scaled in float64,
  # rotated in float64, each result rounded to float32.
  vertices = np.array(rows, dtype=np.float32)
  vertices = (vertices / np.hypot(1.0, phi)).astype(np.float32)
  vertices = (vertices.astype(np.float64) @ _pole_face_rotation()).astype(np.float32)
  return TriangularMesh(vertices, _ICOSAHEDRON_FACES.copy())


def refine(mesh: TriangularMesh, selected: np.ndarray | None = None) -> TriangularMesh:
  """Splits each face into four, adding one vertex per edge (projected to the sphere).

  Args:
    selected: `[num_faces]` bool, the faces to split (the others stay whole, in their
      place; a split face's edge midpoint then sits on its whole neighbour's edge);
      None: all of them.
  """
  faces = mesh.faces if selected is None else mesh.faces[selected]
  num_vertices, num_faces = len(mesh.vertices), len(faces)
  a, b, c = faces.T
  # Each face's edges ab, bc, ca, face by face: [3 * num_faces, 2].
  edges = np.stack([np.stack([a, b], 1), np.stack([b, c], 1), np.stack([c, a], 1)],
                   axis=1).reshape(-1, 2)
  unique_edges, first_use, edge_id = np.unique(
      np.sort(edges, axis=1), axis=0, return_index=True, return_inverse=True)
  # Number the new vertices in the order their edges are first met.
  order = np.argsort(first_use, kind="stable")
  rank = np.empty(len(order), dtype=np.int64)
  rank[order] = np.arange(len(order))
  ab, bc, ca = (num_vertices + rank[edge_id.reshape(-1)]).reshape(num_faces, 3).T
  new_faces = np.stack([
      np.stack([a, ab, ca], 1), np.stack([ab, b, bc], 1),
      np.stack([ca, bc, c], 1), np.stack([ab, bc, ca], 1)], axis=1).reshape(-1, 3)
  if selected is not None:  # each split face's four in its place, the others as they were
    counts = np.where(selected, 4, 1)
    starts = np.cumsum(counts) - counts
    every = np.empty((counts.sum(), 3), np.int64)
    every[starts[~selected]] = mesh.faces[~selected]
    every[(starts[selected][:, None] + np.arange(4)).reshape(-1)] = new_faces
    new_faces = every
  # float32 midpoints, normalized in float32 (the reference's arithmetic). The
  # squared norm must be numpy's float32 dot (what np.linalg.norm of one vector
  # uses): an elementwise sum of squares rounds differently for ~1 vertex in 10.
  ends = mesh.vertices[unique_edges[order]]  # [num_new, 2, 3]
  midpoints = (ends[:, 0] + ends[:, 1]) / np.float32(2.0)
  midpoints = midpoints / np.sqrt(np.vecdot(midpoints, midpoints))[:, None]
  return TriangularMesh(np.concatenate([mesh.vertices, midpoints]).astype(np.float32),
                        new_faces.astype(np.int32))


def mesh_hierarchy(levels: int, inside=None, regional_levels: int = 0
                   ) -> list[TriangularMesh]:
  """Meshes of refinement 0..levels, then `regional_levels` more that split only the faces
  over a region (`inside`: `[n, 3]` unit vectors -> `[n]` bool; a face is over it when
  a corner or its centroid is inside); the last one is the finest."""
  meshes = [icosahedron()]
  for _ in range(levels):
    meshes.append(refine(meshes[-1]))
  for _ in range(regional_levels):
    vertices, faces = meshes[-1].vertices.astype(np.float64), meshes[-1].faces
    centroids = vertices[faces].sum(axis=1)
    centroids /= np.linalg.norm(centroids, axis=-1, keepdims=True)
    over = inside(vertices)[faces].any(axis=1) | inside(centroids)
    meshes.append(refine(meshes[-1], over))
  return meshes


def faces_to_directed_edges(faces: np.ndarray):
  """Each face (a, b, c) as the edges a -> b, b -> c, c -> a: `(senders [3F], receivers [3F])`.

  On a closed, consistently oriented mesh this gives every edge once in each direction.
  """
  return (np.concatenate([faces[:, 0], faces[:, 1], faces[:, 2]]),
          np.concatenate([faces[:, 1], faces[:, 2], faces[:, 0]]))


def multi_mesh_edges(meshes: list[TriangularMesh]):
  """Directed edges of all levels merged, each once in each direction, sorted by receiver
  (then sender).

  On uniformly refined levels every face edge is one direction of an edge the
  neighbouring face gives the other way, and no two levels share an edge; a regional
  level repeats the faces it leaves whole (taken once) and halves the edges along its
  border on one side only (their reverses added).

  Returns:
    `(senders [num_edges], receivers [num_edges])` indices into the finest
    mesh's vertices.
  """
  senders, receivers = faces_to_directed_edges(np.concatenate([m.faces for m in meshes]))
  num = np.int64(len(meshes[-1].vertices))
  keys = np.unique(np.concatenate([receivers.astype(np.int64) * num + senders,
                                   senders.astype(np.int64) * num + receivers]))
  return (keys % num).astype(senders.dtype), (keys // num).astype(receivers.dtype)
