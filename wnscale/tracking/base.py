"""What every tracker does for a run: `Tracker`, the interface of each tracker's module.

A tracker keeps one tracked run per workdir. `open` creates it, or reopens the one whose
ids an earlier start of the same run recorded (`Where.record`), and returns the ids to
record; the other calls log into it. `run.TrackedRun` makes the calls (from a thread of
its own for each tracker: a slow or failing tracker never holds the training loop) and
decides what to log: `logged_through` says which steps of each metric the tracker already
holds, so that steps redone after a crash are not logged twice.
"""

from __future__ import annotations

import abc
import dataclasses

# How a run ended (`Tracker.close`).
FINISHED, STOPPED, FAILED = "finished", "stopped", "failed"
# `Tracker.logged_through`'s key for every metric name.
EVERY = "*"


@dataclasses.dataclass(frozen=True)
class Where:
  """Where a tracker keeps a run, and what identifies it.

  Attributes:
    workdir: the run directory (local or a URL, normalized).
    name: the run's name (the workdir's last part).
    tags: `{name: value}`: model, processor, resolution, commit.
    record: what this tracker's `open` returned at an earlier start of the run (its
      ids), or None (a new run).
  """

  workdir: str
  name: str
  tags: dict
  record: dict | None


def flatten(config: dict) -> dict:
  """`{"train": {"steps": 8}, "seed": 0}` -> `{"train.steps": 8, "seed": 0}`."""
  return {f"{section}.{key}" if isinstance(keys, dict) else section: value
          for section, keys in config.items()
          for key, value in (keys.items() if isinstance(keys, dict) else [("", keys)])}


class Tracker(abc.ABC):
  """One tracker's run (see the module docstring). Calls come from one thread at a time."""

  def __init__(self, where: Where):
    self.where = where

  @abc.abstractmethod
  def open(self) -> dict:
    """Creates or reopens the tracked run; returns its ids (JSON) to record in the workdir.

    Raises:
      UserError: the tracker cannot be reached or used (one line naming it and why).
    """

  @abc.abstractmethod
  def describe(self) -> str:
    """Where to see the run (one phrase, for the run's summary); after `open`."""

  def logged_through(self, resume_step: int) -> dict[str, int]:
    """`{metric name: the last step of it the tracked run holds}`, read from the tracker's
    own store (`EVERY` for every name: a tracker whose steps only go forward);
    `resume_step`: the step the training run resumes from."""
    del resume_step
    return {}

  def begin(self, resume_step: int):
    """The training loop starts after `resume_step` (after `logged_through`); not called
    when files are only added to the run (`run.attach`)."""

  @abc.abstractmethod
  def params(self, config: dict):
    """Logs the resolved config (`{section: {key: value}}`) as the run's parameters."""

  @abc.abstractmethod
  def log(self, step: int, values: dict):
    """Logs `{name: float}` at `step` (names as in metrics.jsonl)."""

  @abc.abstractmethod
  def artifact(self, path: str, folder: str, step: int | None = None):
    """Keeps the local file `path` with the run, under `folder` (e.g. "evaluation/x");
    `step`: the training step it is of, where the tracker shows files by step (None: the
    last step logged)."""

  def flush(self):
    """Writes out what is buffered (before the workdir's files are uploaded)."""

  @abc.abstractmethod
  def close(self, status: str | None):
    """Ends this process's use of the run: `status` FINISHED, STOPPED or FAILED, or None
    to leave the run's status as it is (files added to a run that has ended)."""
