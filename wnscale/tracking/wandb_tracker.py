"""Weights & Biases: one W&B run per workdir (`pip install 'wnscale[wandb]'`).

Where, by W&B's conventions: `WANDB_MODE` (online, offline, disabled), `WANDB_PROJECT`,
`WANDB_ENTITY`, `WANDB_BASE_URL` and the credentials (`WANDB_API_KEY`, `wandb login`) as
W&B reads them. Without `WANDB_MODE` and without credentials, the run is offline. Its
local files are under `<workdir>/wandb/` (for a workdir in a bucket, where W&B puts them:
`WANDB_DIR` or the current directory); an offline run is uploaded later with
`wandb sync <workdir>/wandb/offline-run-*` (each start of a resumed run is one such
directory, synced in order into the one run). The run is named after the workdir; a later
start reopens the run recorded in the workdir (its id, project and entity).

The config is the run's config (updated at each start), metrics are history at their
`metrics.jsonl` steps with the same names, files are the run's files (under their folder),
the tags are `name:value` run tags. What a resumed run already holds: online, W&B's step
of the reopened run; offline, the history of the earlier starts' transaction logs, read
by W&B's own reader (`wandb leet inspect --json`).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import wandb

from wnscale import paths
from wnscale.tracking import base


class Tracker(base.Tracker):
  """The W&B run of a workdir (see the module docstring)."""

  def open(self) -> dict:
    mode = os.environ.get("WANDB_MODE") or None
    if mode is None and not wandb.login(prompt=False, verify=False):
      mode = "offline"
    record = self.where.record or {}
    local = not paths.is_url(self.where.workdir)
    self.run = wandb.init(
        id=record.get("run_id"), resume="allow",
        project=record.get("project"), entity=record.get("entity"),
        dir=self.where.workdir if local else None, name=self.where.name, mode=mode,
        tags=[f"{name}:{value}"[:64] for name, value in self.where.tags.items()] or None,
        settings=wandb.Settings(console="off", silent=True))
    self.offline = self.run.settings.mode == "offline"
    return {"run_id": self.run.id, "project": self.run.project, "entity": self.run.entity}

  def describe(self) -> str:
    if self.offline:
      return (f"W&B offline run {self.run.id} of project {self.run.project} (upload: wandb "
              f"sync {os.path.dirname(os.path.dirname(self.run.dir))}/offline-run-*-"
              f"{self.run.id})")
    return f"W&B run {self.run.url}"

  def logged_through(self, resume_step: int) -> dict[str, int]:
    """W&B's steps only go forward: every metric is held through the run's last step."""
    del resume_step
    if not self.offline:
      return {base.EVERY: self.run.starting_step - 1} if self.run.resumed else {}
    this = os.path.dirname(self.run.dir)
    earlier = [path for path in glob.glob(os.path.join(
        os.path.dirname(this), f"offline-run-*-{self.run.id}")) if path != this]
    return {base.EVERY: max((step for path in earlier for step in history_steps(path)),
                            default=0)}

  def params(self, config: dict):
    self.run.config.update(config, allow_val_change=True)

  def log(self, step: int, values: dict):
    self.run.log(values, step=step)

  def artifact(self, path: str, folder: str, step: int | None = None):
    del step
    target = os.path.join(self.run.dir, folder, os.path.basename(path))
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copyfile(path, target)
    self.run.save(target, base_path=self.run.dir, policy="now")

  def close(self, status: str | None):
    self.run.finish(exit_code=1 if status == base.FAILED else 0)


def history_steps(run_directory: str) -> list[int]:
  """The steps of the history rows in a W&B run directory's transaction log (`.wandb`),
  read with W&B's own reader."""
  result = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json",
                           run_directory], capture_output=True, text=True, timeout=300,
                          check=True)
  records = (json.loads(line) for line in result.stdout.splitlines() if line.startswith("{"))
  return [record["history"]["step"]["num"] for record in records
          if record.get("type") == "history"]
