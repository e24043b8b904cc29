"""A store being written: its size up front, then times written, bytes and the time left.

On a terminal a one-line bar is redrawn in place; otherwise (a log file, a CI
job) a log line marks every tenth of the work, so a long write is never silent
and never floods the log.
"""

from __future__ import annotations

import datetime
import logging
import sys
import time

BAR_WIDTH = 24
REDRAW_SECONDS = 0.1
LOG_FRACTIONS = 10  # log lines per write, off a terminal


def size_text(num_bytes: float) -> str:
  """`753.2 MB`, `1.24 GB`: decimal units, as disks and buckets are sold."""
  if num_bytes >= 1e9:
    return f"{num_bytes / 1e9:.2f} GB"
  return f"{num_bytes / 1e6:.1f} MB"


class WriteProgress:
  """Reports the writing of `num_times` time steps of `bytes_per_time` bytes each to `path`."""

  def __init__(self, path: str, num_times: int, bytes_per_time: int, stream=None):
    self.stream = sys.stderr if stream is None else stream
    self.on_terminal = bool(getattr(self.stream, "isatty", lambda: False)())
    self.path, self.num_times, self.bytes_per_time = path, num_times, bytes_per_time
    self.times_done = 0
    self.start = time.perf_counter()
    self._drawn = 0.0
    self._logged = 0  # tenths of the work logged so far
    logging.info("Writing %s: %d times, %s uncompressed.", path, num_times,
                 size_text(num_times * bytes_per_time))

  def _line(self) -> str:
    elapsed = max(time.perf_counter() - self.start, 1e-9)
    rate = self.times_done / elapsed
    left = (self.num_times - self.times_done) / rate if rate > 0 else None
    eta = "?" if left is None else str(datetime.timedelta(seconds=round(left)))
    written = self.times_done * self.bytes_per_time
    return (f"times {self.times_done}/{self.num_times} | {size_text(written)} of "
            f"{size_text(self.num_times * self.bytes_per_time)} | "
            f"{size_text(written / elapsed)}/s | ETA {eta}")

  def done(self, times_done: int):
    """`times_done` time steps (counted from the first) are written."""
    self.times_done = times_done
    if self.on_terminal:
      if time.perf_counter() - self._drawn > REDRAW_SECONDS or times_done == self.num_times:
        filled = round(BAR_WIDTH * times_done / max(self.num_times, 1))
        self.stream.write(f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self._line()}  ")
        self.stream.flush()
        self._drawn = time.perf_counter()
      return
    tenths = LOG_FRACTIONS * times_done // max(self.num_times, 1)
    if tenths > self._logged:
      self._logged = tenths
      logging.info("%s: %s", self.path, self._line())

  def close(self):
    if self.on_terminal:
      self.stream.write("\n")
      self.stream.flush()
