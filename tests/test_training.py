"""Training end to end, in real processes: loss falls, an abrupt end (a second Ctrl-C
mid-save, as kill -9) resumes exactly, multi-process runs match one process, a Ctrl-C to
one process of two stops both at one step, and a failing restore or another model loses
nothing in the workdir. In this process: a slow store shows as input wait, and a run
resumed while batches were prefetched continues exactly. (Ctrl-C, a resharded resume,
and a damaged newest checkpoint skipped by the resumed run of a full disk:
test_interrupts.py.)

(That remat and one graph shard give the same training is covered at the level
of the loss and gradients, in test_remat.py and test_sharding.py.)"""

import json
import logging
import os
import re
import shutil
import signal
import threading
import time

import jax
import numpy as np
import pytest
from mlflow import MlflowClient

pytestmark = pytest.mark.slow  # real training runs, in real processes

from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.data import pipeline, prefetch, run_data
from wnscale.data import source as source_lib
from wnscale.model import setup
from wnscale.train import checkpoint, optimizer, run_directory, trainer
from tiny_runs import read_metrics

from tiny_runs import (REPO, STEPS, Started, cluster_process, losses,
                       run, snapshot, train_command, wait_for_step)


@pytest.fixture
def reference(trained_tiny_run):
  """The uninterrupted run (conftest.py): 1 process x 4 devices, graph sharded 4 ways."""
  return trained_tiny_run


def test_end_to_end_run(reference):
  metrics = read_metrics(reference)
  train = [m for m in metrics if "loss" in m]
  assert [m["step"] for m in train] == list(range(1, STEPS + 1))
  for m in train:
    assert {"loss", "learning_rate", "steps_per_sec", "input_wait_fraction", "host_fraction",
            "grad_norm"} <= set(m)
    assert np.isfinite(m["loss"]) and m["steps_per_sec"] > 0
    assert 0 <= m["input_wait_fraction"] <= 1 and 0 <= m["host_fraction"] <= 1
  loss = [m["loss"] for m in train]
  assert np.mean(loss[-3:]) < 0.8 * np.mean(loss[:3])
  evals = [m for m in metrics if any(k.startswith("eval/rmse/") for k in m)]
  assert [m["step"] for m in evals] == [6, 12]
  assert all(np.isfinite(v) and v > 0 for k, v in evals[-1].items() if k != "step")
  assert "eval/rmse/temperature_500" in evals[-1]  # a TensorBoard tag as well
  assert json.load(open(os.path.join(reference, "config.json")))["model"]["latent_size"] == 32
  assert len(os.listdir(os.path.join(reference, "configs"))) == 1  # a dated copy per start
  assert os.listdir(os.path.join(reference, "tensorboard"))
  assert sorted(os.listdir(os.path.join(reference, "checkpoints"))) == ["12", "4", "8"]


def test_a_ctrl_c_after_a_sigterm_mid_save_ends_at_once_and_the_resumed_run_matches(
    reference, tmp_path):
  """A SIGTERM (a batch scheduler's), handled as a Ctrl-C is, then a Ctrl-C while the step
  reached is evaluated and saved: the run ends at once, as kill -9 would (the kernel's
  default action of SIGINT), with no traceback. (Ctrl-C first: test_interrupts.py.)"""
  workdir = str(tmp_path)
  started = Started(train_command(workdir))
  try:
    wait_for_step(started, workdir, 5)  # the eval compile at step 6 leaves a window
    started.process.send_signal(signal.SIGTERM)
    started.wait_for(r"SIGTERM received: checkpointing the step reached")
    started.ctrl_c()
    assert started.finish(timeout=120) == -signal.SIGINT, started.stderr[-3000:]  # shell: 130
  finally:
    started.kill()
  assert "Traceback" not in started.stderr, started.stderr[-3000:]
  assert max(losses(workdir)) < STEPS
  result = run(workdir)
  assert f"Taking over the lock {workdir}/lock.json" in result.stderr  # the ended run's
  assert "that process is no longer running" in result.stderr
  assert losses(workdir) == losses(reference)  # exact, step for step
  assert not [name for name in os.listdir(os.path.join(workdir, "checkpoints"))
              if "orbax-checkpoint-tmp" in name]  # a cut save's leftovers: removed


def test_nonfinite_loss_stops_without_checkpointing_it(tmp_path):
  config = config_lib.load(os.path.join(REPO, "configs", "tiny.py"))
  config.train.update(steps=6, warmup_steps=0, learning_rate=1e12, log_every=1,
                      checkpoint_every=1, eval_every=0)
  config.data.update(train_start="2020-01-01", train_end="2020-01-20",
                     eval_start="2020-01-21", eval_end="2020-01-31")
  config.mesh.update(data=2, graph=4)
  with pytest.raises(trainer.NonFiniteLossError, match=r"NaN or inf at step (\d+)") as error:
    trainer.train_and_evaluate(config, str(tmp_path))
  assert not _prefetch_threads()  # stopped on the error too
  bad_step = int(re.search(r"step (\d+)", str(error.value)).group(1))
  saved = [int(s) for s in os.listdir(tmp_path / "checkpoints") if s.isdigit()]
  assert all(step <= bad_step for step in saved)
  shutil.rmtree(tmp_path)


def test_two_processes_match_one_and_a_ctrl_c_to_one_stops_both_at_one_step(
    reference, tmp_path):
  """A 2-process run, stopped by a SIGINT to one process only and continued by 2
  processes: both stop at one step (the SIGINT reaches JAX's preemption service as a
  SIGTERM would, e.g. a preemption notice to one host), and every step's loss is that
  of the 1-process run. Two starts of the continuation are stopped first, while they set
  up: a SIGINT to one process ends both at once; a SIGTERM to the cluster (before any
  step of a run resumed at a later step) stops both at the first step."""
  workdir = str(tmp_path)
  trackers = ["--config.train.trackers=('tensorboard', 'mlflow')"]
  cluster = Started(train_command(workdir, devices=4, data=1, graph=4, processes=2,
                                  extra=trackers))
  try:
    wait_for_step(cluster, workdir, 3)
    os.kill(cluster_process(cluster.process.pid, 1), signal.SIGINT)  # not the one that logs
    assert cluster.finish(timeout=300) == 0, cluster.stderr[-3000:]
  finally:
    cluster.kill()
  output = cluster.stderr
  stops = set(re.findall(r"\[p(\d)\] .*Stopped at step (\d+) after SIG(?:INT|TERM)", output))
  assert {process for process, _ in stops} == {"0", "1"}, output[-3000:]
  assert len({step for _, step in stops}) == 1  # both at the same step
  stopped = int(stops.pop()[1])
  assert stopped < STEPS
  saved = os.path.join(workdir, "checkpoints", str(stopped))
  assert sorted(os.listdir(os.path.join(saved, "data"))) == [
      "commit_success.txt", "process_0-of-2.json", "process_1-of-2.json"]
  assert max(int(s) for s in os.listdir(os.path.join(workdir, "checkpoints"))
             if s.isdigit()) == stopped

  command = train_command(workdir, devices=4, data=1, graph=4, processes=2, extra=trackers)
  interrupted = Started(command)
  try:
    interrupted.wait_for(r"\[p1\] .*JAX process 1 of 2")
    os.kill(cluster_process(interrupted.process.pid, 1), signal.SIGINT)
    signalled = time.monotonic()
    assert interrupted.finish(timeout=120) == 130
  finally:
    interrupted.kill()
  # Not held at JAX's shutdown barrier, nor left waiting for its peer: the other one stops
  # with it (the launcher's doing) before any time-out of theirs (30 s and more).
  assert time.monotonic() - signalled < 25, interrupted.stderr[-3000:]
  assert "[p1] Interrupted (Ctrl-C)." in interrupted.stderr
  assert "Traceback" not in interrupted.stderr, interrupted.stderr[-3000:]

  terminated = Started(command)
  try:
    terminated.wait_for(r"\[p0\] .*JAX process 0 of 2")
    terminated.process.send_signal(signal.SIGTERM)
    assert terminated.finish(timeout=300) == 0, terminated.stderr[-3000:]
  finally:
    terminated.kill()
  stops = set(re.findall(r"\[p(\d)\] .*Stopped at step (\d+) after SIGTERM",
                         terminated.stderr))
  assert stops == {("0", str(stopped + 1)), ("1", str(stopped + 1))}, terminated.stderr[-3000:]

  result = run(workdir, devices=4, data=1, graph=4, processes=2, extra=trackers)
  # launch.local_cluster: every line names its process; Gloo's connection chatter is left out.
  lines = (result.stdout + result.stderr).splitlines()
  assert lines and all(line.startswith(("[p0] ", "[p1] ")) for line in lines)
  assert not any("[Gloo]" in line for line in lines)
  got, want = losses(workdir), losses(reference)
  assert sorted(got) == sorted(want)
  np.testing.assert_allclose([got[s] for s in sorted(got)], [want[s] for s in sorted(want)],
                             rtol=2e-4)
  # Checkpoints on schedule and at the stop, the newest 3 kept (train.max_checkpoints).
  kept = sorted({4, 8, STEPS, stopped, stopped + 1})[-3:]
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == sorted(map(str, kept))
  # Process 0 alone logged to the trackers: one MLflow run, each step once.
  client = MlflowClient(tracking_uri=f"sqlite:///{workdir}/mlflow/mlflow.db")
  runs = client.search_runs([client.get_experiment_by_name(os.path.basename(workdir))
                             .experiment_id])
  assert len(runs) == 1 and runs[0].info.status == "FINISHED"
  history = client.get_metric_history(runs[0].info.run_id, "loss")
  assert sorted(metric.step for metric in history) == sorted(got)


def _prefetch_threads() -> list[threading.Thread]:
  return [t for t in threading.enumerate() if t.name == prefetch.THREAD_NAME]


def _config_like_run_flags():
  """In this process, the config that `RUN_FLAGS` give (on 2 x 4 of the 8 test devices)."""
  config = config_lib.load(os.path.join(REPO, "configs", "tiny.py"))
  config.train.update(steps=STEPS, warmup_steps=2, log_every=1, checkpoint_every=4,
                      eval_every=6, eval_batches=2)
  config.data.update(train_start="2020-01-01", train_end="2020-01-20",
                     eval_start="2020-01-21", eval_end="2020-01-31")
  config.mesh.update(data=2, graph=4)
  return config


def test_a_slow_store_shows_as_input_wait(tmp_path, monkeypatch, caplog):
  """Each read of a batch takes 4 s longer (two at a time: Grain's reading threads), many
  times the step: once the batches read ahead during the compile are used up, most of
  the loop's time is spent waiting for the next batch, in metrics.jsonl and in the
  progress lines. (At 2 s a read, a machine loaded to ~0.7 s a step showed 35%.)"""
  read_batch = source_lib.WeatherExampleSource.read_batch

  def slow_read_batch(self, indices):
    time.sleep(4.0)
    return read_batch(self, indices)

  monkeypatch.setattr(source_lib.WeatherExampleSource, "read_batch", slow_read_batch)
  config = _config_like_run_flags()
  config.train.update(steps=12, log_every=4, eval_every=0, checkpoint_every=12)
  with caplog.at_level(logging.INFO):
    trainer.train_and_evaluate(config, str(tmp_path))
  logged = [m for m in read_metrics(str(tmp_path)) if "loss" in m]
  assert [m["step"] for m in logged] == [4, 8, 12]
  for m in logged:
    assert 0 <= m["input_wait_fraction"] <= 1 and 0 <= m["host_fraction"] <= 1, m
  assert logged[-1]["input_wait_fraction"] > 0.5, logged
  lines = re.findall(r"step \d+/12 \| .* steps/s \| input wait (\d+)% \| host (\d+)% "
                     r"\| ETA", caplog.text)
  assert [(int(wait), int(host)) for wait, host in lines] == [
      (round(100 * m["input_wait_fraction"]), round(100 * m["host_fraction"])) for m in logged]


def test_a_run_resumed_after_batches_prefetched_continues_with_the_next(tmp_path,
                                                                        monkeypatch):
  """Three batches placed ahead of the step: when step 4 is checkpointed, batches past the
  fourth are already taken from the data iterator. The run as a crash right after that
  checkpoint leaves it (a copy, the checkpoint of step 8 deleted) resumes with the fifth
  batch: the uninterrupted run's losses, bitwise (a batch skipped or repeated changes
  every later loss)."""
  placed, placed_at_save = [], {}
  place, save = trainer._place, checkpoint.Checkpointer.save

  def counted_place(*args):
    placed.append(None)
    return place(*args)

  def recorded_save(self, step, *args):
    placed_at_save[step] = len(placed)
    return save(self, step, *args)

  monkeypatch.setattr(trainer, "_place", counted_place)
  monkeypatch.setattr(checkpoint.Checkpointer, "save", recorded_save)
  config = _config_like_run_flags()
  config.train.update(steps=8, checkpoint_every=4, eval_every=0, prefetch_batches=3)
  reference = str(tmp_path / "reference")
  trainer.train_and_evaluate(config, reference)
  assert placed_at_save[4] > 4  # the test's premise: the thread was ahead at the save
  assert not _prefetch_threads()  # stopped at the end

  crashed = str(tmp_path / "crashed")
  shutil.copytree(reference, crashed)
  shutil.rmtree(os.path.join(crashed, "checkpoints", "8"))
  trainer.train_and_evaluate(config, crashed)
  assert max(losses(crashed)) == 8
  assert losses(crashed) == losses(reference)  # exact, step for step


def test_a_failing_data_restore_keeps_the_checkpoint(reference, tmp_path, monkeypatch):
  workdir = str(tmp_path / "run")
  shutil.copytree(reference, workdir)
  before = snapshot(workdir)

  def broken_restore(self, state):
    raise RuntimeError("injected failure while restoring the data iterator")

  monkeypatch.setattr(pipeline.DataPipeline, "restore", broken_restore)
  config = _config_like_run_flags()
  config.train.steps += 4  # steps left to train: the run restores its data state
  with pytest.raises(RuntimeError, match="injected failure"):
    trainer.train_and_evaluate(config, workdir)
  assert snapshot(workdir) == before  # no checkpoint set aside, nothing rewritten


def test_another_model_leaves_the_workdir_untouched(reference, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(reference, workdir)
  before = snapshot(workdir)
  config = _config_like_run_flags()
  config.model.latent_size = 16
  config.train.steps += 4  # steps left to train: the run reads its checkpoint
  with pytest.raises(checkpoint.CheckpointMismatchError, match="another model or optimizer configuration"):
    trainer.train_and_evaluate(config, workdir)
  assert snapshot(workdir) == before  # config.json, configs/, checkpoints, metrics


def test_eval_range_outside_the_store_is_an_error_before_compiling(reference, tmp_path):
  config = _config_like_run_flags()
  # The reference run's synthetic store (2020-01), named as a store of real data.
  config.data.update(path=run_data.synthetic_store_path(specs_lib.from_config(config).data,
                                                       config.seed),
                     synthetic=False, eval_start="2021-06-01", eval_end="2021-06-30")
  assert os.path.exists(config.data.path)
  with pytest.raises(ValueError, match=r"Time range 2021-06-01 .. 2021-06-30 lies outside "
                     r"the store .* data.eval_start/eval_end"):
    trainer.train_and_evaluate(config, str(tmp_path))
  assert not os.path.exists(tmp_path / "config.json")


def test_no_store_and_no_synthetic_names_the_setting(tmp_path):
  config = config_lib.load(os.path.join(REPO, "configs", "graphcast_1p0.py"))
  with pytest.raises(ValueError, match=r"`data.path=PATH_OR_URL`") as library:
    trainer.train_and_evaluate(config, str(tmp_path))
  assert "--" not in str(library.value)
  assert os.listdir(tmp_path) == []


# Three rollout phases of 4 steps (1, 2 and 3 autoregressive steps), an EMA of the
# parameters, a frozen processor, and each batch of 2 in 2 micro-batches.
RECIPE = ["--config.train.rollout_schedule=((0,1),(4,2),(8,3))",
          "--config.train.ema_decay=0.9", "--config.train.freeze=('processor',)",
          "--config.train.accumulation_steps=2"]
ONE_DEVICE = dict(devices=1, data=1, graph=1)  # three phases compile: the cheapest program
PHASE_COMPILED = (r"Rollout phase (\d) of 3 .*: compiled its train step \(2 micro-batches a "
                  r"step, their gradients summed\)")


def test_a_rollout_curriculum_resumed_in_its_second_phase_continues_exactly(tmp_path):
  """A run of three phases, with an EMA, a frozen processor and micro-batches: every
  metrics line names its phase's `target_steps`, each phase's step is compiled when it
  starts, the processor never changes. The run as a crash right after its checkpoint of
  step 6 leaves it (a copy, its later checkpoints deleted) resumes there, in mid-phase,
  changes phase at step 8, and gives the uninterrupted run's losses, parameters and EMA
  bitwise. (A kill -9 itself: test_stations.py, test_remote_storage.py, conftest's
  trained_station_run. Micro-batches give the whole batch's loss and gradient:
  test_accumulation.py.)"""
  reference = str(tmp_path / "reference")
  result = run(reference, **ONE_DEVICE, extra=RECIPE + ["--config.train.checkpoint_every=3"])
  assert re.findall(PHASE_COMPILED, result.stderr) == ["1", "2", "3"]
  assert re.search(r"Frozen \(no update, no optimizer state\): processor \([\d,]+ "
                   r"parameters\); [\d,]+ parameters trained", result.stderr)
  metrics = read_metrics(reference)
  assert [(m["step"], m["target_steps"]) for m in metrics if "loss" in m] == [
      (step, 1 + (step - 1) // 4) for step in range(1, STEPS + 1)]
  assert all("target_steps" in m for m in metrics)  # the evaluations' lines too
  assert sorted(os.listdir(os.path.join(reference, "checkpoints"))) == ["12", "6", "9"]

  workdir = str(tmp_path / "crashed")
  shutil.copytree(reference, workdir)
  for step in ("9", "12"):
    shutil.rmtree(os.path.join(workdir, "checkpoints", step))
  no_eval = ["--config.train.eval_every=0"]  # evaluations change nothing trained
  resumed = run(workdir, **ONE_DEVICE, extra=RECIPE + no_eval)
  assert "Resumed from step 6" in resumed.stderr
  assert re.findall(PHASE_COMPILED, resumed.stderr) == ["2", "3"]
  assert losses(workdir) == losses(reference)  # exact, step for step

  def params(run_dir, step, which):
    return {optimizer.path_name(path): np.asarray(leaf) for path, leaf in
            jax.tree_util.tree_flatten_with_path(checkpoint.restore_params(
                os.path.join(run_dir, "checkpoints"), abstract, step, which)[0])[0]}

  specs = specs_lib.from_config(config_lib.from_json(open(os.path.join(reference,
                                                                       "config.json")).read()))
  abstract = checkpoint.abstract_like(setup.init_model_shapes(specs)[1],
                                      jax.sharding.SingleDeviceSharding(jax.devices()[0]))
  for which in run_directory.PARAMS:
    got, want = params(workdir, STEPS, which), params(reference, STEPS, which)
    assert got.keys() == want.keys()
    for name in want:
      np.testing.assert_array_equal(got[name], want[name], err_msg=f"{which} {name}")
  raw, first = params(reference, STEPS, "raw"), params(reference, 6, "raw")
  assert all(np.array_equal(raw[name], first[name]) == name.startswith("processor")
             for name in raw)
