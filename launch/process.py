"""What every JAX launcher sets up in its process before the library runs."""

import logging

import jax


def quiet_orbax(record: logging.LogRecord) -> bool:
  """Keeps Orbax's per-save/restore INFO chatter out of the progress log (warnings stay)."""
  return record.levelno >= logging.WARNING or "/orbax/" not in record.pathname


def set_up(platform: str | None, num_cpu_devices: int | None):
  """Quiets Orbax's INFO logs; forces a JAX platform and a count of fake CPU devices.

  Importing JAX starts no backend; the first device query does. So this only
  has to come before that.
  """
  logging.getLogger("absl").addFilter(quiet_orbax)
  if platform:
    jax.config.update("jax_platforms", platform)
  if num_cpu_devices:
    jax.config.update("jax_num_cpu_devices", num_cpu_devices)
