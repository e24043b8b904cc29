r"""Scores a forecast against the truth the WeatherBench2 way, with baselines and figures.

  python -m launch.evaluate --forecast=/tmp/tiny_forecast.zarr --truth=STORE.zarr \
      --climatology=/tmp/clim.zarr --out=/tmp/tiny_eval
  # only the initial times of November 1-15 (the truth must cover their valid times)
  python -m launch.evaluate --forecast=F.zarr --truth=STORE.zarr --out=DIR \
      --init_start=2020-11-01 --init_end=2020-11-15
  # against another model's forecast (same layout): adds a scorecard
  python -m launch.evaluate --forecast=F.zarr --truth=STORE.zarr --baseline=OTHER.zarr --out=DIR

Writes DIR/forecast.nc (and persistence.nc, climatology.nc, baseline.nc) in
WeatherBench2's results layout, DIR/metrics.json, and PNG figures.
"""

from absl import flags

from launch import cli  # before JAX's backend starts: it quiets libtpu

from wnscale.evaluation.scoring import evaluate

_FORECAST = flags.DEFINE_string("forecast", None, "Forecast zarr store.")
_TRUTH = flags.DEFINE_string("truth", None, "Truth zarr store (WeatherBench2 layout).")
_OUT = flags.DEFINE_string("out", None, "Output directory.")
_CLIMATOLOGY = flags.DEFINE_string("climatology", None,
                                   "Climatology store (launch.make_climatology): ACC and the "
                                   "climatology baseline.")
_BASELINE = flags.DEFINE_string("baseline", None, "Another forecast to compare with.")
_MAPS = flags.DEFINE_list("maps", None, "Channels to map, e.g. geopotential@500,2m_temperature "
                          "(default: two headline channels).")
_MAP_LEADS = flags.DEFINE_list("map_leads", None,
                               "Lead times to map, e.g. 1d,5d (default: first and last).")
_INIT_START = flags.DEFINE_string("init_start", None, "First initial time to score (default: "
                                  "the forecast's first), e.g. 2020-11-01T12.")
_INIT_END = flags.DEFINE_string("init_end", None, "Last initial time to score (a date: its "
                                "whole day; default: the forecast's last).")


def main(argv):
  del argv
  result = evaluate(_FORECAST.value, _TRUTH.value, _OUT.value,
                    climatology_path=_CLIMATOLOGY.value, baseline_path=_BASELINE.value,
                    map_channels=_MAPS.value, map_leads=_MAP_LEADS.value,
                    init_start=_INIT_START.value, init_end=_INIT_END.value)
  for path in result["files"]:
    print(path)


if __name__ == "__main__":
  cli.run(main, required=("forecast", "truth", "out"))
