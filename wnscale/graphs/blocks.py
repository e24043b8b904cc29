"""Blocks of rows worked on side by side in threads: the graph build's use of a host's cores.

numpy's array loops, gathers and sorts and scipy's KD-tree queries release the GIL, so
the blocks of a vectorized per-row computation run in parallel in threads, without
copying the inputs to other processes. Each block writes its own rows of an output
allocated beforehand: the result is the same for any block size and any number of
threads, so a graph does not depend on the host that built it.
"""

from __future__ import annotations

import concurrent.futures
import os
from typing import Callable


def cores() -> int:
  """The CPU cores this process may run on (its affinity, not the host's count)."""
  if hasattr(os, "sched_getaffinity"):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def for_blocks(num_rows: int, block: int, work: Callable[[slice], None]):
  """Calls `work(rows)` once for each `slice` of at most `block` of `num_rows` rows, in
  `cores()` threads; an error in any block is raised here."""
  slices = [slice(start, min(start + block, num_rows)) for start in range(0, num_rows, block)]
  if len(slices) <= 1 or cores() == 1:
    for rows in slices:
      work(rows)
    return
  with concurrent.futures.ThreadPoolExecutor(min(cores(), len(slices))) as pool:
    for _ in pool.map(work, slices):  # waits for each block, raising its error
      pass
