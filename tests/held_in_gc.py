"""`launch.train` whose main thread, once asked, is held in a garbage-collection callback
until a signal comes: where the soak's Ctrl-C during set-up was dropped.

  python -m launch.local_cluster --module=held_in_gc -- --config=... --workdir=...

A signal's handler runs at the first check of the main thread's Python code after the
signal; JAX's `_xla_gc_callback` runs at every collection, so a Ctrl-C that lands during
a collection is handled inside that callback, where Python prints its exception and
drops it (`launch.cli._raise_swallowed_interrupt`). Here a callback of the same kind
takes that moment and keeps it: once the file that `HOLD_IN_GC` names exists, the next
collection in the main thread prints `held in a garbage collection` and waits there (at
most `HOLD_S`) for a signal; once only. The rest is launch.train, unchanged.
"""

import gc
import os
import runpy
import sys
import threading
import time

HOLD_S = 60.0
_held = []


def hold(phase, info):
  del info
  if (_held or phase != "start" or threading.current_thread() is not threading.main_thread()
      or not os.path.exists(os.environ["HOLD_IN_GC"])):
    return
  _held.append(True)
  print("held in a garbage collection", file=sys.stderr, flush=True)
  deadline = time.monotonic() + HOLD_S
  while time.monotonic() < deadline:
    time.sleep(0.01)  # a signal's handler runs here, inside the callback


gc.callbacks.append(hold)
runpy.run_module("launch.train", run_name="__main__", alter_sys=True)
