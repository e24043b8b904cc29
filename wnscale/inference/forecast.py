"""`run_forecast`: forecasts from a trained run's checkpoint into a WeatherBench2 zarr store.

The run directory gives the model (`config.json`) and its parameters (the
newest checkpoint, or a chosen step; parameters only, no optimizer). Initial
conditions come from the run's store or another with the same variables;
normalization uses the training store's statistics. The rollout runs sharded
over the `(data, graph)` mesh exactly like training, streaming each lead time
to the host (`rollout.StreamingForecaster`; a run's modalities read their observations
at the initial times and write their targets as groups of the store), and each initial
time is recorded as finished once all its lead times are written (`forecast_store`):
the same command continues a killed forecast where it stopped. Ctrl-C or SIGTERM stops it
after the lead time being computed, says how many initial times the store holds,
and returns (a second Ctrl-C stops at once; `wnscale.interrupts`).

Several JAX processes (`jax.distributed`) run one forecast on the global mesh,
each reading the initial conditions of its devices' batch rows. Process 0
creates the store; every process writes a share of its chunks (`forecast_store`),
and all wait for each other at each finished batch of initial times, so all agree
on the finished ones. A Ctrl-C or SIGTERM to any
process stops all after a finished batch (`interrupts.AgreedStop`).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import time

import jax
import numpy as np
import pandas as pd
from jax.experimental import multihost_utils

from wnscale import config as config_lib
from wnscale import interrupts, paths
from wnscale import specs as specs_lib
from wnscale.assembly import Assembly, assemble_run
from wnscale.data.reading import store as store_lib
from wnscale.data.reading.store import TimeRangeError, time_range
from wnscale.data.run_data import open_run_data
from wnscale.data.source import parse_duration
from wnscale.errors import ArgumentError, UserError
from wnscale.inference import forecast_store
from wnscale.inference.rollout import StreamingForecaster, live_device_bytes
from wnscale.progress import ForecastProgress
from wnscale.sharding import mesh as mesh_lib
from wnscale.train.run_directory import RunDirectory


def load_run_specs(run: RunDirectory, mesh: dict | None = None,
                   data_path: str | None = None,
                   resolution: float | None = None) -> tuple[specs_lib.Specs, str]:
  """`(specs, store path)`: the specs of the run's config with mesh overrides (`data`,
  `graph`, `exchange`) and the initial conditions' grid spacing `resolution` (an imported
  run's config does not know its grid), made once; the store of the initial conditions
  (default: the run's)."""
  config = run.read_config()
  config.mesh.update(mesh or {})
  if resolution is not None:
    config.data.resolution = resolution
  specs = specs_lib.from_config(config_lib.validate(config))
  return specs, data_path or specs.data.path


def select_init_times(times: np.ndarray, *, init_times=None, start=None, end=None,
                      every: str = "12h", time_step_hours: int = 6, input_steps: int = 2,
                      path: str = "") -> np.ndarray:
  """Indices into `times` (a store's times at the model step) of the initial times.

  Either `init_times` (a list), or every `every` from `start` to `end` (inclusive;
  an `end` without a time covers its day). Each needs `input_steps - 1` earlier
  store times for its history.
  """
  times = np.asarray(times, "datetime64[ns]")
  span = f"it covers {times[0]} .. {times[-1]} every {time_step_hours} h"
  if init_times:
    wanted = pd.DatetimeIndex([pd.Timestamp(t) for t in init_times]).values
    missing = [t for t in wanted if t not in times]
    if missing:
      raise UserError(f"Initial time {pd.Timestamp(missing[0])} is not a time of the store "
                       f"{path} at the model's {time_step_hours} h step; {span}.")
    indices = np.searchsorted(times, wanted)
  else:
    interval = parse_duration(every, "init_every")
    step = pd.Timedelta(hours=time_step_hours)
    if interval <= pd.Timedelta(0) or interval % step:
      raise ArgumentError("init_every", every, "must be a positive multiple of the model's "
                          f"{time_step_hours} h step.")
    try:
      first, count = time_range(times, start, end, path)
    except TimeRangeError as error:
      raise ArgumentError(f"init_{error.side}", error.value,
                          f"{error.where()} of the store {path}, which {error.coverage}."
                          ) from error
    indices = np.arange(first, first + count, interval // step)
    if len(indices) == 0:
      raise UserError(f"No initial times in {start} .. {end} in the store {path}; {span}.")
  early = [i for i in indices if i < input_steps - 1]
  if early:
    raise UserError(f"Initial time {pd.Timestamp(times[early[0]])} needs the "
                     f"{input_steps - 1} earlier state(s) of its history, which the store "
                     f"{path} does not hold; {span}.")
  return np.asarray(indices, np.int64)


def _check_members(model: specs_lib.ModelSpec, members: int | None):
  """A clear error unless an ensemble run (an FGN, GenCast's denoiser) gets `members` and a
  deterministic one does not."""
  ensemble = None
  if model.noise_channels:
    ensemble = f"an FGN ensemble model (model.noise_channels={model.noise_channels})"
  elif model.denoiser.noise_frequencies:
    ensemble = ("GenCast's denoiser, sampled into an ensemble (model.denoiser_noise_frequencies"
                f"={model.denoiser.noise_frequencies})")
  if ensemble and members is None:
    raise ArgumentError("members", None, f"is required: the run is {ensemble}; give the "
                        "number of members to forecast (N >= 1).")
  if members is not None and not ensemble:
    raise ArgumentError("members", members, "is for ensemble runs (an FGN: "
                        "model.noise_channels > 0; GenCast's denoiser: "
                        "model.denoiser_noise_frequencies > 0); this run's model is "
                        "deterministic: its members would all be the same.")
  if members is not None and members < 1:
    raise ArgumentError("members", members, "must be >= 1.")


def lead_steps(lead: str, time_step_hours: int) -> int:
  """Model steps in `lead` (e.g. "10d", "36h"), which must be a multiple of the step."""
  total, step = parse_duration(lead, "lead"), pd.Timedelta(hours=time_step_hours)
  if total <= pd.Timedelta(0) or total % step:
    raise ArgumentError("lead", lead, "must be a positive multiple of the model's "
                        f"{time_step_hours} h step.")
  return int(total // step)


def run_forecast(workdir: str, out: str, *, lead: str = "10d", init_times=None,
                 init_start: str | None = None, init_end: str | None = None,
                 init_every: str = "12h", step: int | None = None,
                 data_path: str | None = None, resolution: float | None = None,
                 mesh_overrides: dict | None = None, members: int | None = None,
                 params: str | None = None, stream=None) -> dict:
  """Forecasts every initial time not yet in `out`; returns a summary (speed, memory).

  Args:
    workdir: a training run directory (`config.json`, `checkpoints/`).
    out: the forecast store (created, or continued when it holds the same forecast).
    lead: the longest lead time; every model step up to it is written.
    init_times / init_start, init_end, init_every: the initial times (see
      `select_init_times`); default: every `init_every` over the run's eval range.
    step: the checkpoint; default: the newest (or, continuing `out`, the one it used).
    data_path: initial conditions from this store instead of the run's.
    resolution: their grid spacing in degrees, instead of the run's `data.resolution`.
    mesh_overrides: overrides of the config's `mesh` section (`data`, `graph`, `exchange`).
    members: an ensemble run's size (an FGN's or a denoiser's; required then): members
      0..N-1, a `number` dim; member k's noise depends on (run seed, initial time, k,
      lead) only (a denoiser's per-node noise also on the grid node: `wnscale.model.sampler`).
    params: `run_directory.PARAMS`: "ema" (the moving average of the parameters) or
      "raw"; default: the moving average if the run kept one.
    stream: where a progress bar goes (default stderr; a bar only on a terminal).
  """
  ready = _set_up(RunDirectory(workdir, argument="workdir"), out, lead, init_times,
                  init_start, init_end, init_every, step, data_path, resolution,
                  mesh_overrides, members, params)
  indices, init_datetimes = ready.indices, ready.init_datetimes
  num_leads, output = ready.num_leads, ready.output
  remaining = [i for i in range(len(indices)) if i not in set(output.completed)]
  summary = {"out": output.path, "checkpoint_step": ready.step, "initial_times": len(indices),
             "already_written": len(indices) - len(remaining), "lead_times": num_leads}
  if not remaining:
    logging.info("%s already holds all %d initial times.", output.path, len(indices))
    return summary

  forecaster = StreamingForecaster(ready.specs, ready.assembly, ready.params, ready.store,
                                   ready.readers)
  stop = interrupts.AgreedStop(
      "stopping after the lead time being computed; finished initial times are kept"
      if jax.process_count() == 1 else "stopping every process after the initial times "
      "being computed; finished initial times are kept")
  try:
    compile_start = time.perf_counter()
    summary["step_memory"] = forecaster.compile()
    summary["compile_seconds"] = time.perf_counter() - compile_start
    logging.info("Forecasting %d initial times x %d lead times (%d done before) into %s, "
                 "%d at a time.", len(remaining), num_leads, summary["already_written"],
                 output.path, forecaster.batch_size)
    gc.collect()  # the restore's garbage holds device arrays; the peak below is the rollout's
    # One row per (initial time, member), initial time major; a deterministic run: member None.
    rows = [(init_index, member) for init_index in remaining
            for member in (range(members) if members else [None])]
    progress = ForecastProgress(len(rows), num_leads, stream)
    peak, stopped = _forecast_rows(rows, indices, init_datetimes, num_leads, members,
                                   forecaster, output, progress, stop)
    progress.close()
  finally:
    stop.restore()
  if stopped:
    summary.update(interrupted=stop.signal_name, written=len(output.completed) -
                   summary["already_written"])
    logging.warning("Interrupted (%s): %d of %d initial times are in %s; run the same command "
                    "to finish.", stop.signal_name, len(output.completed), len(indices),
                    output.path)
    return summary
  seconds = time.perf_counter() - progress.start
  summary.update(written=len(remaining), model_steps=len(rows) * num_leads,
                 seconds=seconds, steps_per_sec=len(rows) * num_leads / seconds,
                 peak_live_device_bytes=peak, write_wait_seconds=output.wait_seconds)
  logging.info("Wrote %d initial times x %d lead times to %s: %.2f model steps/s.",
               len(remaining), num_leads, output.path, summary["steps_per_sec"])
  return summary


@dataclasses.dataclass
class _Forecast:
  """A forecast set up (`_set_up`): the model and its parameters, the initial times, the
  output store."""

  specs: specs_lib.Specs
  store: store_lib.WeatherStore  # the initial conditions
  indices: np.ndarray  # of the initial times in `store.times`
  init_datetimes: np.ndarray
  num_leads: int
  assembly: Assembly
  params: object
  step: int  # of the checkpoint
  output: forecast_store.ForecastStore
  readers: tuple  # each modality's observations (`observations.ModalityReader`), in layout


def _set_up(run: RunDirectory, out: str, lead: str, init_times, init_start, init_end,
            init_every: str, step: int | None, data_path: str | None,
            resolution: float | None, mesh_overrides: dict | None, members: int | None,
            params: str | None) -> _Forecast:
  """Everything `run_forecast` checks and builds before its loop (see its arguments)."""
  previous = forecast_store.recorded_settings(out, "out")  # first: one not ours stops all
  if previous is not None and previous["workdir"] != run.path:
    raise ArgumentError("out", paths.normalize(out), f"holds a forecast of another run, "
                        f"{previous['workdir']}; choose another `out`, or remove it to start "
                        "again.")
  specs, path = load_run_specs(run, mesh_overrides, data_path, resolution)
  _check_members(specs.model, members)
  d = specs.data
  # The initial conditions, normalized with the training run's statistics; each modality's
  # observations (its inputs at the initial times) aligned with their times.
  run_data = open_run_data(d, specs.seed, path=path)
  store = run_data.store
  indices = _init_indices(store, d, path, init_times, init_start, init_end, init_every)
  num_leads = lead_steps(lead, d.time_step_hours)
  leads = pd.timedelta_range(pd.Timedelta(hours=d.time_step_hours), periods=num_leads,
                             freq=f"{d.time_step_hours}h")
  if step is None and previous is not None:
    step = previous["checkpoint_step"]  # continue with the parameters it was started with

  assembly = assemble_run(specs, run_data, mesh_lib.make_mesh(specs.mesh))
  readers = tuple(reader.in_layout(assembly.layout.point_slots[reader.name])
                  for reader in run_data.readers)
  which = params
  params, step = run.restore_params(assembly.params, step, which)
  logging.info("Restored the parameters of step %d from %s.", step, run.path)

  init_datetimes = store.times[indices]
  outputs = d.outputs
  on_points = store.points.field_shape is None
  if on_points:  # one latitude and longitude per point, in the store's order
    latitude, longitude = store.points.latitude, store.points.longitude
  else:
    latitude, longitude = store.points.axes()
    latitude = latitude[::-1] if store.flip_latitude else latitude
  settings = forecast_store.forecast_settings(
      workdir=run.path, checkpoint_step=step, initial_conditions=path,
      init_times=init_datetimes, leads=leads, variables=outputs, levels=d.pressure_levels,
      members=members, params=which, modalities={
          reader.name: {"variables": list(reader.targets), "observations": reader.path}
          for reader in readers if reader.targets})
  output = _open_output(
      out, settings, init_times=init_datetimes, leads=leads, variables=outputs,
      levels=d.pressure_levels, latitude=latitude, longitude=longitude,
      flip_latitude=store.flip_latitude, on_points=on_points, members=members,
      point_coords=cutout_coords(store.points), argument="out",
      modalities={reader.name: _group_layout(reader) for reader in readers if reader.targets})
  return _Forecast(specs, store, indices, init_datetimes, num_leads, assembly, params, step,
                   output, readers)


def _group_layout(reader) -> dict:
  """A target modality's group in the forecast store (`forecast_store.ForecastStore`)."""
  return {"variables": list(reader.targets), "station_id": reader.station_id,
          "latitude": reader.points.latitude, "longitude": reader.points.longitude}


def _open_output(out: str, settings: dict, **layout) -> forecast_store.ForecastStore:
  """The forecast store (`forecast_store.ForecastStore` of these arguments), each process
  writing its share: process 0 creates or opens it; the others open it once it is there."""
  if jax.process_count() == 1:
    return forecast_store.ForecastStore(out, settings, **layout)
  share = dict(writer_index=jax.process_index(), num_writers=jax.process_count(),
               barrier=multihost_utils.sync_global_devices)
  output = (forecast_store.ForecastStore(out, settings, **layout, **share)
            if jax.process_index() == 0 else None)
  multihost_utils.sync_global_devices("wnscale forecast store ready")
  if output is not None:
    return output
  paths.forget_listings(out)  # any listing this process made there predates the store
  return forecast_store.ForecastStore(out, settings, **layout, **share)


def cutout_coords(points) -> dict:
  """A cut-out's `region` mask and `cell_area` along `values`, for its forecast store
  (`launch.evaluate --region=cutout` scores the region with the model's areas); none
  for other points."""
  if points.region is None:
    return {}
  return {store_lib.REGION: points.region, store_lib.CELL_AREA: points.area}


def _init_indices(store, data, path: str, init_times, init_start, init_end,
                  init_every: str) -> np.ndarray:
  """`select_init_times` of the arguments; by default over the run's eval range."""
  chosen = init_times is not None or init_start is not None or init_end is not None
  try:
    return select_init_times(
        store.times, init_times=init_times, start=init_start if chosen else data.eval_start,
        end=init_end if chosen else data.eval_end, every=init_every,
        time_step_hours=data.time_step_hours, input_steps=data.input_steps, path=path)
  except ArgumentError as error:
    if chosen or error.argument not in ("init_start", "init_end"):
      raise
    raise UserError(f"{error.__cause__} (the run's eval range, the default initial times); "
                    "choose initial times inside it.") from error


def _forecast_rows(rows, indices, init_datetimes, num_leads, members, forecaster, output,
                   progress, stop: interrupts.AgreedStop) -> tuple[int, bool]:
  """Forecasts `rows` (initial time, member) into `output` until done or stopped; returns
  the peak of live device bytes and whether it stopped."""
  peak, single = 0, jax.process_count() == 1
  for number, first in enumerate(range(0, len(rows), forecaster.batch_size)):
    if stop.reached(number):  # every process, at the same batch
      return peak, True
    batch = rows[first:first + forecaster.batch_size]
    inits = [init_index for init_index, _ in batch]
    row_members = [member for _, member in batch] if members else None
    for lead_index, states, points in forecaster.run(indices[inits], num_leads, row_members):
      for row, ((init_index, member), state) in enumerate(zip(batch, states)):
        output.write(init_index, lead_index, state, member,
                     {name: values[row] for name, values in points.items()})
      peak = max(peak, live_device_bytes())
      progress.leads_done(lead_index, len(batch))
      if single and stop.reached(number):  # this batch's initial times stay unfinished
        return peak, True
    # An initial time is done with its last row; every process agrees, so all meet at the
    # store's one barrier for the batch (several processes), before the record.
    finished = [init_index for init_index, member in batch
                if member is None or member == members - 1]
    if finished:
      output.finish_init(*finished)
    for init_index, member in batch:
      label = str(pd.Timestamp(init_datetimes[init_index]))
      progress.init_done(label if member is None else f"{label} member {member}")
  return peak, False
