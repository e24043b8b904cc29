"""Exports a wnscale run as a WeatherNext 2 model: its checkpoint and config, as released.

  python -m launch.export_weathernext2 --workdir=RUN --out=DIR [--step=N] [--params=ema|raw]

`RUN` is a run directory (`launch.train`'s, e.g. a fine-tuned import, or
`launch.import_weathernext2`'s) of a model WeatherNext 2's code can run: an FGN with the
mesh-transformer processor and WeatherNext 2's inputs; any other is refused, naming the
setting. `DIR` gets `params.npz` (WeatherNext 2's `checkpoint.load(f, fgn.CheckPoint)`
reads it) and `config.json` (its `fiddle_config_io.get_fiddle_config(text)` builds it).
An existing DIR is replaced only with --overwrite (`wnscale.outputs`).
"""

from absl import flags

from launch import cli  # before JAX's backend starts: it quiets libtpu
from wnscale.interop import weathernext2_export

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory to export.")
_OUT = cli.define_output("out", "Directory to write params.npz and config.json into.",
                         weathernext2_export.KIND)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step to export (default: the newest).")
_PARAMS = cli.define_params()


def main(argv):
  del argv
  weathernext2_export.export_weathernext2(_WORKDIR.value, _OUT.value, step=_STEP.value,
                                          params=_PARAMS.value, overwrite=cli.overwrite())


if __name__ == "__main__":
  cli.run(main, required=("workdir", "out"), writes_workdir=False)
