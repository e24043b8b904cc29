"""The run directory (`--workdir`): what a run keeps there, and a clear error when it cannot.

The directory may be a URL (`gs://bucket/run`, `wnscale.paths`).

  <workdir>/config.json     the resolved config of the run
  <workdir>/metrics.jsonl   one JSON object per logged step (and per evaluation)
  <workdir>/tensorboard/    TensorBoard events, the same names as metrics.jsonl
  <workdir>/checkpoints/    Orbax checkpoints, one directory per saved step
"""

from __future__ import annotations

from wnscale import outputs, paths

CONFIG = "config.json"
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"
CHECKPOINTS = "checkpoints"


def prepare(workdir: str):
  """Makes `workdir` (and its parents) if missing; a `UserError` if it is a file or
  cannot be written (`outputs.check_writable`: local or `gs://`)."""
  outputs.check_writable(workdir, f"--workdir {paths.normalize(workdir)}", make=True)


def describe(workdir: str, checkpoint_steps) -> str:
  """Where every output of a run is, for the end-of-run summary."""
  steps = ", ".join(str(step) for step in sorted(checkpoint_steps)) or "none"
  config, metrics, tensorboard, checkpoints = (
      paths.join(workdir, name) for name in (CONFIG, METRICS, TENSORBOARD, CHECKPOINTS))
  return (f"config {config}; metrics {metrics}; TensorBoard {tensorboard}/ (tensorboard "
          f"--logdir {workdir}); checkpoints {checkpoints}/ (steps {steps})")
