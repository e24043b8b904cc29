"""gs:// paths end to end, against a Cloud Storage emulator the tests start themselves
(`tests/gcs.py`): files and arrays, a store and GraphCast's statistics in a bucket, and a
training run whose store, cache, checkpoints and metrics all live in the bucket, killed
with SIGKILL and resumed from the bucket with the same losses."""

import os
import re
import signal
import subprocess
import sys
import time

import fsspec
import gcs
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts

from wnscale import paths
from wnscale.data.making import synthetic
from wnscale.data.reading import normalization
from wnscale.data.reading import store_formats
from tiny_runs import read_metrics

from tiny_runs import REPO, process_env

GRAPHCAST_STATS = os.path.join(os.path.dirname(__file__), "fixtures", "graphcast_5p625", "stats")
LEVELS = (500, 850)


@pytest.fixture(scope="module")
def bucket():
  with gcs.emulator() as url:
    yield url


def _fresh_listings():
  """gcsfs caches listings per process; files written by other processes need a fresh look."""
  fsspec.filesystem("gs").invalidate_cache()


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


def _train(bucket, workdir, **kwargs):
  command = [sys.executable, "-m", "launch.train", "--platform=cpu", "--num_cpu_devices=2",
             *TRAIN_FLAGS, f"--config.data.path={bucket}/era5.zarr", f"--workdir={workdir}"]
  env = dict(process_env(), WNSCALE_CACHE_DIR=f"{bucket}/cache")
  return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, **kwargs)


def _losses(workdir):
  _fresh_listings()
  return {m["step"]: m["loss"] for m in read_metrics(workdir) if "loss" in m}


@pytest.mark.slow
def test_train_from_a_bucket_kill_and_resume_from_the_bucket(bucket):
  """Store, cache, checkpoints, metrics, config and TensorBoard all in the bucket."""
  made = subprocess.run(
      [sys.executable, "-m", "launch.make_dataset", f"--out={bucket}/era5.zarr",
       "--resolution=5.625", "--start=2020-01-01", "--end=2020-01-10", "--levels=13",
       "--variables=temperature,geopotential,u_component_of_wind,v_component_of_wind,"
       "specific_humidity,2m_temperature,mean_sea_level_pressure"],
      cwd=REPO, env=process_env(), capture_output=True, text=True, timeout=300)
  assert made.returncode == 0, made.stderr[-3000:]

  reference = f"{bucket}/reference"
  process = _train(bucket, reference)
  _, stderr = process.communicate(timeout=600)
  assert process.returncode == 0, stderr[-3000:]
  want = _losses(reference)
  assert sorted(want) == list(range(1, STEPS + 1))
  _fresh_listings()
  assert {p.name for p in paths.as_epath(f"{reference}/checkpoints").iterdir()} >= {"6", "8"}
  assert paths.exists(f"{reference}/config.json")
  assert any(paths.as_epath(f"{reference}/tensorboard").iterdir())
  assert any(paths.as_epath(f"{bucket}/cache/graphs").iterdir())
  assert any(paths.as_epath(f"{bucket}/cache/stats").iterdir())

  workdir = f"{bucket}/run"
  process = _train(bucket, workdir)
  deadline = time.monotonic() + 600
  while True:  # until a whole checkpoint is in the bucket, then SIGKILL mid-run
    assert process.poll() is None, process.stderr.read()[-3000:]
    assert time.monotonic() < deadline, "no checkpoint in the bucket"
    _fresh_listings()
    checkpoints = paths.as_epath(f"{workdir}/checkpoints")
    # In a bucket Orbax writes a step in place and marks it whole last.
    if checkpoints.exists() and any(ocp.step.is_checkpoint_finalized(step)
                                    for step in checkpoints.iterdir() if step.name.isdigit()):
      break
    time.sleep(0.2)
  process.send_signal(signal.SIGKILL)
  process.wait(timeout=60)
  assert max(_losses(workdir), default=0) < STEPS

  process = _train(bucket, workdir)
  _, stderr = process.communicate(timeout=600)
  assert process.returncode == 0, stderr[-3000:]
  assert re.search(r"Resumed from step [2-7], checkpoint", stderr), stderr[-3000:]
  # The killed run's workdir lock: its process is gone, so it is taken over (and given back).
  assert (f"Taking over the lock {workdir}/lock.json" in stderr
          and "that process is no longer running" in stderr), stderr[-3000:]
  assert _losses(workdir) == want  # exact, step for step
  _fresh_listings()
  assert not paths.exists(f"{workdir}/lock.json")
  assert len(list(paths.as_epath(f"{workdir}/configs").iterdir())) == 2  # one per start
