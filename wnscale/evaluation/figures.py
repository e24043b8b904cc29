"""PNG figures of an evaluation (matplotlib, no display and no map data needed).

  * `plot_scores`: RMSE and ACC against lead time for the headline channels,
    every scored forecast (model, persistence, climatology, baseline) on the
    same axes;
  * `plot_map`: forecast, truth and their difference for one channel, one
    initial time and lead time, on the latitude-longitude grid, or on a point
    set's points (triangulated on longitude and latitude);
  * `plot_station_rmse`: RMSE against lead time at stations, the station forecast and
    the grid forecast interpolated there on the same axes, one panel per variable;
  * `plot_scorecard`: the relative RMSE difference of the model against a
    baseline per channel and lead time (blue: the model is better).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr
from matplotlib import tri
from matplotlib.figure import Figure

from wnscale.data import variables as variables_lib
from wnscale.evaluation import results as results_lib
from wnscale.evaluation.datasets import channel_names

STYLES = {"forecast": dict(color="tab:blue", lw=2),
          "baseline": dict(color="tab:orange", lw=2),
          "persistence": dict(color="0.35", ls="--"),
          "climatology": dict(color="0.35", ls=":")}
_DPI = 110
# A point map repeats the points this many degrees of longitude past 0 and 360, so that its
# triangles cross the date line's edges of the plot.
_WRAP_DEGREES = 30.0


def units(variable: str) -> str:
  return variables_lib.lookup(variable).units


def _lead_axis(result: xr.Dataset):
  """`(x values, axis label)` of the lead times: days, or hours for short forecasts."""
  leads = pd.TimedeltaIndex(result[results_lib.RESULTS_LEAD].values)
  if leads.max() >= pd.Timedelta(days=2):
    return leads / pd.Timedelta(days=1), "lead time (days)"
  return leads / pd.Timedelta(hours=1), "lead time (hours)"


def plot_scores(results: dict[str, xr.Dataset], path: str, title: str = ""):
  """RMSE (and ACC, where scored) against lead time, one row per headline channel.

  An ensemble forecast adds its CRPS (against the others' MAE: their CRPS)
  and its spread/skill ratio.
  """
  model = results["forecast"]
  channels = results_lib.headline_channels(model)
  scored = model["metric"].values
  columns = ["rmse"] + (["acc"] if "acc" in scored else [])
  if "spread_skill" in scored:
    columns += ["crps", "spread_skill"]
  figure = Figure(figsize=(4.2 * len(columns), 2.8 * len(channels)), dpi=_DPI,
                  layout="constrained")
  axes = figure.subplots(len(channels), len(columns), squeeze=False)
  x, xlabel = _lead_axis(model)
  for row, (label, variable, level) in enumerate(channels):
    for column, metric in enumerate(columns):
      ax = axes[row, column]
      for name, result in results.items():
        if variable not in result or metric not in result["metric"].values:
          continue
        y = results_lib.value(result, metric, variable, level)
        if np.isfinite(y).any():  # the climatology's ACC is undefined (zero anomaly)
          ax.plot(x, y, marker="o", ms=3, label=name, **STYLES.get(name, {}))
      unit = f" ({units(variable)})" if metric in ("rmse", "crps") else ""
      ax.set_title(f"{label}: {metric.upper()}{unit}", fontsize=10)
      ax.set_xlabel(xlabel)
      ax.grid(alpha=0.3)
  axes[0, 0].legend(fontsize=8)
  if title:
    figure.suptitle(title, fontsize=10)
  figure.savefig(path)


def plot_station_rmse(results: dict[str, xr.Dataset], path: str, title: str = ""):
  """RMSE against lead time of every scored forecast (`evaluation.stations`' results),
  one panel per variable; the first result's styled as the model, the next as a baseline."""
  first = next(iter(results.values()))
  variables = list(first.data_vars)
  figure = Figure(figsize=(4.6 * len(variables), 3.2), dpi=_DPI, layout="constrained")
  axes = figure.subplots(1, len(variables), squeeze=False)[0]
  x, xlabel = _lead_axis(first)
  for ax, variable in zip(axes, variables):
    for (name, result), style in zip(results.items(), (STYLES["forecast"], STYLES["baseline"])):
      ax.plot(x, results_lib.value(result, "rmse", variable, None), marker="o", ms=3,
              label=name, **style)
    ax.set_title(f"{variable}: RMSE ({units(variable)})", fontsize=10)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  if title:
    figure.suptitle(title, fontsize=10)
  figure.savefig(path)


def plot_map(latitude, longitude, forecast: np.ndarray, truth: np.ndarray, title: str,
             units: str, path: str):
  """Forecast, truth and forecast - truth, each `[num_lat, num_lon]` on a regular grid of
  `latitude [num_lat]` (ascending) x `longitude [num_lon]`, or `[points]` at the points
  `latitude`, `longitude` `[points]` (same shape as the fields)."""
  figure = Figure(figsize=(15, 3.4), dpi=_DPI, layout="constrained")
  axes = figure.subplots(1, 3)
  low = np.nanmin([np.nanmin(forecast), np.nanmin(truth)])
  high = np.nanmax([np.nanmax(forecast), np.nanmax(truth)])
  error = forecast - truth
  limit = float(np.nanmax(np.abs(error))) or 1.0
  panels = [("forecast", forecast, dict(cmap="viridis", vmin=low, vmax=high)),
            ("truth", truth, dict(cmap="viridis", vmin=low, vmax=high)),
            ("forecast - truth", error, dict(cmap="RdBu_r", vmin=-limit, vmax=limit))]
  draw = (_points_drawer if np.ndim(forecast) == 1 else _grid_drawer)(latitude, longitude)
  for ax, (name, values, style) in zip(axes, panels):
    image = draw(ax, values, style)
    ax.set_title(name, fontsize=10)
    ax.set_xlabel("longitude")
    figure.colorbar(image, ax=ax, shrink=0.8, label=units)
  axes[0].set_ylabel("latitude")
  figure.suptitle(title, fontsize=10)
  figure.savefig(path)


def _grid_drawer(latitude, longitude):
  """`draw(ax, values [num_lat, num_lon], style) -> image` of a regular grid's cells."""
  # Cell edges half a spacing beyond the first and last rows and columns.
  extent = [longitude[0] - (longitude[1] - longitude[0]) / 2,
            longitude[-1] + (longitude[-1] - longitude[-2]) / 2,
            latitude[0] - (latitude[1] - latitude[0]) / 2,
            latitude[-1] + (latitude[-1] - latitude[-2]) / 2]
  return lambda ax, values, style: ax.imshow(values, origin="lower", extent=extent,
                                             interpolation="nearest", **style)


def _points_drawer(latitude, longitude):
  """`draw(ax, values [points], style) -> image`: the values at the points, interpolated
  on the Delaunay triangles of (longitude, latitude), repeated past 0 and 360 deg."""
  longitude = np.mod(longitude, 360.0)
  east, west = longitude < _WRAP_DEGREES, longitude > 360.0 - _WRAP_DEGREES
  index = np.concatenate([np.arange(longitude.size), np.flatnonzero(east),
                          np.flatnonzero(west)])
  triangles = tri.Triangulation(
      np.concatenate([longitude, longitude[east] + 360.0, longitude[west] - 360.0]),
      latitude[index])

  def draw(ax, values, style):
    image = ax.tripcolor(triangles, values[index], shading="gouraud", **style)
    ax.set_xlim(0.0, 360.0)
    ax.set_ylim(-90.0, 90.0)
    return image

  return draw


def plot_scorecard(model: xr.Dataset, baseline: xr.Dataset, path: str,
                   names=("forecast", "baseline")):
  """100 x (RMSE model - RMSE baseline) / RMSE baseline per channel (rows) and lead (columns)."""
  channels = [entry for entry in channel_names(model) if entry[1] in baseline]
  rows = [(results_lib.value(model, "rmse", variable, level)
           - results_lib.value(baseline, "rmse", variable, level))
          / results_lib.value(baseline, "rmse", variable, level) * 100
          for _, variable, level in channels]
  table = np.array(rows)
  x, xlabel = _lead_axis(model)
  figure = Figure(figsize=(max(6.0, 2.8 + 0.45 * len(x)), 1.4 + 0.32 * len(channels)),
                  dpi=_DPI, layout="constrained")
  ax = figure.subplots()
  limit = float(np.nanmax(np.abs(table))) if np.isfinite(table).any() else 1.0
  image = ax.imshow(table, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto")
  ax.set_yticks(range(len(channels)), [channel for channel, _, _ in channels], fontsize=8)
  ax.set_xticks(range(len(x)), [f"{v:g}" for v in x], fontsize=8)
  ax.set_xlabel(xlabel)
  for (i, j), v in np.ndenumerate(table):
    if np.isfinite(v):
      ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=6,
              color="white" if abs(v) > limit / 2 else "black")
  figure.colorbar(image, ax=ax, label="RMSE difference (%)")
  ax.set_title(f"RMSE of {names[0]} relative to {names[1]}\n(negative: {names[0]} better)",
               fontsize=9)
  figure.savefig(path)
