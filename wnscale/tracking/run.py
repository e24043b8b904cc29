"""`TrackedRun`: the trackers of one training run, driven for it (process 0's).

  * Start. `TrackedRun.open` loads every tracker of `train.trackers` (a missing package
    is one line with the pip command) and opens its run before any work: a tracker that
    cannot be reached (a server down, a bad URI) is one line naming it
    (`errors.UserError`). The ids of each tracked run are kept in `<workdir>/trackers.json`
    (`RECORD`), so a later start of the same run reopens the same tracked run.
  * What is logged. The resolved config as parameters and `config.json` as an artifact
    (`config`), every `metrics.jsonl` entry at its step with its names (`log`), files
    (`artifact`: e.g. the evaluation figures), and the run's tags (`run_tags`: model,
    processor, resolution, commit).
  * Resume. A resumed run starts from its checkpoint's step, so the steps after it that
    the crashed process had logged are trained and logged again. Each tracker says which
    steps of each metric it already holds (`base.Tracker.logged_through`, from its own
    store); those are not logged again, and the entries of `metrics.jsonl` up to the
    checkpoint's step that it lacks (a tracker added to the run, or one that failed) are
    logged first (`begin`).
  * Failures later. Every call to a tracker runs on a thread of its own, in order, so the
    training loop never waits for one. A tracker that fails warns once, naming it and the
    error, and gets no more calls in this process; `metrics.jsonl` keeps every value.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import subprocess
import tempfile
import threading
from typing import TYPE_CHECKING

from wnscale import paths
from wnscale.tracking import base, registry
from wnscale.errors import UserError

if TYPE_CHECKING:
  from wnscale.specs import Specs

RECORD = "trackers.json"
FLUSH_TIMEOUT_S = 60.0  # how long `flush` waits for each tracker
CLOSE_TIMEOUT_S = 120.0  # how long the end of a run waits for each tracker's last calls


def run_tags(specs: Specs, model: str = "") -> dict[str, str]:
  """The tags of a run of `specs`: `model` (its config's name, when given), processor,
  resolution (the grid: `data.grid` or the regular spacing), commit (wnscale's)."""
  d = specs.data
  tags = {"model": model} if model else {}
  resolution = d.grid or f"{d.resolution:g}deg"
  if d.regional_path:
    resolution += " with a regional cut-out"
  return tags | {"processor": specs.model.processor.name, "resolution": resolution,
                 "commit": commit()}


def commit() -> str:
  """wnscale's git commit (short; `+` when its files differ from it), or its version when
  it is not a git checkout."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

  def git(*args):
    return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                          timeout=30, check=True).stdout.strip()

  try:
    return git("rev-parse", "--short", "HEAD") + ("+" if git("status", "--porcelain",
                                                             "wnscale") else "")
  except (OSError, subprocess.SubprocessError):
    from importlib import metadata  # noqa: PLC0415
    return metadata.version("wnscale")


def read_record(workdir: str) -> dict:
  """`{tracker: ids}` kept in `workdir` (empty: none)."""
  path = paths.join(workdir, RECORD)
  return json.loads(paths.read_text(path)) if paths.exists(path) else {}


class TrackedRun:
  """The trackers of one run (see the module docstring); a no-op when `open`ed disabled.

  Use as an exit callback (`contextlib.ExitStack.push`) or a `with` block: it closes the
  trackers as FAILED when an exception ends the run (Ctrl-C aside), else FINISHED when the
  last step logged reached the run's `total_steps`, else STOPPED.
  """

  def __init__(self, workers: list[_Worker], total_steps: int):
    self.workers, self.descriptions = [], []
    for worker in workers:
      self.add(worker)
    self.total_steps = total_steps
    self.last_step = 0
    self.staging = None  # copies of the files given to the trackers, until they are closed

  @classmethod
  def open(cls, names, workdir: str, tags: dict, total_steps: int,
           enabled: bool = True) -> TrackedRun:
    """Opens the runs of trackers `names` (`train.trackers`) for the run in `workdir`.

    Raises:
      UserError: a tracker's package is missing, or the tracker cannot be reached.
    """
    if not enabled or not names:
      return cls([], total_steps)
    workdir = paths.normalize(workdir)
    classes = {name: registry.load(name) for name in names}  # every missing package first
    record = read_record(workdir)
    name = os.path.basename(workdir.rstrip("/"))
    opened = cls([], total_steps)
    for tracker_name, tracker_class in classes.items():
      tracker = tracker_class(base.Where(workdir, name, dict(tags), record.get(tracker_name)))
      try:
        record[tracker_name] = tracker.open()
      except Exception as error:
        opened.close(base.FAILED)  # those opened before it: this start ends here
        if isinstance(error, UserError):
          raise
        raise UserError(f"train.trackers: {tracker_name} cannot be used: {_first_line(error)}"
                        f" (fix it, or leave {tracker_name!r} out of train.trackers).") from error
      opened.add(_Worker(tracker_name, tracker))
    paths.write_text(paths.join(workdir, RECORD), json.dumps(record, indent=2))
    return opened

  def add(self, worker: _Worker):
    self.workers.append(worker)
    self.descriptions.append(worker.tracker.describe())

  def begin(self, resume_step: int, kept: list[dict]):
    """The loop starts after `resume_step`; `kept`: the `metrics.jsonl` entries up to it."""
    self.last_step = resume_step
    for worker in self.workers:
      worker.call("begin", resume_step, kept)

  def config(self, config: dict, config_file: str):
    """Logs the resolved `config` as parameters and the file `config_file` (the run's
    config.json, local or a URL) as an artifact."""
    for worker in self.workers:
      worker.call("params", config)
    self.artifact(config_file, "")

  def log(self, step: int, values: dict):
    """Logs a `metrics.jsonl` entry: `{name: value}` at `step`."""
    self.last_step = max(self.last_step, step)
    for worker in self.workers:
      worker.call("log", step, values)

  def artifact(self, path: str, folder: str, step: int | None = None):
    """Keeps a copy of the file `path` (local or a URL) with every tracked run, under
    `folder` (`base.Tracker.artifact`)."""
    if not self.workers:
      return
    self.staging = self.staging or tempfile.mkdtemp(prefix="wnscale-tracking-")
    local = os.path.join(tempfile.mkdtemp(dir=self.staging), os.path.basename(path))
    with open(local, "wb") as f:  # as it is now: the trackers read it later
      f.write(paths.read_bytes(path))
    for worker in self.workers:
      worker.call("artifact", local, folder, step)

  def flush(self):
    """Waits (at most `FLUSH_TIMEOUT_S` each) until every tracker has written what it got."""
    for worker in self.workers:
      worker.call("flush", timeout=FLUSH_TIMEOUT_S)

  def close(self, status: str | None):
    """Ends the trackers' runs: `status` a `base` status, or None to leave it as it is."""
    for worker in self.workers:
      worker.stop(status, CLOSE_TIMEOUT_S)
    self.workers = []
    if self.staging:
      shutil.rmtree(self.staging, ignore_errors=True)

  def __enter__(self) -> TrackedRun:
    return self

  def __exit__(self, error_type, error, traceback):
    if error_type is not None and not issubclass(error_type, KeyboardInterrupt):
      status = base.FAILED
    else:  # a second Ctrl-C, which stops at once, is a stop too
      status = base.FINISHED if self.last_step >= self.total_steps else base.STOPPED
    self.close(status)


def attach(workdir: str, files, folder: str, step: int | None = None) -> list[str]:
  """Adds the local `files` (e.g. an evaluation's figures) under `folder` to the tracked runs
  of the training run in `workdir` (those its `RECORD` names), leaving their status as it
  is; returns the trackers that got them. A tracker that cannot be reached is a warning
  (the files stay where they are)."""
  record = read_record(workdir) if paths.exists(workdir) else {}
  if not record:
    return []
  try:
    tracked = TrackedRun.open(tuple(record), workdir, {}, 0)
  except UserError as error:
    logging.warning("The run %s's trackers do not get %s: %s", workdir, folder, error)
    return []
  for path in files:
    tracked.artifact(path, folder, step)
  tracked.close(None)
  return list(record)


class _Worker:
  """One tracker's calls, made in order on a thread of its own; a failing one is dropped.

  `held` (asked in `begin`: `base.Tracker.logged_through`) is the last step of each metric
  that the tracker holds: a value at or before it is left out.
  """

  def __init__(self, name: str, tracker: base.Tracker):
    self.name, self.tracker = name, tracker
    self.failed = False
    self.held = {}
    self.queue = queue.Queue()
    self.thread = threading.Thread(target=self._run, name=f"wnscale-tracker-{name}",
                                   daemon=True)
    self.thread.start()

  def call(self, method: str, *args, timeout: float | None = None):
    """Queues `method(*args)`; with `timeout`, waits that long for it to be done."""
    done = threading.Event()
    self.queue.put((method, args, done))
    if timeout is not None and not done.wait(timeout):
      logging.warning("Tracker %s: %s is taking over %.0f s; the run goes on without waiting.",
                      self.name, method, timeout)

  def stop(self, status: str | None, timeout: float):
    self.call("close", status)
    self.queue.put(None)
    self.thread.join(timeout)
    if self.thread.is_alive():
      logging.warning("Tracker %s did not finish within %.0f s; what it had not sent yet is "
                      "lost (metrics.jsonl holds every value).", self.name, timeout)

  def _run(self):
    while (item := self.queue.get()) is not None:
      method, args, done = item
      try:
        if not self.failed:  # `begin` and `log` decide what to log; the rest is the tracker's
          (getattr(self, f"_{method}", None) or getattr(self.tracker, method))(*args)
      except Exception as error:  # noqa: BLE001 (a tracker never stops the run)
        self.failed = True
        logging.warning("Tracker %s failed (%s): it logs nothing more in this run; "
                        "metrics.jsonl holds every value, and the next start of this run "
                        "logs what it missed.", self.name, _first_line(error))
      finally:
        done.set()

  def _begin(self, resume_step: int, kept: list[dict]):
    self.held = self.tracker.logged_through(resume_step)
    self.tracker.begin(resume_step)
    for entry in kept:  # what the tracker lacks up to the step resumed from
      self._log(entry["step"], entry)

  def _log(self, step: int, values: dict):
    new = {name: value for name, value in _values(values).items()
           if step > max(self.held.get(name, 0), self.held.get(base.EVERY, 0))}
    if new:
      self.tracker.log(step, new)


def _values(entry: dict) -> dict:
  """The numbers of a metrics entry, `step` left out."""
  return {name: float(value) for name, value in entry.items()
          if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)}


def _first_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0] if text else ''}"[:400]

