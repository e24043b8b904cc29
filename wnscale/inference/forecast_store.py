"""A forecast written as a WeatherBench2-layout zarr store, one initial time at a time.

Layout: every state variable on dims `time` (the initial time),
[`number` (ensemble member),] `prediction_timedelta` (timedelta64), [`level`,]
`latitude`, `longitude`; latitude in the order of the store the initial
conditions came from. On a point set (a reduced Gaussian grid, an anemoi-datasets
store's points) one dim `values` takes the place of `latitude`, `longitude`,
with `latitude(values)` and `longitude(values)` coordinates, the points in the
store's order. Each target modality of the run (e.g. `stations`) is a zarr group of the
store, `<path>/<name>`: its targets on dims `time`, [`number`,] `prediction_timedelta`,
`station`, with `latitude`, `longitude` and `station_id` along `station` (the order
`observations.open_observations` reads them in), written with the grid, chunk for chunk.
Float32 in physical units with a `units` attribute;
one chunk per (initial time, [member,] lead time), so a lead time is written
as soon as it is computed and a chunk never holds two initial times.

The store is laid out in full when created (whole or not at all:
`paths.building`; the path may be a `gs://` URL), NaN until written. Its attributes record the forecast's settings
(`SETTINGS_ATTR`) and the initial times finished so far
(`datasets.COMPLETED_ATTR`, updated atomically after each one), so a killed
forecast keeps every finished initial time and the same command continues
with the rest; a store of other settings is never written into. A full disk
ends the same way, as an `errors.NoSpaceLeft` saying how many initial times
were kept (`outputs.writing`).

A forecast by several processes has every process write a share of each lead
time's chunks: after the rollout gathers the outputs, every process holds them
all, so the chunks (one per variable and lead time) are dealt out, largest first,
and no chunk has two writers. Process 0 creates the store (the others open it
once it is there) and, after a barrier that every writer's share of an initial
time is written, records that initial time as finished.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import pandas as pd

from wnscale import outputs, paths
from wnscale.data import variables as variables_lib
from wnscale.data.making import writer
from wnscale.data.reading import observations
from wnscale.data.reading.store import POINT_DIM, STATIC_DIMS
from wnscale.errors import ArgumentError, UserError
from wnscale.evaluation.datasets import COMPLETED_ATTR, ENSEMBLE, INIT, LEAD

SETTINGS_ATTR = "wnscale_forecast"


def recorded_settings(path: str, argument: str = "path") -> dict | None:
  """The settings an existing forecast store at `path` was written with (None: no store);
  an `ArgumentError` of `argument` (the caller's name for `path`) if it is none of ours."""
  if not outputs.holds_data(path):  # nothing there, or an empty directory
    return None
  if not paths.is_complete(path):
    raise UserError(f"{path} is a forecast store whose creation was cut short; remove it "
                     "and run the same command again.")
  try:
    return writer.read_attrs(path)[SETTINGS_ATTR]
  except Exception as error:  # not a zarr store, or not one of ours
    raise ArgumentError(argument, path, f"exists and is not a forecast store written by "
                        f"wnscale ({error}); choose another `{argument}` or remove it."
                        ) from error


class ForecastStore:
  """Writes states into a forecast store; see the module docstring.

  Args:
    path: the store (created if missing, else resumed when its settings match).
    settings: JSON-serializable settings recorded in the store (`init_times`,
      `lead_hours`, ...); a resumed store must have been written with the same.
    init_times: `[num_inits]` datetime64; leads: `[num_leads]` timedelta64.
    variables, levels: the state layout (`variables.channel_names` order).
    latitude: `[num_lat]` in the order to write (the source store's);
      `flip_latitude`: states arrive latitude ascending and are to be flipped.
    longitude: `[num_lon]`.
    on_points: `latitude` and `longitude` are `[points]`, one of each per point (a
      `values` dim; `flip_latitude` must be False).
    point_coords: `{name: [points]}` more coordinates along `values` (a cut-out's
      `region` mask and `cell_area`: `launch.evaluate --region=cutout` reads them).
    members: ensemble size (adds the `number` dim); None: deterministic.
    modalities: `{name: {"variables": [C_t], "station_id", "latitude", "longitude": [S]}}`
      each target modality's group (module docstring).
    argument: the caller's name for `path`: a store of other settings there is an
      `ArgumentError` of it.
    writer_index, num_writers: this process's share of the chunks, of `num_writers`
      (the processes); writer 0 creates the store and records finished initial
      times, the others need it to exist (writer 0 made it).
    barrier: `barrier(name)` returns once every writer has called it with `name`
      (with several writers: `multihost_utils.sync_global_devices`).

  `wait_seconds` sums the time this process waited for its writes: what writing
  cost beyond the rollout it overlaps.
  """

  def __init__(self, path: str, settings: dict, *, init_times, leads, variables, levels,
               latitude, longitude, flip_latitude: bool, on_points: bool = False,
               point_coords: dict | None = None, members: int | None = None,
               modalities: dict | None = None, argument: str = "path",
               writer_index: int = 0, num_writers: int = 1,
               barrier: Callable[[str], None] | None = None):
    self.path = paths.normalize(path)
    self.variables, self.levels = tuple(variables), tuple(levels)
    self.flip_latitude = flip_latitude
    self.space = (POINT_DIM,) if on_points else STATIC_DIMS
    self.grid = (len(latitude),) if on_points else (len(latitude), len(longitude))
    self.members = members
    self.writer_index, self.num_writers, self.barrier = writer_index, num_writers, barrier
    self.wait_seconds = 0.0
    self.modalities = modalities or {}
    existing = recorded_settings(self.path, argument)
    if existing is None and writer_index != 0:
      raise RuntimeError(f"{self.path}: no forecast store for writer {writer_index} to open; "
                         "writer 0 makes it first.")
    if existing is None:
      outputs.remove_leftovers(self.path, outputs.FORECAST)  # of a creation killed outright
      self._create(settings, init_times, leads, latitude, longitude, point_coords or {})
    elif existing != settings:
      changed = sorted(key for key in existing.keys() | settings.keys()
                       if existing.get(key) != settings.get(key))
      raise ArgumentError(argument, self.path, f"holds a forecast with other settings "
                          f"({', '.join(changed)} differ); choose another `{argument}`, or "
                          "remove it to start again.")
    self.completed = sorted(int(i) for i in writer.read_attrs(self.path)[COMPLETED_ATTR])
    self._handles = {name: writer.open_variable(self.path, name) for name in self.variables}
    self._point_handles = {name: [writer.open_variable(paths.join(self.path, name), variable)
                                  for variable in layout["variables"]]
                           for name, layout in self.modalities.items()}
    self._pending = []

  def _create(self, settings, init_times, leads, latitude, longitude, point_coords):
    coords = {INIT: np.asarray(init_times, "datetime64[ns]"),
              LEAD: np.asarray(leads, "timedelta64[ns]")}
    coords.update({name: (self.space, np.asarray(values))
                   for name, values in point_coords.items()})
    for name, values in (("latitude", latitude), ("longitude", longitude)):
      values = np.asarray(values)
      coords[name] = (self.space, values) if self.space == (POINT_DIM,) else values
    lead_dims = ((ENSEMBLE, LEAD) if self.members else (LEAD,))
    if self.members:
      coords[ENSEMBLE] = np.arange(self.members)
    if self.levels:
      coords["level"] = np.asarray(self.levels, np.int64)
    layouts = {}
    for name in self.variables:
      level_dims = ("level",) if variables_lib.lookup(name).atmospheric else ()
      dims = (INIT,) + lead_dims + level_dims + self.space
      chunks = (1,) * (1 + len(lead_dims)) + (len(self.levels),) * len(level_dims) + self.grid
      layouts[name] = writer.VariableLayout(dims, chunks,
                                            {"units": variables_lib.lookup(name).units})
    with outputs.building(self.path) as where:
      writer.create_store(where, coords, layouts, {SETTINGS_ATTR: settings, COMPLETED_ATTR: []})
      for name, layout in self.modalities.items():
        self._create_modality(paths.join(where, name), coords, lead_dims, layout)
      if self.modalities:
        writer.consolidate(where)

  def _create_modality(self, where: str, coords: dict, lead_dims: tuple, layout: dict):
    """A target modality's group at `where` (the module docstring's layout)."""
    station = observations.DIMS[1]
    group_coords = {name: coords[name] for name in (INIT, LEAD, ENSEMBLE) if name in coords}
    group_coords.update({name: ((station,), np.asarray(layout[name]))
                         for name in observations.COORDINATES})
    dims = (INIT,) + lead_dims + (station,)
    chunks = (1,) * (1 + len(lead_dims)) + (len(layout["station_id"]),)
    writer.create_store(where, group_coords, {
        name: writer.VariableLayout(dims, chunks, {"units": variables_lib.lookup(name).units})
        for name in layout["variables"]})

  def _kept(self) -> str:
    """What a forecast cut short by a full disk keeps, for its message."""
    return (f"its {len(self.completed)} finished initial time(s) are kept; free some space and "
            "run the same command again to forecast the rest")

  def write(self, init_index: int, lead_index: int, state: np.ndarray, member: int | None = None,
            points: dict | None = None):
    """Starts writing this process's share of one state `[channels, lat * lon]` (latitude
    ascending) or `[channels, points]`, and of each target modality's `points[name]`
    `[C_t, stations]`, in physical units (every process is given them all)."""
    self._wait()  # at most one lead time's writes in flight
    prefix = (init_index,) + (() if member is None else (member,)) + (lead_index,)
    chunks = [(handle[prefix], values) for name, handles in self._point_handles.items()
              for handle, values in zip(handles, points[name])]
    channel = 0
    for name in self.variables:
      width = len(self.levels) if variables_lib.lookup(name).atmospheric else 1
      field = state[channel:channel + width].reshape((width,) + self.grid)
      if self.flip_latitude:
        field = field[:, ::-1]
      chunks.append((self._handles[name][prefix],
                     field if variables_lib.lookup(name).atmospheric else field[0]))
      channel += width
    # Dealt out largest first (a stable sort: the same order in every process).
    chunks = sorted(chunks, key=lambda chunk: -chunk[1].size)
    self._pending += [handle.write(np.ascontiguousarray(values, np.float32))
                      for handle, values in chunks[self.writer_index::self.num_writers]]

  def finish_init(self, *init_indices: int):
    """Waits for this process's writes of the initial times and, once every writer's are
    done (one barrier), records them as finished (writer 0)."""
    completed = sorted(set(self.completed) | {int(i) for i in init_indices})
    self._wait()
    if self.barrier is not None:
      self.barrier(f"wnscale forecast: initial times {list(init_indices)} written")
    if self.writer_index == 0:
      with outputs.writing(self.path, self._kept):
        writer.update_attrs(self.path, {COMPLETED_ATTR: completed})
    self.completed = completed

  def _wait(self):
    """Waits for the writes in flight (all of them, even after one fails)."""
    pending, self._pending = self._pending, []
    start = time.perf_counter()
    with outputs.writing(self.path, self._kept):
      writer.wait_all(pending)
    self.wait_seconds += time.perf_counter() - start


def forecast_settings(*, workdir: str, checkpoint_step: int, initial_conditions: str,
                      init_times, leads, variables, levels, members=None,
                      params=None, modalities=None) -> dict:
  """The JSON settings that identify a forecast (what a resumed run must match);
  `modalities`: `{name: {"variables": [...], "observations": store path}}` of its groups."""
  ensemble = {} if members is None else {"members": int(members)}
  chosen = {} if params is None else {"params": params}  # run_directory.PARAMS, when asked
  chosen.update({"modalities": modalities} if modalities else {})
  return {**ensemble, **chosen, "workdir": paths.normalize(workdir), "checkpoint_step": int(checkpoint_step),
          "initial_conditions": paths.normalize(initial_conditions),
          "init_times": [str(pd.Timestamp(t)) for t in init_times],
          "lead_hours": [float(pd.Timedelta(lead) / pd.Timedelta(hours=1)) for lead in leads],
          "variables": list(variables), "levels": [int(level) for level in levels]}
