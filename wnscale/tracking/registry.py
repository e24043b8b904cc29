"""The trackers a run can log to, one registry entry each (`train.trackers` names them).

An entry names the tracker's module (its `Tracker` class: `base.Tracker`), the package it
needs, and the extra of wnscale that installs it. A new tracker is one more entry and its
module. Nothing here imports a tracker's package: `check` runs while a config is
validated, `load` when a run starts.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import NamedTuple

from wnscale.errors import UserError


class Entry(NamedTuple):
  """A registry entry.

  Attributes:
    module: the module holding the tracker's `Tracker` class.
    package: the import name of the package it needs.
    extra: wnscale's extra that installs the package (`pip install 'wnscale[extra]'`).
  """

  module: str
  package: str
  extra: str


TRACKERS = {
    "tensorboard": Entry("wnscale.tracking.tensorboard_tracker", "tensorboardX", "tensorboard"),
    "mlflow": Entry("wnscale.tracking.mlflow_tracker", "mlflow", "mlflow"),
    "wandb": Entry("wnscale.tracking.wandb_tracker", "wandb", "wandb"),
}


def check(names) -> str | None:
  """What is wrong with `train.trackers` = `names` (an unknown or repeated name), or None."""
  unknown = [name for name in names if name not in TRACKERS]
  if unknown:
    return (f"train.trackers: unknown tracker {unknown[0]!r}; the trackers are "
            f"{tuple(TRACKERS)}")
  if len(set(names)) != len(names):
    return f"train.trackers={tuple(names)} names a tracker twice"
  return None


def load(name: str) -> type:
  """The `Tracker` class of tracker `name`.

  Raises:
    UserError: its package is not installed (saying how to install it).
  """
  entry = TRACKERS[name]
  if importlib.util.find_spec(entry.package) is None:
    raise UserError(f"train.trackers includes {name!r}, whose package {entry.package} is not "
                    f"installed: pip install 'wnscale[{entry.extra}]' (or leave {name!r} out "
                    "of train.trackers).")
  return importlib.import_module(entry.module).Tracker
