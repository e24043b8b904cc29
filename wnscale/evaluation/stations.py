"""`evaluate_stations`: a forecast's station predictions against observations, with the grid's.

A forecast written by `launch.forecast` for a run with a target modality holds it as a
zarr group (`F.zarr/stations`: dims `time`, [`number`,] `prediction_timedelta`,
`station`; `inference.forecast_store`). Each of its variables the observation store
(`data.reading.observations`) also holds is scored against the observations at the valid
times, per lead time: RMSE, bias (forecast - observed) and MAE over every (initial time,
station) pair observed. Beside it, as a baseline, the grid forecast interpolated to the
same stations (`data.making.stations.interpolate`) on the same pairs: a value enters the scores
only where the observation and both forecasts are present (an ensemble by its mean).
Without a station group, only the baseline is scored, at every station of the store.

Written to `out_dir`: `<name>.nc` per scored forecast (dims `(metric, lead_time)`,
metrics `rmse`, `bias`, `mae`, `count`), `metrics.json` (`results.write`) and
`stations_rmse.png` (RMSE against lead time, both lines, one panel per variable).
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pandas as pd
import xarray as xr
import zarr

from wnscale import outputs
from wnscale.data.making import stations as stations_lib
from wnscale.data.reading import observations, store_formats
from wnscale.data.reading import store as store_lib
from wnscale.errors import UserError
from wnscale.evaluation import datasets, figures
from wnscale.evaluation import results as results_lib
from wnscale.evaluation.datasets import ENSEMBLE, INIT, LEAD
from wnscale.evaluation.metrics import LATITUDE, LONGITUDE
from wnscale.graphs.points import PointSet

STATION = observations.DIMS[1]
GRID = "grid_interpolated"  # the baseline's name in the results
METRICS = ("rmse", "bias", "mae", "count")
FIGURE = "stations_rmse.png"


def station_groups(path: str) -> list[str]:
  """The names of the forecast store's groups laid out along `station`."""
  root = zarr.open_group(path, mode="r")
  return sorted(name for name, group in root.groups()
                if any(STATION in array.attrs.get("_ARRAY_DIMENSIONS", ())
                       for _, array in group.arrays()))


def evaluate_stations(forecast_path: str, observations_path: str, out_dir: str, *,
                      init_start: str | None = None, init_end: str | None = None,
                      overwrite: bool = False) -> dict:
  """Scores the station forecast and the grid forecast at the stations; writes `out_dir`.

  Args:
    forecast_path: a forecast store (`launch.forecast`); its finished initial times.
    observations_path: an observation store holding the valid times (a time it lacks is
      missing) and every station of the forecast's group.
    init_start, init_end: score only these initial times (`datasets.initial_times_in`).
    overwrite: replace the results already in `out_dir` (`outputs.check`).

  Returns:
    `{"results": {name: xr.Dataset}, "files": [paths], "note": a line or None}`; the
    station group's results first (when there is one), then `GRID`'s.

  Raises:
    UserError: no variable to score, stations the observations lack, several groups.
  """
  out_dir = os.path.abspath(out_dir)
  outputs.check(out_dir, outputs.RESULTS, argument="out_dir", overwrite=overwrite)
  forecast = datasets.open_forecast(forecast_path)
  if init_start or init_end:
    forecast = datasets.initial_times_in(forecast, init_start, init_end)
  groups = station_groups(forecast_path)
  if len(groups) > 1:
    raise UserError(f"The forecast {forecast_path} holds several station groups {groups}; "
                    "scoring one observation store against them is not supported.")
  held = set(store_formats.open_dataset(observations_path).data_vars)
  group, note = None, None
  if groups:
    group = xr.open_zarr(forecast_path, group=groups[0], chunks=None,
                         decode_timedelta=True).sel({INIT: forecast.init_times})
    variables = [name for name in group.data_vars if name in held]
  else:
    variables = [name for name in forecast.variables if name in held]
    note = (f"The forecast {forecast_path} has no station group (its run predicted no "
            "stations): only the grid forecast interpolated to the stations is scored.")
  if not variables:
    raise UserError(f"No variable to score: the observation store {observations_path} holds "
                    f"{sorted(held)}, the forecast's "
                    f"{'group ' + groups[0] if groups else 'grid'} "
                    f"{sorted(group.data_vars) if groups else list(forecast.variables)}.")
  observed = store_formats.open_points(observations_path, variables)
  columns = _station_columns(observed, group, forecast_path)
  points = (observed.points if group is None else PointSet.from_points(
      group["latitude"].values, group["longitude"].values, np.ones(group.sizes[STATION])))
  interpolate = _interpolator(forecast.dataset, points)
  names = ([groups[0]] if group is not None else []) + [GRID]
  sums = {name: np.zeros((len(variables), 4, len(forecast.leads))) for name in names}
  logging.info("Scoring %d initial times x %d lead times at %d stations.",
               len(forecast.init_times), len(forecast.leads), points.size)
  for index, init in enumerate(forecast.init_times):
    at = observations.time_index(observed.times, (init + forecast.leads).values)
    grid = forecast.at_init(index)
    for channel, name in enumerate(variables):
      truth = observed.values[name][np.maximum(at, 0)][:, columns].astype(np.float64)
      truth[at < 0] = np.nan
      candidates = [interpolate(_mean(grid[name]))]
      if group is not None:
        candidates.insert(0, _mean(group[name].isel({INIT: index})).transpose(LEAD, STATION)
                          .values.astype(np.float64))
      present = np.isfinite(truth) & np.all([np.isfinite(c) for c in candidates], axis=0)
      for key, candidate in zip(names, candidates):
        error = np.where(present, candidate - np.where(present, truth, 0), 0)
        sums[key][channel] += [present.sum(1), error.sum(1), np.square(error).sum(1),
                               np.abs(error).sum(1)]
  results = {name: _results(sums[name], variables, forecast.leads, len(forecast.init_times),
                            points.size) for name in names}
  about = {"forecast": os.path.abspath(forecast_path),
           "observations": os.path.abspath(observations_path),
           "initial_times": [str(t) for t in forecast.init_times], "stations": points.size,
           "note": note}
  with outputs.building(out_dir, overwrite) as where:
    files = results_lib.write(results, where, about)
    files.append(os.path.join(where, FIGURE))
    figures.plot_station_rmse(results, files[-1], title=(
        f"{os.path.basename(forecast_path)}: {len(forecast.init_times)} initial times, "
        f"{points.size} stations"))
  files = [os.path.join(out_dir, os.path.relpath(path, where)) for path in files]
  return {"results": results, "files": files, "note": note}


def _station_columns(observed: observations.ObservationStore, group: xr.Dataset | None,
                     path: str) -> np.ndarray:
  """`[S]` the column of each forecast station in the observations (all of them without a
  group)."""
  if group is None:
    return np.arange(observed.station_id.size)
  wanted = group["station_id"].values.astype(str)
  columns = np.minimum(np.searchsorted(observed.station_id, wanted),
                       observed.station_id.size - 1)
  lacking = wanted[observed.station_id[columns] != wanted]
  if lacking.size:
    raise UserError(f"The observation store {observed.path} lacks {lacking.size} of the "
                    f"{wanted.size} stations of the forecast {path} (e.g. {lacking[:3].tolist()}"
                    "): score it against the store its run observed.")
  return columns


def _interpolator(grid: xr.Dataset, points: PointSet):
  """`f(field (LEAD, space)) -> [L, S]`: a grid forecast's field at `points`."""
  if LATITUDE in grid.dims:  # a regular grid, latitude ascending (`datasets`)
    source = PointSet.regular(grid[LATITUDE].values, grid[LONGITUDE].values)
  else:
    source = PointSet.from_points(grid[LATITUDE].values, grid[LONGITUDE].values,
                                  np.ones(grid[LATITUDE].size))
  space = store_lib.spatial_dims(grid)
  return lambda field: stations_lib.interpolate(
      field.transpose(LEAD, *space).values.reshape(field.sizes[LEAD], -1), source, points)


def _mean(field: xr.DataArray) -> xr.DataArray:
  """An ensemble's mean (a deterministic field as it is)."""
  return field.mean(ENSEMBLE) if ENSEMBLE in field.dims else field


def _results(sums: np.ndarray, variables, leads, num_inits: int, num_stations: int
             ) -> xr.Dataset:
  """Results (`METRICS` x lead time per variable) of `sums` `[V, 4, L]`: count, sum of
  errors, of squares, of absolute values."""
  count, total, squares, absolute = sums.transpose(1, 0, 2)
  with np.errstate(invalid="ignore", divide="ignore"):
    table = np.stack([np.sqrt(squares / count), total / count, absolute / count, count],
                     axis=1)
  return xr.Dataset(
      {name: (("metric", results_lib.RESULTS_LEAD), table[i]) for i, name in enumerate(variables)},
      coords={"metric": list(METRICS), results_lib.RESULTS_LEAD: pd.TimedeltaIndex(leads)},
      attrs={"num_initial_times": num_inits, "num_stations": num_stations})


def headline_table(results: dict[str, xr.Dataset], max_leads: int = 3) -> str:
  """RMSE, bias and MAE of each scored forecast side by side, per variable, at up to
  `max_leads` lead times (the first, the last and between), as text."""
  first = next(iter(results.values()))
  leads = pd.TimedeltaIndex(first[results_lib.RESULTS_LEAD].values)
  picked = sorted({round(i * (len(leads) - 1) / max(max_leads - 1, 1))
                   for i in range(min(max_leads, len(leads)))})
  header = ["variable", "lead"] + [f"{name} {metric.upper()}" for metric in METRICS[:3]
                                   for name in results] + ["count"]
  rows = []
  for variable in first.data_vars:
    for index in picked:
      cells = [f"{results_lib.value(result, metric, variable, None)[index]:.4g}"
               for metric in METRICS[:3] for result in results.values()]
      count = int(results_lib.value(first, "count", variable, None)[index])
      rows.append([variable, results_lib.lead_label(leads[index]), *cells, str(count)])
  widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
  return "\n".join("  ".join(cell.rjust(width) for cell, width in zip(row, widths))
                   for row in [header, *rows])
