"""Run metrics: `metrics.jsonl` (one JSON object per logged step) and TensorBoard events."""

from __future__ import annotations

import json
import math
import os
import re

from tensorboardX import SummaryWriter

from wnscale.train import workdir as workdir_lib

# Names TensorBoard keeps as they are; metrics.jsonl uses the same names.
_TAG = re.compile(r"[\w./-]+")


class MetricsWriter:
  """Appends metrics of process 0; on resume, drops entries past the restored step.

  Dropping them keeps `metrics.jsonl` one line per step even when a run died
  after logging steps that its last checkpoint does not include.
  """

  def __init__(self, workdir: str, resume_step: int, enabled: bool = True):
    self.enabled = enabled
    if not enabled:
      return
    self.path = os.path.join(workdir, workdir_lib.METRICS)
    if os.path.exists(self.path):
      with open(self.path) as f:
        kept = [line for line in f if _step_of(line) <= resume_step]
      with open(self.path + ".tmp", "w") as f:
        f.writelines(kept)
      os.replace(self.path + ".tmp", self.path)
    self.file = open(self.path, "a")
    self.tensorboard = SummaryWriter(os.path.join(workdir, workdir_lib.TENSORBOARD))

  def write(self, step: int, values: dict):
    """Appends `{name: value}` at `step`; names must be valid TensorBoard tags."""
    if not self.enabled:
      return
    bad = [name for name in values if not _TAG.fullmatch(name)]
    if bad:
      raise ValueError(f"Metric names {bad} are not TensorBoard tags (letters, digits, _ . / -)")
    values = {k: (float(v) if not isinstance(v, str) else v) for k, v in values.items()}
    self.file.write(json.dumps({"step": step, **values}) + "\n")
    self.file.flush()
    for name, value in values.items():
      if isinstance(value, float) and math.isfinite(value):
        self.tensorboard.add_scalar(name, value, step)
    self.tensorboard.flush()

  def close(self):
    if self.enabled:
      self.file.close()
      self.tensorboard.close()


def _step_of(line: str) -> float:
  """The step of a metrics line; a line cut short by a crash counts as past any step."""
  try:
    return json.loads(line)["step"]
  except (json.JSONDecodeError, KeyError, TypeError):
    return math.inf


def read_metrics(workdir: str) -> list[dict]:
  """The entries of `workdir/metrics.jsonl`, in order."""
  with open(os.path.join(workdir, workdir_lib.METRICS)) as f:
    return [json.loads(line) for line in f if line.strip()]
