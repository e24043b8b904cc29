"""gs:// paths end to end, against a Cloud Storage emulator the tests start themselves
(`tests/gcs.py`): files and arrays, a store and GraphCast's statistics in a bucket, and a
2-process training run whose store, cache, checkpoints and metrics all live in the
bucket, killed with SIGKILL, its newest checkpoint damaged, and resumed from the bucket
with the same losses."""

import os
import signal
import subprocess
import sys
import time

import gcs
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts

from wnscale import paths
from wnscale.data.making import synthetic
from wnscale.data.reading import normalization
from wnscale.data.reading import store_formats
from tiny_runs import (REPO, Started, cluster_process, damage_checkpoint, process_env,
                       read_metrics)

GRAPHCAST_STATS = os.path.join(os.path.dirname(__file__), "fixtures", "graphcast_5p625", "stats")
LEVELS = (500, 850)


@pytest.fixture(scope="module")
def bucket():
  with gcs.emulator() as url:
    yield url


def test_files_and_arrays_in_a_bucket(bucket, tmp_path):
  path = paths.join(bucket, "dir", "note.txt")
  assert paths.is_url(path) and not paths.exists(path)
  paths.write_text(path, "hello")
  assert paths.exists(path) and paths.read_text(path) == "hello"
  with paths.local_copy(path) as local:
    assert open(local).read() == "hello"
  spec = paths.kvstore_spec(paths.join(bucket, "arrays", "x.zarr"))
  assert spec == {"driver": "gcs", "bucket": bucket[5:], "path": "arrays/x.zarr/"}
  array = ts.open({"driver": "zarr", "kvstore": spec}, create=True, dtype=ts.float32,
                  shape=[3, 4]).result()
  array.write(np.arange(12, dtype=np.float32).reshape(3, 4)).result()
  reopened = ts.open({"driver": "zarr", "kvstore": spec}, read=True).result()
  np.testing.assert_array_equal(reopened.read().result()[2], [8, 9, 10, 11])
  assert paths.kvstore_spec(str(tmp_path)) == {"driver": "file", "path": f"{tmp_path}/"}
  with pytest.raises(ValueError, match="Unsupported URL scheme 'ftp'"):
    paths.kvstore_spec("ftp://host/x")


def test_store_and_statistics_in_a_bucket(bucket, tmp_path):
  """A store written into the bucket reads as its local twin; GraphCast's files load."""
  arguments = dict(start="2020-01-01", end="2020-01-02", levels=LEVELS,
                   variables=["temperature", "2m_temperature"])
  local = synthetic.write_synthetic_store(str(tmp_path / "era.zarr"), **arguments)
  remote = synthetic.write_synthetic_store(paths.join(bucket, "era.zarr"), **arguments)
  read = {path: store_formats.open_store(path, ["temperature", "2m_temperature"], LEVELS)
          for path in (local, remote)}
  np.testing.assert_array_equal(read[remote].read_state([1, 5]), read[local].read_state([1, 5]))
  assert read[remote].handles["temperature"].kvstore.spec().to_json()["driver"] == "gcs"
  stats = normalization.load_or_compute_stats(remote, ["temperature"], LEVELS)
  np.testing.assert_allclose(
      stats["temperature"].values,
      normalization.load_or_compute_stats(local, ["temperature"], LEVELS)["temperature"].values)

  directory = paths.join(bucket, "graphcast", "stats")
  for name in normalization.GRAPHCAST_FILES.values():
    paths.upload(os.path.join(GRAPHCAST_STATS, name), paths.join(directory, name))
  np.testing.assert_array_equal(normalization.read_stats(directory)["temperature"].values,
                                normalization.read_stats(GRAPHCAST_STATS)["temperature"].values)


STEPS = 8
TRAIN_FLAGS = [
    "--config=configs/tiny.py", f"--config.train.steps={STEPS}",
    "--config.train.warmup_steps=2", "--config.train.log_every=1",
    "--config.train.checkpoint_every=2", "--config.train.eval_every=0",
    "--config.mesh.data=1", "--config.mesh.graph=2",
    "--config.data.train_start=2020-01-01", "--config.data.train_end=2020-01-08",
    "--config.data.eval_start=2020-01-09", "--config.data.eval_end=2020-01-10",
]


def _train(bucket, workdir) -> Started:
  """The run in 2 processes of 1 device (`launch.local_cluster`)."""
  command = [sys.executable, "-m", "launch.local_cluster", "--num_processes=2",
             "--num_cpu_devices=2", "--timeout=600", "--", *TRAIN_FLAGS,
             f"--config.data.path={bucket}/era5.zarr", f"--workdir={workdir}"]
  return Started(command, env=dict(process_env(), WNSCALE_CACHE_DIR=f"{bucket}/cache"))


def _losses(workdir):
  paths.forget_listings(workdir)  # the run's processes wrote there since
  return {m["step"]: m["loss"] for m in read_metrics(workdir) if "loss" in m}


def _whole_steps(workdir) -> list[int]:
  """The steps of the checkpoints whole in the bucket (in a bucket Orbax writes a step in
  place and marks it whole last)."""
  paths.forget_listings(workdir)
  checkpoints = paths.as_epath(f"{workdir}/checkpoints")
  if not checkpoints.exists():
    return []
  return sorted(int(step.name) for step in checkpoints.iterdir()
                if step.name.isdigit() and ocp.step.is_checkpoint_finalized(step))


@pytest.mark.slow
def test_train_from_a_bucket_kill_and_resume_from_the_bucket(bucket):
  """Store, cache, checkpoints, metrics, config and TensorBoard all in the bucket. The
  resumed run also finds its newest checkpoint damaged (the soak's `--faults=2 --seed=9
  --storage=emulator`): process 0 sets it aside, and process 1, whose listings still
  named it, saves that step again (it stopped with `StepAlreadyExistsError`)."""
  made = subprocess.run(
      [sys.executable, "-m", "launch.make_dataset", f"--out={bucket}/era5.zarr",
       "--resolution=5.625", "--start=2020-01-01", "--end=2020-01-10", "--levels=13",
       "--variables=temperature,geopotential,u_component_of_wind,v_component_of_wind,"
       "specific_humidity,2m_temperature,mean_sea_level_pressure"],
      cwd=REPO, env=process_env(), capture_output=True, text=True, timeout=300)
  assert made.returncode == 0, made.stderr[-3000:]

  reference = f"{bucket}/reference"
  started = _train(bucket, reference)
  assert started.finish(timeout=600) == 0, started.stderr[-3000:]
  want = _losses(reference)
  assert sorted(want) == list(range(1, STEPS + 1))
  assert {p.name for p in paths.as_epath(f"{reference}/checkpoints").iterdir()} >= {"6", "8"}
  assert paths.exists(f"{reference}/config.json")
  assert any(paths.as_epath(f"{reference}/tensorboard").iterdir())
  assert any(paths.as_epath(f"{bucket}/cache/graphs").iterdir())
  assert any(paths.as_epath(f"{bucket}/cache/stats").iterdir())

  workdir = f"{bucket}/run"
  started = _train(bucket, workdir)
  try:
    pids = [cluster_process(started.process.pid, index) for index in (0, 1)]
    deadline = time.monotonic() + 600
    while len(_whole_steps(workdir)) < 2:  # then SIGKILL to every process
      assert started.process.poll() is None, started.stderr[-3000:]
      assert time.monotonic() < deadline, "no 2 checkpoints in the bucket"
      time.sleep(0.2)
    for pid in pids:
      os.kill(pid, signal.SIGKILL)
  finally:
    started.kill()
  started.finish(timeout=60)
  assert max(_losses(workdir), default=0) < STEPS
  whole = _whole_steps(workdir)  # another may have become whole before the kill
  damaged = f"{workdir}/checkpoints/{whole[-1]}"
  damage_checkpoint(damaged)

  started = _train(bucket, workdir)
  assert started.finish(timeout=600) == 0, started.stderr[-3000:]
  stderr = started.stderr
  assert f"Skipping checkpoint {damaged}" in stderr, stderr[-3000:]
  assert f"Resumed from step {whole[-2]}, checkpoint" in stderr, stderr[-3000:]
  assert "unexpected error" not in stderr, stderr[-3000:]
  assert "moveTo" not in stderr, stderr[-3000:]  # gcsfs's tracebacks, setting it aside
  # The killed run's workdir lock: its process is gone, so it is taken over (and given back).
  assert (f"Taking over the lock {workdir}/lock.json" in stderr
          and "that process is no longer running" in stderr), stderr[-3000:]
  assert _losses(workdir) == want  # exact, step for step
  assert not paths.exists(f"{workdir}/lock.json")
  assert len(list(paths.as_epath(f"{workdir}/configs").iterdir())) == 2  # one per start
  aside = [p.name for p in paths.as_epath(f"{workdir}/checkpoints").iterdir()
           if p.name.startswith(f"{whole[-1]}.damaged-")]
  assert len(aside) == 1, aside  # kept for inspection
