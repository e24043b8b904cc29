"""A forecast's progress: a one-line bar on a terminal, plain log lines otherwise.

Counts model steps (one lead time of one initial time), their rate since the
start, and the time left at that rate.
"""

from __future__ import annotations

import datetime
import logging
import sys
import time

BAR_WIDTH = 24
REDRAW_SECONDS = 0.1


class Progress:
  """Reports `num_inits` initial times of `num_leads` lead times each."""

  def __init__(self, num_inits: int, num_leads: int, stream=None):
    self.stream = sys.stderr if stream is None else stream
    self.on_terminal = bool(getattr(self.stream, "isatty", lambda: False)())
    self.num_inits, self.num_leads = num_inits, num_leads
    self.inits_done = self.steps_done = self.lead = 0
    self.start = time.perf_counter()
    self._drawn = 0.0

  @property
  def steps_per_sec(self) -> float:
    return self.steps_done / max(time.perf_counter() - self.start, 1e-9)

  def _eta(self) -> str:
    rate = self.steps_per_sec
    left = self.num_inits * self.num_leads - self.steps_done
    return str(datetime.timedelta(seconds=round(left / rate))) if rate > 0 else "?"

  def leads_done(self, lead: int, steps: int):
    """Lead time `lead` (0-based) is done for `steps` initial times."""
    self.lead, self.steps_done = lead + 1, self.steps_done + steps
    if self.on_terminal and time.perf_counter() - self._drawn > REDRAW_SECONDS:
      self._draw()

  def init_done(self, label: str):
    self.inits_done += 1
    if self.on_terminal:
      self._draw()
    else:
      logging.info("initial time %s done (%d/%d) | %.2f model steps/s | ETA %s", label,
                   self.inits_done, self.num_inits, self.steps_per_sec, self._eta())

  def _draw(self):
    total = max(self.num_inits * self.num_leads, 1)
    filled = round(BAR_WIDTH * self.steps_done / total)
    self.stream.write(f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] initial times "
                      f"{self.inits_done}/{self.num_inits} | lead {self.lead}/{self.num_leads}"
                      f" | {self.steps_per_sec:.2f} steps/s | ETA {self._eta()}  ")
    self.stream.flush()
    self._drawn = time.perf_counter()

  def close(self):
    if self.on_terminal:
      self.stream.write("\n")
      self.stream.flush()
