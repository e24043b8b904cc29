"""Imports a WeatherNext 2 checkpoint (its `.npz` and fiddle JSON config) as a wnscale run.

  python -m launch.import_weathernext2 --checkpoint=PARAMS.npz --config=WeatherNext2.json \
      --out=WORKDIR [--stats_dir=STATS]
  python -m launch.import_weathernext2 --checkpoint=PARAMS.npz --config=WeatherNext2 ...

The config is one of WeatherNext 2's released fiddle configs (`WeatherNext2.json`,
`WeatherNextCyclones.json`, `WeatherNextCyclones_Mini.json`), or one derived
from them, or a released model's name, looked up in an installed `weathernext`
package as WeatherNext 2's own code does. Its normalization statistics are used
unless `--stats_dir` gives GraphCast's three files. `WORKDIR` gets `config.json`, `stats/` and the
parameters (`checkpoints/0`); then `python -m launch.predict_example
--workdir=WORKDIR --members=2 --noise=SEED ...`, or fine-tune with CRPS:
`python -m launch.train --config=configs/imported.py:WORKDIR
--config.train.init_from=WORKDIR --config.data.path=STORE --workdir=NEW_RUN`.
A run already at WORKDIR is replaced only with --overwrite.
"""

from absl import flags

from launch import cli  # before JAX's backend starts: it quiets libtpu
from wnscale.train import run_directory

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "WeatherNext 2 parameters (.npz).")
_CONFIG = flags.DEFINE_string("config", None, "WeatherNext 2 model config (fiddle JSON), or "
                              "a released model's name with weathernext installed.")
_STATS_DIR = flags.DEFINE_string("stats_dir", None, "Directory of GraphCast-format "
                                 "statistics to use instead of the config's.")
_OUT = cli.define_output("out", "Run directory to create.", run_directory.KIND)


def main(argv):
  del argv
  # Imported here: a mistake in the flags is reported before this slow import.
  from wnscale.interop.weathernext2_import import import_weathernext2  # noqa: PLC0415
  import_weathernext2(_CHECKPOINT.value, _CONFIG.value, _OUT.value, stats_dir=_STATS_DIR.value,
                      overwrite=cli.overwrite())


if __name__ == "__main__":
  cli.run(main, required=("checkpoint", "config", "out"), writes_workdir=False)
