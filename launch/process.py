"""What every JAX launcher sets up in its process before the library runs."""

import logging
import sys
import threading

import jax

from wnscale.errors import is_no_space


def quiet_orbax(record: logging.LogRecord) -> bool:
  """Keeps Orbax's per-save/restore INFO chatter out of the progress log (warnings stay).

  Also its logs (and asyncio's, of Orbax's event loops) of a write that found the
  disk full, tracebacks and all: Orbax raises that error again where the run waits
  for the save, and the run reports it in one line (`wnscale.errors.NoSpaceError`).
  """
  if "/orbax/" not in record.pathname and record.name != "asyncio":
    return True
  if record.exc_info and is_no_space(record.exc_info[1]):
    return False
  if "No space left on device" in record.getMessage():
    return False
  return record.levelno >= logging.WARNING or record.name == "asyncio"


def _quiet_closed_event_loops(previous):
  """An unraisable-exception hook that leaves out `RuntimeError('Event loop is closed')`.

  When one write of an Orbax save fails, Orbax closes that save's event loop while
  tensorstore still completes its other writes; each completion then finds the loop
  closed and prints this traceback (dozens for one full disk). The failure itself
  is raised where the run waits for the save.
  """
  def hook(unraisable):
    if not (isinstance(unraisable.exc_value, RuntimeError)
            and str(unraisable.exc_value) == "Event loop is closed"):
      previous(unraisable)
  return hook


def _quiet_full_disk_in_threads(previous):
  """A `threading.excepthook` that leaves out a full disk's traceback in a writer thread
  (e.g. TensorBoard's): the run finds the full disk too and reports it in one line."""
  def hook(args):
    if not is_no_space(args.exc_value):
      previous(args)
  return hook


def set_up(platform: str | None, num_cpu_devices: int | None):
  """Quiets Orbax's INFO logs and a full disk's background tracebacks (`quiet_orbax`,
  and the hooks above); forces a JAX platform and a count of fake CPU devices.

  Importing JAX starts no backend; the first device query does. So this only
  has to come before that.
  """
  for logger in ("absl", "asyncio"):
    logging.getLogger(logger).addFilter(quiet_orbax)
  sys.unraisablehook = _quiet_closed_event_loops(sys.unraisablehook)
  threading.excepthook = _quiet_full_disk_in_threads(threading.excepthook)
  if platform:
    jax.config.update("jax_platforms", platform)
  if num_cpu_devices:
    jax.config.update("jax_num_cpu_devices", num_cpu_devices)
