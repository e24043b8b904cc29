"""Runs N local CPU processes of a multi-process job, to try multi-host on one machine.

  python -m launch.local_cluster --num_processes=2 -- --config=configs/tiny.py --workdir=DIR

Starts `python -m launch.train` (or `--module`) N times with a free loopback
coordinator port, `--platform=cpu` and each process's share of
`--num_cpu_devices` fake devices; prefixes each line of output with the
process id (`[p0] ...`, stdout to stdout, stderr to stderr), leaving out Gloo's
connection messages unless `--gloo_messages`; if one process fails, stops the
others; exits with the first failure's code (2: a mistake in the input; 128 + N
for a process ended by signal N, as a shell reports it). Of failures seen at once, a
signal from outside or a mistake in the input is the cause; another process's exit 1
(a peer left) or abort followed it.

Ctrl-C, SIGTERM and SIGHUP reach the processes as from a terminal: each is passed
on to every process (they run in a process group of their own, so a terminal's
Ctrl-C reaches them once, through here). The training processes then save the
step they agree on and exit 0, and so does this; a second Ctrl-C stops them at once.
If this launcher is killed outright, each process gets a Ctrl-C's SIGINT from the
kernel (Linux) and, seconds later, ends itself if still running
(`launch.process.watch_launcher`): none runs on unwatched, holding the workdir.
When one process fails after a signal passed on (a Ctrl-C during set-up: each exits
130), the others have `GRACE_S` to stop on their own before they are killed.
"""

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from absl import flags

from launch import cli
from wnscale.errors import UserError

_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 2, "Processes to start.")
_NUM_CPU_DEVICES = flags.DEFINE_integer("num_cpu_devices", 4,
                                        "Fake CPU devices over all processes.")
_MODULE = flags.DEFINE_string("module", "launch.train", "Entry point run in each process.")
_TIMEOUT = flags.DEFINE_float("timeout", 3600.0, "Seconds before all processes are stopped.")
# After a signal passed on, how long the others may take to stop on their own once one
# has ended (a Ctrl-C during set-up: well under a second) before they are killed.
GRACE_S = 5.0

_GLOO_MESSAGES = flags.DEFINE_bool("gloo_messages", False,
                                   "Show Gloo's '[Gloo] Rank i is connected to ...' lines.")


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _forward(process_id: int, stream, out, gloo_messages: bool):
  """Copies `stream` to `out` line by line, prefixed `[p<id>] `."""
  for line in iter(stream.readline, ""):
    if gloo_messages or not line.startswith("[Gloo]"):
      out.write(f"[p{process_id}] {line}")
      out.flush()


def _cause_first(returncode: int) -> int:
  """Sort key of exit codes seen in one poll: a signal from outside (a kill, SIGTERM,
  SIGINT, SIGHUP) or a mistake in the input (2) caused the run's end; an exit 1 (another
  process left) or an abort (the coordination service gone) followed it."""
  external = (-signal.SIGKILL, -signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP)
  return 0 if returncode in external else 1 if returncode == 2 else 2


def run_cluster(num_processes: int, num_cpu_devices: int, module: str, args: list[str],
                timeout: float, gloo_messages: bool = False) -> int:
  """Starts the processes, waits for all, returns 0 or the first nonzero exit code."""
  if num_processes < 1:
    raise UserError(f"--num_processes={num_processes} must be at least 1.")
  if num_cpu_devices % num_processes:
    raise UserError(f"{num_cpu_devices} fake CPU devices (--num_cpu_devices) do not split "
                    f"over --num_processes={num_processes} processes; give a multiple of it.")
  port = free_port()
  env = dict(os.environ, JAX_PLATFORMS="cpu", **{cli.LAUNCHER_PID: str(os.getpid())})
  processes, forwarders = [], []
  passed_on = []  # the signals passed on to the processes
  previous = _pass_on_signals(processes, passed_on)  # also while they start
  code = 0
  try:
    for process_id in range(num_processes):
      command = [sys.executable, "-m", module, *args, f"--coordinator_address=localhost:{port}",
                 f"--num_processes={num_processes}", f"--process_id={process_id}",
                 "--platform=cpu", f"--num_cpu_devices={num_cpu_devices // num_processes}"]
      # A session of its own: a terminal's signals reach it only through `_pass_on_signals`.
      process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env,
                                 start_new_session=True, preexec_fn=_terminated_with_parent)
      for stream, out in ((process.stdout, sys.stdout), (process.stderr, sys.stderr)):
        forwarders.append(threading.Thread(target=_forward, daemon=True,
                                           args=(process_id, stream, out, gloo_messages)))
        forwarders[-1].start()
      processes.append(process)
    deadline = time.monotonic() + timeout
    while None in [p.poll() for p in processes]:  # each polled: any() would stop at one
      failed = [p.returncode for p in processes if p.returncode not in (None, 0)]
      if failed or time.monotonic() > deadline:
        code = min(failed, key=_cause_first) if failed else 124
        break
      time.sleep(0.2)
    else:  # all ended between two polls
      code = min((p.returncode for p in processes if p.returncode), key=_cause_first,
                 default=0)
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)
    if passed_on:  # each got the signal: a moment to stop on its own, saying so
      deadline = time.monotonic() + GRACE_S
      while None in [p.poll() for p in processes] and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in processes:  # only the processes started here
      if p.poll() is None:
        p.kill()
      p.wait()
    for forwarder in forwarders:  # the last lines of output
      forwarder.join(timeout=10)
  return 128 - code if code < 0 else code  # -N: ended by signal N


def _terminated_with_parent():
  """In a started process: a SIGINT when this launcher dies (even by SIGKILL), as from a
  Ctrl-C, so that it stops instead of training on unwatched, holding the workdir (Linux's
  PR_SET_PDEATHSIG; elsewhere nothing). A SIGINT, not a SIGTERM: once `jax.distributed`
  has started, JAX takes a SIGTERM as a preemption notice, acted on at the first step
  (after the set-up and compile: 50 s in the soak), while a Ctrl-C during set-up stops
  the process at once, and one in the loop saves the step reached as a SIGTERM does."""
  if _PRCTL is not None:
    _PRCTL(1, signal.SIGINT)  # 1: PR_SET_PDEATHSIG


# Looked up here, not in the forked child (where only async-signal-safe calls belong).
_PRCTL = ctypes.CDLL(None).prctl if sys.platform.startswith("linux") else None


def _pass_on_signals(processes, passed_on: list) -> dict:
  """Passes SIGINT, SIGTERM and SIGHUP on to every running process (and onto
  `passed_on`); returns the handlers they replace."""
  def pass_on(signum, frame):
    del frame
    passed_on.append(signum)
    for process in processes:
      if process.poll() is None:
        process.send_signal(signum)

  return {signum: signal.signal(signum, pass_on)
          for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}


def main(argv):
  sys.exit(run_cluster(_NUM_PROCESSES.value, _NUM_CPU_DEVICES.value, _MODULE.value, argv[1:],
                       _TIMEOUT.value, _GLOO_MESSAGES.value))


if __name__ == "__main__":
  cli.run(main, unknown_flag_hint="the flags of each process (e.g. --config, --workdir) go "
          "after --: python -m launch.local_cluster --num_processes=2 -- --config=... "
          "--workdir=...")
