"""The tiny config's training run in real processes: the flags the process tests share,
the processes' environment, the launch command, and watching a launched process.

No JAX here: conftest.py imports this module before JAX's flags are set.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import NamedTuple

REPO = os.path.join(os.path.dirname(__file__), "..")
# Cheap XLA:CPU compiles: no expensive LLVM passes (the tiny train step compiles in 6 s
# instead of 9 s), and fusions by the classic elemental emitter rather than the newer
# fusion emitters (test_remat.py: 85 s of CPU instead of 134 s; the programs run as
# fast). Runs that a test compares all compile with the same flags.
# libtpu's own XLA lacks the fusion-emitter flag and aborts on an unknown flag: a process
# that loads libtpu (a TPU-topology compile) must not see it in XLA_FLAGS.
CPU_ONLY_XLA_FLAG = "--xla_cpu_use_fusion_emitters=false"
FAST_COMPILE_XLA_FLAGS = ("--xla_backend_optimization_level=0"
                          " --xla_llvm_disable_expensive_passes=true " + CPU_ONLY_XLA_FLAG)
STEPS = 12
RUN_FLAGS = [
    "--config=configs/tiny.py",
    f"--config.train.steps={STEPS}", "--config.train.warmup_steps=2",
    "--config.train.log_every=1", "--config.train.checkpoint_every=4",
    "--config.train.eval_every=6", "--config.train.eval_batches=2",
    "--config.data.train_start=2020-01-01", "--config.data.train_end=2020-01-20",
    "--config.data.eval_start=2020-01-21", "--config.data.eval_end=2020-01-31",
]


def read_metrics(workdir: str) -> list[dict]:
  """The entries of `workdir/metrics.jsonl` (a directory or a URL), in order."""
  from wnscale import paths  # noqa: PLC0415 (not before conftest has set JAX's flags)
  text = paths.read_text(paths.join(workdir, "metrics.jsonl"))
  return [json.loads(line) for line in text.splitlines() if line.strip()]


def fast_compile_env() -> dict:
  """Environment variables for a launched process that compiles fast: cheap XLA:CPU passes,
  and this test session's own compilation cache: a later launch of the same program (a run
  resumed after a kill, a forecast run again) loads it (the tiny run: its set-up, train
  and eval step compiles took 9 s instead of 22 s on a loaded machine), every program
  however fast it compiles (JAX keeps only those over 1 s by default: the tiny run's
  set-up programs then took ~1 s of CPU in each launch)."""
  return {"XLA_FLAGS": FAST_COMPILE_XLA_FLAGS,
          "JAX_COMPILATION_CACHE_DIR": os.path.join(os.environ["WNSCALE_CACHE_DIR"], "xla"),
          "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def process_env() -> dict:
  """The test session's environment for a launched process: CPU, its own device count
  (`--num_cpu_devices`), no libtpu settings, fast compiles."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", **fast_compile_env())
  # This working tree's package, whatever an editable install points at.
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
  for name in ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES"):
    env.pop(name, None)
  return env


def train_command(workdir, devices=4, data=1, graph=4, processes=1, extra=()) -> list[str]:
  """`launch.train` (or `launch.local_cluster` of `processes`) with `RUN_FLAGS`."""
  flags = RUN_FLAGS + [f"--workdir={workdir}", f"--config.mesh.data={data}",
                       f"--config.mesh.graph={graph}", *extra]
  if processes == 1:
    return [sys.executable, "-m", "launch.train", "--platform=cpu",
            f"--num_cpu_devices={devices}", *flags]
  return [sys.executable, "-m", "launch.local_cluster", f"--num_processes={processes}",
          f"--num_cpu_devices={devices}", "--timeout=600", "--", *flags]


def run(workdir, **kwargs) -> subprocess.CompletedProcess:
  """Trains to the end (`train_command`'s arguments); asserts that the run succeeded."""
  result = subprocess.run(train_command(workdir, **kwargs), cwd=REPO, env=process_env(),
                          capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  return result


def losses(workdir) -> dict:
  """`{step: loss}` of a run's `metrics.jsonl`."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    entries = [json.loads(line) for line in f if line.strip()]
  return {m["step"]: m["loss"] for m in entries if "loss" in m}


def damage_checkpoint(step_dir):
  """Cuts the array files and manifests of the checkpoint `step_dir` (a directory or a
  URL) to 7 bytes, as a disk fault would: Orbax can no longer restore it."""
  from wnscale import paths  # noqa: PLC0415 (see read_metrics)

  def damage(folder):
    for entry in folder.iterdir():
      if entry.is_dir():
        damage(entry)
      elif "manifest" in entry.name or entry.name.endswith(".ocdbt") or folder.name == "d":
        entry.write_bytes(entry.read_bytes()[:7])

  damage(paths.as_epath(step_dir) / "state")


def snapshot(workdir) -> dict:
  """Every file under `workdir` with its bytes."""
  files = {}
  for root, _, names in os.walk(workdir):
    for name in names:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        files[os.path.relpath(path, workdir)] = f.read()
  return files


class Started:
  """A launched process in a session of its own (as a terminal's foreground job), its
  stderr collected line by line by a thread."""

  def __init__(self, command, env=None):
    self.process = subprocess.Popen(command, cwd=REPO, env=env or process_env(),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
    self.lines, self.stdout = [], []
    self._threads = [threading.Thread(target=self._read, args=(stream, out), daemon=True)
                     for stream, out in ((self.process.stderr, self.lines),
                                         (self.process.stdout, self.stdout))]
    for thread in self._threads:
      thread.start()

  def _read(self, stream, out):
    for line in iter(stream.readline, ""):
      out.append(line)

  @property
  def stderr(self) -> str:
    return "".join(self.lines)

  def wait_for(self, pattern: str, timeout=300.0) -> re.Match:
    """The first stderr line matching `pattern`, once it is printed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      for line in list(self.lines):
        match = re.search(pattern, line)
        if match:
          return match
      assert self.process.poll() is None, self.stderr[-3000:]
      time.sleep(0.02)
    self.kill()
    raise TimeoutError(f"no line matching {pattern!r}: {self.stderr[-3000:]}")

  def ctrl_c(self):
    """What a terminal does on Ctrl-C: SIGINT to the whole foreground process group."""
    os.killpg(self.process.pid, signal.SIGINT)

  def pause(self):
    """Ctrl-Z: SIGSTOP to the process group. A paused run stays alive (it keeps its
    workdir lock) but takes no step, so a test's window cannot close on a loaded machine."""
    os.killpg(self.process.pid, signal.SIGSTOP)

  def resume(self):
    """`fg`: SIGCONT; signals sent while paused are delivered now."""
    os.killpg(self.process.pid, signal.SIGCONT)

  def finish(self, timeout=300.0) -> int:
    try:
      code = self.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      self.kill()
      raise
    for thread in self._threads:
      thread.join(timeout=10)
    return code

  def kill(self):
    if self.process.poll() is None:
      self.process.kill()
      self.process.wait(timeout=60)


def wait_for_step(started: Started, workdir, step, timeout=300.0):
  """Waits until the run launched as `started` has logged `step` in `metrics.jsonl`."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    assert started.process.poll() is None, started.stderr[-3000:]
    if os.path.exists(os.path.join(workdir, "metrics.jsonl")) and max(
        losses(workdir), default=0) >= step:
      return
    time.sleep(0.1)
  started.kill()
  raise TimeoutError(f"step {step} not reached")


def kill_after_checkpoint(started: Started, workdir, step: int, logged: int | None = None,
                          timeout=300.0):
  """SIGKILLs the run launched as `started` once it has logged step `logged` (default: the
  step after `step`) and its checkpoint of `step` is whole (renamed into place), as a
  machine lost then would."""
  wait_for_step(started, workdir, logged or step + 1, timeout)
  deadline = time.monotonic() + 120
  try:
    while not os.path.isdir(os.path.join(workdir, "checkpoints", str(step))):
      assert time.monotonic() < deadline and started.process.poll() is None
      time.sleep(0.05)
    started.process.kill()
    assert started.finish(timeout=60) == -signal.SIGKILL
  finally:
    started.kill()


def _children(pid):
  """Process ids of `pid`'s children (Linux /proc)."""
  with open(f"/proc/{pid}/task/{pid}/children") as f:
    return [int(child) for child in f.read().split()]


def cluster_process(cluster_pid, process_id, timeout=120):
  """The pid of the launcher's `--process_id=<process_id>` under a local_cluster."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    for child in _children(cluster_pid):
      with open(f"/proc/{child}/cmdline") as f:
        if f"--process_id={process_id}" in f.read().split("\0"):
          return child
    time.sleep(0.2)
  raise TimeoutError(f"process {process_id} of the cluster did not start")


STATION_STEPS = 12
STATION_FLAGS = [
    "--config=configs/tiny_stations.py", "--platform=cpu", "--num_cpu_devices=2",
    "--config.mesh.data=1", "--config.mesh.graph=2",
    f"--config.train.steps={STATION_STEPS}", "--config.train.warmup_steps=2",
    "--config.train.log_every=1", "--config.train.checkpoint_every=6",
    "--config.train.eval_every=8", "--config.train.eval_batches=1",
    "--config.data.train_start=2020-01-01", "--config.data.train_end=2020-01-10",
    "--config.data.eval_start=2020-01-11", "--config.data.eval_end=2020-01-15",
]


class StationRun(NamedTuple):
  """A run of `STATION_FLAGS` killed and resumed (`killed_and_resumed_station_run`)."""

  workdir: str
  before: dict  # {step: loss} logged after the checkpoint of step 6, before the kill
  first_stderr: str
  resumed_stderr: str
  # The cache its statistics went to (the making pytest-xdist worker's: conftest.py).
  cache_dir: str


def killed_and_resumed_station_run(workdir: str) -> StationRun:
  """configs/tiny_stations.py on 2 graph shards, SIGKILLed after step 8 (in the evaluation
  there) with its checkpoint of step 6 whole, then run again to the end."""
  def train():
    return Started([sys.executable, "-m", "launch.train", *STATION_FLAGS,
                    f"--workdir={workdir}"])

  started = train()
  kill_after_checkpoint(started, workdir, 6, logged=8)  # the eval at step 8 leaves a window
  before = {step: loss for step, loss in losses(workdir).items() if step > 6}
  resumed = train()
  assert resumed.finish(timeout=600) == 0, resumed.stderr[-3000:]
  return StationRun(workdir, before, started.stderr, resumed.stderr,
                    os.environ["WNSCALE_CACHE_DIR"])
