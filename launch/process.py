"""What every JAX launcher sets up in its process before the library runs: the platform,
fake CPU devices, the persistent compilation cache, and the processes' cluster
(`jax.distributed`).

  python -m launch.X ... --coordinator_address=host:port --num_processes=2 --process_id=0
  # on Cloud TPU no flags are needed: JAX finds its peers from the environment

The flags are defined here, once, for every launcher that imports this module.
"""

import contextlib
import os
import signal
import threading
import time

from absl import flags, logging

from launch import cli

# JAX is imported in the functions that start it, not with this module: a launcher's
# flags are checked first, and a mistake in them is reported without that slow import.

PLATFORM = flags.DEFINE_string("platform", None, "Force a JAX platform, e.g. cpu.")
NUM_CPU_DEVICES = flags.DEFINE_integer(
    "num_cpu_devices", None, "Fake CPU devices per process, on a CPU run (no accelerator, or "
    "--platform=cpu), e.g. to try mesh.graph > 1.")
COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0.")
NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the run.")
PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
# Seconds without a heartbeat after which JAX's coordination service takes a process for
# dead and ends the others (JAX's default: 100). A process that died between two
# collectives, with nothing else to stop its peers (its launcher killed too, or a slice's
# host gone), held them that long in their next wait for it. The heartbeats come from
# threads of their own, not from Python: a process busy compiling or loaded down still
# sends them.
HEARTBEAT_TIMEOUT_S = 20

COMPILATION_CACHE = flags.DEFINE_bool(
    "compilation_cache", True,
    "Keep compiled programs in JAX's persistent compilation cache, in the cache directory "
    "($WNSCALE_CACHE_DIR/jax, default ~/.cache/wnscale/jax), and load them from there: a run "
    "started again does not compile again. --nocompilation_cache compiles everything.")


def set_up(platform: str | None, num_cpu_devices: int | None):
  """Forces a JAX platform and a count of fake CPU devices.

  Importing JAX starts no backend; the first device query does. So this only
  has to come before that.
  """
  import jax  # noqa: PLC0415
  if platform:
    # The host's CPU beside an accelerator, as JAX starts by default: the parameters are
    # initialized there (`setup.init_model`).
    with_cpu = platform if "cpu" in platform.split(",") else f"{platform},cpu"
    jax.config.update("jax_platforms", with_cpu)
  if num_cpu_devices:
    jax.config.update("jax_num_cpu_devices", num_cpu_devices)


def on_cloud_tpu() -> bool:
  """A Cloud TPU VM of a multi-host slice, unless this run is forced onto another platform."""
  platform = PLATFORM.value or os.environ.get("JAX_PLATFORMS", "")
  return platform in ("", "tpu") and "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")


# Seconds a process whose launcher is gone has to stop on its own before it ends itself:
# a Ctrl-C in the loop saves the step reached in about a second (the tiny run).
ORPHAN_GRACE_S = 5.0


def watch_launcher():
  """In a process of `launch.local_cluster`: once that launcher is gone (killed outright),
  gives the process `ORPHAN_GRACE_S` to stop on its own (on Linux the kernel sends it a
  SIGINT, as a Ctrl-C: a step being trained is saved), then ends it (exit 130), whatever
  it was doing: a compile or a collective holds off the signal's handler, and no one is
  left to read its output or stop it. Nothing outside such a process."""
  launcher = os.environ.get(cli.LAUNCHER_PID)
  if launcher is None:
    return

  def watch():
    while os.getppid() == int(launcher):  # a process whose parent died is given another
      time.sleep(0.5)
    time.sleep(ORPHAN_GRACE_S)
    with contextlib.suppress(OSError):  # its output likely has no reader left
      os.write(2, b"Interrupted: launch.local_cluster is gone; stopped.\n")
    os._exit(128 + signal.SIGINT)  # noqa: SLF001 (at once: nothing is left to wait for)

  threading.Thread(target=watch, name="launcher watch", daemon=True).start()


def is_first_before_start() -> bool:
  """Whether this process is known to be process 0 (or the only one) before JAX starts.
  On a multi-host Cloud TPU the index is known only after `start`."""
  return PROCESS_ID.value in (None, 0) and not on_cloud_tpu()


def start():
  """`watch_launcher`, `set_up` from the flags and the persistent compilation cache (unless
  --nocompilation_cache), then joins the processes' cluster: with gloo CPU
  collectives when the flags name it, from the environment on a Cloud TPU slice,
  none for a single process."""
  import jax  # noqa: PLC0415
  from wnscale import compilation_cache  # noqa: PLC0415
  watch_launcher()
  set_up(PLATFORM.value, NUM_CPU_DEVICES.value)
  if COMPILATION_CACHE.value:
    compilation_cache.enable()
  if COORDINATOR.value or NUM_PROCESSES.value:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(COORDINATOR.value, NUM_PROCESSES.value, PROCESS_ID.value,
                               initialization_timeout=120,
                               heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
  elif on_cloud_tpu():  # peers found from the environment
    jax.distributed.initialize(heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
  logging.info("JAX process %d of %d, %d local / %d global %s devices.", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count(),
               jax.devices()[0].platform)


def stop():
  """Leaves the processes' cluster (nothing for a single process)."""
  import jax  # noqa: PLC0415
  if jax.process_count() > 1:
    jax.distributed.shutdown()
