"""Imports a GenCast checkpoint (its `.npz`) as a wnscale run of its denoiser.

  python -m launch.import_gencast --checkpoint=PARAMS.npz --stats_dir=STATS --out=WORKDIR

The checkpoint is one of GenCast's released ones (GenCast 1p0deg Mini, 1p0deg, 0p25deg)
or one in their layout; the model is derived from its own configs. `STATS` holds
GenCast's statistics files: `mean_by_level.nc`, `stddev_by_level.nc`,
`diffs_stddev_by_level.nc` and `min_by_level.nc` (the sea-surface temperature's fill
value over land, as GenCast's `NaNCleaner`). `WORKDIR` gets `config.json`, `stats/` and
the parameters (`checkpoints/0`). A run already at WORKDIR is replaced only with
--overwrite.
"""

from absl import flags

from launch import cli  # before JAX's backend starts: it quiets libtpu
from wnscale.train import run_directory

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "GenCast parameters (.npz).")
_STATS_DIR = flags.DEFINE_string("stats_dir", None, "Directory of GenCast's statistics "
                                 "(GraphCast's three files and min_by_level.nc).")
_OUT = cli.define_output("out", "Run directory to create.", run_directory.KIND)


def main(argv):
  del argv
  # Imported here: a mistake in the flags is reported before this slow import.
  from wnscale.interop.gencast_import import import_gencast  # noqa: PLC0415
  import_gencast(_CHECKPOINT.value, _STATS_DIR.value, _OUT.value, overwrite=cli.overwrite())


if __name__ == "__main__":
  cli.run(main, required=("checkpoint", "stats_dir", "out"), writes_workdir=False)
