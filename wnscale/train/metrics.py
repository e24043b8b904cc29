"""Run metrics: `metrics.jsonl` (one JSON object per logged step) and TensorBoard events."""

from __future__ import annotations

import json
import math
import os

from tensorboardX import SummaryWriter


class MetricsWriter:
  """Appends metrics of process 0; on resume, drops entries past the restored step.

  Dropping them keeps `metrics.jsonl` one line per step even when a run died
  after logging steps that its last checkpoint does not include.
  """

  def __init__(self, workdir: str, resume_step: int, enabled: bool = True):
    self.enabled = enabled
    if not enabled:
      return
    self.path = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(self.path):
      with open(self.path) as f:
        kept = [line for line in f if _step_of(line) <= resume_step]
      with open(self.path + ".tmp", "w") as f:
        f.writelines(kept)
      os.replace(self.path + ".tmp", self.path)
    self.file = open(self.path, "a")
    self.tensorboard = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write(self, step: int, values: dict):
    if not self.enabled:
      return
    values = {k: (float(v) if not isinstance(v, str) else v) for k, v in values.items()}
    self.file.write(json.dumps({"step": step, **values}) + "\n")
    self.file.flush()
    for name, value in values.items():
      if isinstance(value, float) and math.isfinite(value):
        # TensorBoard tags allow no "@": temperature@500 -> temperature_500.
        self.tensorboard.add_scalar(name.replace("@", "_"), value, step)
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
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]
