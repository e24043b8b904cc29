"""Which grid nodes have more than one closest mesh face (a mesh-to-grid tie): where two
correct codes may give a node different mesh-to-grid edges (`wnscale.graphs.connectivity`'s
docstring), so tests comparing with the reference leave them out."""

from __future__ import annotations

import numpy as np

from wnscale.graphs import connectivity
from wnscale.graphs.icosahedron import TriangularMesh


def tied_grid_nodes(grid_xyz: np.ndarray, mesh: TriangularMesh, tolerance: float = 1e-6,
                    candidates: int = 8, block: int = 65536) -> np.ndarray:
  """`[num_grid_nodes]` bool: the nodes with more than one closest mesh face.

  A node on an edge or vertex shared by faces (within `tolerance`, relative, of
  the smallest squared distance) has several equally good triangles; which one
  a code picks is float rounding (see `connectivity`'s docstring), so two correct
  codes may give such a node different mesh-to-grid edges.
  """
  vertices, faces = mesh.vertices.astype(np.float64), mesh.faces
  points = grid_xyz.astype(np.float64)
  # Float32 positions sit up to ~1e-7 off the edge they lie on: look that far.
  chosen, near_edge = connectivity._containing_faces(points, vertices, faces, candidates,
                                                     block, 1e-5)
  near_edge = np.flatnonzero(near_edge)
  found, _, _, squared = connectivity._candidate_distances(points[near_edge],
                                                           chosen[near_edge], vertices, faces)
  equal = squared <= squared.min(axis=1, keepdims=True) * (1 + tolerance) + 1e-15
  # Distinct faces among the equally close (a candidate row repeats faces).
  ordered = np.sort(np.where(equal, found, -1), axis=1)
  distinct = (ordered[:, 0] >= 0) + ((ordered[:, 1:] != ordered[:, :-1])
                                     & (ordered[:, 1:] >= 0)).sum(axis=1)
  tied = np.zeros(len(points), bool)
  tied[near_edge] = distinct > 1
  return tied
