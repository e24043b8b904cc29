"""Forcings computed from time and position.

Channels (`variables.FORCING_CHANNELS`; a config uses a subset, `data.forcings`):
  * toa_incident_solar_radiation: INSTANTANEOUS top-of-atmosphere irradiance
    at the given time divided by the solar constant, so in [0, ~1.034]:
    `(1 + 0.033 cos(2 pi doy / 365)) * max(0, cos(zenith))`, with the zenith
    from the solar declination (Cooper's formula) and the hour angle of local
    mean solar time (no equation of time: errors < ~4 deg of hour angle).
    A cheap proxy for training. ERA5's field (and so GraphCast's input) is
    the 1-hour integral ending at the time, in J m^-2: a config that wants it
    reads it from the store (`data.stored_forcings`) instead.
  * day_progress_sin/cos: sin/cos of 2 pi x the local mean solar time as a
    fraction of the day (UTC time of day shifted by longitude / 360 days).
  * year_progress_sin/cos: sin/cos of 2 pi x the fraction of the year, years
    counted from 1970-01-01 in tropical years of 365.24219 days.
Both progresses are GraphCast's (`graphcast.data_utils`): computed in float64
from whole seconds since 1970, rounded to float32, then sin/cos in float32.

Global forcings (`GLOBAL_FORCINGS`, chosen by `data.global_forcings`) have no
position: one value per time, `[num_times, F]`, which the model broadcasts to
every grid and mesh node (WeatherNext 2 feeds its year progress this way).
"""

from __future__ import annotations

import numpy as np

from wnscale.data import variables as variables_lib

SECONDS_PER_DAY = 86400
DAYS_PER_YEAR = 365.24219  # the tropical year, as GraphCast counts it
OBLIQUITY_DEG = 23.44


def compute_forcings(times, points, names=variables_lib.FORCING_CHANNELS,
                     given: dict | None = None) -> np.ndarray:
  """Forcings on a grid's points.

  Args:
    times: `[num_times]` datetime64.
    points: the grid nodes (`graphs.points.PointSet`).
    names: the channels, from `variables.FORCING_CHANNELS`, in output order.
    given: `{name: [num_times, num_points]}` values to use instead of
      computing them (e.g. read from a store).

  Returns:
    `[num_times, len(names), num_points]` float32, in the points' order.
  """
  given = given or {}
  seconds = np.asarray(times).astype("datetime64[s]").astype(np.int64)
  latitude, longitude = spatial_axes(points)
  space = np.broadcast_shapes(latitude.shape, longitude.shape)
  out = np.empty((seconds.size, len(names)) + space, np.float32)
  for channel, name in enumerate(names):
    if name in given:
      out[:, channel] = np.asarray(given[name]).reshape((seconds.size,) + space)
    elif name == "toa_incident_solar_radiation":
      out[:, channel] = _solar_radiation(times, seconds, latitude, longitude)
    elif name.startswith("day_progress_"):
      phase = day_progress(seconds, longitude) * (2 * np.pi)  # float32, [time, *lon]
      out[:, channel] = _sin_or_cos(name, phase)
    elif name.startswith("year_progress_"):
      phase = year_progress(seconds) * (2 * np.pi)  # float32, [time]
      out[:, channel] = _sin_or_cos(name, phase).reshape((-1,) + (1,) * len(space))
    else:
      raise ValueError(f"Unknown forcing {name!r}; known: {variables_lib.FORCING_CHANNELS}")
  return out.reshape(seconds.size, len(names), points.size)


def spatial_axes(points) -> tuple[np.ndarray, np.ndarray]:
  """`(latitude, longitude)` degrees that broadcast to the points' field: a regular grid's
  axes as `[num_lat, 1]` and `[1, num_lon]` (what depends on one of them is computed once
  per row or column), other points' `[n]` each."""
  if points.field_shape is None:
    return points.latitude, points.longitude
  latitude, longitude = points.axes()
  return latitude[:, None], longitude[None]


# Forcings that have one value per time (no position), usable as global forcings.
GLOBAL_FORCINGS = ("year_progress_sin", "year_progress_cos")


def compute_global_forcings(times, names) -> np.ndarray:
  """`[num_times, len(names)]` float32 global forcings (`GLOBAL_FORCINGS`) at `times`."""
  seconds = np.asarray(times).astype("datetime64[s]").astype(np.int64)
  phase = year_progress(seconds) * (2 * np.pi)
  return np.stack([_sin_or_cos(name, phase) for name in names], axis=-1).reshape(
      seconds.size, len(names)).astype(np.float32)


def year_progress(seconds: np.ndarray) -> np.ndarray:
  """`[num_times]` float32 in [0, 1): the fraction of the (tropical) year."""
  return np.mod(seconds / SECONDS_PER_DAY / np.float64(DAYS_PER_YEAR), 1.0).astype(np.float32)


def day_progress(seconds: np.ndarray, longitude) -> np.ndarray:
  """`[num_times, *longitude.shape]` float32 in [0, 1): the fraction of the local mean
  solar day."""
  greenwich = np.mod(seconds, SECONDS_PER_DAY) / SECONDS_PER_DAY
  offset = np.deg2rad(np.asarray(longitude)) / (2 * np.pi)
  return np.mod(greenwich.reshape((-1,) + (1,) * offset.ndim) + offset[None],
                1.0).astype(np.float32)


def _sin_or_cos(name: str, phase: np.ndarray) -> np.ndarray:
  return np.sin(phase) if name.endswith("_sin") else np.cos(phase)


def _solar_radiation(times, seconds, latitude, longitude) -> np.ndarray:
  """`[num_times, *space]` instantaneous TOA irradiance / solar constant, of
  `spatial_axes`' latitude and longitude."""
  lat = np.deg2rad(np.asarray(latitude, np.float64))[None]
  longitude = np.asarray(longitude, np.float64)
  day_angle = 2 * np.pi * np.mod(
      np.mod(seconds, SECONDS_PER_DAY).reshape((-1,) + (1,) * longitude.ndim)
      / SECONDS_PER_DAY + longitude[None] / 360.0, 1.0)  # [time, *longitude.shape]
  day_of_year = _day_of_year(times)
  declination = np.deg2rad(OBLIQUITY_DEG) * np.sin(
      2 * np.pi * (285 + day_of_year) / 365)  # [time]; 1-based day
  # Earth-sun distance factor: ~3.3 % more sunlight in early January.
  distance = 1 + 0.033 * np.cos(2 * np.pi * day_of_year / 365)
  hour_angle = day_angle - np.pi  # 0 at local noon
  per_time = (-1,) + (1,) * np.ndim(latitude)  # a time's value, broadcast over space
  cos_zenith = (np.sin(lat) * np.sin(declination).reshape(per_time)
                + np.cos(lat) * np.cos(declination).reshape(per_time)
                * np.cos(hour_angle))  # [time, *space]
  return distance.reshape(per_time) * np.maximum(cos_zenith, 0.0)


def _day_of_year(times) -> np.ndarray:
  """`[num_times]` float day of year, 0 at Jan 1 00 UTC."""
  times = np.asarray(times).astype("datetime64[s]")
  year_start = times.astype("datetime64[Y]").astype("datetime64[s]")
  return (times - year_start).astype(np.float64) / SECONDS_PER_DAY
