"""The run directory (a run's `workdir`): what a run keeps there, and a clear error when it cannot.

The directory may be a URL (`gs://bucket/run`, `wnscale.paths`).

  <workdir>/config.json     the resolved config of the run (`run_directory`)
  <workdir>/metrics.jsonl   one JSON object per logged step (and per evaluation)
  <workdir>/tensorboard/, mlflow/, wandb/, trackers.json   the trackers' runs
                            (`wnscale.tracking`, as `train.trackers` says)
  <workdir>/checkpoints/    Orbax checkpoints, one directory per saved step (`run_directory`)
  <workdir>/lock.json       while a run lives: its host, pid, start and heartbeat (`lock`)

One run at a time: a run takes the workdir's lock before it writes anything
there and gives it back when it ends (also on an error). The lock names its
holder and is refreshed every `HEARTBEAT_S` by a thread; a run that finds a
live holder's lock stops with an `ArgumentError` of `workdir` naming it; one whose holder is gone
(on this host, a process that no longer runs; anywhere, a heartbeat older than
`STALE_S`) takes it over with a warning. Locally the lock appears whole and
at most once (a hard link of a written file); in a bucket it is written and
read back (two runs starting within the same instant could both pass, not two
runs that start seconds apart).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import socket
import threading
import time
import uuid

from wnscale import outputs, paths
from wnscale.errors import ArgumentError
from wnscale.train import run_directory

METRICS = "metrics.jsonl"
LOCK = "lock.json"
HEARTBEAT_S = 30.0
STALE_S = 300.0


def prepare(workdir: str):
  """Makes `workdir` (and its parents) if missing; an `ArgumentError` of `workdir` if it
  is a file, another kind of output (a store, evaluation results: a typo would write a
  run into it) or cannot be written (`outputs.check_writable`: local or `gs://`)."""
  found = outputs.identify(workdir)
  if found is not None and found is not run_directory.KIND:
    raise ArgumentError("workdir", workdir, f"is {found.noun}, not a run directory; give a "
                        "new directory, or that of a run, as `workdir`.")
  outputs.check_writable(workdir, "workdir", make=True)


class _Lock:
  """This process's hold on one workdir's lock file, and the thread that refreshes it."""

  def __init__(self, workdir: str):
    self.path = paths.join(workdir, LOCK)
    self.workdir = workdir
    now = datetime.datetime.now(datetime.timezone.utc)
    self.record = {"host": socket.gethostname(), "pid": os.getpid(),
                   "since": now.strftime("%Y-%m-%d %H:%M:%S UTC"), "heartbeat": time.time(),
                   "token": uuid.uuid4().hex}
    self.holds = 0
    self._stop = threading.Event()
    self._thread = None

  def acquire(self):
    """Takes the lock (see the module docstring); an `ArgumentError` of `workdir` if a live
    run holds it."""
    for _ in range(3):  # another run may take it between our read and our write
      holder = _read_lock(self.path)
      if holder is not None and holder.get("token") != self.record["token"]:
        gone = _why_gone(holder)
        if gone is None:
          raise ArgumentError(
              "workdir", self.workdir,
              f"in use by host {holder.get('host')}, pid {holder.get('pid')}, since "
              f"{holder.get('since')} (its lock {self.path} was refreshed "
              f"{time.time() - holder.get('heartbeat', 0):.0f} s ago). Wait for that run to "
              "end or stop it, or give this run another `workdir`.")
        if gone:  # not this process's own leftover
          logging.warning("Taking over the lock %s of host %s, pid %s (since %s): %s.",
                          self.path, holder.get("host"), holder.get("pid"),
                          holder.get("since"), gone)
      if self._write(create=holder is None) and (
          _read_lock(self.path) or {}).get("token") == self.record["token"]:
        self._thread = threading.Thread(target=self._beat, daemon=True,
                                        name="wnscale-workdir-lock")
        self._thread.start()
        return
    raise ArgumentError("workdir", self.workdir, f"another run keeps taking its lock "
                        f"{self.path}; give this run another `workdir`.")

  def _write(self, create: bool) -> bool:
    """Writes the lock; with `create`, only if there is none (False: one appeared)."""
    text = json.dumps(self.record)
    if not create or paths.is_url(self.path):
      paths.write_text(self.path, text)
      return True
    staged = f"{self.path}.{self.record['token']}"
    with open(staged, "w") as f:
      f.write(text)
    try:
      os.link(staged, self.path)  # fails if the lock exists; never shows it half written
      return True
    except FileExistsError:
      return False
    finally:
      os.remove(staged)

  def _beat(self):
    warned = False
    while not self._stop.wait(HEARTBEAT_S):
      self.record["heartbeat"] = time.time()
      try:
        self._write(create=False)
      except Exception as error:  # noqa: BLE001 (e.g. a full disk: the run reports that)
        if not warned:
          logging.warning("Could not refresh the workdir lock %s: %s", self.path, error)
          warned = True

  def release(self):
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=HEARTBEAT_S)
    try:
      if (_read_lock(self.path) or {}).get("token") == self.record["token"]:
        paths.as_epath(self.path).unlink()
    except OSError as error:
      logging.warning("Could not remove the workdir lock %s (%s); the next run takes it "
                      "over.", self.path, error)


def _read_lock(path: str) -> dict | None:
  """The lock's record; None if there is none; `{}` if it cannot be read (a stale one)."""
  try:
    return json.loads(paths.read_text(path))
  except FileNotFoundError:
    return None
  except (OSError, ValueError):
    return {}


def _why_gone(holder: dict) -> str | None:
  """Why the holder of a lock no longer holds it ("" : it is this process); None: it does."""
  if not holder:
    return "it cannot be read"
  age = time.time() - holder.get("heartbeat", 0)
  if holder.get("host") == socket.gethostname():
    pid = holder.get("pid")
    if pid == os.getpid():
      return ""
    if not _running(pid):
      return "that process is no longer running"
  if age > STALE_S:
    return f"its last heartbeat was {age:.0f} s ago (a live run refreshes it every " \
           f"{HEARTBEAT_S:.0f} s)"
  return None


def _running(pid) -> bool:
  """Whether process `pid` of this host runs (a zombie, ended but not yet reaped by its
  parent, does not: a killed run's process 0 whose launcher was killed too)."""
  try:
    os.kill(int(pid), 0)
  except (ProcessLookupError, TypeError, ValueError):
    return False
  except PermissionError:  # another user's process
    return True
  try:
    with open(f"/proc/{int(pid)}/stat") as f:  # "pid (name) state ...", Linux only
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except (OSError, IndexError):
    return True


_HELD: dict[str, _Lock] = {}


def lock(workdir: str):
  """Takes `workdir`'s lock for this process (again: counted) until as many `unlock`s.

  Raises:
    ArgumentError: of `workdir`, which a live run holds (the message names its host,
      pid and start).
  """
  workdir = paths.normalize(workdir)
  held = _HELD.get(workdir)
  if held is None:
    held = _Lock(workdir)
    held.acquire()
    _HELD[workdir] = held
  held.holds += 1


def unlock(workdir: str):
  """Gives back one `lock` of `workdir`; the last one removes the lock file."""
  workdir = paths.normalize(workdir)
  held = _HELD.get(workdir)
  if held is None:
    return
  held.holds -= 1
  if held.holds == 0:
    del _HELD[workdir]
    held.release()


@contextlib.contextmanager
def locked(workdir: str, enabled: bool = True):
  """`lock(workdir)` for the block (nothing if not `enabled`), given back however it ends."""
  if not enabled:
    yield
    return
  lock(workdir)
  try:
    yield
  finally:
    unlock(workdir)
