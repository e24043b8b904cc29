"""k-hop neighbourhoods on the finest mesh: the attention edges of the mesh transformer.

WeatherNext 2's processor is a transformer whose attention mask is `(A + I)^k`,
A the adjacency of the finest icosahedral mesh (not the multi-mesh): each mesh
node attends to every node at most `k` edges away, itself included. wnscale
writes that mask as an explicit edge list (receiver: the attending node,
sender: a node it attends to), sorted by receiver, so attention is a gather
and a segment softmax that runs on any backend and shards like any other edge
set.

Sizes: a node of a triangulated sphere has about `1 + 3k(k + 1)` nodes within
`k` hops (fewer near the 12 five-neighbour vertices), so the list grows as
k^2 * nodes: levels 0..6 with k = 32 give 127,019,682 edges, 3,101 per node.
It is built ring by ring (the nodes exactly j hops away are the neighbours of
ring j - 1 less rings j - 1 and j - 2), with scipy sparse products, and cached on
disk (its time and memory at that size: docs/benchmarks.md, "Graphs").
"""

from __future__ import annotations

import io
import hashlib
import logging
import os
import time

import numpy as np
import scipy.sparse as sp

from wnscale import cache
from wnscale.graphs import icosahedron


def mesh_adjacency(mesh: icosahedron.TriangularMesh) -> sp.csr_matrix:
  """`[num_nodes, num_nodes]` int32 0/1 adjacency of a triangulated mesh (no self loops)."""
  senders, receivers = icosahedron.faces_to_directed_edges(mesh.faces)
  num_nodes = len(mesh.vertices)
  return sp.csr_matrix((np.ones(len(senders), np.int32), (receivers, senders)),
                       shape=(num_nodes, num_nodes))


def k_hop_edges(adjacency: sp.csr_matrix, k: int):
  """Every (receiver, sender) pair at most `k` hops apart, self pairs included.

  Args:
    adjacency: `[n, n]` symmetric 0/1 adjacency.
    k: hops, >= 0.

  Returns:
    `(senders [E], receivers [E])` int32, sorted by receiver, then sender.
  """
  num_nodes = adjacency.shape[0]
  ring = sp.identity(num_nodes, dtype=np.int32, format="csr")  # 0 hops: the node itself
  previous_ring = sp.csr_matrix((num_nodes, num_nodes), dtype=np.int32)
  receivers, senders = [np.arange(num_nodes)], [np.arange(num_nodes)]
  for _ in range(k):
    reached = ring @ adjacency
    reached.data[:] = 1
    # On a graph, a neighbour of a node j - 1 hops away is j - 2, j - 1 or j hops away.
    next_ring = reached - reached.multiply(ring) - reached.multiply(previous_ring)
    next_ring.eliminate_zeros()
    rows, columns = next_ring.nonzero()
    receivers.append(rows)
    senders.append(columns)
    previous_ring, ring = ring, next_ring
  # The rings are disjoint; CSR conversion sorts by receiver (a counting sort).
  mask = sp.csr_matrix((np.ones(sum(map(len, senders)), np.int8),
                        (np.concatenate(receivers), np.concatenate(senders))),
                       shape=(num_nodes, num_nodes))
  mask.sort_indices()
  counts = np.diff(mask.indptr)
  return (mask.indices.astype(np.int32),
          np.repeat(np.arange(num_nodes, dtype=np.int32), counts))


def _cache_key(mesh_levels: int, k: int) -> str:
  text = f"{cache.source_digest('graphs')}:{mesh_levels}:{k}"
  return hashlib.sha256(text.encode()).hexdigest()[:24]


def build_neighbourhoods(mesh_levels: int, k: int, use_cache: bool = True):
  """`(senders, receivers)` of the `k`-hop neighbourhoods of the finest of `mesh_levels` meshes.

  Indices are mesh node indices (the finest mesh's vertices, as in
  `wnscale.graphs.graph.Graphs`). Cached under `<cache dir>/neighbourhoods/`,
  keyed by the arguments and the graph code; the file holds the senders and
  each receiver's count (receivers are sorted, so the counts give them back).
  """
  path = cache.cache_path("neighbourhoods", _cache_key(mesh_levels, k) + ".npz")
  if use_cache and os.path.exists(path):
    with np.load(path) as cached:
      senders, counts = cached["senders"], cached["counts"]
    return senders, np.repeat(np.arange(len(counts), dtype=np.int32), counts)
  start = time.perf_counter()
  finest = icosahedron.mesh_hierarchy(mesh_levels)[-1]
  senders, receivers = k_hop_edges(mesh_adjacency(finest), k)
  logging.info("Built %d-hop neighbourhoods of mesh level %d in %.1f s: %d edges", k,
               mesh_levels, time.perf_counter() - start, len(senders))
  if use_cache:  # whole or not at all (or not cached: `cache.write_bytes`)
    counts = np.bincount(receivers, minlength=len(finest.vertices)).astype(np.int32)
    buffer = io.BytesIO()
    np.savez(buffer, senders=senders, counts=counts)
    cache.write_bytes(path, buffer.getvalue())
  return senders, receivers
