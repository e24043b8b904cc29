"""Huge pages for the host's large buffers (XLA:CPU's temporaries, the data blocks).

glibc's malloc serves every allocation over 32 MiB with a fresh `mmap` and unmaps
it when it is freed. XLA:CPU allocates a step's temporaries (gigabytes at 1 deg)
that way on every step, so the kernel faults them in again, 4 KiB page by 4 KiB
page, on every step (what that costs: docs/benchmarks.md, "Host memory in huge
pages").

With glibc's tunable `glibc.malloc.hugetlb=1` (glibc 2.35 and later) malloc asks
for transparent huge pages (2 MiB, `madvise`) on its maps: 512 times fewer faults.
It matters where the kernel gives huge pages on request only
(`/sys/kernel/mm/transparent_hugepage/enabled` is `madvise`, the default of Debian
and Ubuntu, so of Cloud TPU VMs); with `always` they are given anyway, with `never`
not at all.

glibc reads its tunables once, when a process starts. `use_huge_pages()` re-runs
the process (`os.execv`: the same pid, arguments and open files) with the tunable
added to `GLIBC_TUNABLES`, once, before anything heavy is imported; the processes it
starts inherit it. `WNSCALE_HUGE_PAGES=0` leaves the process as it is.
"""

from __future__ import annotations

import os
import platform
import sys

TUNABLE = "glibc.malloc.hugetlb=1"
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
OPT_OUT = "WNSCALE_HUGE_PAGES"


def _thp_on_request() -> bool:
  """Whether the kernel gives transparent huge pages to maps that ask (`[madvise]`)."""
  try:
    with open(THP_SETTING) as f:
      return "[madvise]" in f.read()
  except OSError:
    return False


def in_use() -> bool:
  """Whether this process started with the tunable (its large mallocs get huge pages)."""
  return TUNABLE in os.environ.get("GLIBC_TUNABLES", "")


def wanted() -> bool:
  """Whether this process should be re-run with the tunable: a glibc Linux whose kernel
  gives huge pages on request, the tunable not yet set, and no opt-out."""
  if os.environ.get(OPT_OUT, "1") == "0" or "glibc.malloc.hugetlb" in os.environ.get(
      "GLIBC_TUNABLES", ""):
    return False
  return sys.platform == "linux" and platform.libc_ver()[0] == "glibc" and _thp_on_request()


def set_for_new_processes() -> bool:
  """Adds the tunable to this process's `GLIBC_TUNABLES` when `wanted()`, for the
  processes it starts from now on (not for itself); returns whether it did."""
  if not wanted():
    return False
  tunables = os.environ.get("GLIBC_TUNABLES")
  os.environ["GLIBC_TUNABLES"] = f"{tunables}:{TUNABLE}" if tunables else TUNABLE
  return True


def use_huge_pages():
  """Re-runs this process with `glibc.malloc.hugetlb=1` when `wanted()`; else returns."""
  if not set_for_new_processes():
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
