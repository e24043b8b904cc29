"""Train -> forecast -> evaluate in real processes: the forecast store's layout and units,
a 4-way graph-sharded forecast equal to the single-device one, kill -9 and continue, a
forecast by 2 processes stopped and continued, and scores equal to an independent
computation."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import scores
import xarray as xr

from tiny_runs import REPO, Started, cluster_process, process_env
from wnscale.evaluation import metrics

pytestmark = pytest.mark.slow

# The eval range of tiny_runs.RUN_FLAGS is 2020-01-21 .. 2020-01-31 (the store's last day).
# 2020-01-21T06, 21T18, ..., 29T18.
INITS = ["--init_start=2020-01-21T06", "--init_end=2020-01-29", "--init_every=12h"]
NUM_INITS = 18
LEAD = "--lead=2d"  # 8 steps: the last valid time is the store's last time
ONE_DEVICE = "--mesh.graph=1"  # the run trained with the graph over 4 devices
VARIABLES = ("temperature", "geopotential", "u_component_of_wind", "v_component_of_wind",
             "specific_humidity", "2m_temperature", "mean_sea_level_pressure")


def command(module, *flags, devices=1):
  jax_flags = module in ("train", "forecast")  # the others do not use JAX
  platform = ["--platform=cpu", f"--num_cpu_devices={devices}"] if jax_flags else []
  return [sys.executable, "-m", f"launch.{module}", *platform, *flags]


def cluster_command(*flags):
  """`launch.forecast` with `flags` on 2 processes x 2 CPU devices (`launch.local_cluster`)."""
  return [sys.executable, "-m", "launch.local_cluster", "--num_processes=2",
          "--num_cpu_devices=4", "--timeout=300", "--module=launch.forecast", "--", *flags]


def run(module, *flags, devices=1):
  return run_command(command(module, *flags, devices=devices))


def run_command(launched):
  result = subprocess.run(launched, cwd=REPO, env=process_env(), capture_output=True,
                          text=True, timeout=600)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  return result


def completed(path):
  try:
    with open(os.path.join(path, ".zattrs")) as f:
      return json.load(f)["wnscale_completed_inits"]
  except (OSError, ValueError, KeyError):
    return []


@pytest.fixture(scope="module")
def trained(trained_tiny_run):
  """The shared run of the tiny config (conftest.py: 12 steps, graph over 4 devices) and
  its store."""
  with open(os.path.join(trained_tiny_run, "config.json")) as f:
    return trained_tiny_run, json.load(f)["data"]["path"]


@pytest.fixture(scope="module")
def reference(trained, tmp_path_factory):
  """The uninterrupted single-device forecast."""
  workdir, _ = trained
  out = str(tmp_path_factory.mktemp("forecast") / "reference.zarr")
  result = run("forecast", f"--workdir={workdir}", f"--out={out}", *INITS, LEAD, ONE_DEVICE)
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  assert summary["written"] == NUM_INITS and summary["lead_times"] == 8
  assert summary["checkpoint_step"] == 12 and summary["steps_per_sec"] > 0
  return out


def test_forecast_store_layout_and_units(reference, trained):
  _, store = trained
  forecast = xr.open_zarr(reference, chunks=None)
  truth = xr.open_zarr(store, chunks=None)
  assert set(forecast.data_vars) == set(VARIABLES)
  assert forecast["temperature"].dims == ("time", "prediction_timedelta", "level", "latitude",
                                          "longitude")
  assert forecast.sizes["time"] == NUM_INITS
  np.testing.assert_array_equal(forecast.prediction_timedelta.values,
                                pd.timedelta_range("6h", periods=8, freq="6h").values)
  np.testing.assert_array_equal(forecast.latitude.values, truth.latitude.values)  # 90 -> -90
  np.testing.assert_array_equal(forecast.level.values, [500, 850])
  units = {name: forecast[name].attrs["units"] for name in VARIABLES}
  assert units["temperature"] == "K" and units["mean_sea_level_pressure"] == "Pa"
  assert forecast["2m_temperature"].encoding["chunks"] == (1, 1, 32, 64)
  assert forecast.attrs["wnscale_completed_inits"] == list(range(NUM_INITS))
  # Physical values near the truth at the first lead time.
  first = forecast["temperature"].isel(time=0, prediction_timedelta=0).sel(level=850)
  valid = truth["temperature"].sel(time=forecast.time[0] + forecast.prediction_timedelta[0],
                                   level=850)
  assert float(abs(first - valid).mean()) < 5.0


def test_graph_sharded_forecast_equals_single_device(reference, trained, tmp_path):
  workdir, _ = trained
  out = str(tmp_path / "sharded.zarr")
  picked = ["2020-01-21T06", "2020-01-24T18", "2020-01-29T18"]
  run("forecast", f"--workdir={workdir}", f"--out={out}", f"--init_times={','.join(picked)}",
      LEAD, "--mesh.graph=4", "--mesh.exchange=halo", devices=4)
  sharded = xr.open_zarr(out, chunks=None).load()
  single = xr.open_zarr(reference, chunks=None).sel(time=pd.DatetimeIndex(picked)).load()
  for name in VARIABLES:
    scale = float(abs(single[name]).max())
    np.testing.assert_allclose(sharded[name].values, single[name].values, rtol=1e-5,
                               atol=1e-5 * scale)


def test_kill_9_keeps_finished_initial_times_and_the_same_command_continues(
    reference, trained, tmp_path):
  workdir, _ = trained
  out = str(tmp_path / "killed.zarr")
  flags = (f"--workdir={workdir}", f"--out={out}", *INITS, LEAD, ONE_DEVICE)
  kept = kill_9_after(out, flags, 2)
  assert len(kept) < NUM_INITS, "the forecast finished before it was killed"
  before = xr.open_zarr(out, chunks=None)["geopotential"].isel(time=kept).values
  result = run("forecast", *flags)
  assert f"({len(kept)} done before)" in result.stderr
  assert json.loads(result.stdout.strip().splitlines()[-1])["written"] == NUM_INITS - len(kept)
  resumed = xr.open_zarr(out, chunks=None).load()
  expected = xr.open_zarr(reference, chunks=None).load()
  np.testing.assert_array_equal(resumed["geopotential"].isel(time=kept).values, before)
  for name in VARIABLES:
    np.testing.assert_array_equal(resumed[name].values, expected[name].values)


def kill_9_after(out, flags, finished: int) -> list[int]:
  """Launches `launch.forecast` with `flags` on one device, kills it with SIGKILL once `out`
  holds `finished` finished initial times; returns the finished ones it left."""
  process = subprocess.Popen(command("forecast", *flags), cwd=REPO, env=process_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 300
  while len(completed(out)) < finished:
    assert process.poll() is None, process.stderr.read()[-3000:]
    assert time.monotonic() < deadline, "no initial time finished"
    time.sleep(0.01)
  process.send_signal(signal.SIGKILL)
  process.wait()
  kept = completed(out)
  assert len(kept) >= finished
  return kept


def _stop_one_process(out, flags, signum, kept):
  """Launches `cluster_command(*flags)`; once `out` holds more than `kept` finished
  initial times, sends `signum` to process 1 only (not the writer). Returns the
  cluster's exit status, its stderr, and the finished initial times it left."""
  cluster = Started(cluster_command(*flags))
  try:
    deadline = time.monotonic() + 300
    while len(completed(out)) <= kept:
      assert cluster.process.poll() is None, cluster.stderr[-3000:]
      assert time.monotonic() < deadline, "no initial time finished"
      time.sleep(0.01)
    os.kill(cluster_process(cluster.process.pid, 1), signum)
    code = cluster.finish(timeout=300)
  finally:
    cluster.kill()
  return code, cluster.stderr, completed(out)


def test_two_processes_forecast_as_one_stopped_by_a_signal_to_one(reference, trained,
                                                                    tmp_path):
  """2 processes x 2 devices, the graph over the 4 devices of both, stopped by a SIGTERM to
  process 1 only: both stop after the same finished initial time, exit 0. Continued with
  the data over the processes (mesh.data=2, mesh.graph=2: each reads its own initial
  times), it is killed by a SIGKILL of process 1; the same command completes the store,
  which equals the 1-process forecast."""
  workdir, _ = trained
  out = str(tmp_path / "two_processes.zarr")
  flags = (f"--workdir={workdir}", f"--out={out}", *INITS, LEAD)
  code, stderr, stopped = _stop_one_process(out, flags + ("--mesh.graph=4",), signal.SIGTERM,
                                            0)
  assert code == 0, stderr[-3000:]
  stops = dict(re.findall(rf"\[p(\d)\] .*Interrupted \(SIGTERM\): (\d+) of {NUM_INITS} ",
                          stderr))
  assert stops == {"0": str(len(stopped)), "1": str(len(stopped))}, stderr[-3000:]
  assert 1 <= len(stopped) < NUM_INITS, "the forecast finished before it was stopped"

  flags += ("--mesh.data=2", "--mesh.graph=2")
  code, stderr, kept = _stop_one_process(out, flags, signal.SIGKILL, len(stopped))
  assert code == 128 + signal.SIGKILL, stderr[-3000:]  # local_cluster: the killed one's
  assert set(stopped) < set(kept) and len(kept) < NUM_INITS, "finished before the kill"
  result = run_command(cluster_command(*flags))
  assert f"({len(kept)} done before)" in result.stderr
  summaries = [json.loads(line[len("[pN] "):]) for line in result.stdout.splitlines()
               if re.match(r"\[p\d\] \{", line)]
  assert [s["written"] for s in summaries] == [NUM_INITS - len(kept)] * 2
  both = xr.open_zarr(out, chunks=None).load()
  single = xr.open_zarr(reference, chunks=None).load()
  assert both.attrs["wnscale_completed_inits"] == list(range(NUM_INITS))
  for name in VARIABLES:
    scale = float(abs(single[name]).max())
    np.testing.assert_allclose(both[name].values, single[name].values, rtol=1e-5,
                               atol=1e-5 * scale)


def test_evaluate_equals_an_independent_computation(reference, trained, tmp_path):
  _, store = trained
  clim = str(tmp_path / "clim.zarr")
  run("make_climatology", f"--store={store}", "--start=2020-01-01", "--end=2020-01-20",
      f"--out={clim}", "--levels=500,850", f"--variables={','.join(VARIABLES)}")
  out = str(tmp_path / "evaluation")
  printed = run("evaluate", f"--forecast={reference}", f"--truth={store}",
                f"--climatology={clim}", f"--out={out}", "--maps=headline").stdout
  for name in ("forecast.nc", "persistence.nc", "climatology.nc", "metrics.json",
               "scores.png", "map_geopotential500_6h.png", "map_temperature850_48h.png"):
    assert os.path.getsize(os.path.join(out, name)) > 0, name
  # The training run's tracker (train.trackers: TensorBoard) has the figures too.
  assert ("Added the figures and metrics.json to the training run's trackers (tensorboard) "
          "under evaluation/evaluation.") in printed
  # It ends with the headline scores: RMSE of the forecast, persistence and climatology and
  # the forecast's ACC, at the first, a middle and the last lead time, as written.
  table = printed.split("Headline scores (18 initial times; all scores in metrics.json):\n")[1]
  header, *rows = table.strip().splitlines()
  assert header.split() == ["channel", "lead", "forecast", "RMSE", "persistence", "RMSE",
                            "climatology", "RMSE", "forecast", "ACC"], header
  assert [row.split()[:3] for row in rows] == [
      [label, *lead] for label in ("z500", "t850", "t2m", "msl")
      for lead in (("+6", "h"), ("+30", "h"), ("+2", "d"))], rows
  results = xr.open_dataset(os.path.join(out, "forecast.nc"))
  assert results["geopotential"].dims == ("metric", "lead_time", "level")
  forecast = xr.open_zarr(reference, chunks=None).load()
  truth = xr.open_zarr(store, chunks=None).sel(level=[500, 850])
  valid = xr.DataArray(forecast.time.values[:, None] + forecast.prediction_timedelta.values,
                       dims=("time", "prediction_timedelta"))
  # Weights written out: cells from midpoints to +-90 deg, sin(upper) - sin(lower), mean 1.
  lat = np.deg2rad(np.sort(forecast.latitude.values))
  area = np.diff(np.sin(np.r_[-np.pi / 2, (lat[1:] + lat[:-1]) / 2, np.pi / 2]))
  weights = xr.DataArray(area / area.mean(), dims="latitude",
                         coords={"latitude": np.sort(forecast.latitude.values)})
  for name in ("geopotential", "2m_temperature", "mean_sea_level_pressure"):
    f = forecast[name].astype(np.float64)
    t = truth[name].sel(time=valid).drop_vars("time").astype(np.float64).load()
    t = t.assign_coords(time=f.time, prediction_timedelta=f.prediction_timedelta)
    preserve = [dim for dim in ("prediction_timedelta", "level") if dim in f.dims]
    mse = scores.continuous.mse(f, t, preserve_dims=preserve, weights=weights)
    np.testing.assert_allclose(results[name].sel(metric="rmse").values, np.sqrt(mse.values),
                               rtol=1e-9)
  # The tiny model, 12 steps in, is no match for persistence yet, but its scores are sane.
  persistence = xr.open_dataset(os.path.join(out, "persistence.nc"))
  rmse = results["temperature"].sel(metric="rmse", level=850)
  assert np.all(np.isfinite(rmse)) and np.all(rmse > 0)
  assert np.isfinite(persistence["temperature"].sel(metric="acc")).all()
  assert np.allclose(metrics.cell_area_weights(forecast.latitude.values)[::-1], weights.values)
