"""A fault-injection soak: one multi-process training run driven to its last step through
a seeded random schedule of accidents, then compared with the same run uninterrupted.

  python bench/soak.py --faults=50 --seed=0 [--storage=local|emulator] [--steps=N]
                       [--out=DIR]

The run: `launch.local_cluster`, 2 processes x 2 CPU devices, the tiny config, a loss
logged every step and a checkpoint every `--checkpoint_every` steps; its workdir on local
disk (a tmpfs of its own when run as root, so that the disk can fill) or, with
`--storage=emulator`, in a bucket of a Cloud Storage emulator (fake-gcs-server, the one
the tests start) behind a small proxy that can answer errors.

Each fault is drawn from `--seed` (kind, then moment) and injected into a start of the
run; after it the same command is run again, as a scheduler or a user would, until the
run reaches `--steps`. Kinds:
  kill_one, term_one, int_one    SIGKILL, SIGTERM, SIGINT to one training process
  kill_all, term_all, int_all    to every process (SIGTERM and SIGINT to the launcher,
                                 which passes them on; SIGKILL to each process)
  kill_launcher                  SIGKILL to the launcher alone (its processes lose it)
  corrupt                        a SIGKILL, then the newest checkpoint's files cut short
  disk_full                      the workdir's disk filled (then given room again)
  storage_errors                 (emulator) the bucket answers 503 for a while
  storage_restart                (emulator) the emulator stopped, then started again
Moments: `setup` (once the processes have joined), `step` (a random step of those left),
`checkpoint` (while a checkpoint is being written).

At the end: every logged loss and the final train state against the uninterrupted run's
(bitwise), each step's loss logged exactly once, the faults by kind, the restarts, the
time each fault cost (from the fault until the run first logs a step past the one it had
reached), any start that outlived its bound (`--bound`, a hang), and any checkpoint left
that cannot be read. Writes `report.json` into `--out`; exits 1 if anything differs.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.server
import json
import logging
import os
import random
import shutil
import signal
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# wnscale, and the emulator the tests start (tests/gcs.py).
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]
os.environ.setdefault("JAX_PLATFORMS", "cpu")

SIGNAL_KINDS = ("kill_one", "term_one", "int_one", "kill_all", "term_all", "int_all",
                "kill_launcher")
LOCAL_KINDS = SIGNAL_KINDS + ("corrupt", "disk_full")
EMULATOR_KINDS = SIGNAL_KINDS + ("corrupt", "storage_errors", "storage_restart")
ENVIRONMENT_KINDS = ("disk_full", "storage_errors", "storage_restart")
MOMENTS = ("setup", "step", "checkpoint")
# Steps of the run per fault by default: a fault at a step comes up to two checkpoints on,
# and a run the bucket's faults leave going (ridden out) trains on meanwhile: 600 steps
# held 42 of 50 faults in the emulator (`--seed=3`), all 50 on local disk.
STEPS_PER_FAULT = {"local": 12, "emulator": 20}
# A step's share of the bound on a start that trains many (`run_bound`): the tiny run took
# about 1 s a step with two emulator soaks side by side on 2 cores; twice that.
SECONDS_A_STEP = 2.0
SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "int": signal.SIGINT}
PROCESSES = 2


@dataclasses.dataclass
class Fault:
  kind: str
  moment: str
  step: int = 0  # the step reached when it was injected
  at: float = 0.0  # when (seconds since the soak began)
  start_code: int | None = None  # how the start it hit ended
  lost_s: float | None = None  # until a step past `step` was logged


class Start:
  """One start of the run: the launcher in a session of its own, its output collected."""

  def __init__(self, command, workdir: str, env, log):
    self.workdir = workdir
    self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)
    self.lines = []
    self.log = log
    self.reader = threading.Thread(target=self._read, daemon=True)
    self.reader.start()

  def _read(self):
    for line in iter(self.process.stdout.readline, ""):
      self.lines.append(line)
      self.log.write(line)

  def seen(self, text: str) -> bool:
    return any(text in line for line in list(self.lines))

  def running(self) -> bool:
    return self.process.poll() is None

  def workers(self) -> list[int]:
    """The training processes' pids (the launcher's children), also once it has died: those
    with this start's `--workdir`, which no other soak's runs share (a local workdir under
    the soak's own folder, a bucket named after the soak's process)."""
    found = []
    for pid in os.listdir("/proc"):
      if not pid.isdigit():
        continue
      try:
        with open(f"/proc/{pid}/cmdline") as f:
          arguments = f.read().split("\0")
      except OSError:
        continue
      if "launch.train" in arguments and f"--workdir={self.workdir}" in arguments:
        found.append(int(pid))
    return sorted(found)

  def kill_everything(self):
    """SIGKILL to the launcher and the training processes of this start; returns once they
    are gone, as a scheduler restarts a job (a start right after would find process 0,
    still exiting, holding the workdir's lock)."""
    workers = self.workers()
    for pid in [self.process.pid] + workers:
      with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    self.process.wait(timeout=60)
    wait_until(lambda: not self.workers(), 60)


def names(directory: str) -> list[str]:
  """The names in `directory` (a folder or a URL)."""
  from wnscale import paths  # noqa: PLC0415
  return [entry.name for entry in paths.as_epath(directory).iterdir()]


def files(folder) -> list:
  """The files under `folder` (an `epath.Path`), at any depth."""
  found = []
  for entry in folder.iterdir():
    found += files(entry) if entry.is_dir() else [entry]
  return found


def wait_until(condition, timeout: float, poll: float = 0.05) -> bool:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if condition():
      return True
    time.sleep(poll)
  return False


class Soak:

  def __init__(self, args):
    self.args = args
    self.rng = random.Random(args.seed)
    self.out = os.path.abspath(args.out)
    os.makedirs(self.out, exist_ok=True)
    self.log = open(os.path.join(self.out, "log.txt"), "a", buffering=1)
    self.begin = time.monotonic()
    self.faults: list[Fault] = []
    self.starts = 0
    self.hung: list[str] = []
    self.progress: list[tuple[float, int]] = []  # (time, last step logged) samples
    self.current: Start | None = None  # the start running, if any
    self.env = dict(os.environ, JAX_PLATFORMS="cpu",
                    WNSCALE_CACHE_DIR=os.path.join(self.out, "cache"))
    self.proxy = None

  def now(self) -> float:
    return time.monotonic() - self.begin

  def say(self, text: str):
    line = f"[soak {self.now():7.1f} s] {text}"
    print(line, flush=True)
    self.log.write(line + "\n")

  # The run.

  def command(self, workdir: str) -> list[str]:
    a = self.args
    return [sys.executable, "-m", "launch.local_cluster", f"--num_processes={PROCESSES}",
            f"--num_cpu_devices={2 * PROCESSES}", f"--timeout={self.run_bound(a.steps):.0f}",
            "--",
            "--config=tiny", f"--workdir={workdir}", f"--config.seed={a.seed}",
            f"--config.train.steps={a.steps}", "--config.train.log_every=1",
            f"--config.train.checkpoint_every={a.checkpoint_every}",
            f"--config.train.eval_every={a.steps}", "--config.train.eval_batches=1",
            "--config.train.batch_size=2", "--config.mesh.data=2", "--config.mesh.graph=2"]

  def metrics(self, workdir: str) -> list[dict]:
    from wnscale import paths  # noqa: PLC0415
    path = paths.join(workdir, "metrics.jsonl")
    try:
      text = paths.read_text(path) if paths.exists(path) else ""
    except Exception:  # noqa: BLE001 (a bucket answering errors: no sample now)
      return []
    entries = []
    for line in text.splitlines():
      with contextlib.suppress(json.JSONDecodeError):
        entries.append(json.loads(line))
    return entries

  def last_step(self, workdir: str) -> int:
    return max((e["step"] for e in self.metrics(workdir) if "loss" in e), default=0)

  def start(self, workdir: str) -> Start:
    self.starts += 1
    started = self.current = Start(self.command(workdir), workdir, self.env, self.log)
    threading.Thread(target=self.watch, args=(started, workdir), daemon=True).start()
    return started

  def watch(self, started: Start, workdir: str):
    """Samples the last step logged while `started` runs (for the time each fault cost)."""
    while started.running():
      self.progress.append((self.now(), self.last_step(workdir)))
      time.sleep(0.5)

  def finish(self, started: Start, bound: float, what: str) -> int:
    """Waits for `started` to end within `bound` seconds; past it, a hang: killed."""
    if not wait_until(lambda: not started.running(), bound, poll=0.2):
      self.hung.append(f"start {self.starts} ({what}) still running {bound:.0f} s on")
      self.say(f"HUNG: {self.hung[-1]}; killed")
      started.kill_everything()
    started.reader.join(timeout=10)
    # No training process outlives its launcher (an orphan would hold the workdir).
    if not wait_until(lambda: not started.workers(), 30):
      self.hung.append(f"start {self.starts}: training processes outlived the launcher")
      self.say(f"HUNG: {self.hung[-1]}; killed")
      started.kill_everything()
    return started.process.returncode

  # Faults.

  def draw(self) -> Fault:
    kinds = EMULATOR_KINDS if self.args.storage == "emulator" else LOCAL_KINDS
    if self.args.storage == "local" and not self.can_fill:
      kinds = tuple(k for k in kinds if k != "disk_full")
    kind = self.rng.choice(kinds)
    moment = ("step" if kind in ("corrupt",) + ENVIRONMENT_KINDS
              else self.rng.choice(MOMENTS))
    return Fault(kind, moment)

  def reach_moment(self, started: Start, fault: Fault, workdir: str) -> bool:
    """Waits for `fault`'s moment in `started`; False if the start ended first."""
    if fault.moment == "setup":
      ok = wait_until(lambda: started.seen("JAX process") or not started.running(), 300)
      time.sleep(self.rng.uniform(0, 3))
    elif fault.moment == "step":
      done = self.last_step(workdir)
      last = min(self.args.steps - 1, done + 2 * self.args.checkpoint_every)
      target = self.rng.randint(done + 1, max(done + 1, last))
      ok = wait_until(lambda: self.last_step(workdir) >= target or not started.running(),
                      self.args.bound, poll=0.1)
    else:  # while a checkpoint of this start's is written (not one a killed start left)
      left = self.saving(workdir)
      ok = wait_until(lambda: self.saving(workdir) - left or not started.running(),
                      self.args.bound, poll=0.2 if self.args.storage == "emulator" else 0.01)
    return ok and started.running()

  def saving(self, workdir: str) -> set[str]:
    """The checkpoints being written, or left unfinished: Orbax's temporary directories on
    a disk; in a bucket (written in place), the steps without their `commit_success.txt`."""
    from wnscale import paths  # noqa: PLC0415
    directory = paths.join(workdir, "checkpoints")
    try:
      found = names(directory)
      if not paths.is_url(directory):
        return {name for name in found if "tmp" in name}
      return {name for name in found if name.isdigit() and not paths.exists(paths.join(
          directory, name, "commit_success.txt"))}
    except Exception:  # noqa: BLE001 (not there yet)
      return set()

  def inject(self, started: Start, fault: Fault, workdir: str):
    kind = fault.kind
    # The training processes, once the launcher has started them (a fault to one of them
    # is not to be lost on a start that has only just begun).
    wait_until(lambda: len(started.workers()) == PROCESSES or not started.running(), 60)
    workers = started.workers()
    if kind.startswith(("kill", "term", "int")) and kind != "kill_launcher":
      signum = SIGNALS[kind.split("_")[0]]
      if kind.endswith("_one"):
        targets = [self.rng.choice(workers)] if workers else []
      elif signum == signal.SIGKILL:
        targets = [started.process.pid] + workers
      else:
        targets = [started.process.pid]
      for pid in targets:
        with contextlib.suppress(ProcessLookupError):
          os.kill(pid, signum)
    elif kind == "kill_launcher":
      os.kill(started.process.pid, signal.SIGKILL)
    elif kind == "corrupt":
      started.kill_everything()
      self.corrupt_newest(workdir)
    elif kind == "disk_full":
      self.fill_disk()
    elif kind == "storage_errors":  # for 1-10 s
      self.proxy.failing = True
      threading.Timer(self.rng.uniform(1, 10), setattr, (self.proxy, "failing", False)).start()
    elif kind == "storage_restart":
      self.storage.restart()

  def after(self, fault: Fault):
    """Undoes what an environmental fault left, as an operator would."""
    if fault.kind == "disk_full":
      self.free_disk()
    elif fault.kind == "storage_errors":  # in case the run stopped before its timer
      self.proxy.failing = False

  def corrupt_newest(self, workdir: str):
    from wnscale import paths  # noqa: PLC0415
    directory = paths.join(workdir, "checkpoints")
    steps = sorted(int(s) for s in names(directory) if s.isdigit())
    if not steps:
      return
    cut = self.rng.random() < 0.5
    for file in files(paths.as_epath(paths.join(directory, str(steps[-1]), "state"))):
        data = file.read_bytes()
        file.write_bytes(data[:7] if cut else bytes(min(len(data), 64)) + data[64:])
    self.say(f"checkpoint {steps[-1]}: its files {'cut short' if cut else 'overwritten'}")

  # The disk (local storage as root: the workdir on a tmpfs of its own).

  @property
  def can_fill(self) -> bool:
    return self.disk is not None

  def fill_disk(self):
    keep = self.rng.choice([0, 4096, 64 * 1024])
    descriptor = os.open(os.path.join(self.disk, "ballast"), os.O_WRONLY | os.O_CREAT)
    try:  # the blocks taken without writing them (a tmpfs allocates them)
      size, deadline = os.fstat(descriptor).st_size, time.monotonic() + 10
      # In pieces: a tmpfs undoes a failed allocation whole, and the run writes meanwhile
      # (one allocation of all the room, failing, once left the disk with 1 GB free).
      while time.monotonic() < deadline:
        wanted = min(shutil.disk_usage(self.disk).free - keep, 64 << 20)
        if wanted < 4096:
          break
        with contextlib.suppress(OSError):  # taken meanwhile: measured again
          os.posix_fallocate(descriptor, size, wanted)
          size += wanted
    finally:
      os.close(descriptor)
    self.say(f"disk filled: {shutil.disk_usage(self.disk).free} bytes left")

  def free_disk(self):
    with contextlib.suppress(FileNotFoundError):
      os.remove(os.path.join(self.disk, "ballast"))

  # The soak.

  def run_bound(self, steps: int) -> float:
    """Seconds a start that trains `steps` steps may take: its set-up, compile and saves
    (3 x `--bound`), and `SECONDS_A_STEP` a step."""
    return 3 * self.args.bound + SECONDS_A_STEP * steps

  def run(self) -> dict:
    a = self.args
    reference = os.path.join(self.out, "reference")
    if not os.path.exists(os.path.join(reference, "metrics.jsonl")) or (
        self.last_step(reference) < a.steps):
      shutil.rmtree(reference, ignore_errors=True)
      self.say(f"the uninterrupted run: {reference}")
      started = self.start(reference)
      code = self.finish(started, self.run_bound(a.steps), "uninterrupted")
      if code != 0:
        raise SystemExit(f"the uninterrupted run failed ({code}): {self.out}/log.txt")
    self.starts = 0
    with self.storage_context() as workdir:
      pending = [self.draw() for _ in range(a.faults)]
      while True:
        started = self.start(workdir)
        # Faults into this start while it runs: one that stops it (a signal) ends the
        # start; one of the environment (a full disk, the bucket) may leave it running.
        ended_by_fault = False
        while pending and self.reach_moment(started, pending[0], workdir):
          fault = pending.pop(0)
          fault.step, fault.at = self.last_step(workdir), self.now()
          self.say(f"fault {len(self.faults) + 1}/{a.faults}: {fault.kind} at "
                   f"{fault.moment} (step {fault.step})")
          self.inject(started, fault, workdir)
          self.faults.append(fault)
          if fault.kind in ENVIRONMENT_KINDS:  # the run may stop on it, or ride it out
            # A few steps on; for a full disk, past the next checkpoint (which meets it).
            past = (fault.step // a.checkpoint_every + 1) * a.checkpoint_every if (
                fault.kind == "disk_full") else fault.step + 2
            wait_until(lambda: not started.running() or self.last_step(workdir) > past,
                       min(a.bound, 60), poll=0.2)
          else:
            self.finish(started, a.bound, fault.kind)
          self.after(fault)
          fault.start_code = started.process.poll()
          if fault.start_code is None:
            self.say("  the run rode it out")
            continue
          self.finish(started, a.bound, fault.kind)  # its output read, its processes gone
          self.say(f"  that start ended with {fault.start_code}; step "
                   f"{self.last_step(workdir)} logged")
          ended_by_fault = True
          break
        if ended_by_fault:
          continue  # the same command again, as a scheduler would
        code = self.finish(started, self.run_bound(a.steps - self.last_step(workdir)),
                           "to the end")
        done = self.last_step(workdir)
        self.say(f"start {self.starts} ended with {code} at step {done}")
        if code == 0 and done >= a.steps:
          if pending:
            self.say(f"the run ended with {len(pending)} faults not injected")
          break
        if self.starts > 4 * a.faults + 10:
          self.hung.append(f"{self.starts} starts and the run has not ended")
          break
      return self.compare(reference, workdir)

  @contextlib.contextmanager
  def storage_context(self):
    """The run's workdir (`_storage`); a soak stopped midway stops its start first, before
    the disk is unmounted or the emulator stopped (else its processes held the disk, and
    with it the filler: 1 GB of memory)."""
    with self._storage() as workdir:
      try:
        yield workdir
      finally:
        if self.current is not None and (self.current.running() or self.current.workers()):
          self.current.kill_everything()

  @contextlib.contextmanager
  def _storage(self):
    self.disk = None
    if self.args.storage == "local":
      root = tempfile.mkdtemp(prefix="soak-disk-", dir=self.out)
      mounted = os.geteuid() == 0 and subprocess.run(
          ["mount", "-t", "tmpfs", "-o", "size=1g", "tmpfs", root], capture_output=True,
          timeout=30).returncode == 0
      self.disk = root if mounted else None
      try:
        yield os.path.join(root, "run")
      finally:
        if mounted:
          self.free_disk()
          subprocess.run(["umount", "--lazy", root], timeout=60, check=False)
    else:
      import gcs  # noqa: PLC0415 (tests/gcs.py: fake-gcs-server)
      with Emulator(gcs, os.path.join(self.out, "bucket")) as self.storage:
        self.proxy = Proxy(self.storage.url)
        for name in ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL"):
          self.env[name] = os.environ[name] = self.proxy.url
        self.env["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
        os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"  # this process reads too
        # This process lists the bucket while the run writes and removes checkpoints:
        # gcsfs's cached listings would name checkpoints gone since (`not found`).
        import fsspec.config  # noqa: PLC0415
        for protocol in ("gs", "gcs"):
          fsspec.config.conf.setdefault(protocol, {})["use_listings_cache"] = False
        self.env["WNSCALE_CACHE_DIR"] = f"gs://{self.storage.bucket}/cache"  # the data too
        try:
          yield f"gs://{self.storage.bucket}/run"
        finally:
          self.proxy.close()

  # The verdict.

  def compare(self, reference: str, workdir: str) -> dict:
    want = [e for e in self.metrics(reference) if "loss" in e]
    got = [e for e in self.metrics(workdir) if "loss" in e]
    counts = {}
    for entry in got:
      counts[entry["step"]] = counts.get(entry["step"], 0) + 1
    steps = range(1, self.args.steps + 1)
    twice = sorted(s for s in steps if counts.get(s, 0) > 1)
    never = sorted(s for s in steps if s not in counts)
    by_step = {e["step"]: e["loss"] for e in got}
    differ = sorted(e["step"] for e in want if by_step.get(e["step"]) != e["loss"])
    state_equal, unreadable = self.states_read_afresh(reference, workdir)
    for fault in self.faults:
      after = [t for t, step in self.progress if t > fault.at and step > fault.step]
      fault.lost_s = round(after[0] - fault.at, 1) if after else None
    kinds = {}
    for fault in self.faults:
      kinds[fault.kind] = kinds.get(fault.kind, 0) + 1
    lost = [f.lost_s for f in self.faults if f.lost_s is not None]
    report = {
        "seed": self.args.seed, "storage": self.args.storage, "steps": self.args.steps,
        "faults": len(self.faults), "by_kind": kinds, "restarts": self.starts - 1,
        "hung": self.hung, "losses_logged_twice": twice, "losses_never_logged": never,
        "losses_differing": differ, "final_state_bitwise_equal": state_equal,
        "unreadable_checkpoints": unreadable,
        "time_lost_s": {"mean": round(sum(lost) / len(lost), 1) if lost else None,
                        "max": max(lost, default=None)},
        "fault_log": [dataclasses.asdict(f) for f in self.faults],
        "soak_s": round(self.now(), 1)}
    report["ok"] = bool(state_equal and not (twice or never or differ or self.hung or
                                             unreadable))
    with open(os.path.join(self.out, "report.json"), "w") as f:
      json.dump(report, f, indent=1)
    return report

  def states_read_afresh(self, reference: str, workdir: str):
    """`final_states`, read by a new process, as a user would read the run: nothing of
    this one's watching it (gcsfs's listings, Orbax's state) carried into the verdict."""
    command = [sys.executable, os.path.abspath(__file__), "--steps", str(self.args.steps),
               "--states_of", reference, workdir]
    result = subprocess.run(command, env=self.env, capture_output=True, text=True,
                            timeout=600, check=False)
    try:
      verdict = json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
      self.say(f"the final states could not be compared: {result.stderr[-2000:]}")
      return False, []
    if verdict["error"]:
      self.say(f"the final state cannot be read: {verdict['error']}")
    return verdict["equal"], verdict["unreadable"]


def final_states(reference: str, workdir: str, step: int) -> dict:
  """Whether the train states of `step` are bitwise equal (`equal`), the checkpoints of
  `workdir` that cannot be read (`unreadable`), and why the comparison failed (`error`)."""
  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415
  import orbax.checkpoint as ocp  # noqa: PLC0415
  from wnscale import paths  # noqa: PLC0415

  def read(run, step):  # as NumPy arrays, whatever devices wrote them
    path = paths.join(run, "checkpoints", str(step), "state")
    checkpointer = ocp.PyTreeCheckpointer()
    layout = checkpointer.metadata(path)
    layout = getattr(layout, "item_metadata", layout)
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), layout)
    return checkpointer.restore(path, restore_args=as_numpy)

  logging.getLogger().setLevel(logging.CRITICAL)  # Orbax's complaints of a damaged one

  steps = sorted(int(s) for s in names(paths.join(workdir, "checkpoints")) if s.isdigit())
  unreadable = []
  for saved in steps:
    try:
      read(workdir, saved)
    except Exception:  # noqa: BLE001 (reported)
      unreadable.append(saved)
  try:
    mine, theirs = read(workdir, step), read(reference, step)
  except Exception as error:  # noqa: BLE001
    return {"equal": False, "unreadable": unreadable, "error": str(error)}
  leaves = zip(jax.tree.leaves(mine), jax.tree.leaves(theirs), strict=True)
  equal = all(np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in leaves)
  return {"equal": equal, "unreadable": unreadable, "error": None}


class Emulator:
  """fake-gcs-server with a filesystem backend (so that a restart keeps the bucket), on
  one port across restarts."""

  def __init__(self, gcs, root: str):
    # A bucket of this soak's own: its workdir's URL names its processes (`Start.workers`),
    # and another soak running beside it must not find them there.
    self.gcs, self.root, self.bucket = gcs, root, f"soak-{os.getpid()}"
    self.port = gcs._free_port()  # noqa: SLF001
    self.url = f"http://127.0.0.1:{self.port}"

  def __enter__(self):
    os.makedirs(os.path.join(self.root, self.bucket), exist_ok=True)
    self._start()
    return self

  def _start(self):
    binary = str(self.gcs._get_binary_path())  # noqa: SLF001
    self.server = subprocess.Popen(
        [binary, "-scheme", "http", "-backend", "filesystem", "-filesystem-root", self.root,
         "-host", "127.0.0.1", "-port", str(self.port), "-external-url", self.url,
         "-log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def answers():
      try:
        urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2)
        return True
      except (urllib.error.URLError, OSError):
        return False
    if not wait_until(answers, 60, poll=0.1):
      raise RuntimeError("fake-gcs-server did not start")

  def restart(self, down_s: float = 3.0):
    self.server.terminate()
    self.server.wait(timeout=30)
    time.sleep(down_s)
    self._start()

  def __exit__(self, *exc_info):
    self.server.terminate()
    self.server.wait(timeout=30)


class Proxy:
  """An HTTP proxy in front of the emulator; while `failing`, it answers 503 itself."""

  def __init__(self, upstream: str):
    self.failing = False
    proxy = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"

      def log_message(self, *args):
        del args

      def _any(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        if proxy.failing:
          self.send_response(503)
          self.send_header("Content-Length", "0")
          self.end_headers()
          return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in (
            "host", "content-length", "connection", "accept-encoding")}
        request = urllib.request.Request(upstream + self.path, data=body, headers=headers,
                                         method=self.command)
        try:
          with urllib.request.urlopen(request, timeout=60) as answer:
            status, answer_headers, data = answer.status, answer.headers, answer.read()
        except urllib.error.HTTPError as error:
          status, answer_headers, data = error.code, error.headers, error.read()
        except (urllib.error.URLError, OSError):
          status, answer_headers, data = 503, {}, b""
        self.send_response(status)
        for key, value in answer_headers.items():
          if key.lower() not in ("content-length", "transfer-encoding", "connection"):
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = do_HEAD = _any  # noqa: N815

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
      daemon_threads = True

      def handle_error(self, request, client_address):
        del request, client_address  # a client killed mid-request: its connection is gone

    self.server = Server(("127.0.0.1", 0), Handler)
    self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
    threading.Thread(target=self.server.serve_forever, daemon=True).start()

  def close(self):
    self.server.shutdown()


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--faults", type=int, default=50)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--storage", choices=("local", "emulator"), default="local")
  parser.add_argument("--steps", type=int, default=None,
                      help="the run's train.steps; default: room for every fault, "
                      f"{STEPS_PER_FAULT['local']} steps each on local disk (600 for 50), "
                      f"{STEPS_PER_FAULT['emulator']} in the emulator")
  parser.add_argument("--checkpoint_every", type=int, default=10)
  parser.add_argument("--bound", type=float, default=300.0,
                      help="seconds a start may take to end after a fault (a hang past it)")
  parser.add_argument("--out", default=None, help="default: a new folder under /tmp")
  parser.add_argument("--states_of", nargs=2, metavar=("REFERENCE", "WORKDIR"),
                      help=argparse.SUPPRESS)  # the verdict's read, in a fresh process
  args = parser.parse_args()
  args.steps = args.steps or STEPS_PER_FAULT[args.storage] * args.faults
  if args.states_of:
    print(json.dumps(final_states(*args.states_of, args.steps)))
    return 0
  args.out = args.out or tempfile.mkdtemp(prefix=f"soak-{args.storage}-{args.seed}-")
  # A SIGTERM (`timeout`, a scheduler) ends the soak through its clean-up: the disk unmounted.
  signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
  report = Soak(args).run()
  brief = {k: v for k, v in report.items() if k != "fault_log"}
  print(json.dumps(brief, indent=1))
  return 0 if report["ok"] else 1


if __name__ == "__main__":
  sys.exit(main())
