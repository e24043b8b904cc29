"""Trains a wnscale model: parse flags, start the processes' cluster, call the library.

  python -m launch.train --config=configs/tiny.py --workdir=/tmp/wnscale_tiny
  python -m launch.train --config=configs/tiny.py --config.train.steps=50 --workdir=DIR
  # one process of several (on Cloud TPU no flags are needed: JAX finds its peers)
  python -m launch.train --coordinator_address=host:port --num_processes=2 --process_id=0 ...
"""

import os

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from launch import process
from wnscale.train.trainer import train_and_evaluate

_DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.py")
_CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT_CONFIG, "Experiment config file.")
_WORKDIR = flags.DEFINE_string("workdir", os.path.join("/tmp", "wnscale_tiny"),
                               "Run directory: config, metrics, checkpoints.")
_PLATFORM = flags.DEFINE_string("platform", None, "Force a JAX platform, e.g. cpu.")
_NUM_CPU_DEVICES = flags.DEFINE_integer("num_cpu_devices", None,
                                        "With --platform=cpu: fake devices per process.")
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
  logging.info("JAX process %d of %d, %d local / %d global devices.", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())
  train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  if jax.process_count() > 1:
    jax.distributed.shutdown()


if __name__ == "__main__":
  app.run(main)
