"""TensorBoard: event files under `<workdir>/tensorboard/` (tensorboardX writes them).

Metrics are scalars with their `metrics.jsonl` names as tags (NaN and inf are left out);
the config is the run's hparams (TensorBoard's HParams tab, the tags with it); a PNG
artifact is an image at the last step logged, any other file a text (config.json). A resumed
run's writer purges the steps after the checkpoint it resumes from (tensorboardX's
`purge_step`): TensorBoard shows the redone steps once, as logged again. View with
`tensorboard --logdir <workdir>` (`pip install 'wnscale[tensorboard]'`).

In a bucket (`gs://...`), where objects cannot be appended to, the events are written
to a local staging directory and uploaded whole at each `flush` and at the end
(tensorboardX's own gs:// writer is not used: it keeps the whole event file in memory
and speaks to Cloud Storage through its own client).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import tempfile

from matplotlib import image as mpl_image
from tensorboardX import SummaryWriter
from tensorboardX.summary import hparams

from wnscale import paths
from wnscale.tracking import base

DIRECTORY = "tensorboard"


class Tracker(base.Tracker):
  """The TensorBoard event files of a run (see the module docstring)."""

  def open(self) -> dict:
    self.remote = paths.is_url(self.where.workdir)
    self.directory = paths.join(self.where.workdir, DIRECTORY)
    self.local = (tempfile.mkdtemp(prefix="wnscale-tensorboard-") if self.remote
                  else self.directory)
    self.writer = None
    self.purge_step = None
    self.step = 0
    return {}

  def describe(self) -> str:
    viewer = ("" if importlib.util.find_spec("tensorboard") else
              ", after pip install 'wnscale[tensorboard]'")
    return (f"TensorBoard {self.directory}/ (tensorboard --logdir {self.where.workdir}"
            f"{viewer})")

  def logged_through(self, resume_step: int) -> dict[str, int]:
    """Events of an earlier start hold the steps up to `resume_step` (those after it are
    purged by `begin`); no events, none."""
    return {base.EVERY: resume_step} if paths.exists(self.directory) else {}

  def begin(self, resume_step: int):
    self.step = resume_step
    if paths.exists(self.directory):
      self.purge_step = resume_step + 1

  def _writer(self) -> SummaryWriter:
    if self.writer is None:
      self.writer = SummaryWriter(self.local, purge_step=self.purge_step)
    return self.writer

  def params(self, config: dict):
    flat = {key: _hparam(value) for key, value in base.flatten(config).items()}
    flat |= {f"tags.{name}": value for name, value in self.where.tags.items()}
    file_writer = self._writer()._get_file_writer()  # noqa: SLF001 (add_hparams makes a sub-run)
    for summary in hparams(flat, {"loss": math.nan}):
      file_writer.add_summary(summary)

  def log(self, step: int, values: dict):
    self.step = max(self.step, step)
    writer = self._writer()
    for name, value in values.items():
      if math.isfinite(value):
        writer.add_scalar(name, value, step)
    writer.flush()

  def artifact(self, path: str, folder: str, step: int | None = None):
    tag = "/".join(part for part in (folder, os.path.basename(path)) if part)
    step = self.step if step is None else step
    if path.endswith(".png"):
      self._writer().add_image(tag, mpl_image.imread(path)[..., :3], step, dataformats="HWC")
    else:
      with open(path) as f:
        self._writer().add_text(tag, "```\n" + f.read() + "\n```", step)
    self.flush()

  def flush(self):
    if self.writer is None:
      return
    self.writer.flush()
    if self.remote:
      for root, _, files in os.walk(self.local):
        for name in files:
          local = os.path.join(root, name)
          relative = os.path.relpath(local, self.local).replace(os.sep, "/")
          paths.upload(local, paths.join(self.directory, relative))

  def close(self, status: str | None):
    del status  # TensorBoard has no run status
    if self.writer is not None:
      self.flush()
      self.writer.close()
    if self.remote:
      shutil.rmtree(self.local, ignore_errors=True)


def _hparam(value):
  """A config value as an hparam: numbers, strings and bools as they are, others as JSON."""
  if isinstance(value, (bool, int, float, str)):
    return value
  return json.dumps(value)
