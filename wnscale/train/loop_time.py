"""Where the training loop's time goes: waiting on input, on the step, or on the host.

The loop times its parts with a `LoopClock`, and each logged interval reports
`steps_per_sec`, `input_wait_fraction` and `host_fraction` (`metrics.jsonl`, the progress
line). Of an interval's wall time `T` (from the previous logged step to this one; compiles
and evaluations left out, `LoopClock.left_out`):

  input wait: the time the loop was blocked taking the next batch, placed on the
    devices (`next` of `wnscale.data.prefetch.DevicePrefetch`: waiting for the
    background thread's next batch; without prefetch, reading and placing it).
  step: dispatching the step and waiting for its result.
  host: the rest, `T - input wait - step`: Python, metrics and logging, the blocking part
    of checkpoint saves, the preemption check.

  input_wait_fraction = input wait / T;  host_fraction = host / T.

JAX dispatches asynchronously: the step call returns before the devices are done, so the
call's duration says nothing of the devices. The loop therefore waits for each step's
result before it takes the next batch (one step in flight): the devices run the step
exactly while the loop is in the step part, and wait for the loop while it is in the
other two. So `input_wait_fraction` is the share of the time the devices had nothing to
do because the next batch was not ready, `host_fraction` the share they waited for the
host's own work, and `1 - input_wait_fraction - host_fraction` the share they were busy
(the step's dispatch, while they wait for it, counts as busy). Had the loop run
ahead of the devices instead, it would have waited for the next batch while the devices
were still busy with steps queued earlier, and that wait would have read as input
wait. The price is that the devices idle for the loop's own work between two steps,
which the prefetch keeps small and `host_fraction` shows.
"""

from __future__ import annotations

import contextlib
import time


class LoopClock:
  """Times a training loop's parts over each logged interval (module docstring)."""

  def __init__(self):
    self._begin()

  def _begin(self):
    self._start = time.perf_counter()
    self._seconds = {"input": 0.0, "step": 0.0, "left out": 0.0}

  @contextlib.contextmanager
  def _timing(self, part: str):
    start = time.perf_counter()
    try:
      yield
    finally:
      self._seconds[part] += time.perf_counter() - start

  def input_wait(self):
    """A block that takes the next batch on the devices."""
    return self._timing("input")

  def step(self):
    """A block that dispatches the step and waits for its result."""
    return self._timing("step")

  def left_out(self):
    """A block that is no training (a compile, an evaluation): not in the interval's time."""
    return self._timing("left out")

  def interval(self, steps: int) -> dict[str, float]:
    """`steps_per_sec`, `input_wait_fraction` and `host_fraction` of the `steps` steps
    since the previous call (or the clock's start), and starts the next interval."""
    wall = max(time.perf_counter() - self._start - self._seconds["left out"], 1e-9)
    input_wait, step = self._seconds["input"], self._seconds["step"]
    self._begin()
    return {"steps_per_sec": steps / wall,
            "input_wait_fraction": min(input_wait / wall, 1.0),
            "host_fraction": min(max(1.0 - (input_wait + step) / wall, 0.0), 1.0)}
