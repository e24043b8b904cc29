"""Imports a GraphCast checkpoint (GraphCast's published `.npz` format) as a wnscale run.

  python -m launch.import_graphcast --checkpoint=PARAMS.npz --stats_dir=STATS --out=WORKDIR

`STATS` holds GraphCast's `mean_by_level.nc`, `stddev_by_level.nc`,
`diffs_stddev_by_level.nc`. `WORKDIR` gets `config.json`, `stats/` and the
parameters (`checkpoints/0`); then `python -m launch.predict_example
--workdir=WORKDIR ...`, or fine-tune with `python -m launch.train
--config=configs/imported.py:WORKDIR --config.train.init_from=WORKDIR
--config.data.path=STORE --workdir=NEW_RUN`. A run already at WORKDIR is
replaced only with --overwrite (`wnscale.outputs`).
"""

from absl import flags

from launch import cli  # before JAX's backend starts: it quiets libtpu
from wnscale.train import run_directory

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "GraphCast checkpoint (.npz).")
_STATS_DIR = flags.DEFINE_string("stats_dir", None, "Directory of GraphCast's statistics.")
_OUT = cli.define_output("out", "Run directory to create.", run_directory.KIND)


def main(argv):
  del argv
  # Imported here: a mistake in the flags is reported before this slow import.
  from wnscale.interop.graphcast_import import import_graphcast  # noqa: PLC0415
  import_graphcast(_CHECKPOINT.value, _STATS_DIR.value, _OUT.value, overwrite=cli.overwrite())


if __name__ == "__main__":
  cli.run(main, required=("checkpoint", "stats_dir", "out"), writes_workdir=False)
