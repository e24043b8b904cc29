"""Trains a wnscale model: parse flags, start the processes' cluster, call the library.

  python -m launch.train --config=configs/tiny.py --workdir=/tmp/wnscale_tiny
  python -m launch.train --config=configs/tiny.py --config.train.steps=50 --workdir=DIR
  # one process of several (on Cloud TPU no flags are needed: JAX finds its peers)
  python -m launch.train --coordinator_address=host:port --num_processes=2 --process_id=0 ...

Any config key can be overridden as --config.section.key=value; wnscale/config.py
lists them all. A mistake in the input ends the run with a one-line error and exit
status 2 (--traceback to see where it was found). Ctrl-C or SIGTERM saves the step
reached and exits 0 (a second Ctrl-C stops at once). The workdir is locked for the
life of the run (by process 0), from before JAX starts: a second run on it stops
with exit status 2 naming the first.
"""

import os

import jax
from absl import flags, logging

from launch import cli  # before JAX's backend starts (in main): it quiets libtpu
from launch import process

_CONFIG = cli.define_config()
_WORKDIR = cli.define_workdir()
_PLATFORM = flags.DEFINE_string("platform", None, "Force a JAX platform, e.g. cpu.")
_NUM_CPU_DEVICES = flags.DEFINE_integer(
    "num_cpu_devices", None, "Fake CPU devices per process, on a CPU run (no accelerator, or "
    "--platform=cpu), e.g. to try mesh.graph > 1.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")


def _on_cloud_tpu() -> bool:
  """A Cloud TPU VM of a multi-host slice, unless this run is forced onto another platform."""
  platform = _PLATFORM.value or os.environ.get("JAX_PLATFORMS", "")
  return platform in ("", "tpu") and "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")


def main(argv):
  del argv
  process.set_up(_PLATFORM.value, _NUM_CPU_DEVICES.value)
  if _COORDINATOR.value or _NUM_PROCESSES.value:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
                               initialization_timeout=120)
  elif _on_cloud_tpu():
    jax.distributed.initialize()  # Cloud TPU: peers are found from the environment
  logging.info("JAX process %d of %d, %d local / %d global %s devices.", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count(),
               jax.devices()[0].platform)
  # Imported here: a mistake in the flags is reported before this slow import.
  from wnscale.errors import UserError
  from wnscale.train.checkpoint import ParamsOnlyError
  from wnscale.train.trainer import train_and_evaluate
  try:
    train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except ParamsOnlyError as error:
    raise UserError(f"Checkpoint {error.checkpoint} holds model parameters only (an imported "
                    "model, not a training run): start a new run from them with "
                    f"--config.train.init_from={error.run} and another --workdir.") from error
  if jax.process_count() > 1:
    jax.distributed.shutdown()


def _locks_early() -> bool:
  """Whether this process takes the workdir's lock before JAX starts: it is process 0 (or
  the only one). On a multi-host Cloud TPU the index is known only later: the trainer
  takes it there, on process 0."""
  return _PROCESS_ID.value in (None, 0) and not _on_cloud_tpu()


if __name__ == "__main__":
  cli.run(main, required=("config", "workdir"), lock_workdir=_locks_early)
