"""ERA5 files as the Climate Data Store delivers them, opened in WeatherBench2's conventions.

The CDS delivers GRIB (editions 1 and 2; read with cfgrib/ecCodes) or netCDF in one
of two layouts:
  * the current one (netCDF4, since 2024): `valid_time`, `pressure_level`, ECMWF
    short names (`t`, `z`, `t2m`, `u10`, ...), a scalar `number` and an `expver`
    coordinate;
  * the older one: `time`, `level` (or cfgrib's `isobaricInhPa`).
`open_era5_file` turns any of them into a dataset with dims `time`, `level` (hPa,
integers, ascending), `latitude` (the source's order), `longitude` (0..360,
ascending), WeatherBench2's variable names (`variables.ECMWF_NAMES`; a short name the table
lacks keeps its own name, with a warning) and the source's `units`. Data stays
lazy, in the source's dtype: only what a caller selects is read. Variables of a local
netCDF4 file that are indexed and stored as in the file are marked for reading straight
from HDF5 (`hdf5_reads`).
"""

from __future__ import annotations

import logging

import numpy as np
import xarray as xr

from wnscale import paths
from wnscale.data import netcdf
from wnscale.data.making import hdf5_reads
from wnscale.data.variables import ECMWF_NAMES, SURFACE_GEOPOTENTIAL
from wnscale.errors import ArgumentError, UserError

# Names of the dims and coordinates in the layouts above -> WeatherBench2's.
_DIMS = {"valid_time": "time", "pressure_level": "level", "isobaricInhPa": "level",
         "lat": "latitude", "lon": "longitude"}
# Scalar or bookkeeping coordinates of the CDS's files, never data.
_DROPPED = ("expver", "step", "surface", "heightAboveGround", "meanSea", "entireAtmosphere",
            "nominalTop", "depthBelowLandLayer", "forecast_reference_time")
MEMBER = "number"


def open_era5_file(path: str, member: int | None = None) -> xr.Dataset:
  """One CDS file (GRIB or netCDF, local or a URL) in WeatherBench2's conventions, lazy.

  Args:
    member: the ensemble member to keep, for a file holding members along `number`
      (ERA5's EDA); a file without members ignores it.

  Raises:
    UserError: the file is neither GRIB nor netCDF.
    ArgumentError: of `member`: the file holds members and `member` is None (or not
      among them).
  """
  path = paths.normalize(path)
  if not paths.exists(path):
    raise UserError(f"No such file: {path}")
  with paths.as_epath(path).open("rb") as file:
    head = file.read(netcdf.HEAD_BYTES)
  hdf5 = False
  if head[:4] == b"GRIB":
    dataset = _open_grib(path)
  else:
    netcdf_format = netcdf.format_of(head, path)  # a UserError if not netCDF
    engine = netcdf.ENGINES[netcdf_format]
    hdf5 = netcdf_format == netcdf.NETCDF4 and not paths.is_url(path)
    with paths.local_copy(path) as local:  # a local file stays lazy; a URL's copy is loaded
      # cache=False: a block's selection reads only that block (xarray's cache would read
      # and keep a whole variable at its first access).
      dataset = xr.open_dataset(local, engine=engine, chunks=None, cache=False)
      if paths.is_url(path):
        dataset = dataset.load()
  return _normalized(dataset, path, member, hdf5)


def _open_grib(path: str) -> xr.Dataset:
  """A GRIB file as one dataset, indexed by valid time (cfgrib splits files by level type)."""
  import cfgrib  # noqa: PLC0415 (only conversions of GRIB need ecCodes)
  with paths.local_copy(path) as local:  # a local file stays lazy; a URL's copy is loaded
    parts = cfgrib.open_datasets(local, cache=False, backend_kwargs={"indexpath": "",
                                                        "time_dims": ("valid_time",)})
    if paths.is_url(path):
      parts = [part.load() for part in parts]
  if not parts:
    raise UserError(f"{path} holds no GRIB message cfgrib can read")
  merged = []
  for part in parts:
    # cfgrib names `z` at the surface as at pressure levels: tell them apart here.
    if "z" in part.data_vars and "isobaricInhPa" not in part.dims:
      part = part.rename({"z": SURFACE_GEOPOTENTIAL})
    merged.append(part.drop_vars([c for c in _DROPPED if c in part.coords]))
  return xr.merge(merged, compat="override", join="outer")


def _normalized(dataset: xr.Dataset, path: str, member: int | None,
                hdf5: bool) -> xr.Dataset:
  """`dataset` in WeatherBench2's conventions; `hdf5`: it is a local netCDF4 file's, whose
  variables still indexed as stored at the end are marked for direct reads."""
  dataset = dataset.rename({name: new for name, new in _DIMS.items()
                            if name in dataset.dims or name in dataset.coords})
  if "time" not in dataset.dims and "time" in dataset.coords and "valid_time" in dataset.coords:
    dataset = dataset.drop_vars("time")  # a scalar forecast time beside the valid time
  # Whether every variable is still indexed as in the file (no member selected, no time
  # dim added, no dim sorted other than reversed).
  as_stored = MEMBER not in dataset.dims and "time" in dataset.dims
  reversed_dims = ()  # dims indexed in the file's order reversed (still read straight)
  dataset = _one_member(dataset, path, member)
  dataset = dataset.drop_vars([c for c in _DROPPED if c in dataset.coords])
  if "time" not in dataset.dims:
    if "time" in dataset.coords:  # a single time: a dim of one
      dataset = dataset.expand_dims("time")
  renamed = {}
  for name, variable in dataset.data_vars.items():
    short = variable.attrs.get("GRIB_shortName", name)
    if name == SURFACE_GEOPOTENTIAL:
      continue
    if short == "z" and "level" not in variable.dims:
      renamed[name] = SURFACE_GEOPOTENTIAL
    elif name in ECMWF_NAMES or short in ECMWF_NAMES:
      renamed[name] = ECMWF_NAMES.get(name, ECMWF_NAMES.get(short))
    else:
      logging.warning("%s: variable %r is not in the ERA5 -> WeatherBench2 name table; kept "
                      "under its own name.", path, name)
  dataset = dataset.rename(renamed)
  if "level" in dataset.dims:
    # Through a dropped index: assigning float levels' index int values directly makes
    # xarray compare (read) the data.
    levels = dataset["level"].values.astype(np.int64)
    dataset = dataset.drop_indexes("level").assign_coords(level=levels).set_xindex("level")
    steps = np.diff(dataset["level"].values)
    if np.all(steps < 0) and steps.size:  # descending, as the CDS writes them: a reversal
      dataset, reversed_dims = dataset.sortby("level"), ("level",)
    elif np.any(steps < 0):
      dataset, as_stored = dataset.sortby("level"), False
  longitude = dataset["longitude"].values % 360
  dataset = dataset.assign_coords(longitude=longitude)
  if np.any(np.diff(longitude) < 0):
    dataset, as_stored = dataset.sortby("longitude"), False
  if hdf5 and as_stored:
    hdf5_reads.mark(dataset, path, {new: old for old, new in renamed.items()}, reversed_dims)
  dataset.attrs["source"] = path  # data stay lazy and in the source's dtype: read as float32
  return dataset


def _one_member(dataset: xr.Dataset, path: str, member: int | None) -> xr.Dataset:
  if MEMBER not in dataset.coords:
    return dataset
  if MEMBER not in dataset.dims:  # a scalar `number`: one member, nothing to choose
    return dataset.drop_vars(MEMBER)
  members = [int(m) for m in dataset[MEMBER].values]
  if member is None:
    raise ArgumentError("member", None, f"is required: {path} holds ensemble members "
                        f"{members} along 'number'; choose one with `member=N`.")
  if member not in members:
    raise ArgumentError("member", member, f"{path} has no such member; it holds {members}.")
  return dataset.sel({MEMBER: member}, drop=True)
