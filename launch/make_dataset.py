r"""Writes a synthetic WeatherBench2-layout zarr store.

  python -m launch.make_dataset --out=/tmp/era_5p625.zarr --resolution=5.625 \
      --start=2020-01-01 --end=2020-12-31 --levels=13

Train on it with --config.data.path=<the --out path> (and a config whose
data.resolution and time ranges the store covers). An existing store at --out
is replaced only with --overwrite (`wnscale.outputs`).
"""

from absl import flags

from launch import cli
from wnscale import outputs
from wnscale.data import synthetic
from wnscale.data import variables

_OUT = cli.define_output("out", "Path of the zarr store to write.", outputs.STORE)
_RESOLUTION = flags.DEFINE_float("resolution", 5.625, "Grid spacing, degrees.")
_START = flags.DEFINE_string("start", "2020-01-01", "First day (00 UTC).")
_END = flags.DEFINE_string("end", "2020-12-31", "Last day (inclusive).")
_LEVELS = flags.DEFINE_enum("levels", "13", ["13", "37"],
                            "WeatherBench2's 13 levels or ERA5's 37.")
_VARIABLES = flags.DEFINE_list("variables", None,
                               "Variables to write; default: all.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the synthetic fields.")
_ZARR_FORMAT = flags.DEFINE_enum("zarr_format", "2", ["2", "3"],
                                 "Zarr format (WB2 publishes v2).")
_TIME_STEP_HOURS = flags.DEFINE_integer("time_step_hours", 6,
                                        "Hours between time steps.")


def main(argv):
  del argv
  levels = (variables.WB2_LEVELS_13 if _LEVELS.value == "13" else
            variables.ERA5_LEVELS_37)
  synthetic.write_synthetic_store(
      _OUT.value,
      resolution=_RESOLUTION.value,
      start=_START.value,
      end=_END.value,
      levels=levels,
      variables=_VARIABLES.value,
      seed=_SEED.value,
      zarr_format=int(_ZARR_FORMAT.value),
      time_step_hours=_TIME_STEP_HOURS.value,
      overwrite=cli.overwrite(),
  )
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  cli.run(main, required=("out",))
