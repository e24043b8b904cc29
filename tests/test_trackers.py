"""Experiment trackers (`train.trackers`): what a run logged, read back with each tracker's
own client: MLflow's `MlflowClient` on the run's store, W&B's reader of its offline
transaction logs (`wandb leet inspect --json`), TensorBoard's `EventAccumulator`.

The runs are `launch.train` processes of the tiny config (`tiny_runs`), one of them
killed with SIGKILL after its checkpoint of step 4 and started again with the same
command: each tracker then holds every step of `metrics.jsonl` exactly once.
"""

import glob
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from matplotlib import image as matplotlib_image
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from test_cli import assert_user_error
from tiny_runs import (REPO, STEPS, Started, kill_after_checkpoint, process_env, read_metrics,
                       train_command, wait_for_step)
from wnscale import config as config_lib
from wnscale.errors import UserError
from wnscale.tracking import registry
from wnscale.tracking import run as tracking_run
from wnscale.tracking.run import RECORD, TrackedRun

ALL = "--config.train.trackers=('tensorboard', 'mlflow', 'wandb')"
# The loop's timings differ between a step's first run and its run again after a crash;
# every other value is the same (the resumed run continues exactly).
TIMINGS = ("steps_per_sec", "input_wait_fraction", "host_fraction")


def tracker_env(home) -> dict:
  """A launched run's environment with no tracker settings of this machine: no W&B
  credentials (so W&B is offline), MLflow's store in the workdir."""
  env = process_env()
  for name in list(env):
    if name.startswith(("WANDB_", "MLFLOW_")):
      del env[name]
  env["HOME"] = str(home)
  return env


def mlflow_run(workdir):
  """`(client, run)`: the one MLflow run of the workdir's embedded store."""
  client = MlflowClient(tracking_uri=f"sqlite:///{workdir}/mlflow/mlflow.db")
  experiment = client.get_experiment_by_name(os.path.basename(workdir))
  runs = client.search_runs([experiment.experiment_id])
  assert len(runs) == 1, runs
  return client, runs[0]


def mlflow_history(client, run_id) -> dict:
  """`{name: [(step, value), ...]}` of every metric of the run, in step order."""
  names = client.get_run(run_id).data.metrics
  return {name: sorted((m.step, m.value) for m in client.get_metric_history(run_id, name))
          for name in names}


def wandb_records(run_directory) -> list[dict]:
  """The records of a W&B run directory's transaction log, by W&B's own reader."""
  result = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json",
                           run_directory], capture_output=True, text=True, timeout=300,
                          check=True)
  return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def expected(entries) -> dict:
  """`{name: [(step, value), ...]}` of `metrics.jsonl`'s entries."""
  history = {}
  for entry in entries:
    for name, value in entry.items():
      if name != "step":
        history.setdefault(name, []).append((entry["step"], value))
  return history


def assert_same_history(got: dict, want: dict, redone: range, rel: float = 1e-12):
  """Every name at every step, once (an evaluation's entry repeats `target_steps` at its
  step: there, once or twice); the values equal, but the timings of `redone` steps (those
  the tracker kept from before the crash)."""
  assert sorted(got) == sorted(want)
  for name, entries in want.items():
    logged, wanted = {}, {}
    for step, value in got[name]:
      logged.setdefault(step, []).append(value)
    for step, value in entries:
      wanted.setdefault(step, []).append(value)
    assert sorted(logged) == sorted(wanted), name
    for step, values in wanted.items():
      assert 1 <= len(logged[step]) <= len(values), (name, step, logged[step])
      if not (name in TIMINGS and step in redone):
        assert logged[step] == pytest.approx([values[0]] * len(logged[step]), rel=rel,
                                             abs=0), (name, step)


def test_an_unknown_tracker_is_one_line():
  config = config_lib.default_config()
  config.train.trackers = ("tensorboard", "mlfow")
  with pytest.raises(UserError, match=r"^Invalid config: train\.trackers: unknown tracker "
                     r"'mlfow'; the trackers are \('tensorboard', 'mlflow', 'wandb'\)\.$"):
    config_lib.validate(config)


def test_a_missing_package_says_how_to_install_it(tmp_path, monkeypatch):
  real = registry.importlib.util.find_spec
  monkeypatch.setattr(registry.importlib.util, "find_spec",
                      lambda name: None if name == "wandb" else real(name))
  with pytest.raises(UserError) as error:
    TrackedRun.open(("tensorboard", "wandb"), str(tmp_path), {}, 10)
  assert str(error.value) == (
      "train.trackers includes 'wandb', whose package wandb is not installed: pip install "
      "'wnscale[wandb]' (or leave 'wandb' out of train.trackers).")
  assert os.listdir(tmp_path) == []  # before any tracker was opened


def test_an_unreachable_tracker_is_one_line_before_any_work(tmp_path):
  with socket.socket() as probe:  # a port nothing listens on
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
  env = tracker_env(tmp_path / "home") | {"MLFLOW_TRACKING_URI": f"http://127.0.0.1:{port}"}
  workdir = tmp_path / "run"
  result = subprocess.run(train_command(str(workdir), extra=[ALL]), env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
  line = assert_user_error(result, "error: train.trackers: mlflow cannot reach its tracking "
                           f"store http://127.0.0.1:{port} (")
  assert line.endswith("); start the server or fix MLFLOW_TRACKING_URI, or leave 'mlflow' "
                       "out of train.trackers.")
  assert "Store and statistics ready" not in result.stderr
  assert not os.path.exists(workdir / RECORD) and not os.path.exists(workdir / "checkpoints")


@pytest.mark.slow
def test_a_killed_and_resumed_run_is_each_trackers_one_run_with_every_step_once(tmp_path):
  """SIGKILL after the checkpoint of step 4 with step 6 logged, then the same command:
  steps 5.. are trained again; MLflow and W&B hold each step once, TensorBoard shows each
  once (the redone ones as logged again)."""
  workdir = str(tmp_path / "run")
  env = tracker_env(tmp_path / "home")
  started = Started(train_command(workdir, extra=[ALL]), env=env)
  kill_after_checkpoint(started, workdir, 4, logged=6)
  crashed = max(entry["step"] for entry in read_metrics(workdir))
  resumed = subprocess.run(train_command(workdir, extra=[ALL]), cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=900)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "Tracker" not in started.stderr + resumed.stderr  # no tracker failed
  entries = read_metrics(workdir)
  assert [entry["step"] for entry in entries if "loss" in entry] == list(range(1, STEPS + 1))
  want = expected(entries)
  redone = range(5, crashed + 1)
  summary = [line for line in resumed.stderr.splitlines() if "Outputs: " in line][0]
  assert "MLflow run" in summary and "W&B offline run" in summary and "TensorBoard" in summary

  # MLflow: one run (reopened by the second start), each metric at each step once.
  client, found = mlflow_run(workdir)
  record = json.load(open(os.path.join(workdir, RECORD)))
  assert found.info.run_id == record["mlflow"]["run_id"]
  assert found.info.status == "FINISHED"
  assert_same_history(mlflow_history(client, found.info.run_id), want, redone)
  params, tags = found.data.params, found.data.tags
  assert params["train.steps"] == str(STEPS) and params["model.processor"] == (
      "interaction_network")
  assert params["data.path"].endswith(".zarr")  # the resolved config: the store written
  assert tags["model"] == "tiny" and tags["processor"] == "interaction_network"
  assert tags["resolution"] == "5.625deg" and tags["commit"]
  artifacts = [item.path for item in client.list_artifacts(found.info.run_id)]
  assert artifacts == ["config.json"]
  local = client.download_artifacts(found.info.run_id, "config.json", str(tmp_path))
  assert json.load(open(local)) == json.load(open(os.path.join(workdir, "config.json")))

  # W&B: one offline run directory per start, one run id; their history rows together hold
  # each step once, with metrics.jsonl's values.
  run_id = record["wandb"]["run_id"]
  directories = sorted(glob.glob(os.path.join(workdir, "wandb", f"offline-run-*-{run_id}")))
  assert len(directories) == 2
  assert len(glob.glob(os.path.join(workdir, "wandb", "offline-run-*"))) == 2
  rows, runs, configs, files = [], [], [], []
  for directory in directories:
    records = wandb_records(directory)
    rows += [r["history"] for r in records if r["type"] == "history"]
    runs += [r["run"] for r in records if r["type"] == "run"]
    configs += [r["config"]["update"] for r in records if r["type"] == "config"]
    files += [f["path"] for r in records if r["type"] == "files" for f in r["files"]["files"]]
  got = {}
  for row in rows:
    for name, value in row["item"].items():
      if not name.startswith("_"):
        got.setdefault(name, []).append((row["step"]["num"], value))
  assert_same_history({name: sorted(steps) for name, steps in got.items()}, want, redone)
  # The killed start's log may lack its last records (W&B's service process writes it and
  # died with it); the resumed start's run record is there, and every one has the run's id.
  assert {r["run_id"] for r in runs} == {run_id} and "model:tiny" in runs[-1]["tags"]
  assert configs[-1]["train"]["steps"] == STEPS and configs[-1]["data"]["path"].endswith(".zarr")
  assert "config.json" in files

  # TensorBoard: each step once, the redone ones as logged again (purged, then logged).
  events = EventAccumulator(os.path.join(workdir, "tensorboard"))
  events.Reload()
  finite = {name: [(step, value) for step, value in steps if np.isfinite(value)]
            for name, steps in want.items()}
  assert_same_history({name: [(event.step, event.value) for event in events.Scalars(name)]
                       for name in finite}, finite, redone, rel=1e-6)


@pytest.mark.slow
def test_a_tracker_failing_mid_run_warns_once_and_the_run_goes_on(tmp_path):
  """MLflow's store is destroyed while the run trains: one warning naming mlflow, and the
  run ends as it would, with every step in metrics.jsonl."""
  workdir = str(tmp_path / "run")
  started = Started(train_command(workdir, extra=["--config.train.trackers=('mlflow',)"]),
                    env=tracker_env(tmp_path / "home"))
  try:
    wait_for_step(started, workdir, 2)
    database = os.path.join(workdir, "mlflow", "mlflow.db")
    size = os.path.getsize(database)
    with open(database, "r+b") as f:  # in place: the open connection reads garbage
      f.write(b"\0" * size)
    assert started.finish(timeout=600) == 0, started.stderr[-3000:]
  finally:
    started.kill()
  warnings = [line for line in started.stderr.splitlines() if "Tracker mlflow failed" in line]
  assert len(warnings) == 1, started.stderr[-3000:]
  assert "metrics.jsonl holds every value" in warnings[0]
  steps = [entry["step"] for entry in read_metrics(workdir) if "loss" in entry]
  assert steps == list(range(1, STEPS + 1))


def test_a_stopped_run_is_reopened_and_only_process_0_logs(tmp_path):
  """In-process: a run whose trackers are opened by process 0 and not by another; stopped
  early, then reopened (the same MLflow run, KILLED then FINISHED)."""
  workdir = str(tmp_path)
  assert TrackedRun.open(("mlflow",), workdir, {}, 4, enabled=False).workers == []
  assert os.listdir(workdir) == []
  for start, (first, last), status in [(0, (1, 2), "KILLED"), (2, (3, 4), "FINISHED")]:
    with TrackedRun.open(("mlflow",), workdir, {"model": "m"}, 4) as tracked:
      kept = [{"step": step, "loss": float(step)} for step in range(1, start + 1)]
      tracked.begin(start, kept)
      for step in range(first, last + 1):
        tracked.log(step, {"loss": float(step)})
    client, found = mlflow_run(workdir)
    assert found.info.status == status
  assert mlflow_history(client, found.info.run_id) == {
      "loss": [(step, float(step)) for step in range(1, 5)]}


def test_an_evaluations_files_are_added_to_the_finished_runs_trackers(tmp_path):
  """`tracking.attach` (what launch.evaluate does for a forecast of a tracked run): the files
  under their folder, at the forecast's step, the run's status left as it was."""
  workdir = str(tmp_path / "run")
  with TrackedRun.open(("tensorboard", "mlflow"), workdir, {}, 2) as tracked:
    tracked.begin(0, [])
    tracked.log(2, {"loss": 1.0})
  figure = tmp_path / "scores.png"
  matplotlib_image.imsave(figure, np.zeros((8, 12, 3)))
  metrics = tmp_path / "metrics.json"
  metrics.write_text('{"rmse": 1}')
  assert tracking_run.attach(workdir, [str(figure), str(metrics)], "evaluation/e", 2) == [
      "tensorboard", "mlflow"]
  client, found = mlflow_run(workdir)
  assert found.info.status == "FINISHED"
  assert sorted(item.path for item in client.list_artifacts(found.info.run_id,
                                                            "evaluation/e")) == [
      "evaluation/e/metrics.json", "evaluation/e/scores.png"]
  events = EventAccumulator(os.path.join(workdir, "tensorboard"))
  events.Reload()
  images = events.Images("evaluation/e/scores.png")
  assert [(image.step, image.width, image.height) for image in images] == [(2, 12, 8)]
  assert tracking_run.attach(str(tmp_path / "untracked"), [str(figure)], "evaluation/e") == []
