"""Progress of a long piece of work: a one-line bar on a terminal, log lines otherwise.

On a terminal the bar is redrawn in place (at most every `REDRAW_SECONDS`); off
one (a log file, a CI job) the work logs lines of its own choosing, so a long
job is never silent and never floods the log. Three kinds of work report it:
a store being written (`WriteProgress`: times, bytes, the time left), a
forecast (`ForecastProgress`: initial times, lead times, model steps per second),
and work in countable pieces (`TaskProgress`: an evaluation's initial times, a
climatology's blocks: pieces done, time so far, the time left). A single long
piece (a compile) is said before it starts, with how long such a piece takes, while it
lasts, with how long it has taken so far, and after it ends, with how long it took
(`long_step`).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import sys
import threading
import time

from wnscale.errors import raise_if_interrupted

BAR_WIDTH = 24
REDRAW_SECONDS = 0.1
LOG_FRACTIONS = 10  # log lines per store write, off a terminal
LOG_SECONDS = 10.0  # and one at least this often while work is done
STILL_SECONDS = 60.0  # a line this often while one long piece (a compile) lasts, off a terminal


def size_text(num_bytes: float) -> str:
  """`753.2 MB`, `1.24 GB`: decimal units, as disks and buckets are sold."""
  if num_bytes >= 1e9:
    return f"{num_bytes / 1e9:.2f} GB"
  return f"{num_bytes / 1e6:.1f} MB"


class _Bar:
  """What both kinds share: the stream, the clock, the bar and the time left."""

  def __init__(self, stream=None):
    self.stream = sys.stderr if stream is None else stream
    self.on_terminal = bool(getattr(self.stream, "isatty", lambda: False)())
    self.start = time.perf_counter()
    self._drawn = 0.0

  @property
  def seconds(self) -> float:
    return max(time.perf_counter() - self.start, 1e-9)

  def eta(self, done: float, total: float) -> str:
    """The time left at the rate since the start, `?` before anything is done."""
    rate = done / self.seconds
    return str(datetime.timedelta(seconds=round((total - done) / rate))) if rate > 0 else "?"

  def draw(self, done: float, total: float, text: str, now: bool = False):
    """Redraws the bar (on a terminal; not more often than `REDRAW_SECONDS` unless `now`)."""
    if not self.on_terminal or (not now and time.perf_counter() - self._drawn < REDRAW_SECONDS):
      return
    filled = round(BAR_WIDTH * done / max(total, 1))
    self.stream.write(f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {text}  ")
    self.stream.flush()
    self._drawn = time.perf_counter()

  def close(self):
    if self.on_terminal:
      self.stream.write("\n")
      self.stream.flush()


class WriteProgress(_Bar):
  """Reports the writing of `num_times` time steps of `bytes_per_time` bytes each to `path`."""

  def __init__(self, path: str, num_times: int, bytes_per_time: int, stream=None):
    super().__init__(stream)
    self.path, self.num_times, self.bytes_per_time = path, num_times, bytes_per_time
    self.times_done = 0
    self._logged = 0  # tenths of the work logged so far
    self._logged_at = time.perf_counter()
    logging.info("Writing %s: %d times, %s uncompressed.", path, num_times,
                 size_text(num_times * bytes_per_time))

  def _line(self) -> str:
    written = self.times_done * self.bytes_per_time
    return (f"times {self.times_done}/{self.num_times} | {size_text(written)} of "
            f"{size_text(self.num_times * self.bytes_per_time)} | "
            f"{size_text(written / self.seconds)}/s | "
            f"ETA {self.eta(self.times_done, self.num_times)}")

  def done(self, times_done: int):
    """`times_done` time steps (counted from the first) are written."""
    raise_if_interrupted()  # a SIGTERM stops the write here (`errors.Interrupted`)
    self.times_done = times_done
    if self.on_terminal:
      self.draw(times_done, self.num_times, self._line(), now=times_done == self.num_times)
      return
    tenths = LOG_FRACTIONS * times_done // max(self.num_times, 1)
    now = time.perf_counter()
    if tenths > self._logged or (now - self._logged_at >= LOG_SECONDS
                                 and times_done < self.num_times):
      self._logged, self._logged_at = tenths, now
      logging.info("%s: %s", self.path, self._line())


class ForecastProgress(_Bar):
  """Reports `num_inits` initial times of `num_leads` lead times each, in model steps (one
  lead time of one initial time)."""

  def __init__(self, num_inits: int, num_leads: int, stream=None):
    super().__init__(stream)
    self.num_inits, self.num_leads = num_inits, num_leads
    self.inits_done = self.steps_done = self.lead = 0

  @property
  def steps_per_sec(self) -> float:
    return self.steps_done / self.seconds

  def _line(self) -> str:
    return (f"initial times {self.inits_done}/{self.num_inits} | lead {self.lead}/"
            f"{self.num_leads} | {self.steps_per_sec:.2f} steps/s | "
            f"ETA {self.eta(self.steps_done, self.num_inits * self.num_leads)}")

  def leads_done(self, lead: int, steps: int):
    """Lead time `lead` (0-based) is done for `steps` initial times."""
    self.lead, self.steps_done = lead + 1, self.steps_done + steps
    self.draw(self.steps_done, self.num_inits * self.num_leads, self._line())

  def init_done(self, label: str):
    self.inits_done += 1
    if self.on_terminal:
      self.draw(self.steps_done, self.num_inits * self.num_leads, self._line(), now=True)
    else:
      logging.info("initial time %s done (%d/%d) | %.2f model steps/s | ETA %s", label,
                   self.inits_done, self.num_inits, self.steps_per_sec,
                   self.eta(self.steps_done, self.num_inits * self.num_leads))


class TaskProgress(_Bar):
  """Reports `total` pieces of one piece of work, e.g. `TaskProgress("Scoring F.zarr",
  10, "initial times")`: a bar on a terminal, else a log line per piece done (at most
  `LOG_FRACTIONS` of them, and one at least every `LOG_SECONDS`)."""

  def __init__(self, what: str, total: int, unit: str, stream=None):
    super().__init__(stream)
    self.what, self.total, self.unit = what, total, unit
    self.count = 0
    self._logged_tenths, self._logged_at = 0, time.perf_counter()

  def _line(self, label: str = "") -> str:
    elapsed = datetime.timedelta(seconds=round(self.seconds))
    return (f"{self.unit} {self.count}/{self.total}" + (f" ({label})" if label else "") +
            f" | {elapsed} | ETA {self.eta(self.count, self.total)}")

  def done(self, count: int | None = None, label: str = ""):
    """One more piece done (or `count` in all); `label` names it, e.g. its initial time."""
    raise_if_interrupted()  # a SIGTERM stops the work here (`errors.Interrupted`)
    self.count = self.count + 1 if count is None else count
    if self.on_terminal:
      self.draw(self.count, self.total, self._line(label), now=self.count == self.total)
      return
    tenths = LOG_FRACTIONS * self.count // max(self.total, 1)
    now = time.perf_counter()
    if tenths > self._logged_tenths or now - self._logged_at >= LOG_SECONDS:
      self._logged_tenths, self._logged_at = tenths, now
      logging.info("%s: %s", self.what, self._line(label))


@contextlib.contextmanager
def long_step(what: str, expected: str = "", stream=None, every: float = STILL_SECONDS):
  """Says `what` is starting (and `expected`, e.g. "takes minutes at 0.25 deg") before a
  long piece of work with no steps of its own to count, how long it has taken so far
  while it lasts (`still_working`), and how long it took after."""
  logging.info("%s%s...", what, f" ({expected})" if expected else "")
  with still_working(what, stream, every) as clock:
    yield
  logging.info("%s: done in %s.", what, datetime.timedelta(seconds=round(clock.seconds)))


@contextlib.contextmanager
def still_working(what: str, stream=None, every: float = STILL_SECONDS):
  """While the block lasts, how long `what` has taken so far: redrawn in place on a
  terminal, else a line every `every` seconds (a compile that takes ten minutes is never
  silent for more than one). Yields the block's clock (`.seconds`)."""
  clock = _Bar(stream)
  stop, drawn = threading.Event(), threading.Event()

  def tick():  # the work runs in C++ (a compile) that releases the GIL: a thread can speak
    while not stop.wait(1.0 if clock.on_terminal else every):
      so_far = datetime.timedelta(seconds=round(clock.seconds))
      if clock.on_terminal:
        clock.stream.write(f"\r{what}: {so_far} so far  ")
        clock.stream.flush()
        drawn.set()
      else:
        logging.info("%s: %s so far...", what, so_far)

  ticking = threading.Thread(target=tick, name="still_working", daemon=True)
  ticking.start()
  try:
    yield clock
  finally:
    stop.set()
    ticking.join(timeout=5)
    if drawn.is_set():
      clock.close()  # end the line redrawn in place
