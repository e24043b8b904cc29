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
  # a station run's forecast (its F.zarr/stations group) against observations, beside the
  # grid forecast interpolated to the stations
  python -m launch.evaluate --forecast=F.zarr --observations=OBS.zarr --out=DIR

On a point set (forecast and truth with a `values` dim, or an anemoi-datasets truth),
each point weighs its cell's area (the truth's `cell_area`, else its spherical Voronoi
cell's) and the maps are triangulated on longitude and latitude.

Writes DIR/forecast.nc (and persistence.nc, climatology.nc, baseline.nc) in
WeatherBench2's results layout, DIR/metrics.json, and PNG figures (score curves,
a scorecard with a baseline, maps with --maps), then prints the headline scores;
results already in DIR are replaced only with --overwrite (`wnscale.outputs`). A forecast
of a training run that has trackers (`train.trackers`) gets the figures and metrics.json
added to its tracked runs, under evaluation/<DIR's name>.
With --observations instead of --truth: DIR/<group>.nc, grid_interpolated.nc,
metrics.json and stations_rmse.png (`wnscale.evaluation.stations`), and a table of
RMSE, bias and MAE per variable and lead time, both forecasts side by side.
"""

import os

from absl import flags

from launch import cli  # before JAX's backend starts: it quiets libtpu

from wnscale import outputs
from wnscale.errors import ArgumentError, UserError
from wnscale.evaluation import results as results_lib
from wnscale.evaluation import stations
from wnscale.evaluation.scoring import HEADLINE_MAPS, evaluate
from wnscale.inference import forecast_store
from wnscale.tracking import run as tracking

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
_OBSERVATIONS = flags.DEFINE_string(
    "observations", None, "Observation store (dims time, station): score the forecast's "
    "station group and the grid forecast interpolated to the stations against it, instead "
    "of the grid against --truth.")
# What only the grid's scoring takes.
_GRID_ONLY = (_TRUTH, _CLIMATOLOGY, _BASELINE, _MAPS, _MAP_LEADS, _REGION)


def main(argv):
  del argv
  if _OBSERVATIONS.value:
    return _score_stations()
  if _TRUTH.value is None:
    raise ArgumentError("truth", None, "is required: the truth store to score the grid "
                        "against (or --observations=OBS_STORE to score at stations).")
  result = evaluate(_FORECAST.value, _TRUTH.value, _OUT.value,
                    climatology_path=_CLIMATOLOGY.value, baseline_path=_BASELINE.value,
                    map_channels=_MAPS.value, map_leads=_MAP_LEADS.value,
                    init_start=_INIT_START.value, init_end=_INIT_END.value,
                    region=_REGION.value, overwrite=cli.overwrite())
  print("Wrote:")
  for path in result["files"]:
    print(f"  {path}")
  _add_to_trackers(result["files"])
  print(f"Headline scores ({result['results']['forecast'].attrs['num_initial_times']} initial "
        "times; all scores in metrics.json):")
  print(results_lib.headline_table(result["results"]))


def _score_stations():
  """`--observations`: the station scores (`stations.evaluate_stations`), printed."""
  given = [flag.name for flag in _GRID_ONLY if flags.FLAGS[flag.name].present]
  if given:
    raise ArgumentError("observations", _OBSERVATIONS.value, f"scores at stations and "
                        f"takes no --{', --'.join(given)} (the grid's scoring: run it "
                        "again with --truth and another --out).")
  result = stations.evaluate_stations(_FORECAST.value, _OBSERVATIONS.value, _OUT.value,
                                      init_start=_INIT_START.value, init_end=_INIT_END.value,
                                      overwrite=cli.overwrite())
  if result["note"]:
    print(result["note"])
  print("Wrote:")
  for path in result["files"]:
    print(f"  {path}")
  _add_to_trackers(result["files"])
  first = next(iter(result["results"].values()))
  print(f"Scores at {first.attrs['num_stations']} stations ({first.attrs['num_initial_times']} "
        "initial times; missing observations skipped; all lead times in metrics.json):")
  print(stations.headline_table(result["results"]))


def _add_to_trackers(files):
  """The figures and metrics.json, added to the tracked runs (`train.trackers`) of the
  training run whose forecast was scored, under `evaluation/<the --out directory's name>`,
  at the forecast's checkpoint step; nothing for another model's forecast."""
  try:
    settings = forecast_store.recorded_settings(_FORECAST.value, "forecast")
  except UserError:  # not a forecast of wnscale's: no run to add to
    return
  if not settings:
    return
  folder = f"evaluation/{os.path.basename(os.path.normpath(_OUT.value))}"
  added = tracking.attach(settings["workdir"], [path for path in files
                                                if path.endswith((".png", ".json"))],
                          folder, settings.get("checkpoint_step"))
  if added:
    print(f"Added the figures and metrics.json to the training run's trackers "
          f"({', '.join(added)}) under {folder}.")


if __name__ == "__main__":
  cli.run(main, required=("forecast", "out"))
