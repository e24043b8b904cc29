"""ERA5 files written the way the Climate Data Store writes them, by the formats' own libraries:
GRIB 1 and 2 by ecCodes (ERA5's keys: centre ecmf, short names, isobaricInhPa or surface
levels, accumulations as forecast steps from 06 and 18 UTC), netCDF4 in the current CDS layout
by h5netcdf and netCDF3 in the older one (values packed as int16, as it delivered them) by scipy.

The fields are smooth functions of time, level, latitude and longitude (`field`), so a test
can recompute what any file holds.
"""

from __future__ import annotations

import eccodes
import numpy as np
import pandas as pd
import xarray as xr

# The 5.625 deg grid of WeatherBench2's coarsest store (no pole rows), north to south, as
# the CDS delivers latitudes.
LATITUDE = np.arange(87.1875, -90, -5.625)
LONGITUDE = np.arange(0, 360, 5.625)
UNITS = {"t": "K", "z": "m**2 s**-2", "u": "m s**-1", "v": "m s**-1", "q": "kg kg**-1",
         "2t": "K", "msl": "Pa", "10u": "m s**-1", "10v": "m s**-1", "tp": "m",
         "tisr": "J m**-2", "lsm": "(0 - 1)", "sp": "Pa"}
_BASES = {"t": 250.0, "z": 50000.0, "u": 5.0, "v": 0.0, "q": 0.005, "2t": 280.0,
          "msl": 101000.0, "10u": 3.0, "10v": 0.0, "tp": 0.001, "tisr": 1e6, "lsm": 0.5,
          "sp": 98000.0}
# cfgrib's and the CDS netCDF's variable names for the short names that start with a digit.
NETCDF_NAMES = {"2t": "t2m", "10u": "u10", "10v": "v10"}


def field(short_name: str, time, level: int = 0, member: int = 0) -> np.ndarray:
  """`[lat, lon]` float64 values of one variable at one time (and level, member)."""
  hours = (pd.Timestamp(time) - pd.Timestamp("2020-01-01")) / pd.Timedelta(hours=1)
  lat = np.deg2rad(LATITUDE)[:, None]
  lon = np.deg2rad(LONGITUDE)[None]
  wave = np.cos(lat) * np.sin(lon + 0.1 * hours + 0.01 * level) + 0.1 * member
  base = _BASES[short_name] * (1 + level / 5000)
  if short_name == "tp":  # hourly accumulations: positive
    return base * (1.5 + wave) / 10
  if short_name == "lsm":
    return (wave > 0).astype(np.float64)
  return base + abs(_BASES[short_name] or 1) * 0.05 * wave


def write_grib(path, messages, edition: int = 1):
  """Writes `(short_name, level or None, valid time)` messages as ERA5's GRIB has them.

  Accumulated `tp` is written as ERA5 holds it: a forecast from 06 or 18 UTC with a step of
  1..12 hours ending at the valid time.
  """
  with open(path, "wb") as out:
    for short_name, level, valid in messages:
      valid = pd.Timestamp(valid)
      sample = f"regular_ll_{'pl' if level else 'sfc'}_grib{edition}"
      handle = eccodes.codes_grib_new_from_samples(sample)
      try:
        keys = {"centre": "ecmf", "Ni": len(LONGITUDE), "Nj": len(LATITUDE),
                "latitudeOfFirstGridPointInDegrees": LATITUDE[0],
                "latitudeOfLastGridPointInDegrees": LATITUDE[-1],
                "longitudeOfFirstGridPointInDegrees": LONGITUDE[0],
                "longitudeOfLastGridPointInDegrees": LONGITUDE[-1],
                "iDirectionIncrementInDegrees": 5.625, "jDirectionIncrementInDegrees": 5.625,
                "typeOfLevel": "isobaricInhPa" if level else "surface",
                "level": level or 0}
        if short_name == "tp":
          base = (valid - pd.Timedelta(hours=1)).floor("12h") + pd.Timedelta(hours=6)
          if base >= valid:
            base -= pd.Timedelta(hours=12)
          step = int((valid - base) / pd.Timedelta(hours=1))
          keys.update(dataDate=int(base.strftime("%Y%m%d")), dataTime=base.hour * 100,
                      stepType="accum", startStep=step - 1, endStep=step)
        else:
          keys.update(dataDate=int(valid.strftime("%Y%m%d")), dataTime=valid.hour * 100)
        for key, value in keys.items():
          eccodes.codes_set(handle, key, value)
        eccodes.codes_set(handle, "shortName", short_name)
        eccodes.codes_set_values(handle, field(short_name, valid, level or 0).ravel())
        eccodes.codes_write(handle, out)
      finally:
        eccodes.codes_release(handle)


def read_grib_values(path) -> dict:
  """`{(shortName, level, valid time): [lat, lon]}` decoded by ecCodes itself."""
  values = {}
  with open(path, "rb") as f:
    while (handle := eccodes.codes_grib_new_from_file(f)) is not None:
      try:
        base = pd.Timestamp(str(eccodes.codes_get(handle, "validityDate"))) + pd.Timedelta(
            hours=eccodes.codes_get(handle, "validityTime") // 100)
        key = (eccodes.codes_get(handle, "shortName"), eccodes.codes_get(handle, "level"),
               base)
        values[key] = eccodes.codes_get_values(handle).reshape(len(LATITUDE), len(LONGITUDE))
      finally:
        eccodes.codes_release(handle)
  return values


def current_netcdf(short_names, times, levels=(), members=None) -> xr.Dataset:
  """The CDS's netCDF layout since 2024: `valid_time`, `pressure_level`, short names, a
  scalar `number` (or `number` along a dim for EDA members) and an `expver` coordinate."""
  times = pd.DatetimeIndex(times)
  number = [0] if members is None else list(range(members))
  data = {}
  for short_name in short_names:
    if levels:
      values = np.array([[[field(short_name, t, lev, m) for lev in levels] for t in times]
                         for m in number])
      dims = ("number", "valid_time", "pressure_level", "latitude", "longitude")
    else:
      values = np.array([[field(short_name, t, 0, m) for t in times] for m in number])
      dims = ("number", "valid_time", "latitude", "longitude")
    variable = xr.Variable(dims, values.astype(np.float32),
                           {"units": UNITS[short_name], "GRIB_shortName": short_name})
    data[NETCDF_NAMES.get(short_name, short_name)] = variable if members else variable[0]
  coords = {"valid_time": times, "latitude": LATITUDE, "longitude": LONGITUDE,
            "expver": ("valid_time", np.array(["0001"] * len(times), dtype=object))}
  if levels:
    coords["pressure_level"] = np.asarray(levels, np.float64)
  coords["number"] = ("number", number) if members else 0
  return xr.Dataset(data, coords=coords, attrs={"GRIB_centre": "ecmf",
                                                "Conventions": "CF-1.7"})


def older_netcdf(short_names, times, levels=()) -> tuple[xr.Dataset, dict]:
  """The CDS's older netCDF layout: `time`, `level` (int32), longitude -180..180 here, and
  the values packed as int16 with `scale_factor`/`add_offset` (the encoding to write with)."""
  dataset = current_netcdf(short_names, times, levels).drop_vars(["expver", "number"])
  dataset = dataset.rename({"valid_time": "time"})
  if levels:
    dataset = dataset.rename({"pressure_level": "level"}).assign_coords(
        level=np.asarray(levels, np.int32))
  dataset = dataset.assign_coords(longitude=((dataset.longitude + 180) % 360) - 180)
  dataset = dataset.sortby("longitude")
  encoding = {}
  for name, variable in dataset.data_vars.items():
    low, high = float(variable.min()), float(variable.max())
    scale = (high - low) / 65000 or 1.0
    encoding[name] = {"dtype": "int16", "scale_factor": scale,
                      "add_offset": (high + low) / 2, "_FillValue": -32767}
  return dataset, encoding
