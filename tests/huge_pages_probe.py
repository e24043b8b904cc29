"""Run as a process by test_host_memory.py: mallocs and touches 256 MiB as XLA:CPU does its
temporaries, then prints this process's pid, its `GLIBC_TUNABLES` and the KiB of
transparent huge pages it holds (`AnonHugePages`)."""

import ctypes
import os
import sys

from wnscale import host_memory

if "--use" in sys.argv:
  host_memory.use_huge_pages()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
size = 256 << 20
ctypes.memset(libc.malloc(size), 1, size)
with open("/proc/self/smaps_rollup") as f:
  huge_kib = next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages"))
print(os.getpid(), os.environ.get("GLIBC_TUNABLES"), huge_kib)
