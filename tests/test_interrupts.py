"""Accidents that must lose nothing, provoked as a user would: Ctrl-C (a terminal sends
SIGINT to the foreground process group) of a run, of launch.local_cluster and of a
forecast, a second run in a live run's workdir, a full disk at a checkpoint (a tiny
tmpfs; its resumed run also skips a damaged newer checkpoint), a resumed run on other
data. Each asserts the exit status, one line and no traceback, and what is on disk
afterwards; a resumed run's losses equal the uninterrupted run's (`trained_tiny_run`).

A second Ctrl-C during the save, and Ctrl-C to one process of two, are in
test_training.py; kill -9 of a forecast in test_forecast_end_to_end.py.
"""

import contextlib
import errno
import glob
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import gcs
import numpy as np
import pytest

from launch import cli
from tiny_runs import (REPO, STEPS, Started, cluster_process, damage_checkpoint, losses,
                       process_env, run, snapshot, train_command, wait_for_step)
from wnscale import config as config_lib
from wnscale import interrupts
from wnscale import specs as specs_lib
from wnscale.errors import PeerFailed, UserError
from wnscale.train import trainer
from wnscale.train import workdir as workdir_lib
from tiny_runs import read_metrics
from wnscale.train.metrics import MetricsWriter

TESTS = os.path.dirname(os.path.abspath(__file__))
# A tmpfs for the full-disk test: room for the tiny run's first checkpoint (1.2 MB) and
# its other files; `FREE_SPACE_LEFT` is what a filler file leaves free of it. A save of the
# tiny run's checkpoint takes 0.9-1.2 MB (it varies between runs), the log lines of a few
# steps take a few kB.
FULL_DISK_SIZE = "4m"
FREE_SPACE_LEFT = 300 * 1024


def checkpoint_names(workdir):
  return sorted(os.listdir(os.path.join(workdir, "checkpoints")))


def assert_one_error_line(stderr: str, *fragments) -> str:
  """No traceback, and the last line of stderr is the only `error:` line, holding
  `fragments`."""
  assert "Traceback" not in stderr, stderr[-4000:]
  errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and stderr.strip().splitlines()[-1] == errors[0], stderr[-4000:]
  for fragment in fragments:
    assert fragment in errors[0], errors[0]
  return errors[0]


# --- Ctrl-C and a second run in the same workdir -----------------------------------------

@pytest.mark.slow
def test_ctrl_c_saves_the_step_and_a_second_run_in_the_workdir_is_refused(
    trained_tiny_run, tmp_path):
  """Ctrl-C saves the step reached and exits 0; meanwhile a second launch.train on the
  live run's workdir stops before JAX starts, naming the holder. Saved on 8 devices
  (2 x 4), resumed on 4 (1 x 4): the losses are the uninterrupted run's."""
  workdir = str(tmp_path / "run")
  first = Started(train_command(workdir, devices=8, data=2, graph=4))
  try:
    wait_for_step(first, workdir, 3)
    first.pause()  # alive, holding the lock, and short of its last step until resumed
    with open(os.path.join(workdir, "lock.json")) as f:
      holder = json.load(f)
    assert (holder["host"], holder["pid"]) == (socket.gethostname(), first.process.pid)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      metrics_before = f.read()

    second = subprocess.run(train_command(workdir), cwd=REPO, env=process_env(),
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 2, second.stderr[-3000:]
    assert_one_error_line(second.stderr, f"--workdir={workdir}: in use by host "
                          f"{socket.gethostname()}, pid {first.process.pid}, since "
                          f"{holder['since']}", "another --workdir")
    assert "JAX process" not in second.stderr  # refused before JAX started
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      assert f.read().startswith(metrics_before)  # appended to by the first run only

    first.ctrl_c()  # pending until the run is resumed: it stops at the step it paused at
    first.resume()
    assert first.finish(timeout=120) == 0, first.stderr[-3000:]
  finally:
    first.kill()  # SIGKILL ends a paused process too
  assert "Traceback" not in first.stderr, first.stderr[-3000:]
  stopped = int(re.search(r"Stopped at step (\d+) after SIGINT; checkpoint saved to "
                          f"{re.escape(workdir)}/checkpoints/", first.stderr).group(1))
  assert stopped < STEPS and str(stopped) in checkpoint_names(workdir)
  assert max(losses(workdir)) == stopped
  assert not os.path.exists(os.path.join(workdir, "lock.json"))  # given back

  result = run(workdir, devices=4, data=1, graph=4)
  assert f"Resumed from step {stopped}" in result.stderr
  got, want = losses(workdir), losses(trained_tiny_run)
  assert sorted(got) == sorted(want)
  np.testing.assert_allclose([got[s] for s in sorted(got)], [want[s] for s in sorted(want)],
                             rtol=2e-4)


def signal_children(**env) -> Started:
  """`launch.local_cluster` of 2 `tests/signal_child.py` processes (with `env` added), once
  both are ready."""
  env = dict(process_env(), **env, PYTHONPATH=os.pathsep.join(
      [TESTS, os.environ.get("PYTHONPATH", "")]))
  cluster = Started([sys.executable, "-m", "launch.local_cluster", "--num_processes=2",
                     "--num_cpu_devices=2", "--timeout=120", "--module=signal_child"], env=env)
  try:
    for process in (0, 1):
      cluster.wait_for(rf"\[p{process}\] ready", timeout=120)
  except BaseException:
    cluster.kill()
    raise
  return cluster


def test_ctrl_c_of_local_cluster_reaches_each_process_once():
  """The terminal's Ctrl-C reaches launch.local_cluster only (its processes run in
  sessions of their own), which passes it on to each process once. Here process 0 stops
  cleanly and process 1 is ended by the signal: local_cluster exits 130, as a shell
  reports a process ended by SIGINT. (Training processes that save and exit 0, so that
  local_cluster does: test_training.py.)"""
  cluster = signal_children()
  try:
    cluster.ctrl_c()
    assert cluster.finish(timeout=120) == 130, cluster.stderr[-3000:]
  finally:
    cluster.kill()
  assert [line for line in cluster.lines if "SIGINT" in line] == ["[p0] SIGINT 1\n"]
  assert "Traceback" not in cluster.stderr


def bucket_names(bucket: str, prefix: str) -> list[str]:
  """The names of the objects under `prefix` in the emulator's `bucket` (gs://...), asked
  of its JSON API: no client's listing cache between the runs' writes and this."""
  url = (f"{os.environ['STORAGE_EMULATOR_HOST']}/storage/v1/b/{bucket[5:]}/o?"
         f"{urllib.parse.urlencode({'prefix': prefix})}")
  with urllib.request.urlopen(url, timeout=10) as answer:
    return [item["name"] for item in json.load(answer).get("items", [])]


def test_a_ctrl_c_while_a_run_in_a_bucket_sets_up_stops_both_processes_at_once(tmp_path):
  """The soak's finding (`bench/soak.py --storage=emulator --seed=7`): a Ctrl-C to
  launch.local_cluster while its 2 processes set up, the data, cache and workdir in a
  Cloud Storage emulator, was handled inside JAX's garbage-collection callback in both
  (the import that follows JAX's start collects often), where Python dropped it: the run
  trained to its end. Here each process is held in such a callback when the Ctrl-C comes
  (`tests/held_in_gc.py`): both stop within seconds with one line each, local_cluster
  exits 130, and the workdir's lock is given back, nothing else written."""
  hold = tmp_path / "hold"
  with gcs.emulator() as bucket:
    workdir = f"{bucket}/run"
    command = train_command(workdir, devices=4, data=1, graph=4, processes=2)
    command.insert(command.index("--"), "--module=held_in_gc")
    env = dict(process_env(), HOLD_IN_GC=str(hold), WNSCALE_CACHE_DIR=f"{bucket}/cache",
               PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    cluster = Started(command, env=env)
    try:
      for process in (0, 1):
        cluster.wait_for(rf"\[p{process}\] .*JAX process {process} of 2", timeout=120)
      hold.touch()
      for process in (0, 1):
        cluster.wait_for(rf"\[p{process}\] held in a garbage collection", timeout=60)
      cluster.ctrl_c()
      signalled = time.monotonic()
      try:
        code = cluster.finish(timeout=30)
      except subprocess.TimeoutExpired:
        pytest.fail(f"the run went on after the Ctrl-C: {cluster.stderr[-3000:]}")
      assert code == 130, cluster.stderr[-3000:]
    finally:
      cluster.kill()
    stopped_in = time.monotonic() - signalled
    names = bucket_names(bucket, "run/")
  assert stopped_in < 10, cluster.stderr[-3000:]
  said = sorted(line for line in cluster.lines if "Interrupted" in line)
  assert said == ["[p0] Interrupted (Ctrl-C).\n", "[p1] Interrupted (Ctrl-C).\n"], (
      cluster.stderr[-3000:])
  assert "Exception ignored" not in cluster.stderr, cluster.stderr[-3000:]
  assert "Traceback" not in cluster.stderr, cluster.stderr[-3000:]
  assert not any(name.startswith(("run/checkpoints/", "run/metrics")) for name in names)
  assert "run/lock.json" not in names, names  # given back on the way out


def test_a_ctrl_c_reaches_a_process_waiting_for_process_0_at_once():
  """Process 1 waits in the coordination service for what process 0 makes once (a
  synthetic store, statistics: `run_data.once_by_process_0`), for up to 60 s here; a
  Ctrl-C to it ends the wait within a slice of it, not when process 0 is done."""
  port = socket.socket()
  port.bind(("localhost", 0))
  address = f"localhost:{port.getsockname()[1]}"
  port.close()
  code = ("import os, sys, time, jax\n"
          f"jax.distributed.initialize({address!r}, 2, int(sys.argv[1]),\n"
          "                           initialization_timeout=60)\n"
          "from wnscale.data import run_data\n"
          "if jax.process_index() == 0:\n"
          "  time.sleep(60)  # publishes nothing\n"
          "print('waiting', flush=True)\n"
          "try:\n"
          "  run_data.once_by_process_0('never', lambda: b'', 'publish', timeout_s=60)\n"
          "except KeyboardInterrupt:\n"
          "  print('interrupted', flush=True)\n"
          "  os._exit(130)  # not JAX's shutdown barrier, which waits for process 0\n")
  processes = [subprocess.Popen([sys.executable, "-c", code, str(index)], cwd=REPO,
                                env=process_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True) for index in (0, 1)]
  try:
    assert processes[1].stdout.readline() == "waiting\n"
    time.sleep(1.0)  # inside the wait
    processes[1].send_signal(signal.SIGINT)
    signalled = time.monotonic()
    assert processes[1].wait(timeout=30) == 130
    assert time.monotonic() - signalled < 5
    assert processes[1].stdout.read() == "interrupted\n"
  finally:
    for process in processes:
      process.kill()
      process.wait(timeout=60)


def run_late_peers(within: float, **env) -> tuple[Started, int]:
  """`launch.local_cluster` of 2 `tests/late_peer.py` processes (with `env` added: process 1
  comes `LATE_S` seconds late to their first collective), run to its end; the launcher
  and its exit status, once it ends within `within` seconds (else the test fails)."""
  env = dict(process_env(), **env, PYTHONPATH=os.pathsep.join(
      [TESTS, os.environ.get("PYTHONPATH", "")]))
  cluster = Started([sys.executable, "-m", "launch.local_cluster", "--num_processes=2",
                     "--num_cpu_devices=4", "--timeout=120", "--module=late_peer"], env=env)
  try:
    return cluster, cluster.finish(timeout=within)
  except subprocess.TimeoutExpired:
    pytest.fail(f"still running {within:.0f} s on: {cluster.stderr[-3000:]}")
  finally:
    stop_cluster(cluster)


def stop_cluster(cluster: Started):
  """SIGKILL to the launcher and to the processes it started (one held at JAX's shutdown
  barrier would not hear the SIGTERM its launcher's death sends)."""
  try:
    with open(f"/proc/{cluster.process.pid}/task/{cluster.process.pid}/children") as f:
      children = [int(pid) for pid in f.read().split()]
  except OSError:  # the launcher is gone (its processes with it)
    children = []
  for pid in children:
    with contextlib.suppress(ProcessLookupError):
      os.kill(pid, signal.SIGKILL)
  cluster.kill()


def test_a_process_whose_peer_misses_a_collective_stops_every_process_at_once():
  """The soak's fault under load (`bench/soak.py --storage=emulator --seed=7`): process 0
  ran its first step while process 1 was still compiling it; the Gloo rendezvous gave up
  after 30 s, and process 0 was then held at JAX's shutdown barrier, waiting for process
  1, for 5 minutes. Here process 1 comes 120 s late: process 0 says so in one line and
  exits 1 at once, and local_cluster stops process 1 with it (seconds after the 30 s)."""
  cluster, code = run_late_peers(55, LATE_S="120")
  assert code == 1, cluster.stderr[-3000:]
  # The launchers' one-line errors (process 1, still waiting, may abort with a C++ log
  # of its own once process 0's coordination service is gone, before it is stopped).
  errors = [line for line in cluster.lines if re.match(r"\[p\d\] error: ", line)]
  assert len(errors) == 1 and errors[0].startswith(
      "[p0] error: process 0 of 2 stopped: another process left a collective or did not "
      "come to it in time (UNKNOWN: Gloo context initialization failed"), cluster.stderr[-3000:]
  assert "type.googleapis.com" not in errors[0]  # gRPC's payload names left out
  assert "[p0] Traceback" not in cluster.stderr and "Shutdown barrier" not in cluster.stderr
  assert not [line for line in cluster.stdout if "sum" in line]


def test_an_unexpected_error_in_one_process_stops_every_process_at_once():
  """A bug in process 1 (here its `LATE_S` cannot be read) while process 0 waits for it
  in a collective: process 1 prints its traceback and one line and exits 1 at once
  (not after JAX's shutdown barrier, which waits for process 0); local_cluster stops
  process 0, well before its collective would give up (30 s)."""
  started = time.monotonic()
  cluster, code = run_late_peers(55, LATE_S="soon")
  assert code == 1, cluster.stderr[-3000:]
  errors = [line for line in cluster.lines if "error:" in line]
  assert errors == ["[p1] error: process 1 of 2 stopped on an unexpected error, ValueError: "
                    "could not convert string to float: 'soon' (the traceback above); the "
                    "other processes stop with it.\n"], cluster.stderr[-3000:]
  assert "[p1] Traceback" in cluster.stderr  # a bug: where it happened
  assert time.monotonic() - started < 25, cluster.stderr[-3000:]


@pytest.mark.parametrize("message, peer", [
    # The soak's (`--seed=1`): process 1 killed outright while process 0 ran a step.
    ("UNKNOWN: Gloo all-reduce failed: [external/gloo/gloo/transport/tcp/pair.cc:538] Read "
     "error [127.0.0.1]:56490: Connection reset by peer", True),
    ("UNKNOWN: Gloo context initialization failed: DEADLINE_EXCEEDED: GetKeyValue() timed "
     "out with key: cpu:gloo/0,1,2048,2049/2 and duration: 29.99999996s", True),
    # The soak's (`--storage=emulator --seed=2`): process 0 gone while process 1 waited at
    # Orbax's barrier.
    ("UNAVAILABLE: Failed to send RPC to coordination service. Either the leader task was "
     "preempted/died/restarted unexpectedly or this task is experiencing network issues.",
     True),
    # Process 1 killed while process 0 waited at a barrier, no launcher to stop process 0.
    ("INTERNAL: Barrier failed because: task is set to ERROR: UNAVAILABLE: Task 1 heartbeat "
     "timeout. This indicates that the remote task has failed, got preempted, or crashed "
     "unexpectedly.", True),
    ("INVALID_ARGUMENT: Executable expected parameter 0 of size 8 but got 4", False)])
def test_a_peer_that_left_a_collective_is_told_from_a_bug(message, peer):
  """A collective a peer left or never came to is said in one line (the peer's log says
  why); any other error of JAX's keeps its traceback, as a bug."""
  import jax  # noqa: PLC0415
  line = cli._unexpected_in_a_cluster(jax.errors.JaxRuntimeError(message))  # noqa: SLF001
  assert line.startswith("error: process 0 of 1 stopped")
  assert ("another process left a collective or did not come to it in time" in line) == peer
  assert ("(the traceback above)" in line) == (not peer)


def test_a_save_another_process_failed_is_one_line(capsys):
  """A checkpoint's save that another process failed (`coordination.barrier`): its log
  says why; this one's line says where it stopped, and no traceback."""
  failed = PeerFailed("processes 0 and 1 wait at different barriers")
  line = cli._unexpected_in_a_cluster(failed)  # noqa: SLF001
  assert line == ("error: process 0 of 1 stopped: processes 0 and 1 wait at different "
                  "barriers. The run stops; run the same command again to resume from its "
                  "last checkpoint.")
  assert not capsys.readouterr().err


def kill_one_of_a_pair(gone: int, within: float) -> tuple[Started, int]:
  """Two `tests/peer_gone.py` processes, started without a launcher (none to stop the
  survivor); once both have joined, process `gone` is killed (SIGKILL) while the other
  waits for it at a barrier. The survivor and its exit status, once it ends within
  `within` seconds of the kill (else the test fails)."""
  env = dict(process_env(), GONE=str(gone),
             PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
  with socket.socket() as port:
    port.bind(("localhost", 0))
    address = f"localhost:{port.getsockname()[1]}"
  pair = [Started([sys.executable, "-m", "peer_gone", f"--coordinator_address={address}",
                   "--num_processes=2", f"--process_id={index}", "--platform=cpu",
                   "--nocompilation_cache"], env=env) for index in (0, 1)]
  survivor = pair[1 - gone]
  try:
    for started in pair:
      deadline = time.monotonic() + 60
      while started.stdout != ["waiting\n"] and time.monotonic() < deadline:
        assert started.process.poll() is None, started.stderr[-3000:]
        time.sleep(0.05)
    time.sleep(0.5)  # the survivor inside its barrier
    pair[gone].kill()
    killed = time.monotonic()
    try:
      code = survivor.finish(timeout=within)
    except subprocess.TimeoutExpired:
      pytest.fail(f"process {1 - gone} still waiting {within:.0f} s on: "
                  f"{survivor.stderr[-3000:]}")
    assert time.monotonic() - killed < within, survivor.stderr[-3000:]
    return survivor, code
  finally:
    for started in pair:
      started.kill()


def assert_peer_gone(survivor: Started, code: int, index: int, cause: str):
  """The survivor, process `index` of 2, ended either on its barrier's error (one line
  naming `cause`, exit 1) or by JAX's watch of the coordination service (abort, JAX's
  log)."""
  if code == -signal.SIGABRT:
    assert "distributed service detected fatal errors" in survivor.stderr
    return
  assert code == 1, survivor.stderr[-3000:]
  # JAX's watch may still log its abort after the line, while the process exits.
  assert "Traceback" not in survivor.stderr, survivor.stderr[-3000:]
  errors = [line for line in survivor.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1, survivor.stderr[-3000:]
  assert errors[0].startswith(f"error: process {index} of 2 stopped: another process left "
                              "a collective or did not come to it in time"), errors[0]
  assert cause in errors[0], errors[0]


def test_a_process_whose_coordination_service_is_gone_stops_at_once_with_one_line():
  """The soak's fault (`--storage=emulator --seed=2`): process 0 stopped while process 1
  waited at a barrier, which failed with "Failed to send RPC to coordination service";
  that was shown as a bug. Here process 0 is killed while process 1 waits at a barrier;
  process 1 stops within seconds. Either its barrier's error comes first (one line, exit
  1) or JAX's watch of the service ends it (abort): a race that each side wins about
  half the time, so the pair is started until the line is seen."""
  for _ in range(8):
    survivor, code = kill_one_of_a_pair(gone=0, within=5)
    assert_peer_gone(survivor, code, 1, "(UNAVAILABLE: Failed to send RPC to coordination "
                     "service")
    if code == 1:
      return
  pytest.fail("JAX's watch of the coordination service ended process 1 each time")


def test_a_process_whose_peer_died_between_collectives_stops_within_the_heartbeat_timeout():
  """The soak's fault after `kill_launcher` (no launcher left to stop the others): process
  1 died while process 0 was between two waits for it; process 0 waited in the next one
  until JAX's coordination service took process 1 for dead, 100 s by JAX's default. Now
  within `launch.process.HEARTBEAT_TIMEOUT_S` (and a few seconds), with the line of a peer that
  left, or JAX's abort."""
  # 20 s (`launch.process.HEARTBEAT_TIMEOUT_S`, not imported here: its flags would clash
  # with local_cluster's in a test session) and a few seconds.
  survivor, code = kill_one_of_a_pair(gone=1, within=30)
  assert_peer_gone(survivor, code, 0, "heartbeat")


def test_processes_meet_before_their_first_collective():
  """`coordination.all_reach`, as the trainer does after each compile: process 1 comes
  33 s late, longer than the Gloo rendezvous waits, and the collective succeeds."""
  cluster, code = run_late_peers(58, LATE_S="33", MEET="1")
  assert code == 0, cluster.stderr[-3000:]
  assert sorted(line for line in cluster.stdout if "sum" in line) == [
      "[p0] sum 4\n", "[p1] sum 4\n"], cluster.stderr[-3000:]


# Python code run from C where an exception is printed and dropped; `stop()` sends the
# process a signal, whose handler runs at the next check: inside that code.
DROPPING_CALLBACKS = {
    "weakref callback": "reference = weakref.ref(Thing(), stop)",
    "__del__": "Thing.__del__ = stop\n  Thing()",
    "gc callback": "gc.callbacks.append(stop)\n  gc.collect()",
}


@pytest.mark.parametrize("signum, line", [(signal.SIGINT, "Interrupted (Ctrl-C)."),
                                          (signal.SIGTERM, "Interrupted (SIGTERM).")])
@pytest.mark.parametrize("callback", list(DROPPING_CALLBACKS))
def test_a_signal_handled_inside_a_callback_still_stops_the_launcher(callback, signum, line):
  """Whatever Python code runs when the signal's handler does, the launcher stops: one
  line, the signal's exit status, at once (not after the 20 s of work that follows)."""
  code = ("import gc, os, signal, sys, time, weakref\n"
          "from launch import cli\n"
          "sent = []\n"
          "def stop(*_):\n"
          "  if not sent:\n"
          "    sent.append(True)\n"
          f"    os.kill(os.getpid(), {int(signum)})\n"
          "class Thing:\n"
          "  pass\n"
          "def main(argv):\n"
          f"  {DROPPING_CALLBACKS[callback]}\n"
          "  time.sleep(20)\n"
          "  print('went on', file=sys.stderr)\n"
          "cli.run(main)\n")
  start = time.monotonic()
  result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=process_env(),
                          capture_output=True, text=True, timeout=60)
  assert result.returncode == 128 + signum, result.stderr[-3000:]
  assert result.stderr.strip().splitlines() == [line], result.stderr[-3000:]
  assert time.monotonic() - start < 15


def gone(pid: int) -> bool:
  """Whether process `pid` has ended (a zombie too: one whose parent died may wait for a
  reaper that never comes)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] == "Z"
  except FileNotFoundError:
    return True


def test_a_local_cluster_killed_outright_stops_its_processes_within_seconds(tmp_path):
  """SIGKILL to launch.local_cluster (nothing of it runs to pass a signal on), once its
  two processes (`tests/late_peer.py`) have joined `jax.distributed` and compiled: process
  1 sleeps (as a process setting up), process 0 waits in their collective (C code, which
  holds off a signal's handler for up to 30 s). The soak's fault: each got a SIGTERM from
  the kernel, which JAX takes as a preemption notice acted on at the first step, and
  both lived on (50 s). Now the kernel's SIGINT ends process 1 at once, as a Ctrl-C
  does, and process 0 ends itself `launch.process.ORPHAN_GRACE_S` (5 s) after its
  launcher is gone."""
  env = dict(process_env(), LATE_S="120",
             PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
  cluster = Started([sys.executable, "-m", "launch.local_cluster", "--num_processes=2",
                     "--num_cpu_devices=4", "--timeout=120", "--module=late_peer"], env=env)
  try:
    for index in (0, 1):
      deadline = time.monotonic() + 120
      while f"[p{index}] loaded" not in "".join(cluster.stdout):
        assert time.monotonic() < deadline and cluster.process.poll() is None, \
            cluster.stderr[-3000:]
        time.sleep(0.05)
    time.sleep(1.0)  # process 0 inside the collective
    with open(f"/proc/{cluster.process.pid}/task/{cluster.process.pid}/children") as f:
      children = [int(pid) for pid in f.read().split()]
    assert len(children) == 2
    cluster.process.kill()
    killed = time.monotonic()
    ended = {}
    while len(ended) < 2 and time.monotonic() < killed + 30:
      ended.update({pid: time.monotonic() - killed for pid in children
                    if pid not in ended and gone(pid)})
      time.sleep(0.05)
  finally:
    stop_cluster(cluster)
  assert cluster.finish(timeout=60) == -signal.SIGKILL
  assert ended.get(children[1], 99) < 2, ended  # the SIGINT
  # Inside the collective, by its own watch after the grace (4-9 s); sooner when the
  # SIGINT finds it still in Python code, as on a loaded machine (1.1 s seen beside a soak).
  # Without the watch it would wait out Gloo's 30 s.
  assert ended.get(children[0], 99) < 9, ended


@pytest.fixture
def tiny_disk(tmp_path):
  """A directory on a tmpfs of `FULL_DISK_SIZE` (tests run as root to mount it)."""
  if os.geteuid() != 0:
    pytest.skip("mounting a tmpfs needs root")
  mount = tmp_path / "disk"
  mount.mkdir()
  subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FULL_DISK_SIZE}", "tmpfs", str(mount)],
                 check=True, timeout=30)
  try:
    yield str(mount)
  finally:
    subprocess.run(["umount", "-l", str(mount)], check=True, timeout=30)


def fill_disk(directory, leave: int):
  """Writes `directory/filler` so that `leave` bytes stay free on its file system.

  `leave=0` writes until the disk is full: a tmpfs may hold a little less than its
  `statvfs` said (another writer, page rounding), and a full disk is what is asked for."""
  stat = os.statvfs(directory)
  remaining = stat.f_bavail * stat.f_frsize - leave
  piece = b"\0" * (1 << 20)
  descriptor = os.open(os.path.join(directory, "filler"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
  try:
    while remaining > 0:
      try:
        remaining -= os.write(descriptor, piece[:remaining])
      except OSError as error:
        if error.errno != errno.ENOSPC or leave:
          raise
        return
  finally:
    os.close(descriptor)


@pytest.mark.slow
def test_a_full_disk_at_a_checkpoint_is_one_line_and_the_resumed_run_loses_nothing(
    trained_tiny_run, tiny_disk, tmp_path):
  # The run up to its checkpoint of step 4 (the uninterrupted run's, without its later
  # checkpoints), on a disk then filled to leave less than a checkpoint: the resumed run
  # reaches the save of step 8 and finds the disk full. Filled before the launch, not
  # during a run, so that which save fails does not depend on the machine's speed.
  workdir = os.path.join(tiny_disk, "run")
  shutil.copytree(trained_tiny_run, workdir,
                  ignore=lambda root, names: ["8", "12"] if root.endswith("checkpoints") else [])
  fill_disk(tiny_disk, leave=FREE_SPACE_LEFT)
  result = subprocess.run(train_command(workdir), cwd=REPO, env=process_env(),
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 1, result.stderr[-3000:]
  assert "Resumed from step 4" in result.stderr
  line = assert_one_error_line(result.stderr, "the checkpoint of step 4 is intact",
                               "run the same command to resume from step 4")
  # The file that found the disk full: the checkpoint of step 8, or metrics.jsonl or the
  # TensorBoard events of a later step (when the save's first files filled the disk); or,
  # when the failing write's error names no file (one of Orbax's metadata writes), the
  # workdir (seen once in a full-suite run).
  assert re.match(rf"error: No space left on device writing ({re.escape(workdir)}/"
                  r"(checkpoints/8\.orbax-checkpoint-tmp|metrics\.jsonl|tensorboard)|under "
                  rf"{re.escape(workdir)}): ", line), line
  assert len(result.stderr.splitlines()) < 40  # the progress log and that line
  assert checkpoint_names(workdir) == ["4", "8.orbax-checkpoint-tmp"]
  assert not os.path.exists(os.path.join(workdir, "lock.json"))

  copy = str(tmp_path / "copy")  # the same workdir, on a disk with space
  shutil.copytree(workdir, copy)
  # Beside it a damaged newer checkpoint (the uninterrupted run's step 8, cut short; one
  # launch for both accidents): skipped and set aside, and the run resumes from step 4.
  damaged = os.path.join(copy, "checkpoints", "8")
  shutil.copytree(os.path.join(trained_tiny_run, "checkpoints", "8"), damaged)
  damage_checkpoint(damaged)
  resumed = run(copy)
  assert f"Skipping checkpoint {damaged}" in resumed.stderr
  assert f"Resumed from step 4, checkpoint {copy}/checkpoints/4" in resumed.stderr
  assert losses(copy) == losses(trained_tiny_run)  # exact, step for step
  names = checkpoint_names(copy)
  aside = [name for name in names if name.startswith("8.damaged-")]
  assert len(aside) == 1, names  # kept for inspection
  # The leftover removed at the start; step 8 saved again.
  assert [name for name in names if name not in aside] == ["12", "4", "8"]


@pytest.mark.slow
def test_a_save_failing_in_one_process_of_two_stops_both_and_the_resumed_run_loses_nothing(
    tiny_disk, tmp_path):
  """One process's part of a background save meets a full disk while the other's is
  written; the disk is given room and the launcher gets a SIGTERM (the soak's
  `--faults=20 --seed=2`). The two processes waited for each other at different Orbax
  barriers, for 20 minutes; now both stop within seconds, with one line, and the resumed
  run repeats the first start's losses bitwise. The processes are paused around the
  fill, so that process 1 alone writes into the full disk."""
  workdir = os.path.join(tiny_disk, "run")
  flags = ["--config.train.eval_every=0", "--config.train.checkpoint_every=2"]
  command = train_command(workdir, devices=4, data=1, graph=4, processes=2, extra=flags)

  def written(process, step):  # its part of the arrays of the save of `step`
    return glob.glob(os.path.join(workdir, "checkpoints", f"{step}.orbax-checkpoint-tmp",
                                  "state*", f"ocdbt.process_{process}", "manifest.ocdbt"))

  cluster, paused = Started(command), []
  try:
    paused += [cluster_process(cluster.process.pid, index) for index in (0, 1)]
    first, second = paused
    # A save whose part of process 1 is not written yet when it is paused (most are).
    for step in (4, 6, 8, 10):
      cluster.wait_for(rf"\[p0\] .*Checkpoint of step {step}: writing in the background")
      os.kill(second, signal.SIGSTOP)
      deadline = time.monotonic() + 120
      while not written(0, step) and time.monotonic() < deadline:
        time.sleep(0.02)
      if not written(1, step):
        break
      os.kill(second, signal.SIGCONT)
    else:
      pytest.fail("process 1 wrote its part of each save before its pause")
    os.kill(first, signal.SIGSTOP)  # it writes nothing into the full disk
    fill_disk(tiny_disk, leave=0)
    os.kill(second, signal.SIGCONT)
    time.sleep(2.0)  # its writes fail
    os.remove(os.path.join(tiny_disk, "filler"))
    os.kill(first, signal.SIGCONT)
    wait_for_step(cluster, workdir, step + 1)
    cluster.process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    assert cluster.finish(timeout=120) == 1, cluster.stderr[-3000:]
  finally:
    cluster.kill()
    for pid in paused:  # a paused process hears that its launcher is gone once continued
      with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
  assert time.monotonic() - signalled < 30, cluster.stderr[-3000:]
  assert "Traceback" not in cluster.stderr, cluster.stderr[-3000:]
  # Each process says why it stopped, unless the launcher stopped it first: process 1 the
  # full disk, process 0 process 1's failure (or the full disk too, where its own last
  # writes of the save met it: then both wait at the same barrier and stop alike).
  full_disk = (rf"\[p[01]\] error: No space left on device writing ({re.escape(workdir)}/"
               rf"checkpoints/{step}\.orbax-checkpoint-tmp|under {re.escape(workdir)}): "
               rf"the run stopped; .* intact; .* resume from step {step - 2}\.$")
  said = [line for line in cluster.stderr.splitlines() if line[5:].startswith("error: ")]
  assert said and all(re.match(full_disk, line) or line.startswith(
      "[p0] error: process 0 of 2 stopped: ") for line in said), cluster.stderr[-3000:]
  assert f"{step}.orbax-checkpoint-tmp" in checkpoint_names(workdir)
  before = losses(workdir)

  copy = str(tmp_path / "copy")  # on a disk with room for the checkpoints to come
  shutil.copytree(workdir, copy)
  resumed = run(copy, devices=4, data=1, graph=4, processes=2, extra=flags)
  assert f"Resumed from step {step - 2}" in resumed.stderr
  after = losses(copy)
  assert sorted(after) == list(range(1, STEPS + 1))
  assert {k: after[k] for k in before} == before  # bitwise, each step


# --- A resumed run on other data ------------------------------------------------------------

@pytest.mark.slow
def test_a_resumed_run_on_other_data_stops_and_leaves_the_workdir_as_it_was(
    trained_tiny_run, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(trained_tiny_run, workdir)
  before = snapshot(workdir)
  other = subprocess.run(train_command(workdir, extra=["--config.data.train_end=2020-01-15"]),
                         cwd=REPO, env=process_env(), capture_output=True, text=True,
                         timeout=300)
  assert other.returncode == 2, other.stderr[-3000:]
  assert_one_error_line(other.stderr, f"The workdir {workdir} holds a run trained on other data",
                        "data.train_end: '2020-01-20' in config.json, now '2020-01-15'",
                        "another --workdir (--config.train.init_from=",
                        "data.worker_count may change")
  assert "Compiled" not in other.stderr
  assert snapshot(workdir) == before  # nothing written, nothing removed


@pytest.mark.slow  # the trained run
def test_a_copy_of_the_store_and_harmless_keys_are_the_same_data(trained_tiny_run, tmp_path):
  with open(os.path.join(trained_tiny_run, "config.json")) as f:
    config = config_lib.from_json(f.read())
  config.data.worker_count = 2
  copy = str(tmp_path / "copy.zarr")
  shutil.copytree(config.data.path, copy)
  config.data.path = copy
  data = specs_lib.from_config(config).data
  trainer.check_same_data(trained_tiny_run, config, data)  # no error: the same data
  shutil.rmtree(os.path.join(copy, "2m_temperature"))
  with pytest.raises(UserError, match=r"trained on other data \(data.path: ") as library:
    trainer.check_same_data(trained_tiny_run, config, data)
  assert "another `workdir` (`train.init_from=" in str(library.value)
  assert "--" not in str(library.value)


# --- Ctrl-C of a forecast -------------------------------------------------------------------

@pytest.mark.slow
def test_ctrl_c_of_a_forecast_says_what_is_kept(trained_tiny_run, tmp_path):
  out = str(tmp_path / "forecast.zarr")
  forecast = Started([sys.executable, "-m", "launch.forecast", "--platform=cpu",
                      "--num_cpu_devices=1", f"--workdir={trained_tiny_run}", f"--out={out}",
                      "--init_start=2020-01-21T06", "--init_end=2020-01-29",
                      "--init_every=12h", "--lead=2d", "--mesh.graph=1"])
  try:
    forecast.wait_for(r"initial time .* done \(2/18\)")
    forecast.ctrl_c()
    assert forecast.finish(timeout=120) == 0, forecast.stderr[-3000:]
  finally:
    forecast.kill()
  assert "Traceback" not in forecast.stderr
  with open(os.path.join(out, ".zattrs")) as f:
    kept = json.load(f)["wnscale_completed_inits"]
  assert 2 <= len(kept) < 18
  assert (f"Interrupted (SIGINT): {len(kept)} of 18 initial times are in {out}; run the same "
          "command to finish.") in forecast.stderr
  summary = json.loads(forecast.stdout[-1])
  assert summary["interrupted"] == "SIGINT" and summary["written"] == len(kept)


# --- In this process: the pieces -------------------------------------------------------------

def test_stop_request_records_the_first_signal_and_a_second_ctrl_c_is_left_to_the_system():
  before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
  with interrupts.StopRequest("stopping") as stop:
    assert stop.requested is None
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)  # the handler runs between bytecodes of this thread
    assert stop.requested == "SIGTERM"
    assert signal.getsignal(signal.SIGINT) == signal.SIG_DFL  # Ctrl-C now ends at once
  assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def _write_lock(workdir, **record):
  with open(os.path.join(workdir, "lock.json"), "w") as f:
    json.dump({"host": socket.gethostname(), "pid": os.getpid(), "since": "2026-01-01 00:00:00 "
               "UTC", "heartbeat": time.time(), "token": "theirs", **record}, f)


def test_the_workdir_lock_names_a_live_holder_and_takes_over_a_gone_one(tmp_path, caplog):
  workdir = str(tmp_path)
  lock = os.path.join(workdir, "lock.json")
  _write_lock(workdir, host="elsewhere", pid=123)
  with pytest.raises(UserError, match=r"^workdir=.*: in use by host elsewhere, pid 123, "
                                      r"since 2026-01-01 00:00:00 UTC") as library:
    workdir_lib.lock(workdir)
  assert "another `workdir`" in str(library.value) and "--" not in str(library.value)
  assert json.load(open(lock))["token"] == "theirs"  # left alone

  dead = subprocess.Popen(["true"])
  dead.wait(timeout=30)
  # Ended, not yet reaped (as a killed run's process 0 whose launcher was killed too, seen
  # by the soak's restart right after a kill -9): a zombie holds nothing.
  zombie = subprocess.Popen(["true"])
  deadline = time.monotonic() + 30
  while time.monotonic() < deadline and " Z " not in open(f"/proc/{zombie.pid}/stat").read():
    time.sleep(0.01)
  for record, why in (({"host": "elsewhere", "heartbeat": time.time() - workdir_lib.STALE_S - 1},
                       "its last heartbeat was"),
                      ({"pid": dead.pid}, "that process is no longer running"),
                      ({"pid": zombie.pid}, "that process is no longer running")):
    _write_lock(workdir, **record)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
      workdir_lib.lock(workdir)
    assert f"Taking over the lock {lock}" in caplog.text and why in caplog.text
    held = json.load(open(lock))
    assert (held["host"], held["pid"]) == (socket.gethostname(), os.getpid())
    workdir_lib.lock(workdir)  # again in this process: counted, not refused
    workdir_lib.unlock(workdir)
    assert os.path.exists(lock)
    workdir_lib.unlock(workdir)
    assert not os.path.exists(lock)
  zombie.wait(timeout=30)


def test_metrics_are_appended_and_only_lines_past_the_restored_step_dropped(tmp_path):
  path = tmp_path / "metrics.jsonl"
  lines = "".join(json.dumps({"step": step, "loss": 1.0 / step}) + "\n" for step in range(1, 9))
  path.write_text(lines)
  inode = os.stat(path).st_ino
  writer = MetricsWriter(str(tmp_path), resume_step=8)
  writer.write(9, {"loss": 0.1})
  writer.close()
  assert os.stat(path).st_ino == inode  # the same file, appended to
  assert path.read_text().startswith(lines)
  writer = MetricsWriter(str(tmp_path), resume_step=5)
  writer.close()
  assert [m["step"] for m in read_metrics(str(tmp_path))] == [1, 2, 3, 4, 5]


NO_SPACE = ("NoSpaceLeft('No space left on device writing /d/x')", 1,
            "error: No space left on device writing /d/x")


@pytest.mark.parametrize("raised, status, line, traceback", [
    (*NO_SPACE, True),  # without --traceback: the full-disk run below
    ("KeyboardInterrupt()", 130, "Interrupted (Ctrl-C).", False),
])
def test_a_full_disk_and_a_ctrl_c_outside_a_loop_are_one_line(raised, status, line, traceback):
  code = ("import sys; from launch import cli; from wnscale.errors import NoSpaceLeft\n"
          "def main(argv):\n"
          f"  raise {raised}\n"
          "cli.run(main)")
  result = subprocess.run([sys.executable, "-c", code] + (["--traceback"] if traceback else []),
                          cwd=REPO, env=process_env(), capture_output=True, text=True,
                          timeout=120)
  assert result.returncode == status, result.stderr[-3000:]
  assert result.stderr.strip().splitlines()[-1] == line
  assert ("Traceback" in result.stderr) == traceback
