"""Train -> forecast -> climatology -> evaluate on a point set (the training and the
forecast in real processes, the scores by the launchers' functions here): the tiny
model on the octahedral reduced Gaussian grid O32 (5,248 points, a `values` dim). The
forecast store's layout, scores weighed by the store's own cell areas equal to numpy's,
the map figure, and the climatology per point equal to a numpy mean."""

import json
import os

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from test_forecast_end_to_end import run as launch
from wnscale.evaluation.climatology import compute_climatology
from wnscale.evaluation.scoring import evaluate
from tiny_runs import losses, run

pytestmark = pytest.mark.slow

INIT_TIMES = ["2020-01-21T06", "2020-01-22T00"]  # in the eval range of tiny_runs.RUN_FLAGS
NUM_LEADS = 2  # 6 h and 12 h
OUTPUTS = ("temperature", "geopotential", "u_component_of_wind", "v_component_of_wind",
           "specific_humidity", "2m_temperature", "mean_sea_level_pressure")


@pytest.fixture(scope="module")
def octahedral_run(tmp_path_factory):
  """`--config.data.grid=O32`: 6 steps on one device; `(workdir, its store, the run's
  stderr)`."""
  workdir = str(tmp_path_factory.mktemp("o32_run"))
  result = run(workdir, devices=1, graph=1,
               extra=["--config.data.grid=O32", "--config.train.steps=6",
                      "--config.train.eval_every=0", "--config.train.checkpoint_every=6"])
  with open(os.path.join(workdir, "config.json")) as f:
    return workdir, json.load(f)["data"]["path"], result.stderr


@pytest.fixture(scope="module")
def scored(octahedral_run, tmp_path_factory):
  """The run's forecast, the store's climatology of the training days (two channels: its
  smoothing over 366 days costs ~2 s a channel), and the forecast's scores with 2 m
  temperature mapped: `(forecast, climatology, evaluation dir)`."""
  workdir, store, _ = octahedral_run
  root = tmp_path_factory.mktemp("o32_scored")
  forecast, clim, out = (str(root / name) for name in ("forecast.zarr", "clim.zarr", "eval"))
  launch("forecast", f"--workdir={workdir}", f"--out={forecast}",
         f"--init_times={','.join(INIT_TIMES)}", "--lead=12h")
  # The library functions of launch.make_climatology and launch.evaluate (their
  # launchers on a grid: test_forecast_end_to_end.py).
  compute_climatology(store, clim, "2020-01-01", "2020-01-20", levels=[850],
                      variables=["temperature", "2m_temperature"])
  evaluate(forecast, store, out, map_channels=["2m_temperature"])
  return forecast, clim, out


def test_trains_on_an_octahedral_grid(octahedral_run):
  """A synthetic store on the reduced Gaussian grid's 5,248 points (values layout) is
  written and trained on (sharded on points: test_sharding.py)."""
  workdir, _, stderr = octahedral_run
  assert "grid O32 (5,248 points)" in stderr
  loss = [value for _, value in sorted(losses(workdir).items())]
  assert len(loss) == 6 and np.all(np.isfinite(loss))
  assert np.mean(loss[-2:]) < np.mean(loss[:2])


def test_forecast_on_points_and_its_area_weighted_scores(octahedral_run, scored):
  _, store, _ = octahedral_run
  forecast_path, _, out = scored
  forecast = xr.open_zarr(forecast_path, chunks=None).load()
  truth = xr.open_zarr(store, chunks=None)
  # WeatherBench2's forecast layout, `values` for the grid, wnscale's names and units.
  assert sorted(forecast.data_vars) == sorted(OUTPUTS)
  assert forecast["temperature"].dims == ("time", "prediction_timedelta", "level", "values")
  assert forecast["2m_temperature"].dims == ("time", "prediction_timedelta", "values")
  assert forecast["2m_temperature"].attrs["units"] == "K"
  assert forecast.sizes["values"] == 5248
  for name in ("latitude", "longitude"):
    assert forecast[name].dims == ("values",)
    np.testing.assert_allclose(forecast[name].values, truth[name].values)
  np.testing.assert_array_equal(forecast.time.values, pd.DatetimeIndex(INIT_TIMES).values)
  assert forecast.attrs["wnscale_completed_inits"] == [0, 1]
  # The RMSE weighs each point by the store's own cell area.
  valid = forecast.time.values[:, None] + forecast.prediction_timedelta.values[None]
  area = truth["cell_area"].values
  results = xr.open_dataset(os.path.join(out, "forecast.nc"))
  for name, level in (("2m_temperature", None), ("temperature", 850)):
    predicted, observed = forecast[name], truth[name].values[np.searchsorted(
        truth.time.values, valid)]  # [init, lead, (level,) values]
    if level is not None:
      index = list(truth.level.values).index(level)
      predicted, observed = predicted.sel(level=level), observed[:, :, index]
    squared = (predicted.values.astype(np.float64) - observed) ** 2
    rmse = np.sqrt(((squared * area).sum(-1) / area.sum()).mean(0))
    ours = results[name].sel(metric="rmse")
    ours = ours if level is None else ours.sel(level=level)
    np.testing.assert_allclose(ours.values, rmse, rtol=1e-9)
    assert np.all(rmse > 0)
  for hours in (6, 12):  # the map of the first and the last lead time
    with open(os.path.join(out, f"map_2m_temperature_{hours}h.png"), "rb") as f:
      assert f.read(4) == b"\x89PNG"


def test_climatology_on_points_is_the_windowed_mean(octahedral_run, scored):
  """Day of year 10 at 00 and 18 UTC: the store's values there over January 1-20, weighed
  1 - |day - 10| / 30 (WeatherBench2's 61-day window)."""
  _, store, _ = octahedral_run
  _, clim_path, _ = scored
  clim = xr.open_zarr(clim_path, chunks=None)
  assert clim["temperature"].dims == ("hour", "dayofyear", "level", "values")
  assert clim["latitude"].dims == ("values",)
  truth = xr.open_zarr(store, chunks=None).sel(time=slice("2020-01-01", "2020-01-20"))
  times = pd.DatetimeIndex(truth.time.values)
  for hour in (0, 18):
    at_hour = np.flatnonzero(times.hour == hour)
    weight = 1 - np.abs(np.asarray(times.day_of_year)[at_hour] - 10) / 30
    for name, field in (("2m_temperature", truth["2m_temperature"]),
                        ("temperature", truth["temperature"].sel(level=850))):
      values = field.values[at_hour].astype(np.float64)
      expected = np.tensordot(weight, values, axes=1) / weight.sum()
      ours = clim[name].sel(hour=hour, dayofyear=10)
      ours = ours if name == "2m_temperature" else ours.sel(level=850)
      np.testing.assert_allclose(ours.values, expected, rtol=1e-6)
