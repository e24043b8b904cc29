"""What every JAX launcher sets up in its process before the library runs."""

import jax


def set_up(platform: str | None, num_cpu_devices: int | None):
  """Forces a JAX platform and a count of fake CPU devices.

  Importing JAX starts no backend; the first device query does. So this only
  has to come before that.
  """
  if platform:
    jax.config.update("jax_platforms", platform)
  if num_cpu_devices:
    jax.config.update("jax_num_cpu_devices", num_cpu_devices)
