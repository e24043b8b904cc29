r"""Scores a forecast against the truth the WeatherBench2 way, with baselines and figures.

  python -m launch.evaluate --forecast=/tmp/tiny_forecast.zarr --truth=STORE.zarr \
      --climatology=/tmp/clim.zarr --out=/tmp/tiny_eval
  # only the initial times of November 1-15 (the truth must cover their valid times)
  python -m launch.evaluate --forecast=F.zarr --truth=STORE.zarr --out=DIR \
      --init_start=2020-11-01 --init_end=2020-11-15
  # against another model's forecast (same layout): adds a scorecard
  python -m launch.evaluate --forecast=F.zarr --truth=STORE.zarr --baseline=OTHER.zarr --out=DIR
  # a cut-out run's region only, against its regional store (or any box: --region=40,60,0,30)
  python -m launch.evaluate --forecast=F.zarr --truth=REGIONAL.zarr --region=cutout --out=DIR

On a point set (forecast and truth with a `values` dim, or an anemoi-datasets truth),
each point weighs its cell's area (the truth's `cell_area`, else its spherical Voronoi
cell's) and the maps are triangulated on longitude and latitude.

Writes DIR/forecast.nc (and persistence.nc, climatology.nc, baseline.nc) in
WeatherBench2's results layout, DIR/metrics.json, and PNG figures (score curves,
a scorecard with a baseline, maps with --maps), then prints the headline scores;
results already in DIR are replaced only with --overwrite (`wnscale.outputs`).
"""

from absl import flags

from launch import cli  # before JAX's backend starts: it quiets libtpu

from wnscale import outputs
from wnscale.evaluation import results as results_lib
from wnscale.evaluation.scoring import HEADLINE_MAPS, evaluate

_FORECAST = flags.DEFINE_string("forecast", None, "Forecast zarr store.")
_TRUTH = flags.DEFINE_string("truth", None, "Truth store: WeatherBench2's layout (a regular "
                             "grid, or points along `values`) or an anemoi-datasets store.")
_OUT = cli.define_output("out", "Output directory (results and figures).", outputs.RESULTS)
_CLIMATOLOGY = flags.DEFINE_string("climatology", None,
                                   "Climatology store (launch.make_climatology): ACC and the "
                                   "climatology baseline.")
_BASELINE = flags.DEFINE_string("baseline", None, "Another forecast to compare with.")
_MAPS = flags.DEFINE_list("maps", [], "Channels to map (forecast, truth and error), e.g. "
                          f"geopotential@500,2m_temperature, or {HEADLINE_MAPS} for two headline "
                          "channels (default: no maps).")
_MAP_LEADS = flags.DEFINE_list("map_leads", None,
                               "Lead times to map, e.g. 1d,5d (default: first and last).")
_INIT_START = flags.DEFINE_string("init_start", None, "First initial time to score (default: "
                                  "the forecast's first), e.g. 2020-11-01T12.")
_INIT_END = flags.DEFINE_string("init_end", None, "Last initial time to score (a date: its "
                                "whole day; default: the forecast's last).")
_REGION = flags.DEFINE_string("region", None, "Score only a region: 'cutout', the regional "
                              "points of a cut-out run's forecast (data.regional_path), or a "
                              "box lat0,lat1,lon0,lon1 in degrees; the truth (and climatology) "
                              "need only hold its points, e.g. the regional store.")


def main(argv):
  del argv
  result = evaluate(_FORECAST.value, _TRUTH.value, _OUT.value,
                    climatology_path=_CLIMATOLOGY.value, baseline_path=_BASELINE.value,
                    map_channels=_MAPS.value, map_leads=_MAP_LEADS.value,
                    init_start=_INIT_START.value, init_end=_INIT_END.value,
                    region=_REGION.value, overwrite=cli.overwrite())
  print("Wrote:")
  for path in result["files"]:
    print(f"  {path}")
  print(f"Headline scores ({result['results']['forecast'].attrs['num_initial_times']} initial "
        "times; all scores in metrics.json):")
  print(results_lib.headline_table(result["results"]))


if __name__ == "__main__":
  cli.run(main, required=("forecast", "truth", "out"))
