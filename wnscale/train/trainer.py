"""`train_and_evaluate(config, workdir)`: the whole training run.

Data (Grain, per-process share) -> sharded train step (shard_map over the
`(data, graph)` mesh) -> Optax -> metrics and evaluation -> Orbax checkpoints.
Re-running with the same workdir resumes from the newest good checkpoint:
model, optimizer and data iterator, so the losses continue exactly. The
workdir, the store and the statistics may be URLs (`gs://...`).
SIGTERM or Ctrl-C (SIGINT) saves a checkpoint and returns cleanly; with several
processes, all of them save the same step (JAX's preemption sync point),
whichever got the signal; a second Ctrl-C stops at once (`wnscale.interrupts`).
Process 0 holds the workdir's lock for the whole run (`workdir.lock`). A
resumed run must read the data its checkpoints were trained on
(`check_same_data`). A full disk ends the run with a `NoSpaceLeft` naming the
path; the checkpoints written before stay, and the next start removes what
the failed save left (Orbax's temporary directories).
Batches are read and placed on the devices ahead of the step by a background thread
(`train.prefetch_batches`, `wnscale.data.prefetch`); a checkpoint holds the data
position after the last batch trained on, not after those prefetched. The loop waits for
each step's result before it takes the next batch, so that its logged shares of time
waiting on input and on the host say how long the devices waited (`loop_time`).
A rollout curriculum (`train.rollout_schedule`, `wnscale.train.curriculum`) trains
phase by phase, each with its own compiled step and a data pipeline of its
target length continuing the previous one's position; a moving average of the
parameters (`train.ema_decay`) is part of the train state, and is what the
evaluations score; `train.freeze` leaves parts of the model out of the optimizer;
`train.accumulation_steps` runs each batch as micro-batches inside the step (the
whole batch's gradient and metrics).
What the run logs as it goes: `wnscale.train.run_log`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import gc
import json
import logging
import re
import time

import jax
import ml_collections
import numpy as np

from wnscale import compilation_cache, coordination, interrupts, paths, progress
from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.data import pipeline, prefetch
from wnscale.data import source as source_lib
from wnscale.data.reading import store as store_lib
from wnscale.data.run_data import (check_store_given, open_example_store, open_grid_store,
                                   open_run_data, resolve_store)
from wnscale.assembly import assemble_run
from wnscale.errors import ArgumentError, NoSpaceLeft, UserError, no_space
from wnscale.model import ensemble, setup
from wnscale.planner import auto_remat, topology
from wnscale.sharding import mesh as mesh_lib
from wnscale.sharding.layout import ShardedLayout
from wnscale.tracking.run import TrackedRun, run_tags
from wnscale.train import checkpoint as checkpoint_lib
from wnscale.train import curriculum
from wnscale.train import evaluation, loop_time, optimizer as optimizer_lib
from wnscale.train import param_layouts, run_directory, run_log
from wnscale.train.run_directory import RunDirectory
from wnscale.train import step as step_lib
from wnscale.train import workdir as workdir_lib
from wnscale.train.metrics import MetricsWriter
from wnscale.train.state import initial_state


class NonFiniteLossError(RuntimeError):
  """The loss became NaN or inf; no checkpoint of that state was written."""


def _check_finite(state):
  bad_step = int(state.nonfinite_step)
  if bad_step >= 0:
    raise NonFiniteLossError(
        f"The loss became NaN or inf at step {bad_step}; stopping without checkpointing "
        "that state. Lower train.learning_rate or check the data for bad values.")


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, name: str = "") -> dict:
  """Trains `config` in `workdir` (a directory or a URL); returns the last logged metrics.

  `name`: the config's name (e.g. its file's), the `model` tag of the run's trackers.

  Raises:
    UserError: a mistake in the config or the data; another run holds the workdir;
      the data differ from those the workdir's checkpoints were trained on.
    NoSpaceLeft: the disk holding the workdir is full.
  """
  run_start = time.perf_counter()
  # The specs, made once: what is built below reads them, never the config.
  specs = specs_lib.from_config(config_lib.validate(config))
  train = specs.train
  check_store_given(specs.data)  # before a tracker or the workdir is touched
  run = RunDirectory(workdir)
  workdir_lib.prepare(run.path)
  _check_init_from(train.init_from, run)
  with workdir_lib.locked(run.path, enabled=jax.process_index() == 0):
    check_same_data(run, config, specs.data)  # a finished run too: on other data, it says so
    saved = run.saved_steps()
    if saved and saved[-1] >= train.steps:  # said before the store is opened
      logging.info("Nothing to train: the newest checkpoint, %s, is at step %d, and "
                   "train.steps=%d. Raise train.steps to train further.",
                   run.checkpoint(saved[-1]), saved[-1], train.steps)
      return {}
    try:
      with contextlib.ExitStack() as closing:  # whatever is opened, closed however it ends
        # The trackers first: one that cannot be reached stops the run before any work.
        trackers = TrackedRun.open(train.trackers, run.path, run_tags(specs, name),
                                   train.steps, enabled=jax.process_index() == 0)
        closing.push(trackers)  # closed last: FAILED on an error, else by the last step
        training = _set_up(specs, config_lib.to_json(config), run, closing, trackers)
        return _train(training, closing, run_start)
    except Exception as error:
      if isinstance(error, NoSpaceLeft) or no_space(error) is None:
        raise
      gc.collect()  # the failed save's coroutines, now (quietly), not at interpreter exit
      raise _no_space_error(error, run) from error


def _no_space_error(error: BaseException, run: RunDirectory) -> NoSpaceLeft:
  """One line for a full disk: the path being written, and what is safe."""
  path = None
  while error is not None and path is None:
    if isinstance(error, OSError) and error.filename:
      path = error.filename
    else:  # tensorstore's message, through Orbax: ... Failed writing: "<path>": ...
      found = re.findall(r'"((?:/|[a-z0-9]+://)[^"]+)"', str(error))
      path = found[-1] if found else None
    error = error.__cause__ or error.__context__
  if path and ".orbax-checkpoint-tmp" in path:  # a file deep inside: name the checkpoint
    path = path[:path.index(".orbax-checkpoint-tmp")] + ".orbax-checkpoint-tmp"
  steps = run.saved_steps()
  safe = (f"the checkpoint{'s' * (len(steps) > 1)} of step{'s' * (len(steps) > 1)} "
          f"{', '.join(map(str, steps))} {'are' if len(steps) > 1 else 'is'} intact; free "
          f"space and run the same command to resume from step {steps[-1]}" if steps else
          "no checkpoint was saved yet; free space and run the same command")
  return NoSpaceLeft(f"No space left on device writing {path or 'under ' + run.path}: the "
                     f"run stopped; {safe}.")


@dataclasses.dataclass
class _Training:
  """A run set up to train (`_set_up`): what its loop steps, evaluates, logs and saves."""

  specs: specs_lib.Specs  # resolved: the store's path, an auto remat's choice
  recorded: dict  # the config of `specs` (`specs.recorded_config`), kept with each checkpoint
  run: RunDirectory
  layout: ShardedLayout
  constants: tuple  # device `(Constants, halo_indices)`
  state: object
  start_step: int
  train_step: object  # jitted; compiled when each rollout phase starts
  evaluator: evaluation.Evaluator
  train_data: pipeline.DataPipeline
  batches: prefetch.DevicePrefetch  # `train_data`'s batches on the devices
  data_offset: int
  phases: tuple  # the run's `specs.Phase`s
  pipeline_at: object  # `(phase, data_offset) -> DataPipeline` of the phase's examples
  prefetch_from: object  # `DataPipeline -> DevicePrefetch` of its batches
  num_groups: int
  checkpointer: checkpoint_lib.Checkpointer
  writer: MetricsWriter
  preemption: interrupts.AgreedStop
  frozen: dict  # `optimizer.frozen_counts` of `train.freeze`
  trackers: TrackedRun

  def start_phase(self, phase: specs_lib.Phase):
    """Reads `phase`'s examples from here on: a pipeline of its target length, continuing
    after the last batch trained on (the same examples, indexed alike in every phase);
    the batches prefetched for the previous phase are dropped."""
    position = self.batches.get_state()
    self.batches.close()
    self.train_data.close()
    self.train_data = self.pipeline_at(phase, self.data_offset)
    self.train_data.restore(position)
    self.batches = self.prefetch_from(self.train_data)


def _place(layout: ShardedLayout, batch_size: int, rows_per_example: int, dtype,
           local: dict) -> dict:
  """A process's batch `local` as global device arrays of `batch_size` examples, each on
  `rows_per_example` rows, carried in as `dtype` (`setup.batch_dtype`)."""
  if rows_per_example > 1:  # members on the data axis: a row per member, member-major
    local = {key: np.concatenate([value] * rows_per_example) for key, value in local.items()}
  return layout.global_batch(local, batch_size * rows_per_example, dtype)


def _set_up(specs: specs_lib.Specs, given: dict, run: RunDirectory,
            closing: contextlib.ExitStack, trackers: TrackedRun) -> _Training:
  """Everything `train_and_evaluate` runs once the workdir is locked and the `trackers`
  opened: the data, the model, the state resumed, the steps; what needs closing is pushed
  onto `closing`. `given`: the JSON of the config `specs` were made from (what the run's
  `config.json` records, with the values resolved here)."""
  is_main = jax.process_index() == 0
  train = specs.train
  mesh = mesh_lib.make_mesh(specs.mesh)
  members = ensemble.training_members(specs)
  rows_per_example = _check_members(mesh, members)
  mesh_lib.check_batch_size(mesh, train.batch_size * rows_per_example,
                            train.accumulation_steps)
  warmup = optimizer_lib.warmup_steps(train)
  if warmup != train.warmup_steps and is_main:  # one warning, not one per process
    logging.warning("train.warmup_steps=%d does not fit in a run of train.steps=%d: warm-up "
                    "clipped to %d steps.", train.warmup_steps, train.steps, warmup)

  # The store gives the grid; the training range gives the normalization statistics.
  # The eval range is opened now: a range the store lacks is an error before compiling.
  with run_log.phase("Store and statistics ready") as phase:
    data = dataclasses.replace(specs.data, path=resolve_store(specs.data, specs.seed))
    specs = dataclasses.replace(specs, data=data)
    phases = specs.phases
    store = open_example_store(data)
    _check_batch_fits(data, store, train.batch_size, curriculum.longest(phases))
    # Each modality's observations, at the grid store's times, with the training
    # range's statistics: the same store, statistics and readers for both ranges.
    run_data = open_run_data(data, specs.seed, store=store)
    source = pipeline.make_source(
        data, "train", store=store, norm=run_data.normalization,
        indexed_target_steps=curriculum.longest(phases)).with_modalities(run_data.readers)
    eval_source = (pipeline.make_source(data, "eval", store=store, norm=run_data.normalization
                                        ).with_modalities(run_data.readers)
                   if train.eval_every else None)
    phase["text"] = run_log.describe_data(source, eval_source)
  if specs.model.remat.remat_policy == "auto":  # sized for the longest rollout phase
    chosen = _auto_remat(curriculum.longest_phase_specs(specs))["overrides"]
    specs = dataclasses.replace(specs, model=dataclasses.replace(
        specs.model, remat=dataclasses.replace(specs.model.remat, **chosen)))

  assembly = assemble_run(specs, run_data, mesh, params="init", phase=run_log.phase)
  layout = assembly.layout
  device_constants, halo_indices = layout.constants(assembly.constants)
  # Data: this process's share (processes holding the same batch rows read the same
  # examples), read straight into the layout's grid order. With members on `data`, an
  # example's members lie on the rows of several processes: each reads every example (its
  # devices take their own rows of the tiled batch, `ShardedLayout.global_batch`).
  group, num_groups = (mesh_lib.process_data_group(mesh) if rows_per_example == 1
                       else (0, 1))
  source = source.in_layout(layout.grid_slots, layout.point_slots)
  if eval_source is not None:
    _check_eval_range(specs, eval_source, num_groups)
    eval_source = eval_source.in_layout(layout.grid_slots, layout.point_slots)
  optimizer = optimizer_lib.make_optimizer(train)
  frozen = optimizer_lib.frozen_counts(assembly.params, train.freeze)
  if train.freeze and is_main:
    logging.info("Frozen (no update, no optimizer state): %s; %s parameters trained.",
                 run_log.describe_frozen(frozen), f"{frozen[optimizer_lib.TRAINED]:,}")

  # Resume (only unreadable checkpoint files count as damage, see `_resume`); a new run
  # starts from `train.init_from`'s parameters if given.
  checkpointer = run.checkpointer(train.max_checkpoints)
  closing.callback(checkpointer.close)
  params = assembly.params
  if train.init_from and not checkpointer.manager.all_steps():
    params = _initial_params(train.init_from, assembly)
  state = jax.device_put(initial_state(params, optimizer, ema=bool(train.ema_decay)),
                         assembly.replicated)

  def pipeline_at(phase: specs_lib.Phase, offset: int) -> pipeline.DataPipeline:
    train_data = _train_pipeline(specs, source.with_target_steps(phase.target_steps), group,
                                 num_groups, offset)
    closing.callback(train_data.close)
    return train_data

  place = functools.partial(_place, layout, train.batch_size, rows_per_example,
                            setup.batch_dtype(specs.model))

  def prefetch_from(train_data: pipeline.DataPipeline) -> prefetch.DevicePrefetch:
    batches = prefetch.DevicePrefetch(train_data.iterator, place, train.prefetch_batches)
    closing.callback(batches.close)  # before `train_data.close`: the thread reads from it
    return batches

  state, train_data, data_offset = _resume(checkpointer, run, state, assembly.replicated,
                                           specs, phases, pipeline_at, num_groups)
  # The run is compatible with the workdir's checkpoints: record its resolved config.
  recorded = specs_lib.recorded_config(specs, given)
  if is_main:
    run.write_config(recorded)
  start_step = int(state.step)
  writer = MetricsWriter(run.path, resume_step=start_step, enabled=is_main, trackers=trackers)
  closing.callback(writer.close)
  if is_main:
    trackers.config(recorded, run.config_path)

  train_step = step_lib.train_step_of(specs, layout, assembly.graphdef, optimizer,
                                      device_constants, halo_indices)
  evaluator = evaluation.Evaluator(specs, layout, assembly.graphdef, device_constants,
                                   halo_indices, run_data.normalization.channel_stats,
                                   source.store.channel_names, group, num_groups,
                                   source=eval_source, rows_per_example=rows_per_example)
  preemption = interrupts.AgreedStop("checkpointing the step reached, then stopping")
  closing.callback(preemption.restore)
  return _Training(specs, recorded, run, layout, (device_constants, halo_indices), state,
                   start_step, train_step, evaluator, train_data, prefetch_from(train_data),
                   data_offset, phases, pipeline_at, prefetch_from, num_groups, checkpointer,
                   writer, preemption, frozen, trackers)


def _train(t: _Training, closing: contextlib.ExitStack, run_start: float) -> dict:
  """The training loop of a run set up (`_set_up`); returns the last logged metrics.

  Closes what `closing` holds when the loop ends (the saves finished), before the summary.
  """
  train, state, start_step = t.specs.train, t.state, t.start_step
  is_main = jax.process_index() == 0
  total = train.steps
  last, last_step, last_eval = {}, None, None
  times = {"set-up": time.perf_counter() - run_start, "compile": 0.0, "evaluation": 0.0,
           "checkpoint": 0.0}
  done = start_step
  if start_step >= total:
    logging.info("Nothing to train: the checkpoint is at train.steps=%d. Raise "
                 "train.steps to train further.", total)
  loop_start = time.perf_counter()
  clock, interval_start = loop_time.LoopClock(), start_step
  phase = train_step = None
  for step in range(start_step, total):
    if phase is None or step == phase.end_step:  # a phase starts: its data, its step
      starting = curriculum.phase_at(t.phases, step)
      if phase is not None:  # the resumed or first phase's pipeline is made by `_resume`
        t.start_phase(starting)
      phase, train_step = starting, None
    with clock.input_wait():
      batch = next(t.batches)
    if train_step is None:
      compile_start = time.perf_counter()
      with clock.left_out(), run_log.phase(_compiled_text(
          t.phases, phase, train.accumulation_steps)) as details, _still_compiling():
        loaded = compilation_cache.hits()
        train_step = t.train_step.lower(state, *t.constants, batch).compile()
        if compilation_cache.hits() > loaded:
          details["text"] = "loaded from the persistent compilation cache"
      with clock.left_out():  # all compiled before the step's collectives (`coordination`)
        coordination.all_reach("train step compiled")
      times["compile"] += time.perf_counter() - compile_start
    with clock.step():
      state, metrics = train_step(state, *t.constants, batch)
      jax.block_until_ready(metrics)  # one step in flight (`loop_time`)
    done = step + 1
    preempted = t.preemption.reached(done)
    if done % train.log_every == 0 or done == total:
      _check_finite(state)
      last = {k: float(v) for k, v in metrics.items()} | clock.interval(done - interval_start)
      last["target_steps"] = phase.target_steps
      last_step, interval_start = done, done
      t.writer.write(done, last)
      if is_main:
        eta = datetime.timedelta(seconds=round((total - done)
                                               / max(last["steps_per_sec"], 1e-9)))
        logging.info("step %d/%d | loss %.5f | lr %.2e | %.2f steps/s | input wait %.0f%% | "
                     "host %.0f%% | ETA %s", done, total, last["loss"],
                     last["learning_rate"], last["steps_per_sec"],
                     100 * last["input_wait_fraction"], 100 * last["host_fraction"], eta)
    if train.eval_every and done % train.eval_every == 0:
      eval_start = time.perf_counter()
      with clock.left_out():  # evaluation time is not training speed
        rmse = t.evaluator.evaluate(state.params if state.ema is None else state.ema)
      last_eval = (done, rmse)
      t.writer.write(done, {evaluation.metric_name(k): v for k, v in rmse.items()}
                     | {"target_steps": phase.target_steps})
      if is_main:
        logging.info("eval at step %d, RMSE: %s", done, run_log.format_rmse(rmse))
      times["evaluation"] += time.perf_counter() - eval_start
    if done % train.checkpoint_every == 0 or done == total or preempted:
      _check_finite(state)
      t.writer.sync()  # metrics up to this step are stored before the checkpoint is
      save_start = time.perf_counter()
      t.checkpointer.save(done, state, t.batches,
                          {"step": done, "data_groups": t.num_groups,
                           "data_offset": t.data_offset, "process_count": jax.process_count(),
                           "config": t.recorded})
      blocked = time.perf_counter() - save_start
      times["checkpoint"] += blocked
      if is_main:
        logging.info("Checkpoint of step %d: writing in the background to %s (the loop "
                     "was blocked %.3f s).", done, t.run.checkpoint(done), blocked)
    if preempted:
      t.checkpointer.wait()
      logging.warning("Stopped at step %d after %s; checkpoint saved to %s. Run the same "
                      "command to continue.", done, t.preemption.signal_name,
                      t.run.checkpoint(done))
      break
  times["training"] = (time.perf_counter() - loop_start - times["compile"] - times["evaluation"]
                       - times["checkpoint"])
  closing.close()
  if is_main:
    run_log.summary(start_step, done, time.perf_counter() - run_start, times,
                    (last_step, last), last_eval, train, t.run.path,
                    t.checkpointer.manager.all_steps(), t.specs.data.path, t.frozen,
                    regional_store=t.specs.data.regional_path,
                    trackers=t.trackers.descriptions)
  return last


def _resume(checkpointer, run: RunDirectory, state, sharding, specs, phases, pipeline_at,
            num_groups: int):
  """`(state, train_data, data_offset)` from the newest good checkpoint, or as given; the
  training pipeline (`train_data`: `pipeline_at` of the phase of the step resumed,
  positioned there).

  The data iterator's state is applied after the checkpoint's files are read
  (`Checkpointer.restore_latest`): an error there propagates and sets nothing aside.
  """

  def same_data_layout(metadata) -> bool:  # Grain keeps one state per process
    return (metadata["data_groups"] == num_groups
            and metadata.get("process_count", jax.process_count()) == jax.process_count())

  abstract_state = checkpoint_lib.abstract_like(state, sharding)
  restored = checkpointer.restore_latest(abstract_state, same_data_layout,
                                         param_layouts.train_state_layouts(abstract_state))
  if restored is None:
    logging.info("Starting fresh: no checkpoint in %s.", checkpointer.directory)
    return state, pipeline_at(phases[0], 0), 0
  metadata = restored.metadata
  phase = curriculum.phase_at(phases, restored.step)
  if restored.data_state is not None:
    data_offset = metadata["data_offset"]
    train_data = pipeline_at(phase, data_offset)
    train_data.restore(restored.data_state)
  else:  # positioned by step instead
    data_offset = restored.step * (specs.train.batch_size // num_groups)
    train_data = pipeline_at(phase, data_offset)
    logging.info("Checkpoint had %d data groups of %s processes, now %d of %d: data stream "
                 "positioned by step.", metadata["data_groups"],
                 metadata.get("process_count", "?"), num_groups, jax.process_count())
  logging.info("Resumed from step %d, checkpoint %s.", restored.step,
               run.checkpoint(restored.step))
  return restored.state, train_data, data_offset


# Data settings that change neither which examples a run reads, nor in what order, nor
# their normalization: a resumed run may change them.
HARMLESS_DATA_KEYS = ("worker_count",)


def check_same_data(run: RunDirectory | str, config: ml_collections.ConfigDict,
                    data: specs_lib.DataSpec):
  """A resumed run reads the data its checkpoints were trained on, else a `UserError`.

  Compares `config.data` (its spec: `data`) with the `data` of the config of the run
  directory `run` (a `RunDirectory` or its path) when it has checkpoints to resume from.
  Keys in `HARMLESS_DATA_KEYS` may differ. `data.path` may name another copy of the same store (the same
  variables, levels, times and grid, opened both); with no `data.path` (a
  synthetic store) the other keys say which store it is.
  """
  run = run if isinstance(run, RunDirectory) else RunDirectory(run)
  if not run.saved_steps() or not run.has_config():
    return
  # A key the run's config.json lacks (written before it existed) had its default.
  before = (config_lib.to_json(config_lib.default_config())["data"]
            | json.loads(paths.read_text(run.config_path)).get("data", {}))
  now = config_lib.to_json(config)["data"]
  differ = [key for key in sorted(before.keys() | now.keys())
            if key not in HARMLESS_DATA_KEYS + ("path",) and before.get(key) != now.get(key)]
  if (now["path"] and before.get("path")
      and paths.normalize(now["path"]) != paths.normalize(before["path"])
      and not _same_store(before["path"], now["path"], data)):
    differ.insert(0, "path")
  if differ:
    name = run_directory.CONFIG
    shown = "; ".join(f"data.{key}: {before.get(key, 'absent')!r} in {name}, now "
                      f"{now.get(key, 'absent')!r}" for key in differ[:5])
    more = f" and {len(differ) - 5} more" if len(differ) > 5 else ""
    raise UserError(
        f"The workdir {run.path} holds a run trained on other data ({shown}{more}): resuming "
        f"would mix the two. Resume with the data settings of {run.config_path}, or give "
        f"this run another `workdir` (`train.init_from={run.path}` starts it from "
        f"this run's parameters). Only data.{', data.'.join(HARMLESS_DATA_KEYS)} may change, "
        "and data.path to a copy of the same store.")


def _same_store(before: str, now: str, data: specs_lib.DataSpec) -> bool:
  """Whether the stores at `before` and `now` hold the same variables, levels, times, grid."""
  def describe(path):
    store = open_grid_store(data, path)
    return store.channel_names, store.times.tolist(), store.points.digest()
  try:
    return describe(before) == describe(now)
  except Exception:  # noqa: BLE001 (one of them missing or unreadable: not shown the same)
    return False


def _check_batch_fits(data: specs_lib.DataSpec, store: store_lib.WeatherStore,
                      batch_size: int, target_steps: int):
  """A batch holds distinct examples of the training range of `store`: a `train.batch_size`
  larger than the range's examples is said now, with the numbers (before any statistics or
  compile; not after minutes, as a batch that does not fit in memory)."""
  first, count = store_lib.time_range(store.times, data.train_start, data.train_end,
                                      data.path)
  window = data.input_steps + max(target_steps, data.target_steps)
  examples = len(source_lib.example_starts(store, first, count, window))
  if 0 < examples < batch_size:
    raise ArgumentError(
        "train.batch_size", batch_size,
        f"more than the {examples} example(s) of the training range {data.train_start} .. "
        f"{data.train_end} ({count} times of {data.path} every {data.time_step_hours} h; "
        f"an example spans {window}): lower `train.batch_size` to at most {examples}, or "
        "widen `data.train_start` .. `data.train_end`.")


def _check_members(mesh, members) -> int:
  """Batch rows per example: the members when they are laid out on `data`, else 1."""
  if members is None or not members.on_data:
    return 1
  data = mesh.shape[mesh_lib.DATA]
  if data % members.members:
    raise UserError(f"train.members_on_data=True: mesh.data={data} must be a multiple of "
                    f"train.ensemble_members={members.members} (one member per data shard).")
  return members.members


def _check_init_from(init_from: str, run: RunDirectory):
  """A new run's `train.init_from` holds checkpoints: said before anything is built."""
  if not init_from:
    return
  if run.saved_steps():
    return  # a resumed run starts from its own checkpoints
  checkpoints = RunDirectory(init_from).checkpoints
  if not paths.exists(checkpoints):
    raise ArgumentError("train.init_from", init_from, f"no run there ({checkpoints} does not "
                        "exist); give the directory of a run of launch.train or "
                        "launch.import_graphcast.")


def _initial_params(init_from: str, assembly) -> object:
  """The newest parameters of the run in `init_from` (`train.init_from`), replicated.

  Raises:
    CheckpointMismatchError: they have other shapes than this run's model.
  """
  run = RunDirectory(init_from)
  params, step = run.restore_params(assembly.abstract_params)
  logging.info("Parameters initialized from %s (step %d); optimizer state fresh.",
               run.checkpoints, step)
  return params


def _check_eval_range(specs: specs_lib.Specs, eval_source, num_groups: int):
  """A clear error, before compiling, when the eval range cannot fill one batch."""
  per_group = specs.train.batch_size // num_groups
  if len(eval_source) // num_groups < per_group:
    data = specs.data
    raise UserError(
        f"The eval range {data.eval_start} .. {data.eval_end} of {data.path} holds "
        f"{len(eval_source)} example(s); one evaluation batch needs {per_group} per data "
        f"group ({num_groups} group(s)). Widen data.eval_start/eval_end or set "
        "train.eval_every=0.")


def _still_compiling():
  """A line a minute while the train step compiles (minutes at 0.25 deg), from process 0."""
  if jax.process_index() != 0:
    return contextlib.nullcontext()
  return progress.still_working("Compiling the train step", every=progress.STILL_SECONDS)


def _compiled_text(phases, phase, accumulation_steps: int) -> str:
  """The log line of a phase's compile (naming the phase when there are several, and the
  micro-batches of a step that has them)."""
  micro = (f" ({accumulation_steps} micro-batches a step, their gradients summed)"
           if accumulation_steps > 1 else "")
  if len(phases) == 1:
    return f"Compiled the train step{micro}"
  return (f"Rollout phase {phase.index + 1} of {len(phases)} (steps {phase.first_step + 1}.."
          f"{phase.end_step}, {phase.target_steps} autoregressive step(s)): compiled its "
          f"train step{micro}")


def _auto_remat(specs: specs_lib.Specs) -> dict:
  """Chooses remat settings for this run's devices (`wnscale.planner.auto_remat`)."""
  target = topology.live_target()
  budget = int(specs.train.memory_budget_gib * topology.GIB) or None
  choice = auto_remat.choose_remat(specs, target, step_lib.lower_train_step, budget)
  logging.info("remat_policy='auto': %s", choice["reason"])
  return choice


def _train_pipeline(specs, source, group, num_groups, offset):
  """The training pipeline whose stream starts `offset` examples into this process's share."""
  return pipeline.make_pipeline(specs.data, "train", batch_size=specs.train.batch_size,
                                seed=specs.seed, process_index=group,
                                process_count=num_groups, skip_examples=offset, source=source)
