"""WeatherBench2's deterministic metrics, on xarray data with named dimensions.

The definitions are WeatherBench2's (`weatherbench2.metrics`):
  * a latitude row weighs in proportion to the area of its cells,
    sin(upper bound) - sin(lower bound), the bounds half-way between
    neighbouring rows and at +-90 deg, normalized to mean 1; every longitude
    weighs the same;
  * a spatial mean is the weighted mean over latitude and longitude; on a point
    set (a `values` dim) over the points, each weighing its cell's area
    (`graphs.points.PointSet.area`);
  * per initial time: MSE is the spatial mean of (forecast - truth)^2, bias
    the spatial mean of (forecast - truth), ACC the spatial mean of f' t'
    over the square root of (spatial mean of f'^2) x (spatial mean of t'^2),
    where f' and t' are forecast and truth minus the climatology at the valid
    time (not centred again);
  * over initial times each is averaged, and RMSE = sqrt(mean MSE): the square
    root comes after the average over initial times.

The per-initial-time functions reduce latitude and longitude only; every other
dimension (lead time, level, initial time) is kept. A forecast with an
ensemble dimension is scored by its ensemble mean (`ensemble_dim`), as
WeatherBench2 scores ensembles with deterministic metrics. NaN propagates.

Ensembles (WeatherBench2's `CRPS`, `EnsembleVariance`), per initial time, for
`M` members `X_i` and the truth `Y`:
  * CRPS = spatial mean of (skill - spread / 2), skill = mean_i |X_i - Y|,
    spread = E|X - X'| estimated fairly (unbiased) as
    sum_{i != j} |X_i - X_j| / (M (M - 1)); a one-member ensemble (a
    deterministic forecast) has spread 0 and its CRPS is its MAE;
  * ensemble variance = spatial mean of the members' variance (ddof 1); over
    initial times, spread = sqrt(mean variance), and the spread/skill ratio is
    spread / RMSE of the ensemble mean (1 for a reliable ensemble, up to the
    finite-ensemble factor sqrt((M + 1) / M) that WeatherBench2 does not apply).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from wnscale.data.reading.store import POINT_DIM, spatial_dims
from wnscale.graphs.grid import cell_area_weights

LATITUDE, LONGITUDE = "latitude", "longitude"


def latitude_weights(data: xr.DataArray | xr.Dataset) -> xr.DataArray:
  """`cell_area_weights` of `data`'s latitude coordinate, as a DataArray on it."""
  return xr.DataArray(cell_area_weights(data[LATITUDE].values), dims=[LATITUDE],
                      coords={LATITUDE: data[LATITUDE].values})


def point_weights(area) -> xr.DataArray:
  """`[values]` cell areas of a point set as weights along its `values` dim."""
  return xr.DataArray(np.asarray(area, np.float64), dims=[POINT_DIM])


def spatial_mean(data, weights: xr.DataArray | None = None):
  """The area-weighted mean over latitude and longitude, or a point set's points (other
  dims kept).

  `weights` are per latitude row (every longitude weighs the same; default:
  `latitude_weights`), or per point (`point_weights`, required on points), so the
  weighted mean is mean(weights x data) / mean(weights).
  """
  weights = latitude_weights(data) if weights is None else weights
  return (data * weights).mean(spatial_dims(data), skipna=False) / float(weights.mean())


def _deterministic(forecast, ensemble_dim):
  return forecast if ensemble_dim is None else forecast.mean(ensemble_dim)


def mse(forecast, truth, weights=None, ensemble_dim: str | None = None):
  """Spatial mean of the squared error, per initial time (and lead, level...)."""
  return spatial_mean((_deterministic(forecast, ensemble_dim) - truth) ** 2, weights)


def bias(forecast, truth, weights=None, ensemble_dim: str | None = None):
  """Spatial mean of forecast minus truth."""
  return spatial_mean(_deterministic(forecast, ensemble_dim) - truth, weights)


def acc(forecast, truth, climatology, weights=None, ensemble_dim: str | None = None):
  """Anomaly correlation against `climatology` (aligned with the valid times).

  NaN where an anomaly is zero everywhere (e.g. the climatology as a forecast).
  """
  forecast_anomaly = _deterministic(forecast, ensemble_dim) - climatology
  truth_anomaly = truth - climatology
  with np.errstate(divide="ignore", invalid="ignore"):
    return spatial_mean(forecast_anomaly * truth_anomaly, weights) / np.sqrt(
        spatial_mean(forecast_anomaly ** 2, weights) * spatial_mean(truth_anomaly ** 2, weights))


def crps_spread(forecast, ensemble_dim: str):
  """Pointwise fair estimate of E|X - X'|: sum_{i != j} |X_i - X_j| / (M (M - 1)); 0 if M = 1.

  From the sorted members (no M x M differences): sum_{i,j} |X_i - X_j| =
  2 sum_k (2k - M - 1) X_(k), with X_(1) <= ... <= X_(M).
  """
  members = forecast.sizes[ensemble_dim]
  if members < 2:
    return xr.zeros_like(forecast.isel({ensemble_dim: 0}, drop=True))

  def spread(values, axis):
    ordered = np.sort(values, axis=axis)
    shape = [1] * values.ndim
    shape[axis] = members
    rank_weights = (2 * np.arange(1, members + 1) - members - 1).reshape(shape)
    return 2 * np.sum(rank_weights * ordered, axis=axis) / (members * (members - 1))

  return forecast.reduce(spread, dim=ensemble_dim, keep_attrs=False)


def crps(forecast, truth, weights=None, ensemble_dim: str | None = None):
  """CRPS per initial time: spatial mean of mean_i |X_i - Y| - E|X - X'| / 2 (see above).

  Without `ensemble_dim` the forecast is one member: its CRPS is its MAE.
  """
  if ensemble_dim is None:
    return spatial_mean(abs(forecast - truth), weights)
  skill = abs(forecast - truth).mean(ensemble_dim, skipna=False)
  return spatial_mean(skill - 0.5 * crps_spread(forecast, ensemble_dim), weights)


def ensemble_variance(forecast, weights=None, ensemble_dim: str = "number"):
  """Spatial mean of the members' variance (ddof 1) per initial time."""
  return spatial_mean(forecast.var(ensemble_dim, ddof=1, skipna=False), weights)


def rmse(mse_per_init, init_dim: str = "time"):
  """RMSE from per-initial-time MSE: the square root of their mean."""
  return np.sqrt(mse_per_init.mean(init_dim, skipna=False))
