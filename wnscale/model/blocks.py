"""Work over blocks of rows, each block under its own checkpoint.

At 0.25 deg every `[num_grid_nodes, latent]` array is a gigabyte in bfloat16,
and an MLP on it makes several. Run block by block, by a scan whose body is a
`jax.checkpoint` that saves nothing, an MLP keeps only one block's
intermediates alive, in the forward pass and in the backward recomputation;
only its inputs and outputs exist whole. The price is one more forward pass of
the work inside the blocks.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx


def split_rows(array: jax.Array, num_blocks: int, fill=0) -> jax.Array:
  """`[N, ...] -> [num_blocks, ceil(N / num_blocks), ...]`, the last block padded with `fill`."""
  rows = -(-array.shape[0] // num_blocks)
  padding = [(0, rows * num_blocks - array.shape[0])] + [(0, 0)] * (array.ndim - 1)
  return jnp.pad(array, padding, constant_values=fill).reshape(
      (num_blocks, rows) + array.shape[1:])


def map_row_blocks(module: nnx.Module, fn: Callable, num_blocks: int, blocked: tuple,
                   shared: tuple = ()):
  """`fn(module, *row blocks of blocked, *shared)` over `num_blocks` blocks of rows.

  Args:
    module: holds the parameters `fn` uses (passed through the scan explicitly).
    fn: returns a pytree of `[rows, ...]` arrays for one block of rows.
    blocked: `[N, ...]` arrays cut into blocks along their first axis.
    shared: arrays every block sees whole.

  Returns:
    `fn`'s outputs for all `N` rows, `[N, ...]`; with one block, `fn` on the
    arrays as they are (no scan, no checkpoint).
  """
  if num_blocks == 1:
    return fn(module, *blocked, *shared)
  num_rows = blocked[0].shape[0]
  graphdef, state = nnx.split(module)
  block = jax.checkpoint(lambda state, *args: fn(nnx.merge(graphdef, state), *args),
                         policy=jax.checkpoint_policies.nothing_saveable)
  _, outputs = jax.lax.scan(lambda _, rows: (None, block(state, *rows, *shared)), None,
                            tuple(split_rows(array, num_blocks) for array in blocked))
  return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:])[:num_rows], outputs)
