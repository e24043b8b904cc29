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

from launch import cli  # before JAX's backend starts (in main): it quiets libtpu
from launch import process

_CONFIG = cli.define_config()
_WORKDIR = cli.define_workdir()


def main(argv):
  del argv
  process.start()
  # Imported here: a mistake in the flags is reported before this slow import.
  from wnscale.errors import UserError
  from wnscale.train.checkpoint import ParamsOnlyError
  from wnscale.train.trainer import train_and_evaluate
  try:
    train_and_evaluate(_CONFIG.value, _WORKDIR.value, name=cli.config_name())
  except ParamsOnlyError as error:
    raise UserError(f"Checkpoint {error.checkpoint} holds model parameters only (an imported "
                    "model, not a training run): start a new run from them with "
                    f"--config.train.init_from={error.run} and another --workdir.") from error
  process.stop()


if __name__ == "__main__":
  cli.run(main, required=("config", "workdir"), lock_workdir=process.is_first_before_start)
