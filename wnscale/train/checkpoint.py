"""Orbax checkpoints of a run: train state, Grain iterator state and metadata, together.

Saves are asynchronous (the loop blocks only for the device-to-host copy);
each step directory is written under a temporary name and renamed when
complete, so a crash never leaves a half checkpoint that looks whole.
Restoring walks from the newest step back and skips, with a warning naming
it, any checkpoint that fails to restore (truncated or missing files). A
checkpoint that is whole but holds a different train state (another model or
optimizer configuration) is an error, not damage: nothing is set aside.
"""

from __future__ import annotations

import logging
import os
import time

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from wnscale.errors import UserError


class CheckpointMismatchError(UserError):
  """A checkpoint's train state has other arrays, shapes or dtypes than this run's."""


class Checkpointer:
  """Saves and restores `(TrainState, data iterator, metadata)` under `directory`."""

  def __init__(self, directory: str, max_to_keep: int):
    self.directory = os.path.abspath(directory)
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=True,
            cleanup_tmp_directories=True, create=True),
        # Named so that a new process can read a step's metadata before restoring it.
        item_handlers={"state": ocp.StandardCheckpointHandler(),
                       "data": grain.checkpoint.CheckpointHandler(),
                       "metadata": ocp.JsonCheckpointHandler()})

  def save(self, step: int, state, iterator, metadata: dict):
    """Starts an asynchronous save; returns once device arrays are copied out."""
    self.manager.save(step, force=True, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=grain.checkpoint.CheckpointSave(iterator),
        metadata=ocp.args.JsonSave(metadata)))

  def wait(self):
    """Blocks until every started save is complete on disk."""
    self.manager.wait_until_finished()

  def restore_latest(self, abstract_state, restore_data):
    """Restores the newest good checkpoint, or returns None if there is none.

    Args:
      abstract_state: `jax.ShapeDtypeStruct` tree with the *current* mesh's
        shardings, so a checkpoint saved on another device count reshards.
      restore_data: `(step, metadata) -> None`, restores the data iterator of
        that checkpoint and raises if it cannot.

    Returns:
      `(state, metadata)` or None.

    Raises:
      CheckpointMismatchError: the newest readable checkpoint holds a train
        state of other arrays, shapes or dtypes than `abstract_state`.
    """
    result, damaged = None, []
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        stored = self.manager.item_metadata(step).state.tree
      except Exception as error:  # a missing or unreadable _METADATA
        self._warn_damaged(step, error)
        damaged.append(step)
        continue
      differences = _differences(stored, abstract_state)
      if differences:
        path = os.path.join(self.directory, str(step))
        more = f" and {len(differences) - 3} more" if len(differences) > 3 else ""
        raise CheckpointMismatchError(
            f"The checkpoint {path} was written by another model or optimizer configuration: "
            f"{len(differences)} of its arrays differ from this run's "
            f"({'; '.join(differences[:3])}{more}). Resume with the config it was written "
            f"with (in {os.path.join(path, 'metadata')}), or give this run a new --workdir. "
            "The checkpoint is left as it is.")
      try:
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            metadata=ocp.args.JsonRestore()))
        restore_data(step, restored.metadata)
        result = restored.state, restored.metadata
        break
      except Exception as error:  # Orbax raises many types for damaged files.
        self._warn_damaged(step, error)
        damaged.append(step)
    if damaged:
      self._set_aside(damaged)
    return result

  def _warn_damaged(self, step, error):
    logging.warning("Skipping checkpoint %s (step %d), it cannot be restored: %s",
                    os.path.join(self.directory, str(step)), step,
                    (str(error).splitlines() or [repr(error)])[0][:300])

  def _set_aside(self, steps):
    """Renames damaged step directories (kept for inspection) so new saves can reuse the step."""
    if jax.process_index() == 0:
      for step in steps:
        path = os.path.join(self.directory, str(step))
        os.replace(path, f"{path}.damaged-{int(time.time())}")
        logging.warning("Moved the damaged checkpoint %s aside.", path)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("wnscale damaged checkpoints set aside")
    self.manager.reload()

  def restore_iterator(self, step: int, iterator):
    """Restores the Grain iterator state saved at `step` into `iterator` (in place)."""
    self.manager.restore(step, args=ocp.args.Composite(
        data=grain.checkpoint.CheckpointRestore(iterator)))

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()


def abstract_like(tree, sharding):
  """`jax.ShapeDtypeStruct`s of `tree`'s leaves, all with `sharding`."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def _differences(stored_tree, abstract_state) -> list[str]:
  """How a checkpoint's stored arrays differ from `abstract_state`'s, one line each."""
  def describe(tree):
    return {".".join(map(str, path)): f"{np.dtype(leaf.dtype).name}{list(leaf.shape)}"
            for path, leaf in ocp.tree.to_flat_dict(tree).items()}

  stored, wanted = describe(stored_tree), describe(abstract_state)
  return [f"{name}: checkpoint {stored.get(name, 'absent')}, this run {wanted.get(name, 'absent')}"
          for name in sorted(stored.keys() | wanted.keys())
          if stored.get(name) != wanted.get(name)]
