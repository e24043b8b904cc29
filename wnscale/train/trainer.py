"""`train_and_evaluate(config, workdir)`: the whole training run.

Data (Grain, per-process share) -> sharded train step (shard_map over the
`(data, graph)` mesh) -> Optax -> metrics and evaluation -> Orbax checkpoints.
Re-running with the same workdir resumes from the newest good checkpoint:
model, optimizer and data iterator, so the losses continue exactly.
SIGTERM saves a checkpoint at the current step and returns cleanly.
"""

from __future__ import annotations

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


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains `config` in `workdir`; returns the last logged metrics."""
  config_lib.validate(config)
  os.makedirs(workdir, exist_ok=True)
  is_main = jax.process_index() == 0
  mesh = mesh_lib.make_mesh(config.mesh)
  mesh_lib.check_batch_size(mesh, config.train.batch_size)

  # The store gives the grid and the normalization statistics.
  config = ml_collections.ConfigDict(config)  # a copy; store path and auto remat get resolved
  config.data.path = resolve_store(config)
  source = pipeline.source_from_config(config, "train")
  latitude, longitude = source.store.latitude, source.store.longitude

  if config.model.remat_policy == "auto":
    config.model.update(_auto_remat(config)["overrides"])
  if is_main:  # the resolved config: store path and remat settings as run
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config.to_json_best_effort(indent=2))

  # Model, constants and the sharded layout.
  stats = source.channel_stats
  graphs = setup.graphs_for_grid(config, latitude, longitude)
  constants = setup.make_constants(config, graphs, latitude, longitude,
                                   stats["diff_std"] / stats["std"])
  layout = ShardedLayout(mesh, graphs, *setup.node_positions(config, latitude, longitude),
                         config.mesh.exchange)
  device_constants, halo_indices = layout.constants(constants)
  # Data: this process's share (processes holding the same batch rows read the same
  # examples), read straight into the layout's grid order.
  group, num_groups = mesh_lib.process_data_group(mesh)
  source = source.in_layout(layout.grid_slots)
  train_data = _train_pipeline(config, source, group, num_groups, 0)
  graphdef, params = setup.init_model(config)
  optimizer = optimizer_lib.make_optimizer(config.train)
  schedule = optimizer_lib.learning_rate_schedule(config.train)
  replicated = layout.sharding(jax.sharding.PartitionSpec())
  state = jax.device_put(initial_state(params, optimizer), replicated)

  # Resume.
  checkpointer = checkpoint_lib.Checkpointer(os.path.join(workdir, "checkpoints"),
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
    logging.info("Resumed from step %d.", int(state.step))
  start_step = int(state.step)
  writer = MetricsWriter(workdir, resume_step=start_step, enabled=is_main)

  train_step = step_lib.make_train_step(layout, graphdef, optimizer, schedule,
                                        device_constants, halo_indices,
                                        remat_steps=config.train.remat_rollout)
  evaluator = evaluation.Evaluator(config, layout, graphdef, device_constants, halo_indices,
                                   stats, source.store.channel_names, group, num_groups)

  def next_batch():
    return layout.global_batch(next(train_data.iterator), config.train.batch_size,
                               setup.batch_dtype(config))

  total = config.train.steps
  last = {}
  preemption = _Preemption()
  try:
    if start_step < total:
      batch = next_batch()
      compile_start = time.perf_counter()
      train_step = train_step.lower(state, device_constants, halo_indices, batch).compile()
      if is_main:
        logging.info("Compiled the train step in %.1f s.", time.perf_counter() - compile_start)
    timer_step, timer = start_step, time.perf_counter()
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
        writer.write(done, last)
        if is_main:
          eta = datetime.timedelta(seconds=round((total - done) / max(steps_per_sec, 1e-9)))
          logging.info("step %d/%d | loss %.5f | lr %.2e | %.2f steps/s | ETA %s", done, total,
                       last["loss"], last["learning_rate"], steps_per_sec, eta)
        timer_step, timer = done, time.perf_counter()
      if config.train.eval_every and done % config.train.eval_every == 0:
        rmse = evaluator.evaluate(state.params)
        writer.write(done, {f"eval/rmse/{k}": v for k, v in rmse.items()})
        if is_main:
          logging.info("eval at step %d, RMSE: %s", done,
                       ", ".join(f"{k} {v:.4g}" for k, v in rmse.items()))
        timer = time.perf_counter()  # evaluation time is not training speed
      if done % config.train.checkpoint_every == 0 or done == total or preemption.requested:
        _check_finite(state)
        checkpointer.save(done, state, train_data.iterator,
                          {"step": done, "data_groups": num_groups, "data_offset": data_offset,
                           "config": json.loads(config.to_json_best_effort())})
      if preemption.requested:
        checkpointer.wait()
        logging.warning("Stopped at step %d after SIGTERM; checkpoint saved.", done)
        break
  finally:
    preemption.restore()
    checkpointer.close()
    writer.close()
    train_data.close()
  return last


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
