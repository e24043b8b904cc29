"""`RunDirectory`: what a run directory holds, written and read in one place.

A run directory (`--workdir`; local, or a URL such as `gs://bucket/run`,
`wnscale.paths`) is made by a training run (`wnscale.train.trainer`) or by an
import (`wnscale.interop.graphcast_import`), and read by forecasts, example
predictions and new runs started from its parameters (`train.init_from`):

  <run>/config.json            the resolved config of the run (the newest start's)
  <run>/configs/config-*.json  the config of every start, dated (the history)
  <run>/checkpoints/<step>/    Orbax checkpoints: a training run's train state, data
                               iterator state and metadata, or an import's parameters
  <run>/stats/, <run>/graphcast_remainder.npz   an import's statistics, and what its
                               conversion left out (`interop.graphcast_import`)

What else a training run keeps there (metrics, TensorBoard, its lock): `workdir`.
"""

from __future__ import annotations

import datetime
import json
from typing import TYPE_CHECKING

import ml_collections

from wnscale import config as config_lib
from wnscale import outputs, paths
from wnscale.errors import ArgumentError, UserError

if TYPE_CHECKING:
  from wnscale.train import checkpoint as checkpoint_lib
# `wnscale.train.checkpoint` (Orbax, JAX) is imported where a checkpoint is read or
# written: a launcher that names a run directory checks its flags without that import.

CONFIG = "config.json"
CONFIG_HISTORY = "configs"
CHECKPOINTS = "checkpoints"

# Which parameters of a training run's checkpoint to read: the moving average
# (`state.ema`, `train.ema_decay` > 0) or the raw `state.params`.
PARAMS = ("ema", "raw")

# What `outputs.check` recognises a run directory by. A WeatherNext 2 export
# (`interop.weathernext2_export`) holds a config.json too, beside its params.npz, which no
# run directory holds: named here, as this kind is known wherever an export's is not.
KIND = outputs.Kind("a run directory", (CONFIG, CHECKPOINTS), excludes=("params.npz",))


class RunDirectory:
  """One run directory (see the module docstring).

  Args:
    path: the directory (local or URL).
    argument: the name of the argument that gave `path` (e.g. "workdir"): a
      directory that is not a run is then an `ArgumentError` of it, which a
      launcher shows as its flag; None: a plain `UserError`.
  """

  def __init__(self, path: str, argument: str | None = None):
    self.path = paths.normalize(path)
    self.argument = argument

  @property
  def config_path(self) -> str:
    return paths.join(self.path, CONFIG)

  @property
  def checkpoints(self) -> str:
    """The directory of the run's checkpoints."""
    return paths.join(self.path, CHECKPOINTS)

  def checkpoint(self, step: int) -> str:
    """The directory of the checkpoint of `step`."""
    return paths.join(self.checkpoints, str(step))

  def _not_a_run(self, problem: str) -> UserError:
    if self.argument:
      return ArgumentError(self.argument, self.path, problem)
    return UserError(f"{self.path}: {problem}")

  def has_config(self) -> bool:
    return paths.exists(self.config_path)

  def read_config(self) -> ml_collections.ConfigDict:
    """The run's config as written (`config_lib.from_json`: unknown keys are errors).

    Raises:
      UserError: there is no config (not a run directory).
    """
    if not self.has_config():
      raise self._not_a_run(f"not a run directory: it holds no {CONFIG} (launch.train and "
                            "launch.import_graphcast make one)")
    return config_lib.from_json(paths.read_text(self.config_path))

  def write_config(self, config: dict, history: bool = True):
    """Writes `config` (a config's JSON object: `config_lib.to_json`,
    `specs.recorded_config`) as the run's config; with `history`, a dated copy too (one per
    start)."""
    text = json.dumps(config, indent=2)
    if history:
      started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
      paths.write_text(paths.join(self.path, CONFIG_HISTORY, f"config-{started}.json"), text)
    paths.write_text(self.config_path, text)

  def saved_steps(self) -> list[int]:
    """The steps of the finished checkpoints (Orbax's temporary ones are not), ascending."""
    directory = paths.as_epath(self.checkpoints)
    if not directory.exists():
      return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())

  def checkpointer(self, max_to_keep: int) -> checkpoint_lib.Checkpointer:
    """The training run's `Checkpointer` of its checkpoints (made if missing)."""
    from wnscale.train import checkpoint as checkpoint_lib  # noqa: PLC0415 (see above)
    return checkpoint_lib.Checkpointer(self.checkpoints, max_to_keep, run=self.path)

  def save_params(self, params, metadata: dict, step: int = 0):
    """A checkpoint of parameters alone (an imported model: `checkpoint.save_params`)."""
    from wnscale.train import checkpoint as checkpoint_lib  # noqa: PLC0415
    checkpoint_lib.save_params(self.checkpoints, params, metadata, step)

  def restore_params(self, abstract_params, step: int | None = None,
                     which: str | None = None):
    """`(params, step)`: the parameters of the newest (or `step`'s) checkpoint that restores.

    `abstract_params`: `jax.ShapeDtypeStruct`s with the shardings to restore
    onto. A training run's or an import's checkpoints alike; nothing is written.
    `which`: one of `PARAMS` ("ema", "raw"); None: the EMA if the run kept one.

    Raises:
      UserError: the directory holds no checkpoint (of `step`).
      CheckpointMismatchError: they are parameters of another model.
    """
    if not paths.exists(self.checkpoints):
      raise self._not_a_run(f"not a run directory: it holds no {CHECKPOINTS}/ (launch.train "
                            "and launch.import_graphcast make one)")
    if which not in (None,) + PARAMS:
      raise ValueError(f"which={which!r}, expected one of {PARAMS} or None")
    from wnscale.train import checkpoint as checkpoint_lib  # noqa: PLC0415
    return checkpoint_lib.restore_params(self.checkpoints, abstract_params, step, which)
