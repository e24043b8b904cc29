"""Scores in WeatherBench2's results layout, as JSON, and on disk.

`summarize` turns per-initial-time metrics into results: one dataset per
scored forecast, one data variable per forecast variable, dims
`(metric, lead_time[, level])`, metrics `rmse` (the square root of the mean
MSE; of the ensemble mean for an ensemble), `mse`, `bias`, `crps` (a
deterministic forecast's: its MAE) and, with a climatology, `acc`, each
averaged over the initial times; for an ensemble also `spread` (the square
root of the mean ensemble variance) and `spread_skill` (spread / rmse). `write` saves each as `<name>.nc` and all of them in
`metrics.json` (`{name: {metric: {channel: [one value per lead time]}}}`,
NaN as null).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pandas as pd
import xarray as xr

from wnscale import paths
from wnscale.data import netcdf
from wnscale.evaluation import metrics
from wnscale.evaluation.datasets import INIT, LEAD, channel_names

METRICS = ("rmse", "mse", "bias", "acc", "crps", "spread", "spread_skill")
RESULTS_LEAD = "lead_time"  # WeatherBench2's results dim


def summarize(per_init: dict[str, list[xr.Dataset]]) -> xr.Dataset:
  """Results from `{metric: [per initial time: Dataset of (LEAD[, level])]}`, metric in mse,
  bias, acc, crps, variance."""
  stacked = {name: xr.concat(values, dim=INIT, coords="minimal", compat="override")
             for name, values in per_init.items()}
  averaged = {name: values.mean(INIT, skipna=False) for name, values in stacked.items()}
  averaged["rmse"] = metrics.rmse(stacked["mse"], INIT)
  if "variance" in averaged:  # like the RMSE: the square root after the mean over inits
    averaged["spread"] = np.sqrt(averaged.pop("variance"))
    averaged["spread_skill"] = averaged["spread"] / averaged["rmse"]
  names = [name for name in METRICS if name in averaged]
  results = xr.concat([averaged[name] for name in names], dim=pd.Index(names, name="metric"),
                      coords="minimal", compat="override")
  results = results.rename({LEAD: RESULTS_LEAD})
  results = results.transpose("metric", RESULTS_LEAD, ...).drop_attrs()
  results.attrs["num_initial_times"] = len(next(iter(per_init.values())))
  return results


def value(results: xr.Dataset, metric: str, variable: str, level: int | None) -> np.ndarray:
  """`[num_leads]` one metric of one channel."""
  data = results[variable].sel(metric=metric)
  return (data.sel(level=level) if level is not None else data).values


def to_json(results: dict[str, xr.Dataset]) -> dict:
  """`{name: {metric: {channel: [per lead]}}}`, NaN as None."""
  out = {}
  for name, result in results.items():
    out[name] = {
        metric: {channel: [None if math.isnan(x) else float(x)
                           for x in value(result, metric, variable, level)]
                 for channel, variable, level in channel_names(result)}
        for metric in result["metric"].values.tolist()}
  return out


def write(results: dict[str, xr.Dataset], out_dir: str, about: dict) -> list[str]:
  """Writes `<name>.nc` per result and `metrics.json` (with `about` and the lead times).

  Returns:
    the files written.
  """
  os.makedirs(out_dir, exist_ok=True)
  written = []
  for name, result in results.items():
    path = os.path.join(out_dir, f"{name}.nc")
    paths.write_bytes(path, netcdf.to_bytes(result))  # whole or not at all
    written.append(path)
  first = next(iter(results.values()))
  leads = pd.TimedeltaIndex(first[RESULTS_LEAD].values)
  document = dict(about, lead_time_hours=[lead / pd.Timedelta(hours=1) for lead in leads],
                  scores=to_json(results))
  path = os.path.join(out_dir, "metrics.json")
  with open(f"{path}.tmp{os.getpid()}", "w") as f:
    json.dump(document, f, indent=1)
  os.replace(f"{path}.tmp{os.getpid()}", path)
  return written + [path]
