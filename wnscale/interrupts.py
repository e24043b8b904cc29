"""Stopping on Ctrl-C (SIGINT) or SIGTERM without losing work.

A long loop (training, a forecast) runs inside `StopRequest`: the first signal
only records itself (`requested`) and logs what will happen; the loop checks
`requested` where stopping loses nothing (after a step it then saves, after a
lead time) and ends cleanly. After that first signal SIGINT has its default
action again, so a second Ctrl-C ends the process at once (a shell shows exit
status 130) with whatever was saved before it.

  with interrupts.StopRequest("stopping after this lead time") as stop:
    for ...:
      ...
      if stop.requested:
        break
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Callable

import jax
from jax.experimental import multihost_utils

from wnscale import errors


class StopRequest:
  """Catches `signals` for the life of the `with` block; see the module docstring.

  Args:
    what_happens: said in the log line on the first signal, e.g. "checkpointing
      the step reached, then stopping".
    signals: the signals to catch.
    on_signal: called with the signal number on the first one (e.g. to pass it
      on in another form); None: nothing.

  Attributes:
    requested: the name of the first signal caught (e.g. "SIGINT"), or None.
  """

  def __init__(self, what_happens: str, signals=(signal.SIGINT, signal.SIGTERM),
               on_signal: Callable[[int], None] | None = None):
    self.what_happens = what_happens
    self.signals = tuple(signals)
    self.on_signal = on_signal
    self.requested = None
    self._previous = {}

  def __enter__(self) -> StopRequest:
    if threading.current_thread() is threading.main_thread():  # handlers live there only
      self._previous[signal.SIGINT] = signal.getsignal(signal.SIGINT)  # reset by a signal
      for signum in self.signals:
        self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def _handle(self, signum, frame):
    del frame
    if self.requested is not None:  # e.g. a SIGTERM after a Ctrl-C: already stopping
      return
    self.requested = signal.Signals(signum).name
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # the next Ctrl-C ends the process at once
    how = "Ctrl-C" if signum == signal.SIGINT else self.requested
    logging.warning("%s received: %s (Ctrl-C again stops at once, keeping what is saved).",
                    how, self.what_happens)
    if self.on_signal is not None:
      self.on_signal(signum)

  def __exit__(self, *exc_info):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._previous = {}


class AgreedStop:
  """When a loop run by every JAX process stops on a SIGTERM or a Ctrl-C (SIGINT), at the
  same step in all of them.

  One process: its own handler of both (`StopRequest`). Several: JAX's preemption
  service (`jax.distributed`) catches SIGTERM in any process and agrees on one step
  at which every process stops, so none waits for a peer that has left; a SIGINT (a
  terminal sends it to every process of a job, `launch.local_cluster` passes it on
  to each) is passed on to that service as a SIGTERM to the process itself. The
  handlers are set from construction until `restore`; a signal recorded before
  (`errors.note_interrupt`) and never raised is raised at construction (`errors.Interrupted`).

  The service's sync point is a step: one more than the furthest process's last step
  checked (here, and by Orbax at each save). A SIGTERM before any check (while a resumed
  run sets up or compiles) makes it 1, which a run resumed at a later step never meets:
  the first check of a resumed run also asks about step 1. (Every process computes the
  same point, so all stop at the first step, or none; a notice that came while every
  process was between those two checks, microseconds apart, would still be missed.)

  Args:
    what_happens: said in the log line on the first signal (`StopRequest`).
  """

  def __init__(self, what_happens: str):
    # A signal that stopped nothing before (its exception swallowed by C code): it stops
    # the process now, before the loop, as it would have while the process set up.
    errors.raise_if_interrupted()
    self._single = jax.process_count() == 1
    self._checked = False
    self.stop = StopRequest(
        what_happens,
        signals=(signal.SIGINT, signal.SIGTERM) if self._single else (signal.SIGINT,),
        on_signal=None if self._single else lambda _: os.kill(os.getpid(), signal.SIGTERM))
    self.stop.__enter__()

  @property
  def signal_name(self) -> str:
    """The signal this process caught ("SIGTERM" when a peer's stopped it)."""
    return self.stop.requested or "SIGTERM"

  def reached(self, step: int) -> bool:
    """Whether to stop after `step`; every process calls it once after every step."""
    if self._single:
      return self.stop.requested is not None
    early = not self._checked and step > 1 and multihost_utils.reached_preemption_sync_point(1)
    self._checked = True
    return multihost_utils.reached_preemption_sync_point(step) or early

  def restore(self):
    self.stop.__exit__(None, None, None)
