"""Run metrics: `metrics.jsonl` (one JSON object per logged step), and the run's trackers.

Every entry goes to `metrics.jsonl` first, then to the run's trackers
(`wnscale.tracking`: TensorBoard, MLflow, W&B, as `train.trackers` says), which never
hold the loop nor stop the run.

In a local workdir `metrics.jsonl` is written in place. In a bucket (`gs://...`), where
objects cannot be appended to, it is written to a local staging directory and uploaded
whole by `sync()`: every `SYNC_EVERY_S` seconds, before each checkpoint (so a resumed run
finds every line up to its step) and at `close()`; the trackers write out what they hold
at the same moments (TensorBoard's events are uploaded then too).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import tempfile
import time

from wnscale import paths
from wnscale.tracking.run import TrackedRun
from wnscale.train import workdir as workdir_lib

SYNC_EVERY_S = 60.0
# Names every tracker keeps as they are (TensorBoard's tags); metrics.jsonl uses the same.
_TAG = re.compile(r"[\w./-]+")


class MetricsWriter:
  """Appends metrics of process 0; on resume, drops entries past the restored step.

  Dropping them keeps `metrics.jsonl` one line per step even when a run died
  after logging steps that its last checkpoint does not include. Nothing else
  is ever removed: when no line is past the step, the file is appended to as
  it is; otherwise it is replaced, whole, by its lines up to the step.
  `trackers`: the run's trackers, told where the run resumes (`TrackedRun.begin`,
  with the entries kept) and given every entry written.
  """

  def __init__(self, workdir: str, resume_step: int, enabled: bool = True,
               trackers: TrackedRun | None = None):
    self.enabled = enabled
    if not enabled:
      return
    self.workdir = workdir
    self.trackers = trackers or TrackedRun([], 0)
    self.remote = paths.is_url(workdir)
    self.local_dir = tempfile.mkdtemp(prefix="wnscale-metrics-") if self.remote else workdir
    self.path = os.path.join(self.local_dir, workdir_lib.METRICS)
    stored = paths.join(workdir, workdir_lib.METRICS)
    kept = []
    if paths.exists(stored):
      lines = paths.read_text(stored).splitlines(keepends=True)
      kept = [line for line in lines if _step_of(line) <= resume_step]
      if kept and not kept[-1].endswith("\n"):  # a last line without its end: it is whole
        kept[-1] += "\n"
      if kept != lines or self.remote:  # a remote workdir is staged locally
        paths.write_text(self.path, "".join(kept))
    self.file = open(self.path, "a")
    self.trackers.begin(resume_step, [json.loads(line) for line in kept])
    self._synced = time.monotonic()

  def write(self, step: int, values: dict):
    """Appends `{name: value}` at `step`; names must be valid TensorBoard tags."""
    if not self.enabled:
      return
    bad = [name for name in values if not _TAG.fullmatch(name)]
    if bad:
      raise ValueError(f"Metric names {bad} are not TensorBoard tags (letters, digits, _ . / -)")
    values = {k: (float(v) if not isinstance(v, str) else v) for k, v in values.items()}
    with _naming(self.path):
      self.file.write(json.dumps({"step": step, **values}) + "\n")
      self.file.flush()
    self.trackers.log(step, values)
    if time.monotonic() - self._synced > SYNC_EVERY_S:
      self.sync()

  def sync(self):
    """Has the trackers write out what they hold, and uploads `metrics.jsonl` to a remote
    workdir (nothing to upload for a local one)."""
    if not self.enabled:
      return
    self.trackers.flush()
    if not self.remote:
      return
    if not self.file.closed:
      self.file.flush()
    paths.upload(self.path, paths.join(self.workdir, workdir_lib.METRICS))
    self._synced = time.monotonic()

  def close(self):
    if self.enabled:
      self.file.close()
      self.sync()
      if self.remote:
        shutil.rmtree(self.local_dir, ignore_errors=True)


@contextlib.contextmanager
def _naming(path: str):
  """An `OSError` in the block names `path` (e.g. which file found the disk full)."""
  try:
    yield
  except OSError as error:
    if error.filename:
      raise
    raise OSError(error.errno, error.strerror, path) from error


def _step_of(line: str) -> float:
  """The step of a metrics line; a line cut short by a crash counts as past any step."""
  try:
    return json.loads(line)["step"]
  except (json.JSONDecodeError, KeyError, TypeError):
    return math.inf
