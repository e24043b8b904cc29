"""Attention of each node over its neighbours, by Pallas' block-sparse flash attention kernel.

The arithmetic of `sparse_attention.neighbour_attention` (a receiver attends to
the senders of its edges), computed as WeatherNext 2 computes it on TPUs: by
splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`). The
edge set is a mask on the `[N, N]` attention matrix (row: receiver, column:
sender), cut into `BLOCK` x `BLOCK` tiles; the kernel skips the tiles without
an edge, and masks the others with their bitmaps. Its tile metadata
(`SplashMask`: per tile empty, partial or full, the next tile to fetch, the
partial tiles' bitmaps) is made on the host once per graph and node order,
from the edge list (`NeighbourMask`), without a dense `[N, N]` array (1.7 GB
of bools at WeatherNext 2's 40,962 nodes). How many tiles hold an edge
depends on the node order: `bench/splash_tiles.py`.

Padding: N is padded to a multiple of `BLOCK`. A padding node attends to
itself only (the kernel divides each row by its sum of weights: an empty row
would be 0 / 0) and no real node attends to one, so the padding changes no
real row and its zero cotangent adds nothing to any gradient.

Numerics: logits `q . k` are accumulated in float32, the softmax (running
maximum, weights, sums) and the weighted sum of values are float32, as the
edge path's, and the kernel casts its output to the inputs' dtype (the edge
path casts its float32 output to the activations' dtype before the output
projection: the same rounding). With bfloat16 inputs both take the bfloat16
products of q and k (and weights times float32 values) and add them in
float32. The queries come in scaled, as to the edge path. The backward pass
is the kernel's fused dq/dk/dv pass, in float32, from the forward's
logsumexp; masked logits are the kernel's -0.7 x float32 max, finite.

Where the platform is not a TPU the kernel runs in Pallas' interpret mode
(`interpret=True`): the same arithmetic, slowly, so tests run on a CPU.
"""

from __future__ import annotations

import dataclasses
import hashlib

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

# Tile side (queries and keys, forward and backward): the kernel's lane width. At
# WeatherNext 2's sizes 128 leaves the fewest logits computed of 128, 256 and 512
# (`bench/splash_tiles.py`), and the smallest partial-tile bitmaps.
BLOCK = 128
BLOCK_SIZES = splash.BlockSizes(
    block_q=BLOCK, block_kv=BLOCK, block_kv_compute=BLOCK, block_q_dkv=BLOCK,
    block_kv_dkv=BLOCK, block_kv_dkv_compute=BLOCK, use_fused_bwd_kernel=True)


class NeighbourMask(mask_lib.Mask):
  """An edge set as the kernel's mask `[P, P]` (`P`: N padded to a multiple of `BLOCK`),
  tile by tile: entry (r, s) is True where receiver r attends to sender s.

  Holds each tile with an edge as packed bits; a padding node attends to itself
  (module docstring). Read only as the kernel's mask processing reads it, in
  slices of whole tiles.
  """

  def __init__(self, senders: np.ndarray, receivers: np.ndarray, num_nodes: int):
    """`senders`, `receivers`: `[E]` node indices, sorted by receiver; receivers
    `num_nodes` (padding edges, last) are dropped."""
    receivers = np.asarray(receivers)
    if np.any(np.diff(receivers) < 0):
      raise ValueError("NeighbourMask needs edges sorted by receiver.")
    self.num_blocks = -(-num_nodes // BLOCK)
    size = self.num_blocks * BLOCK
    padding = np.arange(num_nodes, size)
    starts = np.searchsorted(receivers, np.minimum(np.arange(self.num_blocks + 1) * BLOCK,
                                                   num_nodes))
    # [row block, column block] -> index into self.bits; -1: no edge in the tile.
    self.tile_index = np.full((self.num_blocks, self.num_blocks), -1, np.int32)
    bits = []
    for block in range(self.num_blocks):  # one block row [BLOCK, size] at a time
      first, edges = block * BLOCK, slice(starts[block], starts[block + 1])
      dense = np.zeros((BLOCK, size), bool)
      dense[receivers[edges] - first, np.asarray(senders[edges])] = True
      if block == self.num_blocks - 1:
        dense[padding - first, padding] = True
      tiles = dense.reshape(BLOCK, self.num_blocks, BLOCK).transpose(1, 0, 2)
      present = np.flatnonzero(tiles.any(axis=(1, 2)))
      self.tile_index[block, present] = len(bits) + np.arange(len(present))
      bits.extend(np.packbits(tiles[present].reshape(len(present), -1), axis=1))
    self.bits = np.stack(bits)  # [tiles with an edge, BLOCK * BLOCK / 8] uint8
    self._empty = np.zeros((BLOCK, BLOCK), bool)
    self._empty.flags.writeable = False
    self._digest = hashlib.sha256(self.tile_index.tobytes() + self.bits.tobytes()).hexdigest()

  @property
  def shape(self) -> tuple[int, int]:
    return (self.num_blocks * BLOCK,) * 2

  @property
  def tile_fraction(self) -> float:
    """The fraction of tiles with an edge: those the kernel computes."""
    return float(np.mean(self.tile_index >= 0))

  def __getitem__(self, index) -> np.ndarray:
    """`mask[rows, columns]`, two slices along whole tiles: `[rows, columns]` bool."""
    if len(index) != 2 or not all(isinstance(s, slice) for s in index):
      raise IndexError(f"NeighbourMask takes two slices, not {index}")
    rows, columns = (range(*s.indices(n)) for s, n in zip(index, self.shape))
    if any(r.step != 1 or r.start % BLOCK or r.stop % BLOCK for r in (rows, columns)):
      raise IndexError(f"NeighbourMask slices are whole {BLOCK} x {BLOCK} tiles, "
                                f"not {index}")
    tiles = self.tile_index[rows.start // BLOCK:rows.stop // BLOCK,
                            columns.start // BLOCK:columns.stop // BLOCK]
    if tiles.size == 1 and tiles[0, 0] < 0:  # most of the kernel's questions
      return self._empty
    bits = np.where((tiles >= 0)[..., None], self.bits[np.maximum(tiles, 0)], 0)
    unpacked = np.unpackbits(bits, axis=-1).reshape(tiles.shape + (BLOCK, BLOCK))
    return unpacked.transpose(0, 2, 1, 3).reshape(len(rows), len(columns)).astype(bool)

  def __eq__(self, other) -> bool:
    return isinstance(other, NeighbourMask) and self._digest == other._digest

  def __hash__(self) -> int:
    return hash(self._digest)


@dataclasses.dataclass(frozen=True)
class SplashMask:
  """An edge set as the splash kernel reads it (`splash_mask`); a pytree of host arrays.

  Attributes:
    forward, backward: the kernel's `MaskInfo` of its forward and of its fused
      backward pass (per tile: empty, partial or full; the next tile to fetch;
      the partial tiles' bitmaps `[tiles, BLOCK, BLOCK]` bool): the leaves.
    num_nodes: N, the real nodes (queries and keys are the same node set).
    options: the kernel's static settings (block sizes, `interpret`, ...) as
      sorted `(name, value)` pairs.
  """

  forward: object
  backward: object
  num_nodes: int
  options: tuple

  def kernel(self) -> splash.SplashAttentionKernel:
    """The kernel over these (possibly traced) arrays: `(q, k, v) [H, P, D] -> [H, P, D]`."""
    return splash.SplashAttentionKernel(self.forward, None, self.backward, **dict(self.options))


jax.tree_util.register_dataclass(SplashMask, data_fields=["forward", "backward"],
                                 meta_fields=["num_nodes", "options"])


def splash_mask(senders: np.ndarray, receivers: np.ndarray, num_nodes: int, *,
                interpret: bool) -> SplashMask:
  """The `SplashMask` of an edge set within one node set of `num_nodes` nodes (host, once).

  Args:
    senders, receivers: `[E]` indices, sorted by receiver; receiver `num_nodes`
      marks a padding edge.
    interpret: run the kernel in Pallas' interpret mode (any platform but a TPU).
  """
  # One mask for every head: the kernel's metadata has a head axis of 1, read by all.
  kernel = splash.make_splash_mha(
      mask_lib.MultiHeadMask([NeighbourMask(senders, receivers, num_nodes)]),
      block_sizes=BLOCK_SIZES, head_shards=1, q_seq_shards=1, interpret=interpret)
  to_host = lambda info: jax.tree.map(np.asarray, info)
  return SplashMask(to_host(kernel.fwd_mask_info), to_host(kernel.dkv_mask_info), num_nodes,
                    tuple(sorted(kernel.kwargs.items())))


def splash_attention(queries, keys, values, mask: SplashMask) -> jax.Array:
  """Softmax attention of each node over its row of `mask`.

  Args:
    queries: `[N, heads, key_size]`, already scaled (by key_size^-0.5).
    keys: `[N, heads, key_size]`; values: `[N, heads, value_size]` (of the same N nodes).
    mask: the edge set's `SplashMask` (N = `mask.num_nodes`).

  Returns:
    `[N, heads, value_size]` in the inputs' dtype.
  """
  num_nodes = mask.num_nodes
  if not queries.shape[0] == keys.shape[0] == values.shape[0] == num_nodes:
    raise ValueError(f"Splash attention over {num_nodes} nodes got queries, keys and values "
                     f"of {queries.shape[0]}, {keys.shape[0]} and {values.shape[0]} rows.")
  padding = -num_nodes % BLOCK

  def heads_major(x):  # [N, H, D] -> [H, P, D]
    return jnp.pad(x, ((0, padding), (0, 0), (0, 0))).transpose(1, 0, 2)

  out = mask.kernel()(heads_major(queries), heads_major(keys), heads_major(values))
  return out[:, :num_nodes].transpose(1, 0, 2)
