"""WeatherBench2's metrics: hand-worked values, and agreement with an independent
implementation (the `scores` package) fed the same cell-area weights."""

import numpy as np
import pandas as pd
import pytest
import scores
import xarray as xr
from problems import data_spec

from wnscale.evaluation import metrics
from wnscale.graphs import grid
from wnscale.graphs.points import PointSet
from wnscale.model import setup


def field(values, latitude, longitude, **leading):
  """A DataArray `(*leading dims, latitude, longitude)`."""
  dims = tuple(leading) + ("latitude", "longitude")
  coords = dict(leading, latitude=latitude, longitude=longitude)
  return xr.DataArray(np.asarray(values, np.float64), dims=dims, coords=coords)


def test_cell_area_weights_by_hand():
  # Rows at -60, 0, 60: cells [-90, -30], [-30, 30], [30, 90]; areas (sin upper - sin lower)
  # 0.5, 1, 0.5, mean 2/3 -> 0.75, 1.5, 0.75.
  np.testing.assert_allclose(metrics.cell_area_weights([-60, 0, 60]), [0.75, 1.5, 0.75])
  # Either order; the weight stays with its row.
  np.testing.assert_allclose(metrics.cell_area_weights([60, 0, -60]), [0.75, 1.5, 0.75])
  # Rows at +-45: cells [-90, 0] and [0, 90], equal.
  np.testing.assert_allclose(metrics.cell_area_weights([45, -45]), [1, 1])
  # Pole rows get their cap, not cos(90) = 0: rows -90, 0, 90 have cells [-90, -45],
  # [-45, 45], [45, 90]: areas 1 - sin 45, 2 sin 45, 1 - sin 45.
  cap, band = 1 - np.sqrt(0.5), 2 * np.sqrt(0.5)
  np.testing.assert_allclose(metrics.cell_area_weights([-90, 0, 90]),
                             np.array([cap, band, cap]) / ((2 * cap + band) / 3))
  with pytest.raises(ValueError, match="distinct"):
    metrics.cell_area_weights([0, 0, 10])


def test_training_loss_weighs_nodes_the_same_way():
  latitude, longitude = grid.regular_grid(5.625)
  constants = setup.make_constants(data_spec(), None, PointSet.regular(latitude, longitude),
                                   np.ones(1))
  np.testing.assert_allclose(constants.node_weights,
                             np.repeat(metrics.cell_area_weights(latitude), len(longitude)),
                             rtol=1e-7)


LAT3, LON2 = [-60.0, 0.0, 60.0], [0.0, 180.0]  # row weights 0.75, 1.5, 0.75


def test_mse_bias_and_rmse_by_hand():
  truth = field(np.zeros((2, 3, 2)), LAT3, LON2, time=[0, 1])
  # Initial time 0: error 2 on the equator row only; initial time 1: error 1 everywhere.
  forecast = truth.copy(data=[[[0, 0], [2, 2], [0, 0]], [[1, 1], [1, 1], [1, 1]]])
  mse = metrics.mse(forecast, truth)
  # Weighted mean of 4 on the middle row: (1.5 * 4 * 2) / (3 * 2) = 2.
  np.testing.assert_allclose(mse.values, [2.0, 1.0])
  np.testing.assert_allclose(metrics.bias(forecast, truth).values, [1.0, 1.0])
  # RMSE: square root after the average over initial times, sqrt(1.5), not (sqrt 2 + 1) / 2.
  np.testing.assert_allclose(float(metrics.rmse(mse, "time")), np.sqrt(1.5))


def test_acc_by_hand():
  climatology = field(np.full((3, 2), 10.0), LAT3, LON2)
  truth = climatology + field([[1, -1], [2, -2], [1, -1]], LAT3, LON2)
  # Forecast anomaly equal to truth's: ACC 1; opposite: -1; scaled: still 1.
  assert float(metrics.acc(truth, truth, climatology)) == pytest.approx(1.0)
  assert float(metrics.acc(2 * climatology - truth, truth, climatology)) == pytest.approx(-1.0)
  assert float(metrics.acc(climatology + 3 * (truth - climatology), truth,
                           climatology)) == pytest.approx(1.0)
  # Forecast anomaly 1 on the equator row only: mean(f't') = 1.5 * (2 - 2) / 6 = 0 -> ACC 0.
  forecast = climatology + field([[0, 0], [1, 1], [0, 0]], LAT3, LON2)
  assert float(metrics.acc(forecast, truth, climatology)) == pytest.approx(0.0, abs=1e-12)
  # Anomaly (1, 0) on the equator: mean(f't') = 1.5*2/6 = 0.5, mean(f'^2) = 1.5/6 = 0.25,
  # mean(t'^2) = (0.75*2*2 + 1.5*8) / 6 = 2.5: ACC = 0.5 / sqrt(0.625).
  forecast = climatology + field([[0, 0], [1, 0], [0, 0]], LAT3, LON2)
  assert float(metrics.acc(forecast, truth, climatology)) == pytest.approx(0.5 / np.sqrt(0.625))
  # The climatology as a forecast has no anomaly: ACC undefined (NaN), as in WeatherBench2.
  assert np.isnan(float(metrics.acc(climatology, truth, climatology)))


def test_ensemble_is_scored_by_its_mean():
  truth = field(np.zeros((3, 2)), LAT3, LON2)
  members = field(np.stack([np.full((3, 2), 1.0), np.full((3, 2), 3.0)]), LAT3, LON2,
                  number=[0, 1])
  assert float(metrics.mse(members, truth, ensemble_dim="number")) == pytest.approx(4.0)
  assert float(metrics.bias(members, truth, ensemble_dim="number")) == pytest.approx(2.0)


@pytest.fixture(scope="module")
def random_fields():
  """Forecast, truth, climatology on a 5.625 deg grid (latitude descending, as WB2 stores),
  with initial time, lead time and level dims."""
  rng = np.random.default_rng(0)
  latitude, longitude = grid.regular_grid(5.625)
  latitude = latitude[::-1]
  shape = (3, 4, 2, len(latitude), len(longitude))
  dims = dict(time=pd.date_range("2020-01-01", periods=3, freq="12h"),
              lead_time=pd.timedelta_range("6h", periods=4, freq="6h"), level=[500, 850])
  make = lambda scale, offset: field(offset + scale * rng.normal(size=shape), latitude,  # noqa
                                     longitude, **dims)
  truth = make(3.0, 280.0)
  return truth + make(1.0, 0.5), truth, make(0.5, 280.0)


def test_metrics_match_the_scores_package(random_fields):
  forecast, truth, climatology = random_fields
  weights = metrics.latitude_weights(truth)
  per_init = dict(preserve_dims=["time", "lead_time", "level"], weights=weights)
  np.testing.assert_allclose(metrics.mse(forecast, truth),
                             scores.continuous.mse(forecast, truth, **per_init), rtol=1e-12)
  np.testing.assert_allclose(metrics.bias(forecast, truth),
                             scores.continuous.additive_bias(forecast, truth, **per_init),
                             rtol=1e-12)
  # RMSE over initial times: scores averages over time too when asked to reduce it.
  np.testing.assert_allclose(
      metrics.rmse(metrics.mse(forecast, truth), "time"),
      np.sqrt(scores.continuous.mse(forecast, truth, preserve_dims=["lead_time", "level"],
                                    weights=weights)), rtol=1e-12)
  # ACC from weighted means that `scores` computes: mean(f't') = (mse(f', -t') - mse(f', t')) / 4.
  f, t = forecast - climatology, truth - climatology
  zero = xr.zeros_like(t)
  product = (scores.continuous.mse(f, -t, **per_init) - scores.continuous.mse(f, t, **per_init))
  expected = (product / 4) / np.sqrt(scores.continuous.mse(f, zero, **per_init)
                                     * scores.continuous.mse(t, zero, **per_init))
  np.testing.assert_allclose(metrics.acc(forecast, truth, climatology), expected, rtol=1e-10)


def test_nan_propagates(random_fields):
  forecast, truth, _ = random_fields
  forecast = forecast.copy()
  forecast[0, 0, 0, 3, 3] = np.nan
  mse = metrics.mse(forecast, truth)
  assert np.isnan(mse[0, 0, 0]) and np.isfinite(mse[1:]).all()


def test_ensemble_crps_and_spread_by_hand():
  """Members 1, 3, 6 everywhere against truth 2: skill (1 + 1 + 4) / 3 = 2, fair spread
  (2 + 5 + 3) * 2 / (3 * 2) = 10 / 3, CRPS 2 - 5 / 3 = 1 / 3; variance (ddof 1) 19 / 3."""
  truth = field(np.full((3, 2), 2.0), LAT3, LON2)
  members = field(np.stack([np.full((3, 2), v) for v in (1.0, 3.0, 6.0)]), LAT3, LON2,
                  number=[0, 1, 2])
  assert float(metrics.crps(members, truth, ensemble_dim="number")) == pytest.approx(1 / 3)
  assert float(metrics.ensemble_variance(members)) == pytest.approx(19 / 3)
  # One member: the CRPS is the MAE, as it is for a deterministic forecast.
  single = members.isel(number=[2])
  assert float(metrics.crps(single, truth, ensemble_dim="number")) == pytest.approx(4.0)
  assert float(metrics.crps(members.isel(number=2), truth)) == pytest.approx(4.0)


def test_ensemble_crps_matches_the_scores_package(random_fields):
  """WeatherBench2's CRPS (fair spread) equals `scores`' fair ensemble CRPS, per initial time."""
  _, truth, _ = random_fields
  rng = np.random.default_rng(1)
  members = xr.concat([truth + rng.normal(0.3, 1.5, truth.shape) for _ in range(5)],
                      dim=pd.Index(range(5), name="number"))
  weights = metrics.latitude_weights(truth)
  expected = scores.probability.crps_for_ensemble(
      members, truth, "number", method="fair", preserve_dims=["time", "lead_time", "level"],
      weights=weights)
  np.testing.assert_allclose(metrics.crps(members, truth, ensemble_dim="number"), expected,
                             rtol=1e-10)
