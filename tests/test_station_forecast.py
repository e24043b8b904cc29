"""Forecasts with stations and their scores at the stations (configs/tiny_stations.py).

The shared run of the tiny model with stations (conftest.py's `trained_station_run`) and
one uninterrupted single-device forecast of it serve every test: the forecast store's
station group, `launch.evaluate --observations` against an independent computation, and
a kill -9 continued by the same command on 2 processes (the graph over 4 devices). (The sharded forecast step's station feedback against the
single-device model: test_modalities.py.)
"""

import json
import os
import shutil

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

from test_cli import assert_user_error, run as run_launcher
from test_forecast_end_to_end import cluster_command, completed, kill_9_after, run, run_command
from wnscale.data.making import stations as stations_lib
from wnscale.evaluation import stations as station_eval
from wnscale.graphs.points import PointSet

pytestmark = pytest.mark.slow  # a training run and its forecast, shared

T2M, MSL = "2m_temperature", "mean_sea_level_pressure"
# On one device (the run trained on 2 graph shards).
INITS = ("--init_start=2020-01-11", "--init_end=2020-01-12T18", "--init_every=6h",
         "--mesh.graph=1")
NUM_INITS, LEAD, NUM_LEADS = 8, "--lead=18h", 3


@pytest.fixture(scope="module")
def station_run(trained_station_run):
  """The shared run of configs/tiny_stations.py (conftest.py: 12 steps, graph over 2
  devices)."""
  return trained_station_run.workdir


@pytest.fixture(scope="module")
def station_forecast(station_run, trained_station_run, tmp_path_factory):
  """`(forecast store, its observation store)`: the uninterrupted single-device forecast,
  with the cache the run was trained with (its statistics are read there, not made)."""
  out = str(tmp_path_factory.mktemp("station_forecast") / "F.zarr")
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("WNSCALE_CACHE_DIR", trained_station_run.cache_dir)
    result = run("forecast", f"--workdir={station_run}", f"--out={out}", *INITS, LEAD)
  assert json.loads(result.stdout.strip().splitlines()[-1])["written"] == NUM_INITS
  assert "Computed the statistics of the observations" not in result.stderr  # training's
  settings = xr.open_zarr(out).attrs["wnscale_forecast"]
  return out, settings["modalities"]["stations"]["observations"]


def test_the_station_group_layout_coordinates_and_units(station_forecast):
  """F.zarr/stations: the targets on (time, prediction_timedelta, station), the stations of
  the observation store in station_id order with their coordinates, K and Pa, one chunk
  per initial time and lead time, finite physical values; the grid's variables at the root
  as before, the group recorded in the settings."""
  out, observations = station_forecast
  group = xr.open_zarr(out, group="stations", chunks=None)
  assert set(group.data_vars) == {T2M, MSL}
  assert group[T2M].dims == ("time", "prediction_timedelta", "station")
  assert dict(group.sizes) == {"time": NUM_INITS, "prediction_timedelta": NUM_LEADS,
                               "station": 500}
  assert group[T2M].encoding["chunks"] == (1, 1, 500)
  assert (group[T2M].attrs["units"], group[MSL].attrs["units"]) == ("K", "Pa")
  root = xr.open_zarr(out, chunks=None)
  np.testing.assert_array_equal(group.time.values, root.time.values)
  np.testing.assert_array_equal(group.prediction_timedelta.values,
                                pd.timedelta_range("6h", periods=NUM_LEADS, freq="6h").values)
  obs = xr.open_zarr(observations, chunks=None)
  order = np.argsort(obs.station_id.values.astype(str))
  np.testing.assert_array_equal(group.station_id.values, obs.station_id.values[order])
  for name in ("latitude", "longitude"):
    np.testing.assert_allclose(group[name].values, obs[name].values[order])
  assert 150 < float(group[T2M].min()) and float(group[T2M].max()) < 400  # K, 2 steps in
  assert 8e4 < float(group[MSL].min()) and float(group[MSL].max()) < 1.2e5
  assert "station" not in root.dims and T2M in root.data_vars
  assert root.attrs["wnscale_forecast"]["modalities"]["stations"]["variables"] == [T2M, MSL]


def _independent_scores(out: str, observations: str) -> dict:
  """`{forecast: {variable: {metric: [per lead]}}}` of the station group and the grid
  interpolated to its stations, from xarray and numpy, on the values observed where both
  forecasts are present."""
  group = xr.open_zarr(out, group="stations", chunks=None).load()
  grid = xr.open_zarr(out, chunks=None).load().sortby("latitude")
  obs = xr.open_zarr(observations, chunks=None).load()
  obs = obs.assign_coords(station=obs.station_id.values.astype(str)).sel(
      station=group.station_id.values.astype(str))
  source = PointSet.regular(grid.latitude.values, grid.longitude.values)
  points = PointSet.from_points(group.latitude.values, group.longitude.values,
                                np.ones(group.sizes["station"]))
  valid = group.time.values[:, None] + group.prediction_timedelta.values  # [I, L]
  scores = {"stations": {}, "grid_interpolated": {}}
  for name in (T2M, MSL):
    at = np.searchsorted(obs.time.values, valid)  # the store holds every valid time
    assert (obs.time.values[at] == valid).all()
    truth = obs[name].transpose("time", "station").values[at].astype(np.float64)
    station = group[name].values.astype(np.float64)
    flat = grid[name].transpose("time", "prediction_timedelta", "latitude", "longitude").values
    interpolated = stations_lib.interpolate(flat.reshape(flat.shape[:2] + (-1,)), source,
                                            points)
    present = np.isfinite(truth) & np.isfinite(interpolated) & np.isfinite(station)
    assert 0.8 < present.mean() < 0.95  # 10% missing
    for key, forecast in (("stations", station), ("grid_interpolated", interpolated)):
      error = np.where(present, forecast - truth, np.nan)
      scores[key][name] = {"rmse": np.sqrt(np.nanmean(error ** 2, axis=(0, 2))),
                           "bias": np.nanmean(error, axis=(0, 2)),
                           "mae": np.nanmean(np.abs(error), axis=(0, 2)),
                           "count": present.sum(axis=(0, 2))}
  return scores


def test_evaluate_at_stations_equals_an_independent_computation(station_forecast, tmp_path):
  """launch.evaluate --observations: RMSE, bias and MAE per lead time of the station forecast
  and of the grid forecast interpolated to the stations, missing observations skipped,
  equal a numpy computation of their own; both in the printed table, the results files and
  the figure. A forecast without a station group scores the baseline alone, saying so;
  --observations beside --truth is refused."""
  out, observations = station_forecast
  evaluation = str(tmp_path / "evaluation")
  printed = run("evaluate", f"--forecast={out}", f"--observations={observations}",
                f"--out={evaluation}").stdout
  for name in ("stations.nc", "grid_interpolated.nc", "metrics.json", "stations_rmse.png"):
    assert os.path.getsize(os.path.join(evaluation, name)) > 0, name
  table = printed.split(f"Scores at 500 stations ({NUM_INITS} initial times; missing "
                        "observations skipped; all lead times in metrics.json):\n")[1]
  header, *rows = table.strip().splitlines()
  assert header.split() == ["variable", "lead", "stations", "RMSE", "grid_interpolated",
                            "RMSE", "stations", "BIAS", "grid_interpolated", "BIAS",
                            "stations", "MAE", "grid_interpolated", "MAE", "count"], header
  assert [row.split()[:3] for row in rows] == [[name, lead, "h"] for name in (T2M, MSL)
                                               for lead in ("+6", "+12", "+18")]
  expected = _independent_scores(out, observations)
  with open(os.path.join(evaluation, "metrics.json")) as f:
    written = json.load(f)["scores"]
  for key, by_variable in expected.items():
    results = xr.open_dataset(os.path.join(evaluation, f"{key}.nc"))
    for name, metrics in by_variable.items():
      for metric, values in metrics.items():
        np.testing.assert_allclose(results[name].sel(metric=metric).values, values, rtol=1e-9)
        np.testing.assert_allclose(written[key][metric][name], values, rtol=1e-9)
  first = rows[0].split()  # the table's first row: 2 m temperature at +6 h
  assert float(first[3]) == pytest.approx(expected["stations"][T2M]["rmse"][0], rel=1e-3)
  assert float(first[4]) == pytest.approx(expected["grid_interpolated"][T2M]["rmse"][0],
                                          rel=1e-3)

  grid_only = str(tmp_path / "grid_only.zarr")
  shutil.copytree(out, grid_only)
  shutil.rmtree(os.path.join(grid_only, "stations"))
  zarr.consolidate_metadata(grid_only, zarr_format=2)  # as a forecast of a grid-only run
  result = station_eval.evaluate_stations(grid_only, observations, str(tmp_path / "baseline"))
  assert "has no station group" in result["note"]
  assert list(result["results"]) == ["grid_interpolated"]
  # At every station of the store, the same as the group's stations (all of them).
  baseline = xr.open_dataset(os.path.join(evaluation, "grid_interpolated.nc"))
  for name in (T2M, MSL):
    np.testing.assert_allclose(result["results"]["grid_interpolated"][name].values,
                               baseline[name].values, rtol=1e-9)
  assert_user_error(run_launcher("evaluate", f"--forecast={out}", f"--truth={out}",
                                 f"--observations={observations}", f"--out={tmp_path / 'x'}"),
                    "--observations=", "takes no --truth")


def test_a_station_forecast_killed_is_completed_by_the_same_command(station_run,
                                                                    station_forecast, tmp_path):
  """kill -9 after 1 finished initial time: the store keeps the finished ones, station group
  included; the same command (here on 2 processes, the graph over 4 devices) writes the
  rest, equal to the uninterrupted single-device forecast."""
  reference, _ = station_forecast
  out = str(tmp_path / "killed.zarr")
  flags = (f"--workdir={station_run}", f"--out={out}", *INITS, LEAD)
  kept = kill_9_after(out, flags, 1)
  assert len(kept) < NUM_INITS, "the forecast finished before it was killed"
  before = xr.open_zarr(out, group="stations", chunks=None)[T2M].isel(time=kept).values
  # On 2 processes x 2 devices, the graph (stations included) over all 4: the last
  # --mesh.graph counts.
  result = run_command(cluster_command(*flags, "--mesh.data=1", "--mesh.graph=4"))
  assert "[p0] " in result.stderr and f"({len(kept)} done before)" in result.stderr
  resumed = xr.open_zarr(out, group="stations", chunks=None).load()
  expected = xr.open_zarr(reference, group="stations", chunks=None).load()
  np.testing.assert_array_equal(resumed[T2M].isel(time=kept).values, before)
  for name in (T2M, MSL):
    np.testing.assert_allclose(resumed[name].values, expected[name].values, rtol=1e-5)
  assert completed(out) == list(range(NUM_INITS))
