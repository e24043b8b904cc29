"""How many of the splash kernel's tiles the transformer's attention mask fills, per node order.

  python bench/splash_tiles.py [--sizes=5:16,6:32]

For WeatherNext 2's 1 deg Mini (mesh level 5, 16 hops: 10,242 nodes) and its 0.25 deg
model (level 6, 32 hops: 40,962 nodes), the k-hop neighbourhoods (built once, then cached:
`wnscale/graphs/neighbourhoods.py`) as the splash kernel's mask
(`wnscale.model.splash_attention.NeighbourMask`, 128 x 128 tiles), in four node orders:
GraphCast's (the plain path's), the Morton curve of the sharded layout (the train path's,
`wnscale/sharding/partition.py`), and two it could be: a 3-D Hilbert curve of the nodes'
positions, and reverse Cuthill-McKee of the finest mesh's adjacency (a banded order). Per
order, a markdown row: the fraction of tiles holding an edge (the kernel computes those
and skips the rest), the mask's density inside them, the widest block row (the forward's
grid width, in tiles), and the bitmaps of the partial tiles (before the kernel's
deduplication; it keeps one copy for the forward and one for the backward).
"""

import argparse
import os
import sys
import time

import numpy as np
from scipy.sparse.csgraph import reverse_cuthill_mckee

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from wnscale.graphs import icosahedron, neighbourhoods  # noqa: E402
from wnscale.model.splash_attention import BLOCK, NeighbourMask  # noqa: E402
from wnscale.sharding.partition import morton_order  # noqa: E402


def hilbert_order(xyz: np.ndarray, bits: int = 10) -> np.ndarray:
  """Indices sorting points `[n, 3]` (in [-1, 1]^3) along a 3-D Hilbert curve (Skilling's
  transform of the cells' coordinates into the curve's index)."""
  x = np.clip(((xyz + 1.0) / 2.0 * (1 << bits)).astype(np.int64), 0, (1 << bits) - 1)
  q = 1 << (bits - 1)
  while q > 1:  # undo the excess work of each level: inversions and exchanges
    for axis in range(3):
      high = (x[:, axis] & q) != 0
      x[high, 0] ^= q - 1
      swap = np.where(high, 0, (x[:, 0] ^ x[:, axis]) & (q - 1))
      x[:, 0] ^= swap
      x[:, axis] ^= swap
    q >>= 1
  for axis in (1, 2):  # Gray encoding
    x[:, axis] ^= x[:, axis - 1]
  flips = np.zeros(len(x), np.int64)
  q = 1 << (bits - 1)
  while q > 1:
    flips ^= np.where(x[:, 2] & q, q - 1, 0)
    q >>= 1
  x ^= flips[:, None]
  code = np.zeros(len(x), np.int64)
  for bit in range(bits - 1, -1, -1):
    for axis in range(3):
      code = (code << 1) | ((x[:, axis] >> bit) & 1)
  return np.argsort(code, kind="stable")


def renamed(senders: np.ndarray, receivers: np.ndarray, order: np.ndarray):
  """The edges (sorted by receiver) with the nodes renamed by their place in `order`, sorted
  by the new receivers: each receiver's run of edges moved whole, no sort of the edges."""
  num_nodes = len(order)
  place = np.empty(num_nodes, np.int32)
  place[order] = np.arange(num_nodes, dtype=np.int32)
  counts = np.bincount(receivers, minlength=num_nodes)
  starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
  new_starts = np.concatenate([[0], np.cumsum(counts[order])[:-1]])
  index = np.repeat(starts[order] - new_starts, counts[order]) + np.arange(len(senders))
  return place[senders[index]], place[receivers[index]]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="5:16,6:32", help="mesh level:hops, comma-separated")
  args = parser.parse_args()
  print(f"| level | hops | nodes | order | tiles with an edge | density in them | widest row "
        f"| partial tiles MiB |\n|---|---:|---:|---|---:|---:|---:|---:|")
  for size in args.sizes.split(","):
    level, hops = map(int, size.split(":"))
    start = time.perf_counter()
    senders, receivers = neighbourhoods.build_neighbourhoods(level, hops)
    mesh = icosahedron.mesh_hierarchy(level)[-1]
    num_nodes = len(mesh.vertices)
    orders = {"GraphCast's": np.arange(num_nodes), "Morton": morton_order(mesh.vertices),
              "Hilbert": hilbert_order(mesh.vertices),
              "Cuthill-McKee": reverse_cuthill_mckee(neighbourhoods.mesh_adjacency(mesh),
                                                     symmetric_mode=True)}
    for name, order in orders.items():
      mask = NeighbourMask(*renamed(senders, receivers, order), num_nodes)
      tiles = int(np.sum(mask.tile_index >= 0))
      partial = tiles - int(np.sum(np.all(mask.bits == 255, axis=1)))
      print(f"| {level} | {hops} | {num_nodes:,} | {name} | {mask.tile_fraction:.1%} "
            f"({tiles:,} of {mask.tile_index.size:,}) | {len(senders) / (tiles * BLOCK**2):.1%} "
            f"| {int(np.max(np.sum(mask.tile_index >= 0, axis=1)))} of {mask.num_blocks} "
            f"| {partial * BLOCK**2 / 2**20:.0f} |", flush=True)
    print(f"(level {level}, {hops} hops: {time.perf_counter() - start:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
  main()
