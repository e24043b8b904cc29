"""Huge pages for the host's large buffers: a process re-run with glibc's tunable, once;
its large mallocs get transparent huge pages; the processes it starts inherit them."""

import os
import subprocess
import sys

import pytest

from tiny_runs import REPO
from wnscale import host_memory

PROBE = os.path.join(os.path.dirname(__file__), "huge_pages_probe.py")
# Where the kernel gives huge pages on request only (madvise); elsewhere nothing to test.
pytestmark = pytest.mark.skipif(not host_memory._thp_on_request(),
                                reason="transparent huge pages are not given on request here")


def plain_env(**env) -> dict:
  """This environment (this working tree's package first on the path) without the tunable
  and the opt-out, plus `env`."""
  return {**{k: v for k, v in os.environ.items()
             if k not in ("GLIBC_TUNABLES", host_memory.OPT_OUT)},
          "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
          **env}


def probe(*args, **env) -> tuple[int, str, int, int]:
  """`(pid, GLIBC_TUNABLES, huge page KiB, the pid Popen saw)` of the probe run with `env`
  added to `plain_env()`."""
  process = subprocess.Popen([sys.executable, PROBE, *args], env=plain_env(**env),
                             stdout=subprocess.PIPE, text=True)
  out, _ = process.communicate(timeout=60)
  assert process.returncode == 0
  pid, tunables, huge_kib = out.split()
  return int(pid), tunables, int(huge_kib), process.pid


def test_a_process_re_runs_itself_once_with_huge_pages():
  pid, tunables, huge_kib, started = probe("--use")
  assert (pid, tunables) == (started, host_memory.TUNABLE)  # the same process, re-run once
  assert huge_kib >= 128 << 10  # most of the 256 MiB in 2 MiB pages
  # Without the tunable, the same malloc gets none.
  assert probe()[1:3] == ("None", 0)


def test_other_tunables_are_kept_and_the_opt_out_is_honoured():
  assert probe("--use", GLIBC_TUNABLES="glibc.malloc.arena_max=2")[1] == (
      "glibc.malloc.arena_max=2:" + host_memory.TUNABLE)
  assert probe("--use", WNSCALE_HUGE_PAGES="0")[1:3] == ("None", 0)


def test_a_launcher_gives_its_processes_huge_pages():
  """`python -m launch.local_cluster` re-runs itself with the tunable; what it starts
  inherits it."""
  result = subprocess.run(
      [sys.executable, "-m", "launch.local_cluster", "--num_processes=1",
       "--num_cpu_devices=1", "--module=huge_pages_probe", "--timeout=60"],
      cwd=REPO, env=plain_env(PYTHONPATH=os.path.dirname(__file__)),
      capture_output=True, text=True, timeout=90)
  assert result.returncode == 0, result.stderr[-2000:]
  _, tunables, huge_kib = result.stdout.split("[p0] ", 1)[1].split()
  assert tunables == host_memory.TUNABLE and int(huge_kib) >= 128 << 10
