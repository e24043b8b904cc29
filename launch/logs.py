"""Log filters the launchers share."""

import logging


def quiet_orbax(record: logging.LogRecord) -> bool:
  """Keeps Orbax's per-save/restore INFO chatter out of the progress log (warnings stay)."""
  return record.levelno >= logging.WARNING or "/orbax/" not in record.pathname


def install():
  """Applies the filters to absl's logger (where Orbax logs)."""
  logging.getLogger("absl").addFilter(quiet_orbax)
