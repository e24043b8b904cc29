"""Gradient accumulation: a batch's loss and gradient as the sums over its micro-batches.

`train.accumulation_steps = A` splits a batch of `B` rows into `A` micro-batches of
`B / A` consecutive rows and runs them one after another in a `jax.lax.scan`, adding up
their values and gradients in float32: the device holds one micro-batch's activations
(and one float32 gradient sum) at a time, and the result is the whole batch's, to float
rounding, for any function that is a sum over its rows (a loss share whose
normalization counts the whole batch: `wnscale.sharding.sharded_model`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from wnscale.model.manual_axis_types import vary_like


def split(batch: dict, micro_batches: int) -> dict:
  """Every `[B, ...]` array of `batch` as `[micro_batches, B / micro_batches, ...]`:
  micro-batch `k` holds rows `k B / A .. (k + 1) B / A - 1`."""
  return jax.tree.map(
      lambda x: x.reshape((micro_batches, x.shape[0] // micro_batches) + x.shape[1:]), batch)


def value_and_grad(fn, params, batch: dict, micro_batches: int):
  """`(sum over micro-batches of fn(params, micro_batch), its gradient in params)`.

  `fn(params, batch) -> scalar`; `batch`: arrays `[B, ...]` with `B` a multiple of
  `micro_batches` (`split`). With one micro-batch, `jax.value_and_grad(fn)(params, batch)`.
  The sums are carried in float32 and the gradient returned in the parameters' dtypes.
  Under `shard_map` the sums vary over the mesh axes that `params` and `batch` vary over.
  """
  if micro_batches == 1:
    return jax.value_and_grad(fn)(params, batch)
  references = jax.tree.leaves((params, batch))

  def zeros(shape):
    return vary_like(jnp.zeros(shape, jnp.float32), *references)

  def add(sums, micro_batch):
    value, grads = jax.value_and_grad(fn)(params, micro_batch)
    return jax.tree.map(lambda total, x: total + x.astype(jnp.float32), sums,
                        (value, grads)), None

  (value, grads), _ = jax.lax.scan(
      add, (zeros(()), jax.tree.map(lambda p: zeros(p.shape), params)),
      split(batch, micro_batches))
  return value, jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
