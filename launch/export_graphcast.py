"""Exports a wnscale run as a GraphCast checkpoint (GraphCast's published `.npz` format).

  python -m launch.export_graphcast --workdir=RUN --out=PARAMS.npz [--step=N] \
      [--stats_dir=STATS] [--params=ema|raw]

`RUN` is a run directory (`launch.train`'s, e.g. a fine-tuned import, or
`launch.import_graphcast`'s) of a model GraphCast's code can run: the
interaction-network processor, deterministic, GraphCast's inputs; any other is
refused, naming the setting. GraphCast's `checkpoint.load(f, graphcast.CheckPoint)`
reads PARAMS.npz; `STATS` gets `mean_by_level.nc`, `stddev_by_level.nc`,
`diffs_stddev_by_level.nc`. Existing outputs are replaced only with --overwrite
(`wnscale.outputs`).
"""

from absl import flags

from launch import cli  # before JAX's backend starts: it quiets libtpu
from wnscale import outputs
from wnscale.interop.graphcast_export import STATS, export_graphcast

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory to export.")
_OUT = cli.define_output("out", "GraphCast checkpoint file (.npz) to write.", outputs.NPZ)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step to export (default: the newest).")
_STATS_DIR = cli.define_output("stats_dir", "Directory to write the run's statistics into, "
                               "as GraphCast's three files.", STATS)
_PARAMS = cli.define_params()


def main(argv):
  del argv
  export_graphcast(_WORKDIR.value, _OUT.value, step=_STEP.value, stats_dir=_STATS_DIR.value,
                   params=_PARAMS.value, overwrite=cli.overwrite())


if __name__ == "__main__":
  cli.run(main, required=("workdir", "out"), writes_workdir=False)
