"""Orbax checkpoints of a run: train state, Grain iterator state and metadata, together.

Saves are asynchronous (the loop blocks only for the device-to-host copy);
each step directory is written under a temporary name and renamed when
complete, so a crash never leaves a half checkpoint that looks whole. The
directory may be a URL (`gs://bucket/run/checkpoints`): Orbax writes arrays
through tensorstore and the rest through `etils.epath`.

Restoring walks from the newest step back and skips, with a warning naming
it, any checkpoint whose files cannot be read (truncated or missing files).
Only reading counts: what the caller does with the files' contents (e.g.
setting the data iterator's state) happens after `restore_latest` returns, so
its errors propagate and never set a good checkpoint aside. A checkpoint that
is whole but holds a different train state (another model or optimizer
configuration) is an error, not damage: nothing is set aside. One that an older
wnscale wrote with some parameters elsewhere is read where it kept them and moved to
today's places (`param_layouts`).

A run directory may also hold parameters only (`save_params`: an imported
model, `wnscale.interop`); `restore_params` reads the parameters of either
kind (a new run's `train.init_from`, forecasts).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Callable, Sequence

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from wnscale import coordination, paths
from wnscale.errors import ArgumentError, UserError
from wnscale.train import param_layouts


class CheckpointMismatchError(UserError):
  """A checkpoint's train state has other arrays, shapes or dtypes than this run's."""


class ParamsOnlyError(CheckpointMismatchError):
  """A training run found a checkpoint of parameters alone (`save_params`), no train state.

  Attributes:
    run: the run directory holding it, which a new run can start from.
  """

  def __init__(self, checkpoint: str, run: str):
    super().__init__(f"Checkpoint {checkpoint} holds model parameters only (an imported "
                     "model, not a training run): a run resumes only from its own training "
                     f"checkpoints; train.init_from={run} starts a new run, in another "
                     "workdir, from these parameters.")
    self.checkpoint, self.run = checkpoint, run


@dataclasses.dataclass
class Restored:
  """What `Checkpointer.restore_latest` read.

  Attributes:
    step: the checkpoint's step.
    state: the train state, with the shardings asked for.
    metadata: the JSON metadata saved with it.
    data_state: this process's data iterator state as saved (a JSON dict), or
      None when not asked for.
  """

  step: int
  state: object
  metadata: dict
  data_state: dict | None


class _StateWriter:
  """Takes the place of an iterator in Grain's save: gives the state it was made with."""

  def __init__(self, state: dict):
    self.state = json.dumps(state, indent=4).encode()

  def get_state(self) -> bytes:
    return self.state


class _StateReader:
  """Takes the place of an iterator in Grain's restore: keeps the state it is given."""

  def __init__(self):
    self.state = None

  def set_state(self, state: bytes):
    self.state = json.loads(state)

  def start_prefetch(self):
    pass


class Checkpointer:
  """Saves and restores `(TrainState, data iterator, metadata)` under `directory`, the
  checkpoints of the run directory `run` (default: `directory`'s parent)."""

  def __init__(self, directory: str, max_to_keep: int, run: str | None = None):
    self.directory = paths.normalize(directory)
    self.run = paths.normalize(run) if run else str(paths.as_epath(self.directory).parent)
    self.manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=True,
            cleanup_tmp_directories=True, create=True,
            # A save that failed in one process stops every process at once, not after
            # Orbax's 20 minutes (`coordination.barrier`).
            async_options=ocp.AsyncOptions(barrier_sync_fn=coordination.barrier)),
        # Named so that a new process can read a step's metadata before restoring it.
        item_handlers={"state": ocp.StandardCheckpointHandler(),
                       "data": grain.checkpoint.CheckpointHandler(),
                       "metadata": ocp.JsonCheckpointHandler()})

  def save(self, step: int, state, iterator, metadata: dict):
    """Starts an asynchronous save; returns once device arrays are copied out.

    `iterator`: the data's position, `iterator.get_state()` (a Grain iterator's, or
    `wnscale.data.prefetch.DevicePrefetch`'s: after the last batch trained on), read now.
    """
    self.manager.save(step, force=True, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=grain.checkpoint.CheckpointSave(_StateWriter(iterator.get_state())),
        metadata=ocp.args.JsonSave(metadata)))

  def wait(self):
    """Blocks until every started save is complete on disk."""
    self.manager.wait_until_finished()

  def restore_latest(self, abstract_state,
                     read_data_state: Callable[[dict], bool] = lambda metadata: True,
                     older_layouts: Sequence[tuple[object, Callable]] = ()
                     ) -> Restored | None:
    """Reads the newest good checkpoint, or returns None if there is none.

    Args:
      abstract_state: `jax.ShapeDtypeStruct` tree with the *current* mesh's
        shardings, so a checkpoint saved on another device count reshards.
      read_data_state: `metadata -> bool`, whether to read this process's data
        iterator state too (e.g. not when the process count changed, since
        Grain keeps one state per process).
      older_layouts: `(abstract state, to_today)` pairs: the state as older wnscale laid
        it out (`param_layouts.train_state_layouts`), tried in turn when the
        checkpoint's arrays are not `abstract_state`'s; a state read in one is given to
        its `to_today`.

    Raises:
      CheckpointMismatchError: the newest readable checkpoint holds a train
        state of other arrays, shapes or dtypes than `abstract_state`.
      ParamsOnlyError: it holds parameters alone (`save_params`).
    """
    result, damaged = None, []
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        stored = self.manager.item_metadata(step).state.tree
      except Exception as error:  # a missing or unreadable _METADATA
        self._warn_damaged(step, error)
        damaged.append(step)
        continue
      if set(stored) == {"params"}:
        raise ParamsOnlyError(paths.join(self.directory, str(step)), self.run)
      layout = _layout_of(stored, abstract_state, older_layouts)
      if layout is None:
        differences = _differences(stored, abstract_state)
        path = paths.join(self.directory, str(step))
        more = f" and {len(differences) - 3} more" if len(differences) > 3 else ""
        raise CheckpointMismatchError(
            f"The checkpoint {path} was written by another model or optimizer configuration: "
            f"{len(differences)} of its arrays differ from this run's "
            f"({'; '.join(differences[:3])}{more}). Resume with the config it was written "
            f"with (in {paths.join(path, 'metadata')}), or give this run a new `workdir`. "
            "The checkpoint is left as it is.")
      target, to_today = layout
      try:
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target),
            metadata=ocp.args.JsonRestore()))
        data_state = None
        if read_data_state(restored.metadata):
          reader = _StateReader()
          self.manager.restore(step, args=ocp.args.Composite(
              data=grain.checkpoint.CheckpointRestore(reader)))
          data_state = reader.state
        result = Restored(step, restored.state, restored.metadata, data_state)
        break
      except Exception as error:  # Orbax raises many types for damaged files.
        self._warn_damaged(step, error)
        damaged.append(step)
    if damaged:
      self._set_aside(damaged)
    if result is not None:  # outside the damage check: an error here is no damage
      result.state = to_today(result.state)
    return result

  def _warn_damaged(self, step, error):
    _warn_damaged(self.directory, step, error)

  def _set_aside(self, steps):
    """Moves damaged step directories aside (kept for inspection): new saves may reuse the step."""
    if jax.process_index() == 0:
      for step in steps:
        path = paths.join(self.directory, str(step))
        paths.move(path, f"{path}.damaged-{int(time.time())}")
        logging.warning("Moved the damaged checkpoint %s aside.", path)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("wnscale damaged checkpoints set aside")
    # In a bucket the other processes' listings still name the steps moved: Orbax would
    # then refuse to save those steps again (`StepAlreadyExistsError`).
    paths.forget_listings(self.directory)
    self.manager.reload()

  def close(self):
    """Waits for the saves started (raising a failed one's error), then closes the manager."""
    try:
      self.manager.wait_until_finished()
    finally:
      self.manager.close()


def _manager(directory: str, create: bool, state_handler) -> ocp.CheckpointManager:
  """A manager of `directory`'s steps with the items `Checkpointer` writes."""
  return ocp.CheckpointManager(
      directory, options=ocp.CheckpointManagerOptions(create=create),
      item_handlers={"state": state_handler,
                     "data": grain.checkpoint.CheckpointHandler(),
                     "metadata": ocp.JsonCheckpointHandler()})


def save_params(directory: str, params, metadata: dict, step: int = 0):
  """Writes a checkpoint of `params` alone (no optimizer, no data state) as step `step`.

  `restore_params` reads it; a training run refuses to resume from it and
  says to use `train.init_from`. Written whole or not at all (Orbax's
  temporary directory, renamed when complete).
  """
  manager = _manager(paths.normalize(directory), True, ocp.StandardCheckpointHandler())
  try:
    manager.save(step, force=True, args=ocp.args.Composite(
        state=ocp.args.StandardSave({"params": params}),
        metadata=ocp.args.JsonSave(metadata)))
    manager.wait_until_finished()
  finally:
    manager.close()




def restore_params(directory: str, abstract_params, step: int | None = None,
                   which: str | None = None):
  """Restores only the model parameters (`state.params` or `state.ema`) of a run's checkpoint.

  Works for a training run's checkpoints (the optimizer state is not read)
  and for `save_params`' (an imported model). The directory is only read:
  with `step=None` the newest checkpoint that restores is used, a damaged one
  skipped with a warning (and left where it is).

  Args:
    directory: the run's `checkpoints/` directory (local or URL).
    abstract_params: `jax.ShapeDtypeStruct` tree of the parameters, with the
      shardings to restore onto.
    step: the checkpoint to restore; None: the newest.
    which: "ema" or "raw" (`run_directory.PARAMS`); None: the EMA when the checkpoint
      holds one, else raw.

  Returns:
    `(params, step)`.

  Raises:
    UserError: no checkpoint there, or none at `step` (the message lists them); `which`
      is "ema" and the checkpoint holds no EMA.
    CheckpointMismatchError: the checkpoint holds parameters of other arrays,
      shapes or dtypes (another model configuration).
  """
  directory = paths.normalize(directory)
  if not paths.exists(directory):
    raise UserError(f"No checkpoint in {directory}: no such directory; give a run directory "
                    "(of launch.train or launch.import_graphcast).")
  # A PyTree handler: it restores a subtree (the parameters) of the saved state.
  manager = _manager(directory, False, ocp.PyTreeCheckpointHandler())
  try:
    steps = sorted(manager.all_steps(), reverse=True)
    if not steps:
      raise UserError(f"No checkpoint in {directory}: the run has saved none yet (a run of "
                      "launch.train saves them as it trains; launch.import_graphcast writes "
                      "one).")
    if step is not None and step not in steps:
      raise UserError(f"No checkpoint of step {step} in {directory}; it has steps "
                      f"{sorted(steps)}.")
    failures = []
    for candidate in [step] if step is not None else steps:
      try:
        stored = manager.item_metadata(candidate).state
        stored = getattr(stored, "tree", stored)
      except Exception as error:  # a missing or unreadable _METADATA
        _warn_damaged(directory, candidate, error)
        failures.append(candidate)
        continue
      key = _params_key(stored, which, paths.join(directory, str(candidate)))
      stored = stored[key]
      layout = _layout_of(stored, abstract_params,
                          param_layouts.params_layouts(abstract_params))
      if layout is None:
        differences = _differences(stored, abstract_params)
        raise CheckpointMismatchError(
            f"Checkpoint {paths.join(directory, str(candidate))} holds parameters of another "
            f"model than this config builds; {len(differences)} differences: "
            f"{'; '.join(differences[:5])}. Use the model and data settings it was made with "
            "(its run directory's config.json).")
      target, to_today = layout
      item = {key: target}
      try:
        restored = manager.restore(candidate, args=ocp.args.Composite(
            state=ocp.args.PyTreeRestore(
                item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
                partial_restore=True)))
        logging.info("Parameters of %s: %s.", paths.join(directory, str(candidate)),
                     "the moving average (EMA)" if key == "ema" else "the raw ones")
        params = restored.state[key]
      except Exception as error:  # Orbax raises many types for damaged files.
        _warn_damaged(directory, candidate, error)
        failures.append(candidate)
        continue
      return to_today(params), candidate
    raise UserError(f"No checkpoint in {directory} could be restored (tried steps "
                    f"{failures}).")
  finally:
    manager.close()


def _params_key(stored: dict, which: str | None, checkpoint: str) -> str:
  """The state key holding the parameters `which` asks for, in a checkpoint's `stored` tree."""
  has_ema = stored.get("ema") is not None
  if which == "ema" and not has_ema:  # `params`: the argument of forecasts and predictions
    raise ArgumentError("params", which, f"the checkpoint {checkpoint} holds no moving "
                        "average of the parameters (its run had train.ema_decay=0); read its "
                        "raw parameters (`params=raw`).")
  return "ema" if has_ema and which != "raw" else "params"


def _warn_damaged(directory, step, error):
  logging.warning("Skipping checkpoint %s (step %d), it cannot be restored: %s",
                  paths.join(directory, str(step)), step,
                  (str(error).splitlines() or [repr(error)])[0][:300])


def abstract_like(tree, sharding):
  """`jax.ShapeDtypeStruct`s of `tree`'s leaves, all with `sharding`."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def _layout_of(stored_tree, abstract_state, older_layouts) -> tuple[object, Callable] | None:
  """`(abstract_state in the layout the checkpoint holds, its to_today)`: today's, else the
  first of `older_layouts` whose arrays the checkpoint holds; None: none."""
  for target, to_today in [(abstract_state, lambda state: state), *older_layouts]:
    if not _differences(stored_tree, target):
      return target, to_today
  return None


def _differences(stored_tree, abstract_state) -> list[str]:
  """How a checkpoint's stored arrays differ from `abstract_state`'s, one line each."""
  def describe(tree):
    return {".".join(map(str, path)): f"{np.dtype(leaf.dtype).name}{list(leaf.shape)}"
            for path, leaf in ocp.tree.to_flat_dict(tree).items()}

  stored, wanted = describe(stored_tree), describe(abstract_state)
  return [f"{name}: checkpoint {stored.get(name, 'absent')}, this run {wanted.get(name, 'absent')}"
          for name in sorted(stored.keys() | wanted.keys())
          if stored.get(name) != wanted.get(name)]
