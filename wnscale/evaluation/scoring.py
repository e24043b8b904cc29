"""`evaluate`: scores a forecast against the truth the WeatherBench2 way, with baselines.

For every finished initial time of the forecast, one at a time (memory holds
one initial time): the forecast, the truth at its valid times, persistence
(the truth at the initial time, for every lead time), with a climatology the
climatology at the valid times (as a forecast, and for ACC), and with a
baseline forecast that too. Each is scored per variable, level and lead time
(`metrics`: MSE, bias, ACC per initial time) and averaged over initial times
(`results`). Written to `out_dir`: `<name>.nc` per scored forecast in
WeatherBench2's results layout, `metrics.json`, and PNG figures (`figures`).
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pandas as pd
import xarray as xr

from wnscale import outputs
from wnscale.data.reading import store as store_lib
from wnscale.data.source import parse_duration
from wnscale.errors import UserError
from wnscale.evaluation import climatology as climatology_lib
from wnscale.evaluation import datasets, figures, metrics
from wnscale.evaluation import results as results_lib
from wnscale.evaluation.datasets import ENSEMBLE, LEAD
from wnscale.progress import TaskProgress, long_step

FORECAST, BASELINE, PERSISTENCE, CLIMATOLOGY = "forecast", "baseline", "persistence", \
    "climatology"
HEADLINE_MAPS = "headline"  # as the map channels: the first two headline channels


def score(forecast: xr.Dataset, truth: xr.Dataset, climatology: xr.Dataset | None,
          weights: xr.DataArray) -> dict[str, xr.Dataset]:
  """`{"mse", "bias", "crps"[, "acc"][, "variance"]}` of one initial time.

  Each a Dataset over (LEAD[, level]); an ensemble (a `number` dim) is scored
  by its ensemble mean for MSE, bias and ACC, by its members for the CRPS and
  the ensemble variance; a deterministic forecast's CRPS is its MAE.
  """
  ensemble_dim = ENSEMBLE if ENSEMBLE in forecast.dims else None
  scores = {"mse": metrics.mse(forecast, truth, weights, ensemble_dim),
            "bias": metrics.bias(forecast, truth, weights, ensemble_dim),
            "crps": metrics.crps(forecast, truth, weights, ensemble_dim)}
  if ensemble_dim is not None and forecast.sizes[ensemble_dim] > 1:
    scores["variance"] = metrics.ensemble_variance(forecast, weights, ensemble_dim)
  if climatology is not None:
    scores["acc"] = metrics.acc(forecast, truth, climatology, weights, ensemble_dim)
  return scores


def evaluate(forecast_path: str, truth_path: str, out_dir: str, *,
             climatology_path: str | None = None, baseline_path: str | None = None,
             map_channels=(), map_leads=None, init_start: str | None = None,
             init_end: str | None = None, region: str | None = None,
             overwrite: bool = False) -> dict:
  """Scores the forecast (and baselines) and writes results and figures to `out_dir`.

  `out_dir` is checked first (`outputs.check`: it can be written, and holds no
  results unless `overwrite`), and written whole or not at all once all is
  scored (`outputs.building`).

  Args:
    init_start, init_end: score only the initial times in this inclusive range
      (`store.time_range`: an end without a time covers its day); None: from the
      forecast's first / to its last.
    map_channels: channels to map (e.g. `geopotential@500`), `HEADLINE_MAPS` for the
      first two headline channels; none by default.
    map_leads: lead times to map (e.g. "1d"); default: the first and the last.
    region: score only there (`datasets.restricted`: "cutout", a cut-out forecast's
      regional points, or a box "lat0,lat1,lon0,lon1"); the truth and climatology
      then need only hold the region's points (found by their coordinates, e.g. a
      cut-out's regional store). None: everywhere.
    overwrite: replace the results already in `out_dir`.

  Returns:
    `{"results": {name: xr.Dataset}, "files": [written paths]}`.
  """
  out_dir = os.path.abspath(out_dir)
  outputs.check(out_dir, outputs.RESULTS, argument="out_dir", overwrite=overwrite)
  forecast = datasets.open_forecast(forecast_path)
  if init_start or init_end:
    forecast = datasets.initial_times_in(forecast, init_start, init_end)
  weights = None
  if region:
    forecast, weights = datasets.restricted(forecast, region)
  by_coordinates = bool(region)
  truth = datasets.fitted(forecast, datasets.open_truth(truth_path), truth_path, "truth",
                          by_coordinates)
  climatology = None
  if climatology_path:
    climatology = datasets.fitted(forecast, datasets.open_climatology(climatology_path),
                                  climatology_path, "climatology", by_coordinates)
  baseline = None
  if baseline_path:
    forecast, baseline = _common(forecast, datasets.open_forecast(baseline_path))
  datasets.check_valid_times(forecast, truth, truth_path)
  maps = _maps(forecast, map_channels, map_leads)
  if weights is None:
    weights = datasets.weights(forecast, truth, truth_path)
  logging.info("Scoring %d initial times x %d lead times of %s.", len(forecast.init_times),
               len(forecast.leads), forecast_path)
  per_init = {}
  progress = TaskProgress(f"Scoring {forecast_path}", len(forecast.init_times),
                          "initial times")
  for index in range(len(forecast.init_times)):
    for name, scores in _score_init(forecast, index, truth, climatology, climatology_path,
                                    baseline, weights).items():
      for metric, values in scores.items():
        per_init.setdefault(name, {}).setdefault(metric, []).append(values)
    progress.done(label=f"{forecast.init_times[index]:%Y-%m-%d %H:%M}")
  progress.close()
  results = {name: results_lib.summarize(scores) for name, scores in per_init.items()}
  about = {"forecast": os.path.abspath(forecast_path), "truth": os.path.abspath(truth_path),
           "climatology": climatology_path and os.path.abspath(climatology_path),
           "baseline": baseline_path and os.path.abspath(baseline_path),
           "initial_times": [str(t) for t in forecast.init_times], "region": region}
  with outputs.building(out_dir, overwrite) as where:
    files = results_lib.write(results, where, about)
    with long_step(f"Drawing the figures into {out_dir}"):
      files += _figures(results, forecast, truth, where, maps)
  files = [os.path.join(out_dir, os.path.relpath(path, where)) for path in files]
  for path in files:
    logging.info("wrote %s", path)
  return {"results": results, "files": files}


def _score_init(forecast, index, truth, climatology, climatology_path, baseline, weights):
  """`{name: {metric: Dataset}}` of every candidate forecast at initial time `index`
  (`weights`: `datasets.weights`)."""
  init, leads = forecast.init_times[index], forecast.leads
  valid = init + leads
  observed = _on_leads(datasets.at_times(truth, forecast.variables, forecast.levels, valid),
                       leads)
  candidates = {FORECAST: forecast.at_init(index)}
  if baseline is not None:
    candidates[BASELINE] = baseline.at_init(index)
  # Persistence: the truth at the initial time (read once), for every lead time.
  at_init = datasets.at_times(truth, forecast.variables, forecast.levels, [init])
  candidates[PERSISTENCE] = _on_leads(at_init.isel({LEAD: [0] * len(leads)}), leads)
  expected = None
  if climatology is not None:
    expected = _on_leads(_climatology_at(climatology, forecast, valid, climatology_path), leads)
    candidates[CLIMATOLOGY] = expected
  scores = {}
  for name, candidate in candidates.items():
    names = list(candidate.data_vars)
    scores[name] = score(candidate, observed[names],
                         None if expected is None else expected[names], weights)
  return scores


def _on_leads(dataset: xr.Dataset, leads) -> xr.Dataset:
  return dataset.assign_coords({LEAD: np.asarray(leads)})


def _common(forecast: datasets.Forecast, baseline: datasets.Forecast):
  """Both forecasts on the initial times, lead times (and variables) they share.

  The baseline gets the forecast's grid coordinates (checked to agree).
  """
  datasets.check_same_grid(forecast.dataset, forecast.path, baseline.dataset, baseline.path)
  inits = forecast.init_times.intersection(baseline.init_times)
  leads = forecast.leads.intersection(baseline.leads)
  variables = [name for name in baseline.variables if name in forecast.variables]
  if len(inits) == 0 or len(leads) == 0 or not variables:
    raise UserError(f"The forecast {forecast.path} and the baseline {baseline.path} share no "
                     f"initial time, lead time or variable ({len(inits)} initial times, "
                     f"{len(leads)} lead times, variables {variables} shared).")
  if len(inits) < len(forecast.init_times) or len(leads) < len(forecast.leads):
    logging.warning("Scoring the %d initial times and %d lead times the baseline shares.",
                    len(inits), len(leads))
  baseline = baseline.select(inits, leads, variables)
  baseline.dataset = baseline.dataset.assign_coords(datasets.grid_coords(forecast.dataset))
  return forecast.select(inits, leads), baseline


def _climatology_at(climatology, forecast, valid, path) -> xr.Dataset:
  """The climatology at the valid times, loaded; an error where it holds no value."""
  selected = climatology_lib.at_valid_times(climatology[list(forecast.variables)], valid, LEAD)
  if forecast.levels and "level" in selected.dims:
    selected = selected.sel(level=forecast.levels)
  selected = selected.load().astype(np.float64)
  for name in forecast.variables:
    values = selected[name].values
    if np.isnan(values).any():
      lead = int(np.argwhere(np.isnan(values))[0][0])
      time = pd.Timestamp(valid[lead])
      raise UserError(f"The climatology {path} has no value for {name!r} on day of year "
                       f"{time.day_of_year}, hour {time.hour} (valid time {time}); make it from a "
                       "time range that covers that part of the year.")
  return selected


def _maps(forecast: datasets.Forecast, channels, leads) -> list[tuple[str, pd.Timedelta]]:
  """The `(channel, lead time)` pairs to map, checked before any scoring."""
  held = {channel for channel, _, _ in datasets.channel_names(forecast.dataset)}
  if list(channels) == [HEADLINE_MAPS]:
    channels = [f"{variable}@{level}" if level else variable for _, variable, level
                in results_lib.headline_channels(forecast.dataset)[:2]]
  for channel in channels:
    if channel not in held:
      raise UserError(f"No channel {channel!r} to map; the forecast has {sorted(held)}.")
  chosen = [forecast.leads[0], forecast.leads[-1]] if leads is None else [
      parse_duration(lead, "map_leads") for lead in leads]
  for lead in chosen:
    if lead not in forecast.leads:
      raise UserError(f"No lead time {lead} to map; the forecast has "
                       f"{[str(x) for x in forecast.leads]}.")
  return [(channel, lead) for channel in channels for lead in dict.fromkeys(chosen)]


def _figures(results, forecast, truth, out_dir, maps) -> list[str]:
  """The score curves, the scorecard (with a baseline) and the maps; returns their paths."""
  paths = [os.path.join(out_dir, "scores.png")]
  figures.plot_scores(results, paths[0], title=f"{os.path.basename(forecast.path)}: "
                      f"{len(forecast.init_times)} initial times")
  if BASELINE in results:
    paths.append(os.path.join(out_dir, "scorecard.png"))
    figures.plot_scorecard(results[FORECAST], results[BASELINE], paths[-1])
  channels = {channel: (variable, level) for channel, variable, level
              in datasets.channel_names(forecast.dataset)}
  init = forecast.init_times[0]
  space = store_lib.spatial_dims(forecast.dataset)
  for channel, lead in maps:
    variable, level = channels[channel]
    predicted = forecast.dataset[variable].sel({datasets.INIT: init, LEAD: lead})
    observed = truth[variable].sel({datasets.INIT: init + lead})
    if level is not None:
      predicted, observed = predicted.sel(level=level), observed.sel(level=level)
    if ENSEMBLE in predicted.dims:
      predicted = predicted.mean(ENSEMBLE)
    hours = int(lead / pd.Timedelta(hours=1))
    paths.append(os.path.join(out_dir, f"map_{channel.replace('@', '')}_{hours}h.png"))
    figures.plot_map(forecast.dataset[metrics.LATITUDE].values,
                     forecast.dataset[metrics.LONGITUDE].values,
                     predicted.transpose(*space).values, observed.transpose(*space).values,
                     f"{channel}: initial time {init:%Y-%m-%d %H:%M}, lead "
                     f"{results_lib.lead_label(lead)}", figures.units(variable),
                     paths[-1])
  return paths
