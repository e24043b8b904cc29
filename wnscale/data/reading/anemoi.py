"""Reads anemoi-datasets stores: all fields in one array `data [dates, variables, ensembles,
values]`.

The layout, from anemoi-datasets' documentation and the stores its `create` writes: a
zarr v2 group holding the arrays
  * `data` `[dates, variables, ensembles, values]` float32 (a missing date's slots are
    never written: they read as NaN);
  * `dates` `[dates]` datetime64, every `frequency`, missing dates included;
  * `latitudes`, `longitudes` `[values]` degrees, the grid flattened (`field_shape`);
  * `mean`, `stdev`, `minimum`, `maximum` `[variables]`, the statistics over the dates
    `statistics_start_date .. statistics_end_date`, and, where the recipe asked for them,
    `statistics_tendencies_{delta}_{mean,stdev,minimum,maximum}`, those of
    `x(t + delta) - x(t)`;
and the attributes `variables` (the names along `data`'s axis 1), `frequency` ("6h", "1d",
or hours), `field_shape`, `constant_fields`, `missing_dates` (ISO dates), `resolution`
(e.g. "O96", or null), `start_date`, `end_date`, `variables_metadata` and others.

Names: a variable is `{param}_{level}` (a pressure level in hPa) or `{param}`. `param` is
an ECMWF short name (`t_850`, `2t`, `msl`, `lsm`; `z` without a level is the surface
geopotential), as stores built from MARS have them, or a long name (`temperature_850`,
`2m_temperature`), as stores built from netCDF have them; both map to the catalogue's
names and levels (`variables.ECMWF_NAMES`). The land-sea mask and the surface
geopotential are statics whether or not `constant_fields` lists them. A variable the
catalogue lacks, or on other than pressure levels (`variables_metadata`' MARS `levtype`),
is kept under its own name (`AnemoiStore.unknown`, logged) and read like a surface one.
A netCDF source whose upper-air fields are one variable per level (`temperature_500`,
with no level dimension) is recorded by anemoi-datasets with `levtype: sfc`, no
`levelist`, and the whole name as `param`: a long catalogue name of an upper-air
variable with a level in its name and no `levelist` is read as that variable on that
pressure level (`tests/fixtures/anemoi_levels`).

`open_anemoi` reads the attributes and the small arrays, and opens `data` once through
tensorstore; `AnemoiStore.view` is an index transform of it in wnscale's internal order
for one ensemble member. `anemoi_statistics` turns the store's statistics into
wnscale's normalization format. The format (`FORMAT`, an entry of `store_formats.FORMATS`)
opens a store with `open_weather_store` (for training) and `open_as_dataset` (an xarray
Dataset).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re

import numpy as np
import tensorstore as ts
import xarray as xr
import zarr

from wnscale import paths
from wnscale.data import units as units_lib
from wnscale.data import variables as variables_lib
from wnscale.data.reading import store as store_lib
from wnscale.data.reading.format_interface import StoreFormat
from wnscale.errors import ArgumentError, StoreLacks, UserError
from wnscale.graphs.points import PointSet

DIMENSIONS = ("dates", "variables", "ensembles", "values")
ARRAYS = ("dates", "latitudes", "longitudes")
_LEVELLED = re.compile(r"(.+)_(\d+)")
# MARS level types a levelled variable may have to be a pressure-level one (a netCDF
# source writes "pl" too); model levels ("ml"), potential temperature ("pt") and
# others are not wnscale's levels.
_PRESSURE_LEVTYPES = (None, "pl")
_TENDENCY_STDEV = re.compile(r"statistics_tendencies_(\w+?)_stdev")
# Stores whose unknown variables were logged (by this process).
_WARNED: set[str] = set()
# anemoi-datasets' frequency units, in hours.
_UNIT_HOURS = {"d": 24.0, "h": 1.0, "m": 1 / 60, "s": 1 / 3600}


@dataclasses.dataclass(frozen=True, eq=False)
class AnemoiStore:
  """An opened anemoi-datasets store, one ensemble member.

  Attributes:
    path: the store (normalized path or URL).
    member: the ensemble member read, in `0 .. num_members - 1`.
    num_members: the store's ensembles.
    times: `[dates]` datetime64[ns], every date of the store, missing ones included.
    missing: `[dates]` bool, the store's `missing_dates`: never inputs nor targets (their
      fields read as NaN).
    time_step_hours: the store's step (`frequency`), hours.
    latitude, longitude: `[values]` float64 degrees, longitude in [0, 360); the store's
      order of points.
    field_shape: the grid's shape before flattening, e.g. `(lat, lon)` or `(points,)`.
    resolution: the store's `resolution` ("O96", "0.25"), or None.
    atmospheric: `{catalogue name: (levels ascending, store variable index per level)}`.
    surface: `{catalogue name: store variable index}`: surface variables and forcings.
    statics: `{catalogue static: store variable index}` (`variables.STATIC_VARIABLES`).
    unknown: `{store name: store variable index}`: variables the catalogue lacks.
    variables: the store's variable names, in `data`'s order.
    data: `data` as stored, `[dates, variables, ensembles, values]`.
    units: each variable's units (`variables_metadata`' `units`), None where not given.
  """

  path: str
  member: int
  num_members: int
  times: np.ndarray
  missing: np.ndarray
  time_step_hours: float
  latitude: np.ndarray
  longitude: np.ndarray
  field_shape: tuple[int, ...]
  resolution: str | None
  atmospheric: dict[str, tuple[tuple[int, ...], tuple[int, ...]]]
  surface: dict[str, int]
  statics: dict[str, int]
  unknown: dict[str, int]
  variables: tuple[str, ...]
  data: ts.TensorStore
  units: tuple = ()

  def __repr__(self) -> str:
    return (f"AnemoiStore(path={self.path!r}, member={self.member}, "
            f"{len(self.times)} dates every {self.time_step_hours:g} h, "
            f"{self.latitude.size} points)")

  @property
  def num_values(self) -> int:
    return self.latitude.size

  @property
  def grid(self) -> str:
    """The grid, for the log: e.g. "O96, 40320 points" or "7 x 8, 56 points"."""
    shape = " x ".join(str(n) for n in self.field_shape)
    return f"{self.resolution or shape}, {self.num_values} points"

  def view(self, name: str, levels=None) -> ts.TensorStore:
    """`name`'s fields of `member`, a view of `data` in internal order, origin 0.

    Args:
      name: a catalogue name in `atmospheric`, `surface` or `statics`, or a name of
        `unknown`.
      levels: for an atmospheric variable, the levels (hPa) in the order wanted; None:
        all the store has, ascending.

    Returns:
      `[time, level, values]` (atmospheric), `[time, values]` (surface, unknown), or
      `[values]` (a static: its field at the first date that is not missing).

    Raises:
      UserError: `name` or a level is not in the store (naming what it has).
    """
    member = self.data[ts.d[2][self.member]]  # [dates, variables, values]
    if name in self.atmospheric:
      have, indices = self.atmospheric[name]
      if levels is not None:
        absent = [int(level) for level in levels if int(level) not in have]
        if absent:
          raise StoreLacks(self.path, f"level(s) {absent} hPa of {name!r}", str(list(have)), (
              f"Level(s) {absent} hPa of {name!r} not in store {self.path}; it has "
              f"{list(have)}. Choose data.pressure_levels among those."))
        indices = [indices[have.index(int(level))] for level in levels]
      return member[:, np.asarray(indices, np.int64)]
    if name in self.statics:
      first = int(np.flatnonzero(~self.missing)[0])
      return member[first, self.statics[name]]
    index = self.surface.get(name, self.unknown.get(name))
    if index is None:
      raise StoreLacks(self.path, f"variable {name!r}", str(self.names()), (
          f"Store {self.path} has no variable {name!r}; it has {self.names()}. Choose "
          "data.variables among those (the static fields are always needed), or use a "
          "store that has them."))
    return member[:, index]

  def units_of(self, name: str) -> str | None:
    """The units the store gives `name` (a catalogue name: all its levels'), or None."""
    if name in self.atmospheric:
      indices = self.atmospheric[name][1]
    else:
      index = {**self.surface, **self.statics, **self.unknown}.get(name)
      indices = () if index is None else (index,)
    given = {self.units[i] for i in indices if i < len(self.units) and self.units[i]}
    return given.pop() if len(given) == 1 else None

  def names(self) -> list[str]:
    """Every name `view` takes: catalogue names, then the unknown ones."""
    return sorted({**self.atmospheric, **self.surface, **self.statics}) + sorted(self.unknown)


def is_anemoi_store(path: str) -> bool:
  """Whether `path` (local or a URL) holds an anemoi-datasets store: a zarr group with an
  array `data` and a `variables` attribute (WeatherBench2's stores have neither)."""
  path = paths.normalize(path)
  if not paths.exists(paths.join(path, "data", ".zarray")):
    return False
  try:
    attributes = json.loads(paths.read_text(paths.join(path, ".zattrs")))
  except (OSError, ValueError):  # none, or not JSON: not this layout
    return False
  return isinstance(attributes, dict) and "variables" in attributes


def open_anemoi(path: str, member: int = 0) -> AnemoiStore:
  """Opens the anemoi-datasets store `path` (local or a URL) for reading member `member`.

  Raises:
    ArgumentError: of `member`, outside the store's ensembles.
    UserError: a store that is not one, or is malformed: one line naming it and the problem.
  """
  path = paths.normalize(path)
  if not paths.exists(path):
    raise UserError(f"Store not found: {path} (no such file or directory).")
  attributes = _attributes(path)
  data = _open_data(path)
  num_dates, num_variables, num_members, num_values = data.shape
  names = attributes.get("variables")
  if not isinstance(names, list) or len(names) != num_variables:
    raise UserError(f"anemoi-datasets store {path}: attribute `variables` "
                    f"({_describe(names)}) does not name the {num_variables} variables of "
                    f"`data` {list(data.shape)}.")
  if not 0 <= member < num_members:
    raise ArgumentError("member", member, f"store {path} has {num_members} ensemble "
                        f"member(s): choose one of 0 .. {num_members - 1}.")
  times = _read_small(path, "dates")
  if not np.issubdtype(times.dtype, np.datetime64) or times.shape != (num_dates,):
    raise UserError(f"anemoi-datasets store {path}: `dates` ({times.dtype}{list(times.shape)}) "
                    f"are not the {num_dates} datetimes of `data`.")
  times = times.astype("datetime64[ns]")
  step = _frequency_hours(attributes.get("frequency"), path)
  if len(times) > 1 and not np.all(np.diff(times) == np.timedelta64(int(step * 3600), "s")):
    raise UserError(f"anemoi-datasets store {path}: `dates` are not every "
                    f"{attributes['frequency']} (its `frequency`).")
  missing = _missing(attributes.get("missing_dates") or [], times, path)
  latitude, longitude = (_read_small(path, name).astype(np.float64)
                         for name in ("latitudes", "longitudes"))
  if latitude.shape != (num_values,) or longitude.shape != (num_values,):
    raise UserError(f"anemoi-datasets store {path}: `latitudes` {list(latitude.shape)} and "
                    f"`longitudes` {list(longitude.shape)} are not the {num_values} values "
                    "of `data`.")
  if not (np.all(np.isfinite(latitude)) and np.all(np.abs(latitude) <= 90)
          and np.all(np.isfinite(longitude))):
    raise UserError(f"anemoi-datasets store {path}: `latitudes` or `longitudes` hold values "
                    "outside [-90, 90] or that are not finite.")
  field_shape = tuple(int(n) for n in attributes.get("field_shape") or (num_values,))
  if int(np.prod(field_shape)) != num_values:
    raise UserError(f"anemoi-datasets store {path}: `field_shape` {list(field_shape)} does "
                    f"not hold its {num_values} values.")
  metadata = attributes.get("variables_metadata") or {}
  atmospheric, surface, statics, unknown = _catalogue(names, metadata, path)
  if unknown and path not in _WARNED:  # once per store, however often it is opened
    _WARNED.add(path)
    logging.warning("%s: variable(s) %s not in wnscale's catalogue (or not on pressure "
                    "levels); kept under their own names.", path, sorted(unknown))
  return AnemoiStore(path, member, num_members, times, missing, step, latitude,
                     np.mod(longitude, 360.0), field_shape, attributes.get("resolution"),
                     atmospheric, surface, statics, unknown, tuple(names), data,
                     tuple((metadata.get(name) or {}).get("units") for name in names))


def anemoi_statistics(store: AnemoiStore, time_step_hours: float | None = None) -> xr.Dataset:
  """The store's statistics in wnscale's normalization format (`normalization.py`).

  One data variable per catalogue name of the store (and per unknown one, under its own
  name), dims `(statistic[, level])`, `statistic` = mean, std, diff_std; `level` the
  union of the atmospheric variables' levels (NaN where a variable lacks one). mean and
  std are the store's `mean` and `stdev`; diff_std is the `stdev` of its tendencies over
  `time_step_hours` (`statistics_tendencies_{delta}_stdev`); for the statics, which do
  not change, diff_std is their std (as in wnscale's own statistics). anemoi-datasets
  computed them over the dates `statistics_start_date .. statistics_end_date`, every
  ensemble member, missing dates left out; stds are as stored (no floor).

  Args:
    time_step_hours: the model's step, the lag of diff_std; None: the store's step.

  Raises:
    UserError: the store has no tendency statistics over `time_step_hours` (naming the
      steps it has): wnscale cannot make diff_std from mean and std alone.
  """
  step = store.time_step_hours if time_step_hours is None else float(time_step_hours)
  mean, std = (_read_small(store.path, name).astype(np.float64) for name in ("mean", "stdev"))
  tendencies = _tendency_arrays(store.path)
  if step not in tendencies:
    have = ", ".join(f"{hours:g} h" for hours in sorted(tendencies)) or "none"
    raise UserError(
        f"anemoi-datasets store {store.path} has no tendency statistics over {step:g} h "
        f"(it has: {have}), which wnscale's diff_std needs. Leave data.stats_path empty to "
        "compute statistics from the training range, or build the store with "
        f"`statistics: tendencies: ['{_frequency_text(step)}']` in its recipe.")
  diff_std = _read_small(store.path, tendencies[step]).astype(np.float64)
  for name, values in (("mean", mean), ("stdev", std), (tendencies[step], diff_std)):
    if values.shape != (len(store.variables),):
      raise UserError(f"anemoi-datasets store {store.path}: `{name}` {list(values.shape)} "
                      f"does not hold one value per variable ({len(store.variables)}).")
  table = np.stack([mean, std, diff_std])  # [statistic, variables]
  for index, name in enumerate(store.variables):  # degC, hPa: as `store_formats.open_store` reads
    expected = variables_lib.VARIABLES.get(_catalogue_name(str(name)))
    converted = expected and units_lib.conversion(str(name), store.units[index]
                                                   if index < len(store.units) else None,
                                                   expected.units, store.path)
    if converted:
      scale, offset = converted
      table[:, index] *= scale
      table[0, index] += offset
  levels = sorted({level for have, _ in store.atmospheric.values() for level in have})
  data = {}
  for name, (have, indices) in store.atmospheric.items():
    column = np.full((3, len(levels)), np.nan)
    column[:, [levels.index(level) for level in have]] = table[:, list(indices)]
    data[name] = (("statistic", "level"), column)
  for name, index in {**store.surface, **store.unknown}.items():
    data[name] = (("statistic",), table[:, index])
  for name, index in store.statics.items():
    data[name] = (("statistic",), table[[0, 1, 1], index])
  coords = {"statistic": ["mean", "std", "diff_std"]}
  if levels:
    coords["level"] = np.asarray(levels, np.int64)
  attributes = _attributes(store.path)
  return xr.Dataset(data, coords=coords, attrs={
      "time_step_hours": step, "store": store.path, "format": "anemoi-datasets",
      "first_time": str(attributes.get("statistics_start_date")),
      "last_time": str(attributes.get("statistics_end_date"))})


def _attributes(path: str) -> dict:
  """The store's root attributes (`.zattrs`)."""
  file = paths.join(path, ".zattrs")
  if not paths.exists(file):
    raise UserError(f"{path} is not an anemoi-datasets store: it has no .zattrs (zarr v2 "
                    "attributes).")
  try:
    attributes = json.loads(paths.read_text(file))
  except ValueError as error:
    raise UserError(f"anemoi-datasets store {path}: .zattrs is not JSON ({error}).") from error
  if not isinstance(attributes, dict):
    raise UserError(f"anemoi-datasets store {path}: .zattrs is not a JSON object.")
  return attributes


def _open_data(path: str) -> ts.TensorStore:
  """`data`, opened once, checked to be `[dates, variables, ensembles, values]`."""
  try:
    data = ts.open({"driver": "zarr", "kvstore": paths.kvstore_spec(paths.join(path, "data"))},
                   read=True).result()
  except ValueError as error:  # tensorstore's errors for a missing or broken array
    raise UserError(f"anemoi-datasets store {path}: cannot open its array `data`: "
                    f"{str(error).split(' [')[0]}") from error
  if data.rank != len(DIMENSIONS) or any(size == 0 for size in data.shape):
    raise UserError(f"anemoi-datasets store {path}: array `data` has shape "
                    f"{list(data.shape)}; expected [dates, variables, ensembles, values].")
  dtype = np.dtype(data.dtype.numpy_dtype)
  if not np.issubdtype(dtype, np.floating):
    raise UserError(f"anemoi-datasets store {path}: array `data` is {dtype}; wnscale reads "
                    "floating-point data (float32, or float64 read as float32).")
  return data if dtype == np.float32 else ts.cast(data, ts.float32)


def _read_small(path: str, name: str) -> np.ndarray:
  """A small array of the store (dates, coordinates, statistics), whole."""
  try:
    return np.asarray(zarr.open_array(paths.join(path, name), mode="r", zarr_format=2)[...])
  except Exception as error:  # zarr raises many types for a missing or broken array
    raise UserError(f"anemoi-datasets store {path}: cannot read its array `{name}`: "
                    f"{type(error).__name__}: {error}") from error


def _frequency_hours(frequency, path: str) -> float:
  """anemoi-datasets' `frequency` ("6h", "1d", "30m", or hours) in hours."""
  match = re.fullmatch(r"(\d+)([dhms]?)", str(frequency).strip())
  hours = float(match[1]) * _UNIT_HOURS[match[2] or "h"] if match else 0.0
  if hours <= 0:
    raise UserError(f"anemoi-datasets store {path}: attribute `frequency` {frequency!r} is "
                    "not a time step such as '6h' or '1d'.")
  return hours


def _frequency_text(hours: float) -> str:
  """`hours` as anemoi-datasets writes a step: "6h", "1d", "30m"."""
  if hours % 24 == 0:
    return f"{hours / 24:g}d"
  return f"{hours:g}h" if float(hours).is_integer() else f"{hours * 60:g}m"


def _missing(missing_dates, times: np.ndarray, path: str) -> np.ndarray:
  """`[dates]` True at the store's `missing_dates`."""
  try:
    missing = np.asarray(missing_dates, "datetime64[ns]")
  except ValueError as error:
    raise UserError(f"anemoi-datasets store {path}: attribute `missing_dates` holds a value "
                    f"that is not a date ({error}).") from error
  absent = missing[~np.isin(missing, times)]
  if absent.size:
    raise UserError(f"anemoi-datasets store {path}: `missing_dates` "
                    f"{[str(date) for date in absent.astype('datetime64[s]')]} are "
                    "not among its `dates`.")
  mask = np.isin(times, missing)
  if mask.all():
    raise UserError(f"anemoi-datasets store {path}: every date is in `missing_dates`.")
  return mask


def _tendency_arrays(path: str) -> dict[float, str]:
  """`{delta hours: name of its stdev array}` of the store's tendency statistics."""
  consolidated = paths.join(path, ".zmetadata")
  if paths.exists(consolidated):
    keys = json.loads(paths.read_text(consolidated)).get("metadata", {})
    names = [key.split("/")[0] for key in keys]
  else:
    names = [entry.name for entry in paths.as_epath(path).iterdir()]
  tendencies = {}
  for name in names:
    match = _TENDENCY_STDEV.fullmatch(name)
    if match:
      tendencies[_frequency_hours(match[1], path)] = name
  return tendencies


def _catalogue(names, metadata: dict, path: str):
  """The store's variables sorted into `AnemoiStore.atmospheric`, `surface`, `statics` and
  `unknown` (see the module docstring)."""
  levelled, surface, statics, unknown = {}, {}, {}, {}
  seen = {}  # (catalogue name, level) -> the store's name, for duplicates
  for index, store_name in enumerate(names):
    mars = (metadata.get(store_name) or {}).get("mars") or {}
    key = _catalogue_key(str(store_name), mars.get("levtype"), "levelist" in mars)
    if key is None:
      unknown[store_name] = index
      continue
    if key in seen:
      raise UserError(f"anemoi-datasets store {path}: variables {seen[key]!r} and "
                      f"{store_name!r} are both {_describe_key(key)}.")
    seen[key] = store_name
    name, level = key
    if level is not None:
      levelled.setdefault(name, []).append((level, index))
    elif name in variables_lib.STATIC_VARIABLES:
      statics[name] = index
    else:
      surface[name] = index
  atmospheric = {}
  for name, pairs in levelled.items():
    pairs.sort()
    atmospheric[name] = (tuple(level for level, _ in pairs), tuple(index for _, index in pairs))
  return atmospheric, surface, statics, unknown


def _catalogue_key(store_name: str, levtype, has_levelist: bool = False
                   ) -> tuple[str, int | None] | None:
  """`(catalogue name, level or None)` of a store's variable, or None if the catalogue
  lacks it (module docstring: `levtype` and `has_levelist` from its `variables_metadata`)."""
  match = _LEVELLED.fullmatch(store_name)
  param, level = (match[1], int(match[2])) if match else (store_name, None)
  name = variables_lib.ECMWF_NAMES.get(param, param)
  known = name in variables_lib.VARIABLES
  if level is not None:
    atmospheric = known and variables_lib.VARIABLES[name].atmospheric
    # A netCDF variable per level: anemoi-datasets says "sfc", the level is in the name.
    per_level_variable = levtype == "sfc" and not has_levelist and name == param
    return ((name, level) if atmospheric and (levtype in _PRESSURE_LEVTYPES
                                              or per_level_variable) else None)
  if name == "geopotential":  # `z` without a level: the surface geopotential
    return variables_lib.SURFACE_GEOPOTENTIAL, None
  if name in variables_lib.STATIC_VARIABLES or name in variables_lib.FORCING_CHANNELS or (
      known and not variables_lib.VARIABLES[name].atmospheric):
    return name, None
  return None


def _catalogue_name(store_name: str) -> str:
  """The catalogue name a store's variable maps to, level or not (for its units)."""
  match = _LEVELLED.fullmatch(store_name)
  param = match[1] if match else store_name
  return variables_lib.ECMWF_NAMES.get(param, param)


def _describe_key(key) -> str:
  name, level = key
  return name if level is None else f"{name} at {level} hPa"


def _describe(value) -> str:
  return f"{len(value)} names" if isinstance(value, list) else repr(value)


def open_weather_store(path: str, variables: tuple[str, ...], levels: tuple[int, ...],
                       time_step_hours: int, resolution: float | None,
                       forcings: tuple[str, ...], member: int) -> store_lib.WeatherStore:
  """`store_formats.open_store` of an anemoi-datasets store (its arguments checked): views of its
  one `data` array for member `member`, its missing dates `missing`. Its grid is its own
  (`resolution` is not read)."""
  del resolution
  source = open_anemoi(path, member)
  stride = time_step_hours / source.time_step_hours
  if not float(stride).is_integer() or stride < 1:
    raise UserError(f"Store {path} has a time step of {source.time_step_hours:g} h, which "
                    f"does not divide time_step_hours={time_step_hours}")
  stride = int(stride)
  order = _regular_order(source)
  views = {}
  for name in variables + forcings + variables_lib.STATIC_VARIABLES:
    atmospheric = variables_lib.is_atmospheric(name)
    view = source.view(name, levels) if atmospheric else source.view(name)
    # A regular grid's values as `[lat, lon]`, in internal order.
    views[name] = view if order is None else view[..., order]
  atmospheric = any(variables_lib.is_atmospheric(name) for name in variables)
  level_indices = np.arange(len(levels) if atmospheric else 0, dtype=np.int64)
  if order is None:
    points = PointSet.from_points(source.latitude, source.longitude, None,
                                  f"{source.grid} (anemoi-datasets)")
  else:
    points = PointSet.regular(source.latitude[order[:, 0]], source.longitude[order[0]])
  logging.info("Store %s: anemoi-datasets layout, member %d of %d, grid %s", path, member,
               source.num_members, source.grid)
  convert = store_lib.unit_conversions({name: source.units_of(name) for name in views},
                                       views, path)
  return store_lib.WeatherStore(path, variables, levels, time_step_hours,
                                source.times[::stride], points, stride, level_indices,
                                {"data": source.data}, views, forcings=forcings,
                                missing=source.missing[::stride], convert=convert)


def _regular_order(source: AnemoiStore) -> np.ndarray | None:
  """`[lat, lon]` indices of the store's values in a regular grid's internal order
  (latitude and longitude ascending) if its `field_shape` is a whole regular grid
  flattened latitude-major; else None (the values are points)."""
  if len(source.field_shape) != 2:
    return None
  latitude = source.latitude.reshape(source.field_shape)
  longitude = source.longitude.reshape(source.field_shape)
  if not (np.all(latitude == latitude[:, :1]) and np.all(longitude == longitude[:1])):
    return None
  index = np.arange(source.num_values).reshape(source.field_shape)
  return index[np.argsort(latitude[:, 0])][:, np.argsort(longitude[0])]


class _LazyView(xr.backends.BackendArray):
  """A tensorstore view as the lazily indexed array of an xarray variable."""

  def __init__(self, view: ts.TensorStore):
    self.view = view
    self.shape = tuple(view.shape)
    self.dtype = np.dtype(view.dtype.numpy_dtype)

  def __getitem__(self, key):
    return xr.core.indexing.explicit_indexing_adapter(
        key, self.shape, xr.core.indexing.IndexingSupport.OUTER, self._read)

  def _read(self, key):
    return self.view.oindex[key].read().result()


def open_as_dataset(path: str) -> xr.Dataset:
  """`store_formats.open_dataset` of an anemoi-datasets store: its catalogue variables
  (`variables.VARIABLES`: member 0, wnscale's names, no statics) on `(time, [level,]
  values)` with `latitude(values)` and `longitude(values)`, or on `(time, [level,] latitude,
  longitude)` (latitude ascending) where its `field_shape` is a whole regular grid. Its
  `missing_dates` are not among the times; `level` holds the levels every atmospheric
  variable has."""
  source = open_anemoi(paths.normalize(path))
  present = np.flatnonzero(~source.missing)
  order = _regular_order(source)
  if order is None:
    space = (store_lib.POINT_DIM,)
    coords = {"latitude": (space, source.latitude), "longitude": (space, source.longitude)}
  else:
    space = store_lib.STATIC_DIMS
    coords = {"latitude": source.latitude[order[:, 0]],
              "longitude": source.longitude[order[0]]}
  held = [set(levels) for levels, _ in source.atmospheric.values()]
  levels = sorted(set.intersection(*held)) if held else []
  coords.update(time=source.times[present], level=np.asarray(levels, np.int64))

  def variable(name, dims, view):
    view = view if order is None else view[..., order]
    return xr.Variable(dims + space, xr.core.indexing.LazilyIndexedArray(_LazyView(view)),
                       {"units": variables_lib.lookup(name).units})

  data = {name: variable(name, ("time", "level"), source.view(name, levels).oindex[present])
          for name in source.atmospheric if name in variables_lib.VARIABLES}
  data.update({name: variable(name, ("time",), source.view(name).oindex[present])
               for name in source.surface if name in variables_lib.VARIABLES})
  return xr.Dataset(data, coords=coords)


FORMAT = StoreFormat(
    "anemoi-datasets", recognises=is_anemoi_store, open=open_weather_store,
    dataset=open_as_dataset,
    time_step_hours=lambda path, default: open_anemoi(path).time_step_hours,
    statistics=lambda path, time_step_hours: anemoi_statistics(open_anemoi(path),
                                                               time_step_hours))
