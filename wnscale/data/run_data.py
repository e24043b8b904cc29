"""The run's data: its store (the configured one, or a synthetic one when the config asks
for it) and its normalization statistics, each made once by process 0, and what a run opens
of them (`open_run_data`: the grid store, the statistics, each modality's observations),
the same for training and forecasts.

The other processes wait for process 0 through the coordination service's
key-value store, with a bound (`WAIT_FOR_PROCESS_0_S`); if process 0 fails, they
fail at once with its error instead of waiting. A `data` argument is the run's
`wnscale.specs.DataSpec`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import time

import jax
import xarray as xr

from wnscale import cache, coordination, outputs, paths
from wnscale.data import variables as variables_lib
from wnscale.data.making import stations, synthetic
from wnscale.data.reading import normalization, observations, store_formats
from wnscale.data.reading import store as store_lib
from wnscale.errors import ArgumentError, UserError
from wnscale.progress import size_text

# How long a process waits for process 0 to write a synthetic store or compute
# statistics (a 0.25 deg training range can take a while) before giving up.
WAIT_FOR_PROCESS_0_S = 3 * 3600.0


def synthetic_store_path(data, seed: int) -> str:
  """Where the synthetic store of `data` (grid, time ranges, variables, levels) lives."""
  start, end, variables, levels = synthetic_store_contents(data)
  # The contents and the code in the name: a store of other contents or written by
  # other synthetic code is not reused.
  contents = hashlib.sha256(json.dumps([variables, levels]).encode()).hexdigest()[:8]
  code = cache.source_digest("data/making/synthetic.py", "data/forcings.py", "graphs/grid.py",
                             "graphs/points.py")
  grid = data.grid or f"{data.resolution}deg"
  name = f"synthetic-{grid}-{start}-{end}-seed{seed}-{contents}-{code}.zarr"
  return cache.cache_path("datasets", name)


def synthetic_store_contents(data) -> tuple[str, str, list[str], list[int]]:
  """`(start, end, variables, levels)` of the synthetic store of `data`: the days its train
  and eval ranges span, and the config's variables (inputs, target-only variables and
  stored forcings) and pressure levels, no more (at 1 deg a year of all 11 variables on 13
  levels would be ~30 GB)."""
  names = data.outputs + data.stored_forcings
  return (min(data.train_start, data.eval_start), max(data.train_end, data.eval_end),
          sorted(names), sorted(int(level) for level in data.pressure_levels))


def synthetic_store_bytes(data) -> int:
  """Uncompressed bytes of the synthetic store of `data` (an upper bound of its size)."""
  start, end, variables, levels = synthetic_store_contents(data)
  num_times = len(synthetic.store_times(start, end, data.time_step_hours))
  num_points = synthetic.store_points(data.grid, data.resolution).size
  channels = sum(len(levels) if variables_lib.is_atmospheric(name) else 1
                 for name in variables)
  return 4 * num_points * (num_times * channels + 2)


def check_store_given(data):
  """Checks that `data` (a `DataSpec`) names its training data: a store at `data.path`, or
  `data.synthetic`; cheap, so a run checks it before any work.

  Raises:
    ArgumentError: of `data.path`: no store there, or no path and no synthetic store
      asked for.
  """
  if data.path:
    path = paths.normalize(data.path)
    if not paths.exists(path):
      raise ArgumentError(
          "data.path", path,
          "store not found. Point it at a WeatherBench2-layout zarr store; make a synthetic "
          "one there with python -m launch.make_dataset (or "
          "wnscale.data.making.synthetic.write_synthetic_store); or, for small configs such as "
          "configs/tiny.py, set data.synthetic=True and leave data.path empty to have a "
          "synthetic store written into the cache.")
  elif not data.synthetic:
    raise ArgumentError(
        "data.path", None,
        "is required (no training data: data.path is empty and data.synthetic is False). "
        "Pass a WeatherBench2-layout zarr store with `data.path=PATH_OR_URL` "
        "(e.g. gs://weatherbench2/datasets/era5/...zarr), or "
        "`data.synthetic=True` for a synthetic ERA5-like store.")


def resolve_store(data, seed: int) -> str:
  """`data.path`, or the synthetic store of `seed` if `data.synthetic`.

  Process 0 writes the synthetic store (if missing) into the cache directory,
  after checking that it fits on the disk; a process on another host whose
  cache does not hold it then writes its own copy. The store appears whole or not at
  all (`paths.building`: renamed into place locally, a `.complete` marker in a bucket).

  Raises:
    ArgumentError: of `data.path`: no store there, or no path and no synthetic store
      asked for.
    UserError: not enough disk.
  """
  check_store_given(data)
  if data.path:
    return paths.normalize(data.path)
  path = synthetic_store_path(data, seed)
  start, end, variables, levels = synthetic_store_contents(data)

  def write_if_missing() -> bytes:
    if paths.is_complete(path):  # written whole or not at all (`paths.building`)
      return b""
    try:
      outputs.check_writable(path, "synthetic store")
    except ArgumentError as error:
      raise UserError(f"The synthetic store goes into the cache directory {cache.cache_dir()}: "
                      f"{error.problem.split(';')[0]}; set WNSCALE_CACHE_DIR to a "
                      "directory you can write, or give `data.path` a store.") from error
    outputs.remove_leftovers(path, outputs.DATASET)  # of a writer killed outright
    size = synthetic_store_bytes(data)
    free = paths.free_bytes(path)
    if free is not None and size > free:
      raise UserError(
          f"The synthetic store {path} needs up to {size_text(size)} but the disk holds "
          f"only {size_text(free)} free; shorten data.train_*/eval_* ranges, use a "
          "coarser data.resolution, or set WNSCALE_CACHE_DIR to a bigger disk or a bucket.")
    logging.info("Writing the synthetic store %s (%s .. %s; kept for later runs).", path, start,
                 end)
    begin = time.perf_counter()
    synthetic.write_synthetic_store(
        path, resolution=data.resolution, grid_name=data.grid, start=start, end=end,
        levels=levels, variables=variables, seed=seed, time_step_hours=data.time_step_hours,
        overwrite=True)  # in a bucket: one cut short, without its .complete marker
    logging.info("Wrote the synthetic store in %.1f s.", time.perf_counter() - begin)
    return b""

  once_by_process_0(f"synthetic {path}", write_if_missing, "write the synthetic store")
  write_if_missing()  # no-op unless this host's cache is not process 0's
  return path


def resolve_stats(data) -> xr.Dataset:
  """The run's normalization statistics: `data.stats_path`'s, or the training range's.

  Computed ones (`normalization.load_or_compute_stats`) come from process 0,
  so every process normalizes with the same numbers even where hosts' caches differ.
  """
  if data.stats_path:
    return normalization.read_stats(data.stats_path, data.time_step_hours)
  every_input = data.input_normalization == "all"  # forcings' statistics needed too
  arguments = (data.path, data.outputs, data.pressure_levels, data.train_start, data.train_end,
               data.time_step_hours, data.forcings if every_input else (),
               data.stored_forcings if every_input else (), data.member)
  with config_range("train"):
    return once_by_process_0(
        f"stats {normalization.cached_stats_path(*arguments)}",
        lambda: normalization.load_or_compute_stats(*arguments),
        "compute the normalization statistics", encode=normalization.to_bytes,
        decode=normalization.from_bytes)


def resolve_observations(data, modality, seed: int) -> str:
  """The observation store of `modality` (a `data.modalities` entry; `data.path` resolved).

  Its `source` is the store's path, or "synthetic[:N]": a synthetic network of N
  stations observing `data.path` (`stations.write_network`, seed `seed`), written once
  by process 0 into the cache directory beside the synthetic grid stores.

  Raises:
    ArgumentError: of `data.modalities`: no store at the path.
  """
  count = modality.synthetic_stations
  if count is None:
    path = paths.normalize(modality.source)
    if not paths.exists(path):
      raise ArgumentError(
          "data.modalities", modality.source,
          f"no observation store there (modality {modality.name!r}). Make a synthetic "
          "network of a grid store with python -m launch.make_dataset (or "
          "wnscale.data.making.stations.write_network), or give the source 'synthetic' for one of "
          "data.path's grid.")
    return path
  grid = paths.normalize(data.path).rstrip("/").rsplit("/", 1)[-1].removesuffix(".zarr")
  digest = hashlib.sha256(paths.normalize(data.path).encode()).hexdigest()[:8]
  code = cache.source_digest("data/making/stations.py", "data/reading/observations.py")
  path = cache.cache_path("datasets", f"stations-{count}-{grid}-{digest}-seed{seed}-"
                                      f"{code}.zarr")

  def write_if_missing() -> bytes:
    if not paths.is_complete(path):
      logging.info("Writing a synthetic network of %d stations of %s to %s (kept for later "
                   "runs).", count, data.path, path)
      stations.write_network(data.path, path, count, seed=seed, overwrite=True)
    return b""

  once_by_process_0(f"stations {path}", write_if_missing, "write the synthetic stations")
  write_if_missing()  # no-op unless this host's cache is not process 0's
  return path


def modality_readers(data, seed: int, grid_times, training_times
                     ) -> tuple[observations.ModalityReader, ...]:
  """A `ModalityReader` per `data.modalities` entry (`resolve_observations`), aligned with
  the grid store's `grid_times` and normalized with statistics of the grid's
  `training_times` (process 0's, as `resolve_stats`)."""
  readers = []
  for modality in data.modalities:
    path = resolve_observations(data, modality, seed)
    names = list(dict.fromkeys(modality.inputs + modality.targets))
    store = store_formats.open_points(path, names)
    blob = once_by_process_0(
        f"stats {observations.cached_stats_path(path, names, training_times)}",
        lambda store=store, names=names: observations.load_or_compute_stats(
            store, names, training_times), "compute the observations' statistics")
    readers.append(observations.ModalityReader(
        modality, store, grid_times, observations.stats_from_bytes(blob, names)))
  return tuple(readers)


def open_grid_store(data, path: str | None = None, *, variables=None,
                    member: int = 0) -> store_lib.WeatherStore:
  """The grid store `data` reads (`store_formats.open_store`: its stored forcings, its
  regional store cut in) at `path` (default `data.path`), of `variables` (default the
  state's, `data.variables`) and ensemble member `member`."""
  return store_formats.open_store(
      path or data.path, data.variables if variables is None else variables,
      data.pressure_levels, data.time_step_hours, data.resolution,
      forcings=data.stored_forcings, member=member, regional_path=data.regional_path,
      region=data.region_box)


def open_example_store(data) -> store_lib.WeatherStore:
  """The grid store the example sources of `data` read (`source.WeatherExampleSource`): its
  outputs (the state, then the target-only variables) of ensemble member `data.member`."""
  return open_grid_store(data, variables=data.outputs, member=data.member)


@dataclasses.dataclass(frozen=True)
class RunData:
  """What a run reads beside its model (`open_run_data`).

  Attributes:
    store: the grid store (`store.WeatherStore`): training's, or a forecast's initial
      conditions.
    normalization: the `normalization.Normalization` of the statistics (`resolve_stats`:
      the training range's, or `data.stats_path`'s), for the example sources and the model.
    readers: each `data.modalities` entry's `observations.ModalityReader`, aligned with
      `store`'s times, normalized with statistics of the training range.
  """

  store: store_lib.WeatherStore
  normalization: normalization.Normalization
  readers: tuple[observations.ModalityReader, ...]


def open_run_data(data, seed: int, *, path: str | None = None,
                  store: store_lib.WeatherStore | None = None) -> RunData:
  """Opens what a run of `data` (a `DataSpec`, its path resolved) reads: the grid store at
  `path` (default `data.path`; `store`: already open, e.g. a training run's
  `open_example_store`), its normalization and each modality's observations, normalized as
  in training (the training range of `data.path`'s times, whichever store `path` is)."""
  store = store or open_grid_store(data, path)
  norm = normalization.Normalization.from_stats(data, resolve_stats(data))
  if not data.modalities:
    return RunData(store, norm, ())
  same_store = path is None or paths.normalize(path) == paths.normalize(data.path)
  grid_times = store.times if same_store else open_grid_store(data).times
  first, count = store_lib.time_range(grid_times, data.train_start, data.train_end, data.path)
  readers = modality_readers(data, seed, store.times, grid_times[first:first + count])
  return RunData(store, norm, readers)


@contextlib.contextmanager
def config_range(split: str):
  """Turns a `store.TimeRangeError` of the `split` ("train" or "eval") range into one that
  names the config keys to change."""
  try:
    yield
  except store_lib.TimeRangeError as error:
    raise UserError(f"{error}; set data.{split}_start/{split}_end inside it.") from error


def once_by_process_0(key: str, make, what: str, timeout_s: float = WAIT_FOR_PROCESS_0_S,
                      encode=None, decode=None):
  """Runs `make()` on process 0 only; returns its result on every process.

  Process 0 publishes the result as bytes (`encode(result)`; `make` returns bytes
  where `encode` is None), or its error, under `key` in the coordination service's
  key-value store; the others wait at most `timeout_s` for it; every process returns
  `decode(bytes)`. In one process `make()`'s result is returned as it is, never encoded.

  Raises:
    RuntimeError: on the other processes, when process 0 failed (with its message).
    TimeoutError: when process 0 published nothing within `timeout_s`.
  """
  if jax.process_count() == 1:
    return make()
  client = coordination.client()
  key = f"wnscale/{key}"
  if jax.process_index() == 0:
    try:
      result = make()
    except Exception as error:
      client.key_value_set_bytes(key, b"error " + str(error).encode(), allow_overwrite=True)
      raise
    blob = encode(result) if encode else result
    client.key_value_set_bytes(key, b"ok " + blob, allow_overwrite=True)
    return decode(blob) if decode else result  # what the others decode, to the bit
  reply = coordination.wait_for_key(key, timeout_s, f"process 0 to {what}")
  status, _, result = reply.partition(b" ")
  if status != b"ok":
    raise RuntimeError(f"Process 0 could not {what}: {result.decode()}")
  return decode(result) if decode else result
