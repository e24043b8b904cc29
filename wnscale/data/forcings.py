"""Forcings computed from time and position, never read from a store.

Channels, in `variables.FORCING_CHANNELS` order:
  * toa_incident_solar_radiation: INSTANTANEOUS top-of-atmosphere irradiance
    at the given time divided by the solar constant, so in [0, ~1.034]:
    `(1 + 0.033 cos(2 pi doy / 365)) * max(0, cos(zenith))`, with the zenith
    from the solar declination (Cooper's formula) and the hour angle of local
    mean solar time (no equation of time: errors < ~4 deg of hour angle).
    ERA5's field is the 1-hour integral ending at the time; the instantaneous
    value is a close, cheaper proxy for training.
  * sin/cos of day progress: local mean solar time, i.e. UTC time of day
    shifted by longitude / 15 hours, as a fraction of the day.
  * sin/cos of year progress: seconds since 1970-01-01 over the mean Julian
    year (365.25 days). (GraphCast divides by the tropical year, 365.24219
    days, instead: by 2020 the two differ by ~0.4 days of year progress.)

Global forcings (`GLOBAL_FORCINGS`, chosen by `data.global_forcings`) have no
position: one value per time, `[num_times, F]`, which the model broadcasts to
every grid and mesh node (WeatherNext 2 feeds its year progress this way).
"""

from __future__ import annotations

import numpy as np

from wnscale.data import variables as variables_lib

SECONDS_PER_DAY = 86400.0
SECONDS_PER_YEAR = 365.25 * SECONDS_PER_DAY
OBLIQUITY_DEG = 23.44


def _seconds_since_1970(times) -> np.ndarray:
  return (np.asarray(times).astype("datetime64[s]") -
          np.datetime64("1970-01-01T00:00:00", "s")).astype(np.float64)


def _year_angle(seconds: np.ndarray) -> np.ndarray:
  return 2 * np.pi * np.mod(seconds / SECONDS_PER_YEAR, 1.0)


# Name -> its value at each time, from `[num_times]` seconds since 1970.
GLOBAL_FORCINGS = {
    "sin_year_progress": lambda seconds: np.sin(_year_angle(seconds)),
    "cos_year_progress": lambda seconds: np.cos(_year_angle(seconds)),
}


def compute_global_forcings(times, names) -> np.ndarray:
  """`[num_times, len(names)]` float32 global forcings (`GLOBAL_FORCINGS`) at `times`."""
  seconds = _seconds_since_1970(times)
  out = np.empty((len(seconds), len(names)), np.float32)
  for column, name in enumerate(names):
    out[:, column] = GLOBAL_FORCINGS[name](seconds)
  return out


def compute_forcings(times, latitude, longitude) -> np.ndarray:
  """Forcings on the flattened grid.

  Args:
    times: `[num_times]` datetime64.
    latitude: `[num_lat]` degrees (ascending in wnscale).
    longitude: `[num_lon]` degrees.

  Returns:
    `[num_times, 5, num_lat * num_lon]` float32, channels in
    `variables.FORCING_CHANNELS` order, grid flattened latitude-major.
  """
  seconds = _seconds_since_1970(times)
  lat = np.deg2rad(np.asarray(latitude, np.float64))
  lon = np.asarray(longitude, np.float64)
  num_times, num_lat, num_lon = seconds.size, lat.size, lon.size

  # [time, lon]: fraction of the local solar day.
  day_progress = np.mod(
      np.mod(seconds, SECONDS_PER_DAY)[:, None] / SECONDS_PER_DAY +
      lon[None] / 360.0, 1.0)
  day_angle = 2 * np.pi * day_progress
  year_angle = _year_angle(seconds)  # [time]

  day_of_year = _day_of_year(times)
  declination = np.deg2rad(OBLIQUITY_DEG) * np.sin(
      2 * np.pi * (285 + day_of_year) / 365)  # [time]; 1-based day
  # Earth-sun distance factor: ~3.3 % more sunlight in early January.
  distance = 1 + 0.033 * np.cos(2 * np.pi * day_of_year / 365)
  hour_angle = day_angle - np.pi  # 0 at local noon
  cos_zenith = (np.sin(lat)[None, :, None] * np.sin(declination)[:, None, None]
                + np.cos(lat)[None, :, None] * np.cos(declination)[:, None, None]
                * np.cos(hour_angle)[:, None, :])  # [time, lat, lon]
  toa = distance[:, None, None] * np.maximum(cos_zenith, 0.0)

  out = np.empty((num_times, len(variables_lib.FORCING_CHANNELS), num_lat, num_lon),
                 np.float32)
  out[:, 0] = toa
  out[:, 1] = np.sin(day_angle)[:, None, :]
  out[:, 2] = np.cos(day_angle)[:, None, :]
  out[:, 3] = np.sin(year_angle)[:, None, None]
  out[:, 4] = np.cos(year_angle)[:, None, None]
  return out.reshape(num_times, len(variables_lib.FORCING_CHANNELS), num_lat * num_lon)


def _day_of_year(times) -> np.ndarray:
  """`[num_times]` float day of year, 0 at Jan 1 00 UTC."""
  times = np.asarray(times).astype("datetime64[s]")
  year_start = times.astype("datetime64[Y]").astype("datetime64[s]")
  return (times - year_start).astype(np.float64) / SECONDS_PER_DAY
