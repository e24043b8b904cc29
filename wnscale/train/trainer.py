"""`train_and_evaluate(config, workdir)`: the whole training run.

Data (Grain, per-process share) -> sharded train step (shard_map over the
`(data, graph)` mesh) -> Optax -> metrics and evaluation -> Orbax checkpoints.
Re-running with the same workdir resumes from the newest good checkpoint:
model, optimizer and data iterator, so the losses continue exactly.
SIGTERM saves a checkpoint at the current step and returns cleanly.

The log says what the run does: each set-up phase and its time, a fresh start
or the checkpoint it resumes from, each checkpoint save and how long it held
the loop, and a summary at the end (steps, times, final loss and evaluation,
where every output is).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import signal
import time

import jax
import ml_collections
import numpy as np

from wnscale import config as config_lib
from wnscale.data import pipeline
from wnscale.data.resolve import resolve_store
from wnscale.model import setup
from wnscale.planner import auto_remat, topology
from wnscale.sharding import mesh as mesh_lib
from wnscale.sharding.layout import ShardedLayout
from wnscale.train import checkpoint as checkpoint_lib
from wnscale.train import evaluation, optimizer as optimizer_lib
from wnscale.train import step as step_lib
from wnscale.train import workdir as workdir_lib
from wnscale.train.metrics import MetricsWriter
from wnscale.train.state import initial_state


class NonFiniteLossError(RuntimeError):
  """The loss became NaN or inf; no checkpoint of that state was written."""


class _Preemption:
  """Records SIGTERM so the loop can checkpoint and stop between steps."""

  def __init__(self):
    self.requested = False
    self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del signum, frame
    logging.warning("SIGTERM received: checkpointing the current step, then stopping.")
    self.requested = True

  def restore(self):
    signal.signal(signal.SIGTERM, self._previous)


def _check_finite(state):
  bad_step = int(state.nonfinite_step)
  if bad_step >= 0:
    raise NonFiniteLossError(
        f"The loss became NaN or inf at step {bad_step}; stopping without checkpointing "
        "that state. Lower train.learning_rate or check the data for bad values.")


@contextlib.contextmanager
def _phase(what: str):
  """Logs (process 0) `what`, the block's seconds, and the `"text"` it puts in the yielded dict."""
  start = time.perf_counter()
  details = {}
  yield details
  if jax.process_index() == 0:
    logging.info("%s in %.1f s%s", what, time.perf_counter() - start,
                 f": {details['text']}" if "text" in details else ".")


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains `config` in `workdir`; returns the last logged metrics."""
  run_start = time.perf_counter()
  config_lib.validate(config)
  workdir_lib.prepare(workdir)
  is_main = jax.process_index() == 0
  mesh = mesh_lib.make_mesh(config.mesh)
  mesh_lib.check_batch_size(mesh, config.train.batch_size)
  warmup = optimizer_lib.warmup_steps(config.train)
  if warmup != config.train.warmup_steps:
    logging.warning("train.warmup_steps=%d does not fit in a run of train.steps=%d: warm-up "
                    "clipped to %d steps.", config.train.warmup_steps, config.train.steps,
                    warmup)

  # The store gives the grid and the normalization statistics; the eval range is
  # opened now too, so that a mistake in it stops the run before anything compiles.
  config = ml_collections.ConfigDict(config)  # a copy; store path and auto remat get resolved
  with _phase("Store and statistics ready") as phase:
    config.data.path = resolve_store(config)
    source = pipeline.source_from_config(config, "train")
    eval_source = (pipeline.source_from_config(config, "eval")
                   if config.train.eval_every else None)
    phase["text"] = _describe_data(source, eval_source)
  latitude, longitude = source.store.latitude, source.store.longitude

  if config.model.remat_policy == "auto":
    config.model.update(_auto_remat(config)["overrides"])
  if is_main:  # the resolved config: store path and remat settings as run
    with open(os.path.join(workdir, workdir_lib.CONFIG), "w") as f:
      f.write(config.to_json_best_effort(indent=2))

  # Model, constants and the sharded layout.
  stats = source.channel_stats
  graphs = setup.graphs_for_grid(config, latitude, longitude)  # logs built or from cache
  constants = setup.make_constants(config, graphs, latitude, longitude,
                                   stats["diff_std"] / stats["std"])
  with _phase(f"Partitioned the graphs over {mesh.shape[mesh_lib.GRAPH]} graph shard(s) "
              f"({mesh.shape[mesh_lib.DATA]} data x {mesh.shape[mesh_lib.GRAPH]} graph "
              f"devices)"):
    layout = ShardedLayout(mesh, graphs, *setup.node_positions(config, latitude, longitude),
                           config.mesh.exchange)
    device_constants, halo_indices = layout.constants(constants)
  # Data: this process's share (processes holding the same batch rows read the same
  # examples), read straight into the layout's grid order.
  group, num_groups = mesh_lib.process_data_group(mesh)
  source = source.in_layout(layout.grid_slots)
  train_data = _train_pipeline(config, source, group, num_groups, 0)
  with _phase("Initialized the model") as phase:
    graphdef, params = setup.init_model(config)
    phase["text"] = f"{sum(x.size for x in jax.tree.leaves(params)):,} parameters"
  optimizer = optimizer_lib.make_optimizer(config.train)
  schedule = optimizer_lib.learning_rate_schedule(config.train)
  replicated = layout.sharding(jax.sharding.PartitionSpec())
  state = jax.device_put(initial_state(params, optimizer), replicated)

  # Resume.
  checkpointer = checkpoint_lib.Checkpointer(os.path.join(workdir, workdir_lib.CHECKPOINTS),
                                             config.train.max_checkpoints)
  data_offset = 0

  def restore_data(step, metadata):
    nonlocal train_data, data_offset
    train_data.close()
    if metadata["data_groups"] == num_groups:
      train_data = _train_pipeline(config, source, group, num_groups, metadata["data_offset"])
      checkpointer.restore_iterator(step, train_data.iterator)
      data_offset = metadata["data_offset"]
    else:  # Grain's state is per process: position the stream by step instead.
      data_offset = step * (config.train.batch_size // num_groups)
      train_data = _train_pipeline(config, source, group, num_groups, data_offset)
      logging.info("Checkpoint had %d data groups, now %d: data stream positioned by step.",
                   metadata["data_groups"], num_groups)

  restored = checkpointer.restore_latest(checkpoint_lib.abstract_like(state, replicated),
                                         restore_data)
  if restored is not None:
    state = restored[0]
    logging.info("Resumed from step %d, checkpoint %s.", int(state.step),
                 os.path.join(checkpointer.directory, str(int(state.step))))
  else:
    logging.info("Starting fresh: no checkpoint in %s.", checkpointer.directory)
  start_step = int(state.step)
  writer = MetricsWriter(workdir, resume_step=start_step, enabled=is_main)

  train_step = step_lib.make_train_step(layout, graphdef, optimizer, schedule,
                                        device_constants, halo_indices,
                                        remat_steps=config.train.remat_rollout)
  evaluator = evaluation.Evaluator(config, layout, graphdef, device_constants, halo_indices,
                                   stats, source.store.channel_names, group, num_groups,
                                   eval_source)

  def next_batch():
    return layout.global_batch(next(train_data.iterator), config.train.batch_size)

  total = config.train.steps
  last, last_step, last_eval = {}, None, None
  times = {"set-up": time.perf_counter() - run_start, "compile": 0.0, "evaluation": 0.0,
           "checkpoint": 0.0}
  done = start_step
  preemption = _Preemption()
  try:
    if start_step < total:
      batch = next_batch()
      compile_start = time.perf_counter()
      with _phase("Compiled the train step"):
        train_step = train_step.lower(state, device_constants, halo_indices, batch).compile()
      times["compile"] = time.perf_counter() - compile_start
    else:
      logging.info("Nothing to train: the checkpoint is at train.steps=%d. Raise "
                   "--config.train.steps to train further.", total)
    loop_start = time.perf_counter()
    timer_step, timer = start_step, loop_start
    for step in range(start_step, total):
      if step > start_step:
        batch = next_batch()
      state, metrics = train_step(state, device_constants, halo_indices, batch)
      done = step + 1
      if done % config.train.log_every == 0 or done == total:
        _check_finite(state)
        elapsed = time.perf_counter() - timer
        steps_per_sec = (done - timer_step) / max(elapsed, 1e-9)
        last = {k: float(v) for k, v in metrics.items()}
        last["steps_per_sec"] = steps_per_sec
        last_step = done
        writer.write(done, last)
        if is_main:
          eta = datetime.timedelta(seconds=round((total - done) / max(steps_per_sec, 1e-9)))
          logging.info("step %d/%d | loss %.5f | lr %.2e | %.2f steps/s | ETA %s", done, total,
                       last["loss"], last["learning_rate"], steps_per_sec, eta)
        timer_step, timer = done, time.perf_counter()
      if config.train.eval_every and done % config.train.eval_every == 0:
        eval_start = time.perf_counter()
        rmse = evaluator.evaluate(state.params)
        last_eval = (done, rmse)
        writer.write(done, {evaluation.metric_name(k): v for k, v in rmse.items()})
        if is_main:
          logging.info("eval at step %d, RMSE: %s", done, _format_rmse(rmse))
        times["evaluation"] += time.perf_counter() - eval_start
        timer = time.perf_counter()  # evaluation time is not training speed
      if done % config.train.checkpoint_every == 0 or done == total or preemption.requested:
        _check_finite(state)
        save_start = time.perf_counter()
        checkpointer.save(done, state, train_data.iterator,
                          {"step": done, "data_groups": num_groups, "data_offset": data_offset,
                           "config": json.loads(config.to_json_best_effort())})
        blocked = time.perf_counter() - save_start
        times["checkpoint"] += blocked
        if is_main:
          logging.info("Checkpoint of step %d: writing in the background to %s (the loop "
                       "was blocked %.3f s).", done,
                       os.path.join(checkpointer.directory, str(done)), blocked)
      if preemption.requested:
        checkpointer.wait()
        logging.warning("Stopped at step %d after SIGTERM; checkpoint saved.", done)
        break
    loop_end = time.perf_counter()
  finally:
    preemption.restore()
    checkpointer.close()
    writer.close()
    train_data.close()
  times["training"] = loop_end - loop_start - times["evaluation"] - times["checkpoint"]
  if is_main:
    _log_summary(start_step, done, time.perf_counter() - run_start, times, (last_step, last),
                 last_eval, config.train, workdir, checkpointer.manager.all_steps())
  return last


def _describe_data(source, eval_source) -> str:
  store = source.store
  ranges = f"train {source.start} .. {source.end} ({len(source):,} examples)"
  if eval_source is not None:
    ranges += f", eval {eval_source.start} .. {eval_source.end} ({len(eval_source):,} examples)"
  first, last = np.datetime_as_string(store.times[[0, -1]], unit="m")
  return (f"{store.path}, {len(store.times):,} times {first} .. {last} every "
          f"{store.time_step_hours} h, grid {store.latitude.size} x {store.longitude.size}, "
          f"{store.num_channels} channels; {ranges}")


def _format_rmse(rmse: dict) -> str:
  return ", ".join(f"{name} {value:.4g}" for name, value in rmse.items())


def _log_summary(start_step, done, wall_seconds, times, last_logged, last_eval, train, workdir,
                 checkpoint_steps):
  """The end of the run in a few lines: steps, times, final figures, outputs.

  `last_logged`: `(step, metrics)` of the last progress line (step None: there was none);
  `last_eval`: `(step, {channel: RMSE})` of the last evaluation, or None.
  """
  logging.info("Run ended at step %d of %d (%d trained now) in %.1f s: set-up %.1f s, compile "
               "%.1f s, training %.1f s, evaluation %.1f s, checkpoint saves blocking %.1f s.",
               done, train.steps, done - start_step, wall_seconds, times["set-up"],
               times["compile"], times["training"], times["evaluation"], times["checkpoint"])
  if last_logged[0] is not None:
    logging.info("Final loss %.5f at step %d.", last_logged[1]["loss"], last_logged[0])
  if last_eval is not None:
    logging.info("Final evaluation (step %d, the first %d batch(es) of the eval range: "
                 "train.eval_batches), RMSE: %s", last_eval[0], train.eval_batches,
                 _format_rmse(last_eval[1]))
  elif train.eval_every:
    logging.info("No evaluation in this run (every %d steps).", train.eval_every)
  logging.info("Outputs: %s.", workdir_lib.describe(workdir, checkpoint_steps))


def _auto_remat(config) -> dict:
  """Chooses remat settings for this run's devices (`wnscale.planner.auto_remat`)."""
  devices = jax.devices()
  memory = (devices[0].memory_stats() or {}).get("bytes_limit")
  if memory is None and devices[0].platform == "cpu":  # fake CPU devices share the host
    memory = topology.host_memory_bytes() // jax.local_device_count()
  target = topology.Target(f"{devices[0].platform}:{len(devices)}", tuple(devices), memory)
  budget = int(config.train.memory_budget_gib * topology.GIB) or None
  choice = auto_remat.choose_remat(config, target, step_lib.lower_train_step, budget)
  logging.info("remat_policy='auto' chose %s", choice["reason"])
  return choice


def _train_pipeline(config, source, group, num_groups, offset):
  """The training pipeline whose stream starts `offset` examples into this process's share."""
  return pipeline.from_config(config, "train", process_index=group, process_count=num_groups,
                              skip_examples=offset, source=source)
