"""Parameter layouts that older wnscale wrote, and reading their checkpoints into today's model.

A change of where the model keeps a parameter is one entry of `RENAMES`: a function from a
parameter's path in the layout after the change (a tuple of keys, as a checkpoint stores
them) to its path before it. A checkpoint whose arrays are not this run's is tried in each
older layout in turn, newest first (each one more rename back); the first whose arrays
it holds is read, and its parameters moved to today's paths (`OlderLayout`).

Adam's moments are vectors over every parameter in the tree's order (`optax.flatten`), a
tree whose dictionaries are ordered by key, so a rename can reorder them: they are
permuted into today's order too.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import numpy as np

from wnscale.errors import UserError

# A modality's modules as `GraphCast.modalities[name]` names them, and the model's own
# attributes they were before.
_MODALITY_ATTRIBUTES = {"embedder": "{}_embedder", "to_mesh_edges": "{}_to_mesh_edges",
                        "update_mlp": "{}_mlp", "from_mesh_edges": "mesh_to_{}_edges",
                        "output_mlp": "{}_output_mlp"}


def modalities_in_a_container(path: tuple[str, ...]) -> tuple[str, ...]:
  """Modality modules in the container `GraphCast.modalities` (parameters
  `modalities.<name>.embedder...`); before 2026-12-06 (e289331), the model's attributes
  named after the modality (`<name>_embedder...`)."""
  if path[0] != "modalities":
    return path
  name, module, *rest = path[1:]
  return (_MODALITY_ATTRIBUTES[module].format(name), *rest)


# In the order they were made.
RENAMES: tuple[Callable[[tuple[str, ...]], tuple[str, ...]], ...] = (modalities_in_a_container,)


class OlderLayout(NamedTuple):
  """The parameters in one older layout.

  Attributes:
    abstract: the parameters' tree in that layout (nested dictionaries by path).
    to_today: `parameters in that layout -> today's tree` (the tree given).
    to_today_order: `[N] vector over the parameters in that layout's order -> [N] in
      today's` (Adam's moments).
  """

  abstract: dict
  to_today: Callable
  to_today_order: Callable


def older_layouts(params) -> list[OlderLayout]:
  """`params`' tree (today's layout; arrays or `jax.ShapeDtypeStruct`s) in each older
  layout, newest first."""
  paths_and_leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  paths = [tuple(_key(key) for key in path) for path, _ in paths_and_leaves]
  leaves = [leaf for _, leaf in paths_and_leaves]
  sizes = [int(np.prod(leaf.shape)) for leaf in leaves]
  layouts = []
  for rename in reversed(RENAMES):
    paths = [rename(path) for path in paths]
    if len(set(paths)) != len(paths):  # never: a rename that is no rename
      raise ValueError(f"{rename.__name__} gives two parameters one path.")
    layouts.append(_layout(paths, leaves, sizes, treedef))
  return layouts


def _layout(paths, leaves, sizes, treedef) -> OlderLayout:
  abstract = _nested(paths, leaves)
  # Today's leaf indices in the order the older tree flattens.
  older_order = jax.tree.leaves(_nested(paths, list(range(len(paths)))))

  def to_today(older):
    flat = dict(zip(map(tuple, _flat_paths(older)), jax.tree.leaves(older)))
    return jax.tree.unflatten(treedef, [flat[path] for path in paths])

  def to_today_order(vector):
    pieces = np.split(np.arange(sum(sizes)), np.cumsum([sizes[i] for i in older_order])[:-1])
    by_leaf = dict(zip(older_order, pieces))
    # Laid out on the devices as restored, whatever the gather's own sharding.
    return jax.device_put(vector[np.concatenate([by_leaf[i] for i in range(len(paths))])],
                          vector.sharding)

  return OlderLayout(abstract, to_today, to_today_order)


def params_layouts(abstract_params) -> list[tuple[dict, Callable]]:
  """`(parameters in an older layout, to_today)` per older layout, newest first: what
  `checkpoint.restore_params` tries after today's."""
  return [(layout.abstract, layout.to_today) for layout in older_layouts(abstract_params)]


def train_state_layouts(abstract_state) -> list[tuple[object, Callable]]:
  """`(TrainState in an older layout, to_today)` per older layout, newest first: what
  `checkpoint.Checkpointer.restore_latest` tries after today's. Its `to_today` renames
  parameters and EMA and permutes the optimizer's vectors over the parameters.

  Raises (from `to_today`):
    UserError: the optimizer holds a vector over part of the parameters
      (`train.freeze`), whose order this cannot tell.
  """
  num_params = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(abstract_state.params))

  def vector_to_today(layout, leaf):
    if getattr(leaf, "ndim", 0) != 1 or leaf.size == 1:
      return leaf
    if leaf.size != num_params:
      raise UserError(
          "This checkpoint was written by an older wnscale with train.freeze, whose optimizer "
          "state cannot be carried to today's parameter layout; start a new run from its "
          "parameters with train.init_from.")
    return layout.to_today_order(leaf)

  def to_today(layout, state):
    return state._replace(
        params=layout.to_today(state.params),
        ema=None if state.ema is None else layout.to_today(state.ema),
        opt_state=jax.tree.map(functools.partial(vector_to_today, layout), state.opt_state))

  return [(abstract_state._replace(params=layout.abstract,
                                   ema=None if abstract_state.ema is None else layout.abstract),
           functools.partial(to_today, layout))
          for layout in older_layouts(abstract_state.params)]


def _key(key) -> str:
  """A tree path's key as a checkpoint stores it."""
  for attribute in ("key", "name", "idx"):
    if hasattr(key, attribute):
      return str(getattr(key, attribute))
  raise TypeError(f"Unknown tree key {key!r}")


def _nested(paths, leaves) -> dict:
  tree = {}
  for path, leaf in zip(paths, leaves):
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = leaf
  return tree


def _flat_paths(tree) -> list[tuple[str, ...]]:
  return [tuple(_key(key) for key in path)
          for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
