"""Work over blocks of rows, each block under its own checkpoint.

At 0.25 deg every `[num_grid_nodes, latent]` array is a gigabyte in bfloat16,
and an MLP on it makes several. Run block by block, by a scan whose body is a
`jax.checkpoint` that saves nothing, an MLP keeps only one block's
intermediates alive, in the forward pass and in the backward recomputation;
only its inputs and outputs exist whole. The price is one more forward pass of
the work inside the blocks.

Channel-major inputs (`[C, N]`, the batch's layout) are cut inside each block
and transposed there (`node_major_block`): no node-major copy of a whole input
ever exists, in the forward pass or in the backward recomputation.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wnscale.model.manual_axis_types import vary_like


# A block's rows are a multiple of this where that leaves no block empty: a TPU tiles an
# array's last two axes by (16, 128) in bfloat16 ((8, 128) in float32), so `[num_blocks *
# rows, D]` and `[num_blocks, rows, D]`, or `[k * rows, D]` and `[k, rows, D]`, are then one
# layout and reshaping between them is free (else each is a copy: at 0.25 deg, 8 blocks of
# 129,780 grid rows, several copies of a gigabyte a step); and channel-major blocks
# `[C, rows]` (rows the last axis) are whole tiles of `[C, num_blocks * rows]`.
ROW_ALIGN = 128


def block_rows(num_rows: int, num_blocks: int) -> int:
  """Rows per block when `num_rows` rows are cut into `num_blocks` (the last padded) by
  `map_row_blocks`: `ceil(num_rows / num_blocks)`, rounded up to `ROW_ALIGN` unless that
  would leave the last block without a row of its own."""
  rows = -(-num_rows // num_blocks)
  aligned = -(-rows // ROW_ALIGN) * ROW_ALIGN
  return aligned if 1 < num_blocks and aligned * (num_blocks - 1) < num_rows else rows


def split_rows(array: jax.Array, num_blocks: int, fill=0, rows: int | None = None
               ) -> jax.Array:
  """`[N, ...] -> [num_blocks, rows, ...]` (`rows` default `ceil(N / num_blocks)`), the last
  block padded with `fill`."""
  rows = rows or -(-array.shape[0] // num_blocks)
  padding = [(0, rows * num_blocks - array.shape[0])] + [(0, 0)] * (array.ndim - 1)
  return jnp.pad(array, padding, constant_values=fill).reshape(
      (num_blocks, rows) + array.shape[1:])


def slot_major_row_blocks(array: jax.Array, k: int, num_blocks: int) -> jax.Array:
  """`[k R, ...]` slot-major per-edge values (row r's j-th edge at `j R + r`, as
  `aggregation.FixedInDegree` lays them) -> `[num_blocks * k * rows, ...]`: for each block
  of `rows = block_rows(R, num_blocks)` rows, its rows' k slots, slot-major again (padding
  rows' slots 0), so that `map_row_blocks` gives each block its own edges. A numpy array
  gives a numpy array (the host lays out what the blocks' edges need the same way)."""
  xp = np if isinstance(array, np.ndarray) else jnp
  num_rows = array.shape[0] // k
  rows = block_rows(num_rows, num_blocks)
  by_slot = array.reshape((k, num_rows) + array.shape[1:])
  by_slot = xp.pad(by_slot, [(0, 0), (0, rows * num_blocks - num_rows)]
                   + [(0, 0)] * (array.ndim - 1))
  by_block = xp.swapaxes(by_slot.reshape((k, num_blocks, rows) + array.shape[1:]), 0, 1)
  return by_block.reshape((num_blocks * k * rows,) + array.shape[1:])


def node_major_block(array: jax.Array, block, rows: int) -> jax.Array:
  """Rows `block * rows ...` of a channel-major `[C, N]` array, node-major `[rows, C]`.

  Rows past `N` (the last block's padding) hold other rows' values; they line up
  with `split_rows`' padding, which callers drop. The slice is cut where it fits
  (`[N - rows, N)` for the last block) and, in that block only, rotated into place, so
  the array is never padded (that would copy it whole) and the other blocks are not
  copied twice more (a rotation by a traced amount is a concatenation and a slice).
  """
  start = jnp.minimum(block * rows, array.shape[-1] - rows)
  columns = jax.lax.dynamic_slice_in_dim(array, start, rows, axis=-1)
  shift = start - block * rows
  return jax.lax.cond(shift == 0, lambda columns: columns,
                      lambda columns: jnp.roll(columns, shift, axis=-1), columns).T


def map_row_blocks(module: nnx.Module, fn: Callable, num_blocks: int, blocked: tuple,
                   shared: tuple = (), columns: tuple = (), channel_major: bool = False,
                   per_block: tuple = (), policy: Callable | None = None):
  """`fn(module, *row blocks of blocked, *per_block's blocks, *row blocks of columns,
  *shared)` over `num_blocks` blocks of rows.

  Args:
    module: holds the parameters `fn` uses (passed through the scan explicitly).
    fn: returns a pytree of `[rows, ...]` arrays for one block of rows.
    blocked: arrays cut into blocks along their first axis: the first (and any other of
      its length `N`) into blocks of `block_rows(N, num_blocks)` rows, the last padded;
      the others laid out block by block already (`[num_blocks * m, ...]`, each block's
      `m` rows: `slot_major_row_blocks`).
    shared: arrays every block sees whole.
    per_block: pytrees whose every leaf has a leading `[num_blocks]` axis: a block gets
      its own.
    columns: channel-major `[C, N]` arrays; `fn` gets each block node-major,
      `[rows, C]` (cut and transposed inside the block).
    channel_major: `fn` returns `[rows, C]` arrays, returned channel-major, `[C, N]`: each
      block's transposed inside the block and written into its columns of one `[C, N']`
      array (whole tiles where `rows` is a multiple of 128); no node-major `[N, C]`
      array is made. (Stacked as a scan's outputs, XLA lays the stack out channel-major to
      make the final reshape free, and each block's write is then a strided copy: stacked
      `[rows, C]`, 45 ms of the 0.25 deg step on a TPU.)
    policy: the blocks' checkpoint policy (None: save nothing).

  Returns:
    `fn`'s outputs for all `N` rows, `[N, ...]` (or `[C, N]`); with one block, `fn` on the
    arrays as they are (no scan, no checkpoint; `columns` transposed whole).
  """
  transposed = (lambda outputs: jax.tree.map(lambda x: x.T, outputs)) if channel_major else (
      lambda outputs: outputs)
  if num_blocks == 1:
    return transposed(fn(module, *blocked, *jax.tree.map(lambda x: x[0], per_block),
                         *(array.T for array in columns), *shared))
  num_rows = blocked[0].shape[0]
  rows = block_rows(num_rows, num_blocks)
  split = lambda array: split_rows(array, num_blocks,
                                   rows=rows if array.shape[0] == num_rows else None)
  graphdef, state = nnx.split(module)

  def one_block(state, index, row_blocks, own, columns, shared):
    return transposed(fn(nnx.merge(graphdef, state), *row_blocks, *own,
                         *(node_major_block(array, index, rows) for array in columns),
                         *shared))

  block = jax.checkpoint(one_block, policy=policy or jax.checkpoint_policies.nothing_saveable)
  xs = (jnp.arange(num_blocks), tuple(split(array) for array in blocked), per_block)
  if not channel_major:
    _, outputs = jax.lax.scan(lambda _, xs: (None, block(state, *xs, columns, shared)),
                              None, xs)
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:])[:num_rows], outputs)

  def write_block(outputs, xs):  # each block's [C, rows] into its columns
    return jax.tree.map(lambda whole, one: jax.lax.dynamic_update_slice_in_dim(
        whole, vary_like(one, whole), xs[0] * rows, 1),
        outputs, block(state, *xs, columns, shared)), None

  # Inside `shard_map` the carry varies over what any input does (each block's output too).
  inputs = jax.tree.leaves((blocked, per_block, columns, shared))
  shapes = jax.eval_shape(lambda xs: block(state, *xs, columns, shared),
                          jax.tree.map(lambda x: x[0], xs))
  outputs, _ = jax.lax.scan(write_block, jax.tree.map(lambda s: vary_like(
      jnp.zeros((s.shape[0], num_blocks * rows), s.dtype), *inputs), shapes), xs)
  return jax.tree.map(lambda x: x[:, :num_rows], outputs)
