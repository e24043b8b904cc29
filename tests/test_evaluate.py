"""Scoring a forecast store: WeatherBench2's results layout, numbers equal to an
independent computation (the `scores` package, cell-area weights written out here),
persistence and climatology baselines, a baseline forecast's scorecard, clear errors."""

import glob
import json
import os

import numpy as np
import pandas as pd
import pytest
import scores
import xarray as xr

from wnscale.data.making import synthetic
from wnscale.evaluation import climatology as climatology_lib
from wnscale.evaluation import results as results_lib
from wnscale.evaluation.scoring import evaluate

VARIABLES = ["geopotential", "temperature", "2m_temperature"]
LEVELS = [500, 850]
INITS = pd.date_range("2020-01-02", periods=4, freq="12h")
LEADS = pd.timedelta_range("6h", periods=3, freq="6h")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
  """A synthetic truth store (latitude descending) and its climatology."""
  directory = tmp_path_factory.mktemp("evaluate")
  path = synthetic.write_synthetic_store(str(directory / "truth.zarr"), resolution=5.625,
                                         start="2020-01-01", end="2020-01-05",
                                         levels=(500, 700, 850), variables=VARIABLES, seed=4)
  clim = climatology_lib.compute_climatology(path, str(directory / "clim.zarr"),
                                             levels=LEVELS)
  return path, clim, directory


def write_forecast(path, truth_path, offset=0.0, inits=INITS, seed=0):
  """Truth at the valid times, plus a drift growing with lead time and noise; latitude
  ascending (the truth's is descending) and no wnscale attributes, like a foreign model's."""
  truth = xr.open_zarr(truth_path).sel(level=LEVELS)[VARIABLES].sortby("latitude")
  rng = np.random.default_rng(seed)
  fields = {}
  for name in VARIABLES:
    valid = truth[name].sel(time=xr.DataArray(inits.values[:, None] + LEADS.values[None],
                                              dims=("time", "prediction_timedelta")))
    drift = xr.DataArray(np.arange(1, len(LEADS) + 1) * (1.0 + offset),
                         dims="prediction_timedelta")
    noise = rng.normal(scale=0.5 * float(truth[name].std()) / 20, size=valid.shape)
    fields[name] = (valid + drift + noise).astype(np.float32).drop_vars("time")
  forecast = xr.Dataset(fields).assign_coords(time=inits.values, prediction_timedelta=LEADS.values)
  forecast.to_zarr(path, zarr_format=2, consolidated=True)
  return str(path)


def area_weights(latitude):
  """Cell areas written out independently: bounds at midpoints and +-90, mean 1."""
  latitude = np.sort(latitude)
  lat = np.deg2rad(latitude)
  edges = np.r_[-np.pi / 2, (lat[1:] + lat[:-1]) / 2, np.pi / 2]
  area = np.diff(np.sin(edges))
  return xr.DataArray(area / area.mean(), dims="latitude", coords={"latitude": latitude})


@pytest.fixture(scope="module")
def evaluated(store):
  truth_path, clim_path, directory = store
  forecast_path = write_forecast(directory / "forecast.zarr", truth_path)
  baseline_path = write_forecast(directory / "baseline.zarr", truth_path, offset=1.0,
                                 inits=INITS[1:], seed=1)
  out = str(directory / "out")
  result = evaluate(forecast_path, truth_path, out, climatology_path=clim_path,
                    baseline_path=baseline_path, map_channels=["temperature@850"],
                    map_leads=["12h"])
  return result, out, forecast_path, truth_path, clim_path


def test_results_layout_files_and_figures(evaluated):
  result, out, *_ = evaluated
  names = ["forecast", "baseline", "persistence", "climatology"]
  assert sorted(result["results"]) == sorted(names)
  for name in names:
    results = xr.open_dataset(os.path.join(out, f"{name}.nc"))
    assert results["temperature"].dims == ("metric", "lead_time", "level")
    assert results["2m_temperature"].dims == ("metric", "lead_time")
    assert list(results.metric.values) == ["rmse", "mse", "bias", "acc", "crps"]
    np.testing.assert_array_equal(results.lead_time.values, LEADS.values)
    assert results.attrs["num_initial_times"] == 3  # the ones the baseline shares
  document = json.load(open(os.path.join(out, "metrics.json")))
  assert document["lead_time_hours"] == [6.0, 12.0, 18.0]
  assert len(document["scores"]["forecast"]["rmse"]["geopotential@500"]) == 3
  assert all(x is None for x in document["scores"]["climatology"]["acc"]["2m_temperature"])
  for figure in ("scores.png", "scorecard.png", "map_temperature850_12h.png"):
    path = os.path.join(out, figure)
    assert os.path.getsize(path) > 10_000 and open(path, "rb").read(4) == b"\x89PNG"


def test_numbers_equal_an_independent_computation(evaluated):
  result, _, forecast_path, truth_path, clim_path = evaluated
  forecast = xr.open_zarr(forecast_path).isel(time=slice(1, None)).load()  # shared inits
  truth = xr.open_zarr(truth_path).sel(level=LEVELS).sortby("latitude").load()
  clim = xr.open_zarr(clim_path, chunks=None).sel(level=LEVELS).sortby("latitude")
  valid = xr.DataArray(forecast.time.values[:, None] + LEADS.values[None],
                       dims=("time", "prediction_timedelta"))
  weights = area_weights(truth.latitude.values)
  keep = ["prediction_timedelta", "level"]
  for name in VARIABLES:
    f = forecast[name].astype(np.float64)
    t = truth[name].sel(time=valid).drop_vars("time").astype(np.float64)
    t = t.assign_coords(time=f.time, prediction_timedelta=f.prediction_timedelta)
    ours = result["results"]["forecast"][name]
    preserve = [d for d in keep if d in f.dims]
    mse = scores.continuous.mse(f, t, preserve_dims=preserve, weights=weights)
    np.testing.assert_allclose(ours.sel(metric="rmse").values, np.sqrt(mse.values), rtol=1e-9)
    bias = scores.continuous.additive_bias(f, t, preserve_dims=preserve, weights=weights)
    np.testing.assert_allclose(ours.sel(metric="bias").values, bias.values, rtol=1e-7,
                               atol=1e-9 * float(abs(t).max()))
    # Persistence: the truth at the initial time, for every lead.
    p = truth[name].sel(time=f.time).astype(np.float64).broadcast_like(t)
    mse = scores.continuous.mse(p, t, preserve_dims=preserve, weights=weights)
    np.testing.assert_allclose(result["results"]["persistence"][name].sel(metric="rmse").values,
                               np.sqrt(mse.values), rtol=1e-9)
    # ACC: per initial time against the climatology of the valid time's day and hour, then
    # averaged over initial times.
    c = clim[name].isel(hour=xr.DataArray(valid.dt.hour.values // 6, dims=valid.dims),
                        dayofyear=xr.DataArray(valid.dt.dayofyear.values - 1, dims=valid.dims))
    fa, ta = f - c.values, t - c.values
    mean = lambda x: x.weighted(weights).mean(("latitude", "longitude"))  # noqa: E731
    acc = (mean(fa * ta) / np.sqrt(mean(fa ** 2) * mean(ta ** 2))).mean("time")
    np.testing.assert_allclose(ours.sel(metric="acc").values, acc.values, rtol=1e-9)


def test_ensemble_scores_equal_an_independent_computation(store):
  """A 4-member forecast (a `number` dim): CRPS (WeatherBench2's, fair spread) equals the
  `scores` package's fair ensemble CRPS; RMSE is the ensemble mean's; spread is the square
  root of the time-mean area-weighted ensemble variance (ddof 1); spread/skill their ratio.
  Persistence, deterministic, gets its MAE as CRPS."""
  truth_path, _, directory = store
  members = [xr.open_zarr(write_forecast(directory / f"member{k}.zarr", truth_path, seed=k))
             for k in range(4)]
  ensemble = xr.concat(members, dim=pd.Index(range(4), name="number")).transpose(
      "time", "number", ...)
  path = str(directory / "ensemble.zarr")
  ensemble = ensemble.load().drop_encoding()  # one store of its own (no dask needed)
  ensemble.to_zarr(path, zarr_format=2, consolidated=True)
  result = evaluate(path, truth_path, str(directory / "ensemble_out"))["results"]
  assert not glob.glob(str(directory / "ensemble_out" / "map_*"))  # maps only when asked
  forecast = xr.open_zarr(path).load()
  truth = xr.open_zarr(truth_path).sel(level=LEVELS).sortby("latitude").load()
  valid = xr.DataArray(forecast.time.values[:, None] + LEADS.values[None],
                       dims=("time", "prediction_timedelta"))
  weights = area_weights(truth.latitude.values)
  for name in VARIABLES:
    f = forecast[name].astype(np.float64)
    t = truth[name].sel(time=valid).drop_vars("time").astype(np.float64)
    t = t.assign_coords(time=f.time, prediction_timedelta=f.prediction_timedelta)
    preserve = [d for d in ("prediction_timedelta", "level") if d in f.dims]
    ours = result["forecast"][name]
    crps = scores.probability.crps_for_ensemble(f, t, "number", method="fair",
                                                preserve_dims=preserve, weights=weights)
    np.testing.assert_allclose(ours.sel(metric="crps").values, crps.values, rtol=1e-9)
    rmse = np.sqrt(scores.continuous.mse(f.mean("number"), t, preserve_dims=preserve,
                                         weights=weights))
    np.testing.assert_allclose(ours.sel(metric="rmse").values, rmse.values, rtol=1e-9)
    variance = f.var("number", ddof=1).weighted(weights).mean(("latitude", "longitude"))
    spread = np.sqrt(variance.mean("time"))
    np.testing.assert_allclose(ours.sel(metric="spread").values, spread.values, rtol=1e-9)
    np.testing.assert_allclose(ours.sel(metric="spread_skill").values,
                               (spread / rmse).values, rtol=1e-9)
    p = truth[name].sel(time=f.time).astype(np.float64).broadcast_like(t)
    mae = scores.continuous.mae(p, t, preserve_dims=preserve, weights=weights)
    np.testing.assert_allclose(result["persistence"][name].sel(metric="crps").values,
                               mae.values, rtol=1e-9)
  assert "spread" not in result["persistence"]["metric"].values


def test_the_model_beats_its_noisier_baseline_in_the_scorecard_numbers(evaluated):
  results = evaluated[0]["results"]
  model = results["forecast"]["temperature"].sel(metric="rmse")
  baseline = results["baseline"]["temperature"].sel(metric="rmse")
  assert (model < baseline).all()  # the baseline drifts twice as fast


def test_clear_errors(store, tmp_path):
  truth_path, clim_path, _ = store
  forecast_path = write_forecast(tmp_path / "f.zarr", truth_path)
  # A forecast variable the truth lacks.
  other = synthetic.write_synthetic_store(str(tmp_path / "other.zarr"), resolution=5.625,
                                          start="2020-01-01", end="2020-01-05",
                                          levels=(500, 850), variables=VARIABLES[:2])
  with pytest.raises(ValueError, match="'2m_temperature' is not in the truth"):
    evaluate(forecast_path, other, str(tmp_path / "o1"))
  # Valid times the truth does not hold: the first is named.
  late = str(tmp_path / "late.zarr")
  xr.open_zarr(forecast_path).assign_coords(
      time=pd.date_range("2020-01-04T18", periods=len(INITS), freq="6h")).to_zarr(
          late, zarr_format=2)
  with pytest.raises(ValueError, match="no data at 2020-01-06 00:00:00 \\(initial time "
                                       "2020-01-05 06:00:00 \\+ lead 0 days 18:00:00\\).*"
                                       "initial times 2020-01-01 00:00:00 .. 2020-01-05 "
                                       "00:00:00. Score initial times in that range"):
    evaluate(late, truth_path, str(tmp_path / "o2"))
  # A range of initial times reaching past the forecast's is not clipped to it.
  with pytest.raises(ValueError, match="init_end=2020-01-06: is after the last initial time "
                                       "of the forecast"):
    evaluate(late, truth_path, str(tmp_path / "o2"), init_start="2020-01-05",
             init_end="2020-01-06")
  # Another grid.
  coarse = synthetic.write_synthetic_store(str(tmp_path / "coarse.zarr"), resolution=10.0,
                                           start="2020-01-01", end="2020-01-05",
                                           levels=(500, 850), variables=VARIABLES)
  with pytest.raises(ValueError, match="Grids differ: .*32 x 64.*18 x 36"):
    evaluate(forecast_path, coarse, str(tmp_path / "o3"))
  with pytest.raises(ValueError, match="not a climatology"):
    evaluate(forecast_path, truth_path, str(tmp_path / "o4"), climatology_path=truth_path)
  with pytest.raises(ValueError, match="No channel 'nonsense' to map"):
    evaluate(forecast_path, truth_path, str(tmp_path / "o5"), map_channels=["nonsense"])


def test_lead_labels_and_the_headline_table(evaluated):
  assert [results_lib.lead_label(pd.Timedelta(hours=h)) for h in (6, 36, 48, 54, 120)] == [
      "+6 h", "+36 h", "+2 d", "+54 h", "+5 d"]
  result, *_ = evaluated
  header, *rows = results_lib.headline_table(result["results"]).splitlines()
  assert header.split() == ["channel", "lead", "forecast", "RMSE", "baseline", "RMSE",
                            "persistence", "RMSE", "climatology", "RMSE", "forecast", "ACC"]
  z500 = [row.split() for row in rows if row.split()[0] == "z500"]
  rmse = results_lib.value(result["results"]["forecast"], "rmse", "geopotential", 500)
  assert [row[1:3] for row in z500] == [["+6", "h"], ["+12", "h"], ["+18", "h"]]
  assert [float(row[3]) for row in z500] == pytest.approx(rmse, rel=1e-3)


def windowed_mean(values, times, hour, window=61):
  """WeatherBench2's climatology at `hour` for days of year 1..366, in numpy: the mean of
  `values [time, ...]` at that hour weighted by 1 - |day offset| / (window // 2), day
  offsets wrapping over 366 days; NaN where no value weighs (one year, no day 365/366)."""
  half = window // 2
  at_hour = times.hour == hour
  days = np.arange(1, 367)[:, None]
  offset = np.abs(days - np.asarray(times.day_of_year[at_hour])[None])
  weight = np.clip(1 - np.minimum(offset, 366 - offset) / half, 0, None)  # [366, times]
  total = np.tensordot(weight, values[at_hour], axes=1)
  with np.errstate(invalid="ignore"):
    return total / weight.sum(1).reshape((-1,) + (1,) * (values.ndim - 1))


ANEMOI_POINTS = os.path.join(os.path.dirname(__file__), "fixtures", "anemoi_grib", "store.zarr")


def test_scores_climatology_and_maps_on_an_anemoi_datasets_store_of_points(tmp_path):
  """An anemoi-datasets truth on O4 points (`values`): its climatology (per point, equal to
  a numpy mean), a forecast on its points scored with the points' spherical Voronoi areas
  (computed here with scipy) and mapped."""
  from scipy.spatial import SphericalVoronoi
  expected = np.load(ANEMOI_POINTS.replace("store.zarr", "expected.npz"))
  names = list(expected["variables"])
  data = expected["data"][:, :, 0].astype(np.float64)  # [dates, variables, values]
  times = pd.DatetimeIndex(expected["dates"])
  t850 = data[:, names.index("t_850")]
  clim = climatology_lib.compute_climatology(ANEMOI_POINTS, str(tmp_path / "clim.zarr"),
                                             variables=["temperature", "2m_temperature"],
                                             levels=[850])
  opened = xr.open_zarr(clim, chunks=None)
  assert opened["temperature"].dims == ("hour", "dayofyear", "level", "values")
  assert opened["latitude"].dims == ("values",)
  np.testing.assert_allclose(opened.longitude.values, np.mod(expected["longitudes"], 360))
  for hour in (0, 12):
    np.testing.assert_allclose(opened["temperature"].sel(hour=hour, level=850).values,
                               windowed_mean(t850, times, hour), rtol=1e-6)
  # A forecast of the truth at the valid times plus an error growing with the lead time;
  # valid times at hours the store holds on both its days (the others' anomaly is 0).
  inits, leads = times[[0]], pd.to_timedelta(["6h", "24h", "30h"])
  rows = np.searchsorted(times, inits.values[:, None] + leads.values[None])  # [init, lead]
  error = np.random.default_rng(3).normal(size=rows.shape + t850.shape[1:]) * [[1], [2], [3]]
  lat, lon = expected["latitudes"], expected["longitudes"]
  forecast = xr.Dataset(
      {"temperature": (("time", "prediction_timedelta", "level", "values"),
                       (t850[rows] + error)[:, :, None].astype(np.float32))},
      coords={"time": inits, "prediction_timedelta": leads, "level": [850],
              "latitude": ("values", lat), "longitude": ("values", lon)})
  forecast.to_zarr(tmp_path / "forecast.zarr", zarr_format=2, consolidated=True)
  out = str(tmp_path / "out")
  result = evaluate(str(tmp_path / "forecast.zarr"), ANEMOI_POINTS, out, climatology_path=clim,
                    map_channels=["temperature@850"], map_leads=["24h"])
  phi, lam = np.deg2rad(lat), np.deg2rad(lon)
  xyz = np.stack([np.cos(phi) * np.cos(lam), np.cos(phi) * np.sin(lam), np.sin(phi)], -1)
  area = SphericalVoronoi(xyz).calculate_areas()
  squared = (forecast["temperature"].values[:, :, 0] - t850[rows]) ** 2  # [init, lead, values]
  rmse = np.sqrt(((squared * area).sum(-1) / area.sum()).mean(0))
  ours = result["results"]["forecast"]["temperature"].sel(level=850)
  np.testing.assert_allclose(ours.sel(metric="rmse").values, rmse, rtol=1e-5)
  # ACC against the climatology of each valid time's hour and day of year.
  valid = pd.DatetimeIndex((inits.values[:, None] + leads.values[None]).ravel())
  hour = np.searchsorted(opened.hour.values, valid.hour)
  normal = opened["temperature"].sel(level=850).values[hour, np.asarray(valid.day_of_year) - 1]
  predicted = forecast["temperature"].values[:, :, 0] - normal.reshape(rows.shape + (-1,))
  observed = t850[rows] - normal.reshape(rows.shape + (-1,))
  mean = lambda x: (x * area).sum(-1) / area.sum()  # noqa: E731
  acc = (mean(predicted * observed) / np.sqrt(mean(predicted ** 2) * mean(observed ** 2)))
  assert np.isfinite(acc).all()
  np.testing.assert_allclose(ours.sel(metric="acc").values, acc.mean(0), rtol=1e-5)
  assert open(os.path.join(out, "map_temperature850_24h.png"), "rb").read(4) == b"\x89PNG"
  regular = ANEMOI_POINTS.replace("anemoi_grib", "anemoi_members")  # a 7 x 8 grid
  with pytest.raises(ValueError, match=r"Grids differ: .*: 208 points \(latitude .*: 7 x 8"):
    evaluate(str(tmp_path / "forecast.zarr"), regular, str(tmp_path / "out2"))
