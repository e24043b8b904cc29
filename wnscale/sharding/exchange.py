"""How a graph shard gets the sender rows it does not own: the exchange modes.

A mode is one entry of `MODES` (`mesh.exchange` in the config names it), a
class with two halves:

* host side, once, per edge set (`plan`): where each edge's sender row lies in
  the shard's *sender table*, and what each shard must send for it;
* device side, inside `shard_map`: the instance is the model's `exchange`;
  `exchange(edge_set, rows)` turns the shard's own sender rows into that
  sender table. An instance is a pytree (its index arrays the leaves), so that it
  can be passed to a function whose derivative is written out (`rollout_loss`).

Their gradients move no more data than the forward: the transpose of
`all_gather` is `psum_scatter`, and the transpose of a halo `ppermute` is the
reverse `ppermute` followed by a scatter-add into the owner's rows, so plain
autodiff is already optimal.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from wnscale.sharding.mesh import GRAPH


class Gathered(NamedTuple):
  """An edge set's senders in all_gather mode: every shard receives every other shard's rows.

  Attributes:
    rows: rows each shard receives per exchange (padding included).
  """

  rows: int

  def rows_received(self) -> int:
    return self.rows

  def device_arrays(self) -> tuple:
    return ()


class Halo(NamedTuple):
  """Rows each shard sends, per shard offset `k` (shard s sends to shard s + k).

  Attributes:
    offsets: the offsets with any traffic, ascending.
    send_indices: per offset, `[num_shards, rows]` local row indices to send
      (padded with 0; the receiver never reads padded rows).
  """

  offsets: tuple[int, ...]
  send_indices: tuple[np.ndarray, ...]

  def rows_received(self) -> int:
    """Rows each shard receives per exchange (padding included)."""
    return sum(i.shape[1] for i in self.send_indices)

  def device_arrays(self) -> tuple[np.ndarray, ...]:
    """What the exchange needs on the devices, each `[num_shards, rows]` on `graph`."""
    return self.send_indices


@jax.tree_util.register_pytree_node_class
class AllGatherExchange:
  """Every shard sees every sender row: one `all_gather` along `graph`.

  The sender table is the all-gathered sender array, `[num_shards * per_shard, D]`.
  """

  @staticmethod
  def plan(sender_shard, sender_local, receiver_shard, num_shards: int, per_shard: int):
    """`(table index of each edge's sender, Gathered)` of one edge set (numpy)."""
    del receiver_shard
    return sender_shard * per_shard + sender_local, Gathered((num_shards - 1) * per_shard)

  def __init__(self, plans: dict, send_indices: dict, num_shards: int):
    del plans, send_indices, num_shards

  def __call__(self, edge_set: str, rows):
    del edge_set
    return jax.lax.all_gather(rows, GRAPH, axis=0, tiled=True)

  def tree_flatten(self):
    return (), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls({}, {}, 0)


@jax.tree_util.register_pytree_node_class
class HaloExchange:
  """Each shard receives only the rows its edges read, one `ppermute` per shard offset.

  The sender table is the shard's own rows followed by the rows received from
  other shards, one block per shard offset k (received from shard `s - k`).

  Args:
    plans: per edge set name, its `Halo`.
    send_indices: per edge set name, per offset, `[rows]` local row indices this
      shard sends (its block of `Halo.send_indices`, inside `shard_map`).
    num_shards: size of the `graph` axis.
  """

  @staticmethod
  def plan(sender_shard, sender_local, receiver_shard, num_shards: int, per_shard: int):
    """`(table index of each edge's sender, Halo)` of one edge set (numpy)."""
    table_index = np.where(sender_shard == receiver_shard, sender_local, -1)
    remote = sender_shard != receiver_shard
    offsets, send_indices, base = [], [], per_shard
    offset_of_edge = (receiver_shard - sender_shard) % num_shards
    for k in range(1, num_shards):
      at_k = remote & (offset_of_edge == k)
      if not at_k.any():
        continue
      # Rows shard t sends to t + k: its distinct local rows that edges on t + k read,
      # as keys t * per_shard + local (1-D: np.unique of rows is slow for 10^8 edges).
      edge_keys = sender_shard[at_k] * per_shard + sender_local[at_k]
      pair_keys = np.unique(edge_keys)
      pairs = np.stack(np.divmod(pair_keys, per_shard), 1)
      counts = np.bincount(pairs[:, 0], minlength=num_shards)
      rows = counts.max()
      send = np.zeros((num_shards, rows), dtype=np.int32)
      first = np.concatenate([[0], np.cumsum(counts)[:-1]])
      position = np.arange(len(pairs)) - first[pairs[:, 0]]
      send[pairs[:, 0], position] = pairs[:, 1]
      # Receiving shard r finds row (t, local) at base + position in its table.
      table_index[at_k] = base + position[np.searchsorted(pair_keys, edge_keys)]
      offsets.append(k)
      send_indices.append(send)
      base += rows
    return table_index, Halo(tuple(offsets), tuple(send_indices))

  def __init__(self, plans: dict, send_indices: dict, num_shards: int):
    self._offsets = {name: plan.offsets for name, plan in plans.items()}
    self._send_indices = send_indices
    self._num_shards = num_shards

  def __call__(self, edge_set: str, rows):
    parts = [rows]
    for k, indices in zip(self._offsets[edge_set], self._send_indices[edge_set]):
      pairs = [(s, (s + k) % self._num_shards) for s in range(self._num_shards)]
      parts.append(jax.lax.ppermute(rows[indices], GRAPH, pairs))
    return jnp.concatenate(parts, axis=0)

  def tree_flatten(self):
    return (self._send_indices,), (self._offsets, self._num_shards)

  @classmethod
  def tree_unflatten(cls, aux, children):
    exchange = cls({}, children[0], aux[1])
    exchange._offsets = aux[0]
    return exchange


# `mesh.exchange` -> mode; both give the same numbers.
MODES = {"all_gather": AllGatherExchange, "halo": HaloExchange}
