"""Scores in WeatherBench2's results layout, as JSON, and on disk.

`summarize` turns per-initial-time metrics into results: one dataset per
scored forecast, one data variable per forecast variable, dims
`(metric, lead_time[, level])`, metrics `rmse` (the square root of the mean
MSE; of the ensemble mean for an ensemble), `mse`, `bias`, `crps` (a
deterministic forecast's: its MAE) and, with a climatology, `acc`, each
averaged over the initial times; for an ensemble also `spread` (the square
root of the mean ensemble variance) and `spread_skill` (spread / rmse). `write` saves each as `<name>.nc` and all of them in
`metrics.json` (`{name: {metric: {channel: [one value per lead time]}}}`,
NaN as null). `headline_table` is the few lines a person reads first.
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

# WeatherBench2's headline channels: (label, variable, level).
HEADLINE = (("z500", "geopotential", 500), ("t850", "temperature", 850),
            ("t2m", "2m_temperature", None), ("u10", "10m_u_component_of_wind", None),
            ("msl", "mean_sea_level_pressure", None))
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


def headline_channels(result: xr.Dataset) -> list[tuple[str, str, int | None]]:
  """`[(label, variable, level)]`: the headline channels `result` has (else its first 4)."""
  held = {(variable, level) for _, variable, level in channel_names(result)}
  present = [entry for entry in HEADLINE if entry[1:] in held]
  return present or channel_names(result)[:4]


def lead_label(lead: pd.Timedelta) -> str:
  """`+6 h`, `+36 h`; whole days from two days on: `+5 d`."""
  hours = lead / pd.Timedelta(hours=1)
  if hours >= 48 and hours % 24 == 0:
    return f"+{hours / 24:g} d"
  return f"+{hours:g} h"


def headline_table(results: dict[str, xr.Dataset], max_leads: int = 3) -> str:
  """RMSE of every scored forecast (and the forecast's ACC, where scored) on the headline
  channels, at up to `max_leads` lead times (the first, the last and between), as text."""
  forecast_name = next(iter(results))
  first = results[forecast_name]
  leads = pd.TimedeltaIndex(first[RESULTS_LEAD].values)
  picked = sorted({round(i * (len(leads) - 1) / max(max_leads - 1, 1))
                   for i in range(min(max_leads, len(leads)))})
  columns = [f"{name} RMSE" for name in results]
  has_acc = "acc" in first["metric"].values
  if has_acc:
    columns.append(f"{forecast_name} ACC")
  rows = []
  for label, variable, level in headline_channels(first):
    for index in picked:
      cells = [f"{value(result, 'rmse', variable, level)[index]:.4g}"
               if variable in result else "-" for result in results.values()]
      if has_acc:
        cells.append(f"{value(first, 'acc', variable, level)[index]:.3f}")
      rows.append([label, lead_label(leads[index]), *cells])
  header = ["channel", "lead", *columns]
  widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
  lines = ["  ".join(str(cell).rjust(width) for cell, width in zip(row, widths))
           for row in [header, *rows]]
  return "\n".join(lines)


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
