r"""Writes a day-of-year x hour-of-day climatology of a store (WeatherBench2's method).

  python -m launch.make_climatology --store=STORE.zarr --start=2020-01-01 --end=2020-10-31 \
      --out=/tmp/clim.zarr

A 61-day window by default (--window); all the store's catalogue variables and
levels unless --variables / --levels say otherwise. An existing store at --out
is replaced only with --overwrite (`wnscale.outputs`).

With --runner, the blocks of levels and latitude rows are computed by an Apache
Beam pipeline (the same store), here or on Dataflow, Flink or Spark, Beam's own
options after `--` (`launch.runner`):

  python -m launch.make_climatology --store=gs://B/era5.zarr --out=gs://B/clim.zarr \
      --runner=DataflowRunner -- --project=P --region=R --temp_location=gs://B/tmp \
      --setup_file=./pyproject.toml
"""

from absl import flags

from launch import cli, runner  # before JAX's backend starts: it quiets libtpu

from wnscale import outputs

flags.adopt_module_key_flags(runner)  # --help lists --runner

_STORE = flags.DEFINE_string("store", None, "Store: WeatherBench2's layout (a regular grid, "
                             "or points along `values`) or an anemoi-datasets store.")
_OUT = cli.define_output("out", "Climatology zarr store to write.",
                         outputs.CLIMATOLOGY)
_START = flags.DEFINE_string("start", None, "First day (default: the store's first).")
_END = flags.DEFINE_string("end", None, "Last day, inclusive (default: the store's last).")
_WINDOW = flags.DEFINE_integer("window", 61, "Smoothing window in days (odd).")
_VARIABLES = flags.DEFINE_list("variables", None, "Variables (default: all in the store).")
_LEVELS = flags.DEFINE_list("levels", None, "Pressure levels, hPa (default: all).")
_MEMORY_GIB = flags.DEFINE_float("memory_gib", 2.0, "Bound on the sums held in memory.")


def main(argv):
  # Imported here: a mistake in the flags is reported before this slow import.
  from wnscale.evaluation.climatology import compute_climatology  # noqa: PLC0415
  for_each = runner.for_each(argv, "climatology blocks")
  levels = [int(level) for level in _LEVELS.value] if _LEVELS.value else None
  print(compute_climatology(_STORE.value, _OUT.value, _START.value, _END.value,
                            variables=_VARIABLES.value, levels=levels, window=_WINDOW.value,
                            memory_bytes=int(_MEMORY_GIB.value * 2**30),
                            overwrite=cli.overwrite(), for_each=for_each))


if __name__ == "__main__":
  cli.run(main, required=("store", "out"), unknown_flag_hint=runner.UNKNOWN_FLAG_HINT)
