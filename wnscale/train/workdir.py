"""The run directory (`--workdir`): what a run keeps there, and a clear error when it cannot.

The directory may be a URL (`gs://bucket/run`, `wnscale.paths`).

  <workdir>/config.json     the resolved config of the run
  <workdir>/metrics.jsonl   one JSON object per logged step (and per evaluation)
  <workdir>/tensorboard/    TensorBoard events, the same names as metrics.jsonl
  <workdir>/checkpoints/    Orbax checkpoints, one directory per saved step
"""

from __future__ import annotations

import os
import tempfile

from wnscale import paths
from wnscale.errors import UserError

CONFIG = "config.json"
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"
CHECKPOINTS = "checkpoints"


def prepare(workdir: str):
  """Makes `workdir` if missing; a `UserError` if it is a file or cannot be written.

  A URL (`gs://...`) needs no making; the bucket's errors come with the first write.
  """
  if paths.is_url(workdir):
    return
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise UserError(f"--workdir {workdir} is a file, not a directory. Give the run a "
                    "directory of its own (it is made if missing).")
  try:
    os.makedirs(workdir, exist_ok=True)
    # Permission bits alone do not tell (ACLs, read-only mounts): write a file.
    with tempfile.TemporaryFile(dir=workdir, prefix=".wnscale-write-test-"):
      pass
  except OSError as error:
    raise UserError(f"Cannot write to --workdir {workdir} ({error.strerror}). Give a "
                    "directory this user can write to.") from error


def describe(workdir: str, checkpoint_steps) -> str:
  """Where every output of a run is, for the end-of-run summary."""
  steps = ", ".join(str(step) for step in sorted(checkpoint_steps)) or "none"
  config, metrics, tensorboard, checkpoints = (
      paths.join(workdir, name) for name in (CONFIG, METRICS, TENSORBOARD, CHECKPOINTS))
  return (f"config {config}; metrics {metrics}; TensorBoard {tensorboard}/ (tensorboard "
          f"--logdir {workdir}); checkpoints {checkpoints}/ (steps {steps})")
