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

from wnscale.data.source import parse_duration
from wnscale.evaluation import climatology as climatology_lib
from wnscale.evaluation import datasets, figures, metrics
from wnscale.evaluation import results as results_lib
from wnscale.evaluation.datasets import ENSEMBLE, LEAD

FORECAST, BASELINE, PERSISTENCE, CLIMATOLOGY = "forecast", "baseline", "persistence", \
    "climatology"


def score(forecast: xr.Dataset, truth: xr.Dataset, climatology: xr.Dataset | None,
          weights: xr.DataArray) -> dict[str, xr.Dataset]:
  """`{"mse", "bias"[, "acc"]}` of one initial time, each a Dataset over (LEAD[, level])."""
  ensemble_dim = ENSEMBLE if ENSEMBLE in forecast.dims else None
  scores = {"mse": metrics.mse(forecast, truth, weights, ensemble_dim),
            "bias": metrics.bias(forecast, truth, weights, ensemble_dim)}
  if climatology is not None:
    scores["acc"] = metrics.acc(forecast, truth, climatology, weights, ensemble_dim)
  return scores


def evaluate(forecast_path: str, truth_path: str, out_dir: str, *,
             climatology_path: str | None = None, baseline_path: str | None = None,
             map_channels=None, map_leads=None) -> dict:
  """Scores the forecast (and baselines) and writes results and figures to `out_dir`.

  Args:
    map_channels: channels to map (e.g. `geopotential@500`); default: the
      first two headline channels.
    map_leads: lead times to map (`pandas.Timedelta` strings); default: the
      first and the last.

  Returns:
    `{"results": {name: xr.Dataset}, "files": [written paths]}`.
  """
  forecast = datasets.open_forecast(forecast_path)
  truth = datasets.fitted(forecast, datasets.open_truth(truth_path), truth_path, "truth")
  climatology = None
  if climatology_path:
    climatology = datasets.fitted(forecast, datasets.open_climatology(climatology_path),
                                  climatology_path, "climatology")
  baseline = None
  if baseline_path:
    forecast, baseline = _common(forecast, datasets.open_forecast(baseline_path))
  datasets.check_valid_times(forecast, truth, truth_path)
  weights = metrics.latitude_weights(forecast.dataset)
  leads = forecast.leads
  per_init = {}
  logging.info("Scoring %d initial times x %d lead times of %s.", len(forecast.init_times),
               len(leads), forecast_path)
  for index, init in enumerate(forecast.init_times):
    valid = init + leads
    truth_now = _on_leads(datasets.at_times(truth, forecast.variables, forecast.levels, valid),
                          leads)
    candidates = {FORECAST: forecast.at_init(index)}
    if baseline is not None:
      candidates[BASELINE] = baseline.at_init(index)
    candidates[PERSISTENCE] = _on_leads(datasets.at_times(
        truth, forecast.variables, forecast.levels, [init] * len(leads)), leads)
    expected = None
    if climatology is not None:
      expected = _on_leads(_climatology_at(climatology, forecast, valid, climatology_path),
                           leads)
      candidates[CLIMATOLOGY] = expected
    for name, candidate in candidates.items():
      names = list(candidate.data_vars)
      reference = None if expected is None else expected[names]
      for metric, values in score(candidate, truth_now[names], reference, weights).items():
        per_init.setdefault(name, {}).setdefault(metric, []).append(values)
  results = {name: results_lib.summarize(scores) for name, scores in per_init.items()}
  os.makedirs(out_dir, exist_ok=True)
  about = {"forecast": os.path.abspath(forecast_path), "truth": os.path.abspath(truth_path),
           "climatology": climatology_path and os.path.abspath(climatology_path),
           "baseline": baseline_path and os.path.abspath(baseline_path),
           "initial_times": [str(t) for t in forecast.init_times]}
  files = results_lib.write(results, out_dir, about)
  files += _figures(results, forecast, truth, out_dir, map_channels, map_leads)
  for path in files:
    logging.info("wrote %s", path)
  return {"results": results, "files": files}


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
    raise ValueError(f"The forecast {forecast.path} and the baseline {baseline.path} share no "
                     f"initial time, lead time or variable ({len(inits)} initial times, "
                     f"{len(leads)} lead times, variables {variables} shared).")
  if len(inits) < len(forecast.init_times) or len(leads) < len(forecast.leads):
    logging.warning("Scoring the %d initial times and %d lead times the baseline shares.",
                    len(inits), len(leads))
  grid = {dim: forecast.dataset[dim].values for dim in (metrics.LATITUDE, metrics.LONGITUDE)}
  baseline = baseline.select(inits, leads, variables)
  baseline.dataset = baseline.dataset.assign_coords(grid)
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
      raise ValueError(f"The climatology {path} has no value for {name!r} on day of year "
                       f"{time.day_of_year}, hour {time.hour} (valid time {time}); make it from a "
                       "time range that covers that part of the year.")
  return selected


def _figures(results, forecast, truth, out_dir, map_channels, map_leads) -> list[str]:
  """The score curves, the maps and (with a baseline) the scorecard; returns their paths."""
  paths = [os.path.join(out_dir, "scores.png")]
  figures.plot_scores(results, paths[0], title=f"{os.path.basename(forecast.path)}: "
                      f"{len(forecast.init_times)} initial times")
  if BASELINE in results:
    paths.append(os.path.join(out_dir, "scorecard.png"))
    figures.plot_scorecard(results[FORECAST], results[BASELINE], paths[-1])
  channels = {channel: (variable, level) for channel, variable, level
              in datasets.channel_names(forecast.dataset)}
  if map_channels is None:
    map_channels = [f"{variable}@{level}" if level else variable for _, variable, level
                    in figures.headline_channels(results[FORECAST])[:2]]
  leads = forecast.leads
  chosen = [leads[0], leads[-1]] if map_leads is None else [parse_duration(x) for x in
                                                             map_leads]
  init = forecast.init_times[0]
  for channel in map_channels:
    if channel not in channels:
      raise ValueError(f"No channel {channel!r} to map; the forecast has {sorted(channels)}.")
    variable, level = channels[channel]
    for lead in dict.fromkeys(chosen):
      if lead not in leads:
        raise ValueError(f"No lead time {lead} to map; the forecast has {list(leads)}.")
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
                       predicted.transpose(metrics.LATITUDE, metrics.LONGITUDE).values,
                       observed.transpose(metrics.LATITUDE, metrics.LONGITUDE).values,
                       f"{channel}: initial time {init}, lead {lead}",
                       figures.units(variable), paths[-1])
  return paths
