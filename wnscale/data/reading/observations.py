"""The point-store format (`FORMAT`, an entry of `store_formats.FORMATS`): observation
stores, values at stations, read beside a grid store's times.

A store is zarr with dims `(time, station)`: `latitude`, `longitude` (degrees)
and `station_id` (strings) along `station`, one float32 variable per observed
quantity under its WeatherBench2 name (`2m_temperature`,
`mean_sea_level_pressure`, ...), NaN where a value is missing. Stations may come
in any order (they are read in `station_id` order, so two stores of the same
stations in other orders read alike), and the set may vary in time: a station
absent at a time is NaN there. Times may be in any order and need not be the
grid's: `ModalityReader` aligns a modality's values with a grid store's times,
and a grid time the observations lack is all-missing.

A store is read whole into memory when opened (float32: 10,000 stations x a
year at 6 h x 2 quantities is 0.1 GB). Normalization statistics (`load_or_compute_stats`):
mean and std per variable over the grid's training times, NaN skipped, cached
in `<cache dir>/stats/` like the grid's (`normalization.py`).

The format recognises a store by its `station_id` array (a grid store has none), opens it
with `open_observations` (an `ObservationStore`) and describes it as the zarr store it is.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import warnings

import numpy as np
import xarray as xr

from wnscale import cache, outputs, paths
from wnscale.data import netcdf
from wnscale.data.reading import store as store_lib
from wnscale.data.reading.format_interface import POINTS, StoreFormat
from wnscale.data.reading.std_floor import floor_std
from wnscale.errors import UserError
from wnscale.graphs.points import PointSet

DIMS = ("time", "station")
COORDINATES = ("latitude", "longitude", "station_id")


@dataclasses.dataclass(frozen=True, eq=False)
class ObservationStore:
  """An opened observation store, its stations in `station_id` order.

  Attributes:
    path: where it is.
    station_id: `[S]` str.
    points: the stations (`PointSet.from_points`: Voronoi cell areas, mean 1).
    times: `[T]` datetime64[ns], ascending.
    values: `{name: [T, S]}` float32, NaN where missing.
  """

  path: str
  station_id: np.ndarray
  points: PointSet
  times: np.ndarray
  values: dict

  def __repr__(self) -> str:  # stable: no addresses
    return (f"ObservationStore(path={self.path!r}, stations={self.station_id.size}, "
            f"variables={tuple(self.values)})")


def is_point_store(path: str) -> bool:
  """Whether `path` (local or a URL) holds a point store: a zarr store with a `station_id`
  array, which a grid store never has (`outputs.store_kind`, as outputs are told apart)."""
  return outputs.store_kind(paths.normalize(path)) == outputs.OBSERVATIONS.store


def open_observations(path: str, variables) -> ObservationStore:
  """Opens the store at `path` and reads `variables` (WeatherBench2 names).

  Raises:
    UserError: no store there, or not this layout (naming what it lacks), or repeated
      stations or times.
  """
  path = paths.normalize(path)
  if not paths.exists(path):
    raise UserError(f"Observation store not found: {path}. Make a synthetic network of a "
                    "grid store with python -m launch.make_dataset (or "
                    "wnscale.data.making.stations.write_network).")
  try:
    dataset = xr.open_zarr(path, consolidated=None, decode_timedelta=False)
  except Exception as error:  # noqa: BLE001 (whatever zarr says of a directory that is no store)
    raise UserError(f"{path} is not a zarr store: {error}") from error
  with dataset:
    lacking = [name for name in ("time",) + COORDINATES + tuple(variables)
               if name not in dataset.variables]
    if lacking:
      raise UserError(f"The observation store {path} has no {lacking}; it holds "
                      f"{sorted(str(n) for n in dataset.variables)} (an observation store has "
                      f"dims {DIMS}, {', '.join(COORDINATES)} along station and one variable "
                      "per quantity).")
    for name in variables:
      if set(dataset[name].dims) != set(DIMS):
        raise UserError(f"{path}: {name} has dims {dataset[name].dims}, expected {DIMS}.")
    times = dataset["time"].values.astype("datetime64[ns]")
    station_id = dataset["station_id"].values.astype(str)
    latitude, longitude = (dataset[name].values for name in ("latitude", "longitude"))
    values = {name: dataset[name].transpose(*DIMS).values.astype(np.float32)
              for name in variables}
  for what, array in (("station_id", station_id), ("time", times)):
    unique, counts = np.unique(array, return_counts=True)
    if (counts > 1).any():
      raise UserError(f"{path}: {what} {unique[counts > 1][:3].tolist()} repeat(s): each "
                      f"{'station' if what == 'station_id' else 'time'} must appear once.")
  by_time, by_station = np.argsort(times), np.argsort(station_id, kind="stable")
  points = PointSet.from_points(latitude[by_station], longitude[by_station],
                                name=f"{station_id.size:,} stations")
  return ObservationStore(path, station_id[by_station], points, times[by_time],
                          {name: array[by_time][:, by_station] for name, array in values.items()})


def time_index(observation_times: np.ndarray, grid_times: np.ndarray) -> np.ndarray:
  """`[len(grid_times)]` the index of each grid time in `observation_times` (ascending),
  -1 where the observations lack it."""
  at = np.searchsorted(observation_times, grid_times)
  found = at < observation_times.size
  found[found] = observation_times[at[found]] == grid_times[found]
  return np.where(found, at, -1)


def compute_stats(store: ObservationStore, variables, grid_times) -> dict[str, np.ndarray]:
  """`{"mean": [V], "std": [V]}` float32 of `variables` over the store's values at
  `grid_times` (those it has), NaN skipped.

  Raises:
    UserError: a variable has no value at those times.
  """
  at = time_index(store.times, np.asarray(grid_times, "datetime64[ns]"))
  at = at[at >= 0]
  mean, std = [], []
  for name in variables:
    values = store.values[name][at].astype(np.float64)
    if not np.isfinite(values).any():
      raise UserError(f"{store.path}: {name} has no value at the {len(grid_times)} training "
                      f"time(s) of the grid ({len(at)} of them in the store): no statistics.")
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", RuntimeWarning)
      mean.append(np.nanmean(values))
      std.append(np.nanstd(values))
  mean = np.asarray(mean)
  return {"mean": mean.astype(np.float32),
          "std": floor_std(np.asarray(std), mean).astype(np.float32)}


def cached_stats_path(path: str, variables, grid_times) -> str:
  """Where `load_or_compute_stats`' result is cached: `<cache dir>/stats/<store>-<key>.nc`."""
  grid_times = np.asarray(grid_times, "datetime64[ns]")
  key = json.dumps([paths.normalize(path), list(variables), str(grid_times[0]),
                    str(grid_times[-1]), int(grid_times.size),
                    cache.source_digest("data/reading/observations.py",
                                        "data/reading/std_floor.py")])
  name = paths.normalize(path).rstrip("/").rsplit("/", 1)[-1]
  return cache.cache_path("stats", f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:20]}.nc")


def load_or_compute_stats(store: ObservationStore, variables, grid_times) -> bytes:
  """The cached `compute_stats` as netCDF bytes (`stats_from_bytes`), computed if missing."""
  target = cached_stats_path(store.path, variables, grid_times)
  if paths.exists(target):
    return paths.read_bytes(target)
  stats = compute_stats(store, variables, grid_times)
  blob = netcdf.to_bytes(xr.Dataset(
      {name: ("statistic", [stats["mean"][i], stats["std"][i]])
       for i, name in enumerate(variables)}, coords={"statistic": ["mean", "std"]}))
  cache.write_bytes(target, blob)  # whole or not at all (or not cached)
  logging.info("Computed the statistics of the observations %s; cached in %s", store.path,
               target)
  return blob


def stats_from_bytes(blob: bytes, variables) -> dict[str, np.ndarray]:
  """`{"mean": [V], "std": [V]}` float32 of `variables` from `load_or_compute_stats`' bytes."""
  stats = netcdf.from_bytes(blob, "observation statistics")
  table = np.array([[float(stats[name].sel(statistic=s)) for name in variables]
                    for s in ("mean", "std")], np.float32)
  return {"mean": table[0], "std": table[1]}


class ModalityReader:
  """A modality's (`specs.ModalitySpec`) observations at a grid store's times, normalized.

  Picklable (numpy arrays) for Grain's worker processes.

  Attributes:
    name: the modality's.
    inputs, targets: its variables.
    points: its stations (`ObservationStore.points`); station_id: `[S]` theirs.
    stats: `{"inputs"|"targets": {"mean": [C], "std": [C]}}` float32, per kind.
    point_slots: `[slots]` the station in each slot of the point axis, -1 for padding
      (NaN: missing); None: every station in order (`in_layout`).
  """

  def __init__(self, modality, store: ObservationStore, grid_times: np.ndarray,
               stats: dict[str, np.ndarray]):
    """`stats`: `{"mean", "std"}` of `modality.inputs + targets` (unique, in that order)."""
    self.name, self.inputs, self.targets = modality.name, modality.inputs, modality.targets
    self.path, self.points, self.station_id = store.path, store.points, store.station_id
    names = list(dict.fromkeys(modality.inputs + modality.targets))
    mean, std = (np.asarray(stats[s], np.float32)[:, None] for s in ("mean", "std"))
    # [T_obs, V, S] normalized once, so a batch is a gather.
    self._values = (np.stack([store.values[n] for n in names], axis=1) - mean) / std
    self._channels = {kind: [names.index(n) for n in getattr(modality, kind)]
                      for kind in ("inputs", "targets")}
    self.stats = {kind: {s: np.asarray(stats[s], np.float32)[channels]
                         for s in ("mean", "std")}
                  for kind, channels in self._channels.items()}
    self._at = time_index(store.times, np.asarray(grid_times, "datetime64[ns]"))
    self.point_slots = None

  def __repr__(self) -> str:
    return f"ModalityReader({self.name!r}, path={self.path!r})"

  @property
  def num_slots(self) -> int:
    return self.points.size if self.point_slots is None else self.point_slots.size

  def read(self, kind: str, time_indices) -> np.ndarray:
    """`[len(time_indices), C, slots]` float32 normalized values of `kind` ("inputs" or
    "targets") at the grid store's `time_indices`; NaN where missing."""
    at = self._at[np.asarray(time_indices)]
    values = self._values[np.maximum(at, 0)][:, self._channels[kind]]
    values[at < 0] = np.nan
    if self.point_slots is None:
      return values
    values = np.take(values, np.maximum(self.point_slots, 0), axis=-1)
    values[..., self.point_slots < 0] = np.nan
    return values

  def in_layout(self, point_slots: np.ndarray | None) -> ModalityReader:
    """This reader (same arrays) yielding its points in `point_slots` order."""
    clone = copy.copy(self)
    clone.point_slots = None if point_slots is None else np.asarray(point_slots, np.int64)
    return clone


FORMAT = StoreFormat("observations (a point store)", recognises=is_point_store,
                     open=open_observations, dataset=store_lib.open_metadata, yields=POINTS)
