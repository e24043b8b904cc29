"""Nothing lost in what a command writes, each case through the real launcher command.

  - An existing output is never replaced unasked: `make_dataset`, `make_climatology`,
    `evaluate`, `import_graphcast` and `predict_example` refuse an existing `--out`
    (exit 2, one line naming it and `--overwrite`), `--overwrite` replaces only an
    output of the same kind (a dataset never a forecast or a climatology, and every
    other pair), and `forecast` refuses a store that is not its own.
  - One writer per output: a second command writing the same `--out` stops at once
    naming the first; SIGTERM ends a writer as Ctrl-C does, leaving nothing half-made;
    what a writer killed by SIGKILL left is removed by the next writer of that output.
  - An output that cannot be written (a read-only file system, no permission) is said
    before any work, in one line naming the location and why (exit 2).
  - A full disk while writing a store or a forecast is one line naming the path and "no
    space left" (exit 1, no traceback; `--traceback` shows it): a store is left whole or
    not at all (a replaced one intact), and a forecast keeps its finished initial times
    and is continued by the same command once there is room.

The data on disk is compared by checksums of every file. Read-only and tiny file
systems are tmpfs mounts (the tests run as root), unmounted when the test ends.
"""

import concurrent.futures
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import xarray as xr

import gcs
from test_cli import assert_user_error, run, without_root
from tiny_runs import Started, process_env
from wnscale import outputs, paths
from wnscale.data import netcdf
from wnscale.data.making import stations, synthetic
from wnscale.data.reading import store as store_lib
from wnscale.errors import ArgumentError, UserError
from wnscale.evaluation import climatology as climatology_lib
from wnscale.inference import forecast_store
from wnscale.interop import weathernext2_export
from wnscale.train import run_directory

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "graphcast_5p625")
FORECAST = ["--platform=cpu", "--num_cpu_devices=1", "--mesh.graph=1", "--lead=12h"]


def checksums(path) -> dict:
  """`{relative path: sha256}` of every file under the directory `path` (or of the file)."""
  path = str(path)
  if os.path.isfile(path):
    with open(path, "rb") as f:
      return {"": hashlib.sha256(f.read()).hexdigest()}
  sums = {}
  for directory, _, names in os.walk(path):
    for name in names:
      file = os.path.join(directory, name)
      with open(file, "rb") as f:
        sums[os.path.relpath(file, path)] = hashlib.sha256(f.read()).hexdigest()
  return sums


@contextlib.contextmanager
def tmpfs(path, size: str, read_only: bool = False):
  """A tmpfs of `size` (e.g. "1m") mounted at `path` for the block."""
  if os.geteuid() != 0:
    pytest.skip("mounting a tmpfs needs root")
  os.makedirs(path, exist_ok=True)
  options = f"size={size}" + (",ro" if read_only else "")
  subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], check=True,
                 capture_output=True, timeout=30)
  try:
    yield str(path)
  finally:
    subprocess.run(["umount", str(path)], check=True, capture_output=True, timeout=30)


def grow(path, size: str):
  """Frees space on the tmpfs at `path`: makes it `size`."""
  subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True,
                 capture_output=True, timeout=30)


def run_together(*commands, prefixes=None, env=None):
  """`run(*command)` of every command at once (a launcher's start-up keeps one core busy):
  their results, in order. `prefixes`: `{index: prefix}` of commands run under one."""
  prefixes = prefixes or {}
  with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
    return list(pool.map(lambda index: run(*commands[index], env=env,
                                           prefix=prefixes.get(index, ())),
                         range(len(commands))))


def store(path, end="2020-01-02", **kwargs) -> str:
  return synthetic.write_synthetic_store(str(path), start="2020-01-01", end=end,
                                         levels=(500, 850), **kwargs)


def assert_full_disk(result, path):
  """Exit 1, no traceback, one `error:` line, last, naming `path` and no space left."""
  assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-4000:]
  assert "Traceback" not in result.stderr, result.stderr[-4000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and result.stderr.strip().splitlines()[-1] == errors[0], (
      result.stderr[-4000:])
  assert "no space left" in errors[0].lower() and str(path) in errors[0], errors[0]
  return errors[0]


@pytest.fixture(scope="module")
def trained(trained_tiny_run):
  """The shared tiny run and its store."""
  with open(os.path.join(trained_tiny_run, "config.json")) as f:
    return trained_tiny_run, json.load(f)["data"]["path"]


def test_existing_outputs_are_not_replaced_unasked(tmp_path, trained):
  workdir, _ = trained
  data = store(tmp_path / "data.zarr")
  clim = store(tmp_path / "clim.zarr", variables=["2m_temperature"])
  results = tmp_path / "results"
  results.mkdir()
  (results / "metrics.json").write_text("{}")
  run_dir = tmp_path / "run"
  shutil.copytree(workdir, run_dir)
  predictions = tmp_path / "predictions.nc"
  predictions.write_bytes(netcdf.to_bytes(xr.Dataset({"earlier": ("x", [1.0])})))
  everything = checksums(tmp_path)

  cases = [
      (["make_dataset", f"--out={data}", "--end=2020-01-01", "--variables=2m_temperature"],
       f"--out={data}: exists (a dataset store); pass --overwrite to replace it, or choose "
       "another --out."),
      (["make_climatology", f"--store={data}", f"--out={clim}"],
       f"--out={clim}: exists and is not a climatology store (it is a dataset store); "
       "--overwrite replaces only a climatology store"),
      (["make_climatology", f"--store={data}", f"--out={data}", "--overwrite"],
       f"--out={data}: exists and is not a climatology store (it is a dataset store)"),
      (["evaluate", f"--forecast={data}", f"--truth={data}", f"--out={results}"],
       f"--out={results}: exists (evaluation results)"),
      (["import_graphcast", f"--checkpoint={FIXTURE}/params.npz",
        f"--stats_dir={FIXTURE}/stats", f"--out={run_dir}"],
       f"--out={run_dir}: exists (a run directory)"),
      (["predict_example", f"--workdir={run_dir}", f"--example={FIXTURE}/example.nc",
        f"--out={predictions}"], f"--out={predictions}: exists (a netCDF file)"),
      # A forecast continues its own store, and writes into no other.
      (["forecast", f"--workdir={workdir}", f"--out={data}", *FORECAST],
       f"--out={data}: exists and is not a forecast store written by wnscale"),
      # Nor does a training run continue anything but a run.
      (["train", "--config=tiny", f"--workdir={clim}"],
       f"--workdir={clim}: is a dataset store, not a run directory; give a new directory, "
       "or that of a run, as --workdir."),
  ]
  results = run_together(*(args for args, _ in cases), env=process_env())
  for result, (_, message) in zip(results, cases):
    assert_user_error(result, message)
  assert checksums(tmp_path) == everything


def test_unwritable_outputs_are_said_before_any_work(tmp_path, trained):
  workdir, truth = trained
  locked = tmp_path / "locked"
  locked.mkdir(mode=0o555)
  clim = locked / "clim.zarr"
  with tmpfs(tmp_path / "read_only", "1m", read_only=True) as read_only:
    forecast, scores = os.path.join(read_only, "f.zarr"), os.path.join(read_only, "scores")
    results = run_together(
        ["forecast", f"--workdir={workdir}", f"--out={forecast}", *FORECAST],
        ["evaluate", f"--forecast={truth}", f"--truth={truth}", f"--out={scores}"],
        ["make_climatology", f"--store={truth}", f"--out={clim}"],
        prefixes={2: without_root()}, env=process_env())
  assert_user_error(results[0], f"--out={forecast}: cannot write there (Read-only file "
                    f"system in {read_only})")
  assert "Restored" not in results[0].stderr  # stopped before any work
  assert_user_error(results[1], f"--out={scores}: cannot write there (Read-only file system")
  assert_user_error(results[2], f"--out={clim}: cannot write there (Permission denied in "
                    f"{locked})")
  assert os.listdir(locked) == []


def test_a_file_in_the_way_and_missing_parents(tmp_path):
  (tmp_path / "file").write_text("")
  with pytest.raises(ArgumentError, match=f"^out={tmp_path}/file/x.zarr: lies under "
                     f"{tmp_path}/file, which is a file"):
    outputs.check(str(tmp_path / "file" / "x.zarr"), outputs.STORE, argument="out")
  with pytest.raises(UserError, match="is a directory; give the path of a file"):
    outputs.check(str(tmp_path), outputs.FILE, argument="out")
  # Missing parents are made, as for a workdir.
  deep = tmp_path / "new" / "deeper" / "s.zarr"
  outputs.check(str(deep), outputs.STORE, argument="out")
  store(deep, end="2020-01-01", variables=["2m_temperature"])
  assert xr.open_zarr(deep).sizes["time"] == 4
  # A library caller is told of its arguments, not of a launcher's flags.
  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "notes.txt").write_text("")
  for path, overwrite, said in ((deep, False, "pass `overwrite=True` to replace it, or "
                                 "choose another `out`."),
                                (tmp_path / "other", True, "`overwrite` replaces only a dataset "
                                 "store: choose another `out`")):
    with pytest.raises(ArgumentError) as library:
      outputs.check(str(path), outputs.STORE, argument="out", overwrite=overwrite)
    assert str(library.value).startswith(f"out={path}: exists") and said in str(library.value)
    assert "--" not in str(library.value)


def test_a_full_disk_while_making_a_store(tmp_path):
  """The store being replaced stays intact; once there is room, --overwrite replaces it."""
  with tmpfs(tmp_path / "disk", "2m") as disk:
    path = store(os.path.join(disk, "s.zarr"), variables=["2m_temperature"])
    before = checksums(path)
    make = ["make_dataset", f"--out={path}", "--start=2020-01-01", "--end=2020-01-04",
            "--levels=13", "--overwrite"]
    error = assert_full_disk(run(*make), path)
    assert "the existing one is unchanged" in error
    assert checksums(path) == before and os.listdir(disk) == ["s.zarr"]
    grow(disk, "64m")
    result = run(*make)
    assert result.returncode == 0, result.stderr[-3000:]
    assert xr.open_zarr(path).sizes["time"] == 16 and os.listdir(disk) == ["s.zarr"]


def test_a_full_disk_while_making_a_climatology(tmp_path):
  truth = store(tmp_path / "truth.zarr", variables=["2m_temperature"])
  with tmpfs(tmp_path / "disk", "256k") as disk:
    clim = os.path.join(disk, "clim.zarr")
    make = ["make_climatology", f"--store={truth}"]  # two outputs: one writer each
    plain, shown = run_together([*make, f"--out={clim}"],
                                [*make, f"--out={disk}/other.zarr", "--traceback"])
    assert os.listdir(disk) == []
  assert "nothing was left there" in assert_full_disk(plain, clim)
  assert shown.returncode == 1 and "Traceback" in shown.stderr
  assert shown.stderr.strip().splitlines()[-1].startswith("error: No space left")


def test_a_full_disk_while_forecasting_keeps_the_finished_initial_times(tmp_path, trained):
  workdir, _ = trained
  inits = "--init_times=2020-01-21T06,2020-01-21T18,2020-01-22T06"
  # The layout (~250 KiB) and about two of the three initial times (~150 KiB each).
  with tmpfs(tmp_path / "disk", "560k") as disk:
    out = os.path.join(disk, "f.zarr")
    os.mkdir(out)  # an empty directory holds nothing: the forecast goes there
    command = ["forecast", f"--workdir={workdir}", f"--out={out}", inits, *FORECAST]
    error = assert_full_disk(run(*command, env=process_env(), timeout=300), out)
    kept = xr.open_zarr(out).attrs["wnscale_completed_inits"]
    assert 1 <= len(kept) <= 2 and f"its {len(kept)} finished initial time(s) are kept" in error
    finished = {name: value for name, value in checksums(out).items()  # their chunks
                if name.startswith("2m_temperature") and name.split(os.sep)[-1].split(".")[0]
                in {str(i) for i in kept}}
    assert len(finished) == 2 * len(kept)  # 2 lead times each
    grow(disk, "64m")
    result = run(*command, env=process_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["already_written"] == len(kept) and summary["written"] == 3 - len(kept)
    after = checksums(out)
    assert all(after[name] == value for name, value in finished.items())  # not redone
    forecast = xr.open_zarr(out)
    assert forecast.attrs["wnscale_completed_inits"] == [0, 1, 2]
    assert not np.isnan(forecast["2m_temperature"].values).any()


def test_outputs_in_a_bucket():
  """The same rules for a gs:// output (a Cloud Storage emulator): a probe object is
  written and removed, an existing store is replaced only when asked."""
  with gcs.emulator() as bucket:
    path = paths.join(bucket, "s.zarr")
    store(path, end="2020-01-01", variables=["2m_temperature"])
    with pytest.raises(UserError, match=f"path={path}: exists \\(a dataset store\\); pass "
                       "`overwrite=True`"):
      store(path, variables=["2m_temperature"])
    store(path, variables=["2m_temperature"], overwrite=True)
    assert store_lib.open_metadata(path).sizes["time"] == 8 and paths.is_complete(path)
    assert sorted(entry.name for entry in paths.as_epath(bucket).iterdir()) == [
        "s.zarr", "s.zarr.complete"]  # no probe left
    with pytest.raises(UserError, match="^out=gs://no-such-bucket/s.zarr: cannot write there "
                       "\\(no such bucket\\)"):
      outputs.check("gs://no-such-bucket/s.zarr", outputs.STORE, argument="out")


def forecast_of(path, truth, inits=2, leads=2) -> str:
  """A forecast store at `path` as `launch.forecast` writes it (settings, finished initial
  times), its states copied from the store `truth` (2m_temperature only)."""
  init_times = xr.open_zarr(truth)["time"].values[:inits]
  lead_times = np.arange(1, leads + 1) * np.timedelta64(6, "h")
  settings = forecast_store.forecast_settings(
      workdir="/elsewhere/run", checkpoint_step=1, initial_conditions=truth,
      init_times=init_times, leads=lead_times, variables=["2m_temperature"], levels=[])
  latitude, longitude = (xr.open_zarr(truth)[name].values for name in ("latitude", "longitude"))
  out = forecast_store.ForecastStore(
      str(path), settings, init_times=init_times, leads=lead_times,
      variables=["2m_temperature"], levels=[], latitude=latitude, longitude=longitude,
      flip_latitude=False)
  field = xr.open_zarr(truth)["2m_temperature"].values.reshape(-1, 1, latitude.size *
                                                              longitude.size)
  for init in range(inits):
    for lead in range(leads):
      out.write(init, lead, field[init + lead + 1])
    out.finish_init(init)
  return out.path


def test_overwrite_replaces_only_an_output_of_the_same_kind(tmp_path):
  """Each kind of store wnscale writes, results, a run directory and a WeatherNext 2 export
  (both hold a config.json), predictions and a checkpoint file refused as the --out of a
  command that writes another kind, with --overwrite: one line saying what is there;
  nothing changed. (The kinds a launcher writes: dataset, climatology, observation store,
  evaluation results, run directory, WeatherNext 2 export, netCDF and .npz files; a
  forecast is continued, never replaced.)"""
  data = store(tmp_path / "data.zarr", variables=["2m_temperature"])
  clim = climatology_lib.compute_climatology(data, str(tmp_path / "clim.zarr"))
  # A forecast store's creation killed outright (a dead pid): removed when it is made again;
  # another kind of leftover beside it is left alone.
  dead = subprocess.Popen(["true"])
  dead.wait(timeout=30)
  left = {kind: tmp_path / f"forecast.zarr.{what}-{dead.pid}" for kind, what in
          (("forecast", "partial"), ("dataset", "replaced"))}
  for kind, path in left.items():
    (path / ("prediction_timedelta" if kind == "forecast" else "time")).mkdir(parents=True)
    (path / ".zgroup").write_text("{}")
  forecast = forecast_of(tmp_path / "forecast.zarr", data)
  assert not left["forecast"].exists() and left["dataset"].exists()
  shutil.rmtree(left["dataset"])
  station_store = stations.write_observations(
      str(tmp_path / "stations.zarr"), np.array(["2020-01-01"], "datetime64[ns]"),
      np.array(["A"]), np.zeros(1), np.zeros(1), {"2m_temperature": np.zeros((1, 1))})
  results = tmp_path / "results"
  results.mkdir()
  (results / "metrics.json").write_text("{}")
  # A run directory and a WeatherNext 2 export both hold a config.json.
  run_dir, export = tmp_path / "run", tmp_path / "export"
  for path, names in ((run_dir, ("config.json", "checkpoints/0/x")),
                      (export, ("config.json", "params.npz"))):
    for name in names:
      (path / name).parent.mkdir(parents=True, exist_ok=True)
      (path / name).write_text("{}")
  # Predictions (netCDF) and a checkpoint (.npz): files told apart by their first bytes.
  predictions, checkpoint = tmp_path / "predictions.nc", tmp_path / "params.npz"
  predictions.write_bytes(netcdf.to_bytes(xr.Dataset({"x": ("x", [1.0])})))
  np.savez(checkpoint, x=np.zeros(1))
  everything = checksums(tmp_path)
  make = ["make_dataset", "--end=2020-01-01", "--variables=2m_temperature", "--overwrite"]
  cases = [
      ([*make, f"--out={forecast}"], forecast, "a dataset store", "it is a forecast store"),
      ([*make, f"--out={clim}"], clim, "a dataset store", "it is a climatology store"),
      (["make_climatology", f"--store={data}", f"--out={forecast}", "--overwrite"], forecast,
       "a climatology store", "it is a forecast store"),
      (["make_climatology", f"--store={data}", f"--out={station_store}", "--overwrite"],
       station_store, "a climatology store", "it is an observation store"),
      (["make_dataset", "--stations=3", f"--from_store={data}", f"--out={data}",
        "--overwrite"], data, "an observation store", "it is a dataset store"),
      (["evaluate", f"--forecast={forecast}", f"--truth={data}", f"--out={clim}",
        "--overwrite"], clim, "evaluation results", "it is a climatology store"),
      (["export_weathernext2", f"--workdir={run_dir}", f"--out={run_dir}", "--overwrite"],
       run_dir, "a WeatherNext 2 checkpoint directory", "it is a run directory"),
      (["import_weathernext2", f"--checkpoint={export}/params.npz",
        f"--config={export}/config.json", f"--out={export}", "--overwrite"], export,
       "a run directory", "it holds config.json, params.npz"),
      (["predict_example", f"--workdir={run_dir}", f"--example={FIXTURE}/example.nc",
        f"--out={checkpoint}", "--overwrite"], checkpoint, "a netCDF file",
       "it is an .npz file"),
      (["export_graphcast", f"--workdir={run_dir}", f"--out={predictions}", "--overwrite"],
       predictions, "an .npz file", "it is a netCDF file"),
  ]
  for result, (_, path, noun, found) in zip(run_together(*(c[0] for c in cases)), cases):
    assert_user_error(result, f"--out={path}: exists and is not {noun} ({found}); "
                      f"--overwrite replaces only {noun}")
  assert checksums(tmp_path) == everything
  # The library, every pair of kinds: only the same kind is replaced.
  existing = {outputs.DATASET: data, outputs.CLIMATOLOGY: clim, outputs.FORECAST: forecast,
              outputs.OBSERVATIONS: station_store, outputs.RESULTS: str(results),
              run_directory.KIND: str(run_dir), weathernext2_export.KIND: str(export),
              outputs.NETCDF: str(predictions), outputs.NPZ: str(checkpoint)}
  for kind, path in existing.items():
    assert outputs.identify(path) is kind
    for other in existing:  # (a file where a directory goes: test_a_file_in_the_way...)
      if other is kind or other.continues or other.is_file != kind.is_file:
        continue
      with pytest.raises(ArgumentError, match=f"exists and is not {other.noun} "
                         f"\\(it is {kind.noun}\\)"):
        outputs.check(path, other, argument="out", overwrite=True)
    if not kind.continues:
      outputs.check(path, kind, argument="out", overwrite=True)  # the same kind: replaced
  with pytest.raises(ArgumentError, match="the output is also what this command reads"):
    climatology_lib.compute_climatology(clim, clim, overwrite=True)


def test_sigterm_ends_a_climatology_and_an_evaluation_as_ctrl_c_would(tmp_path):
  """SIGTERM (a batch scheduler's) while `make_climatology` computes its blocks and while
  `evaluate` scores its initial times (each paused at its first progress line, so the
  signal lands mid-work): one line saying nothing was written, exit 143, nothing left."""
  data = store(tmp_path / "data.zarr", end="2020-01-06", resolution=1.40625,
               variables=["2m_temperature"])  # 1.4 deg: scoring takes a moment
  forecast = forecast_of(tmp_path / "forecast.zarr", data, inits=16)
  coarse = store(tmp_path / "coarse.zarr", variables=[
      "2m_temperature", "mean_sea_level_pressure", "10m_u_component_of_wind",
      "10m_v_component_of_wind"])
  clim, scores = str(tmp_path / "out" / "clim.zarr"), str(tmp_path / "out" / "scores")
  commands = [
      ("make_climatology", [f"--store={coarse}", f"--out={clim}"], r": blocks 1/\d+ ", clim,
       f"Interrupted (SIGTERM): nothing was left at {clim}."),
      ("evaluate", [f"--forecast={forecast}", f"--truth={data}", f"--out={scores}"],
       r"Scoring \d+ initial times", scores, f"Interrupted (SIGTERM): nothing was written to "
       f"{scores}."),
  ]
  started = [Started([sys.executable, "-m", f"launch.{module}", *args])
             for module, args, *_ in commands]
  try:
    waiting = dict(enumerate(started))
    deadline = time.monotonic() + 120
    while waiting and time.monotonic() < deadline:  # each paused at its line, however fast
      for index, process in list(waiting.items()):
        if any(re.search(commands[index][2], line) for line in list(process.lines)):
          process.pause()
          process.process.send_signal(signal.SIGTERM)
          process.resume()
          del waiting[index]
        assert process.process.poll() is None, process.stderr[-3000:]
      time.sleep(0.01)
    assert not waiting
    for process, (_, _, _, out, line) in zip(started, commands):
      assert process.finish(timeout=120) == 128 + signal.SIGTERM, process.stderr[-3000:]
      assert "Traceback" not in process.stderr, process.stderr[-3000:]
      assert process.stderr.strip().splitlines()[-1] == line
  finally:
    for process in started:
      process.kill()
  assert os.listdir(tmp_path / "out") == []


def _catches(pid: int, signum: int) -> bool:
  """Whether process `pid` has a handler of `signum` installed (its SigCgt mask)."""
  with open(f"/proc/{pid}/status") as f:
    caught = next(line for line in f if line.startswith("SigCgt:")).split()[1]
  return bool(int(caught, 16) >> (signum - 1) & 1)


@pytest.mark.parametrize("signum, name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C")])
def test_a_signal_while_a_launcher_starts_is_one_line(signum, name):
  """SIGTERM or Ctrl-C once launch.cli has set its handlers, while the launcher still
  imports its modules (JAX, the planner): one line, the signal's exit status, no
  traceback. (Python catches SIGINT from its start: the SIGTERM handler, set with it,
  tells when.)"""
  started = Started([sys.executable, "-m", "launch.compile", "--config=tiny"])
  try:
    deadline = time.monotonic() + 60
    while not _catches(started.process.pid, signal.SIGTERM):
      assert time.monotonic() < deadline and started.process.poll() is None, started.stderr
      time.sleep(0.002)
    started.pause()  # where it is, however fast it imports
    started.process.send_signal(signum)
    started.resume()
    assert started.finish(timeout=60) == 128 + signum, started.stderr[-3000:]
  finally:
    started.kill()
  assert started.stderr.strip() == f"Interrupted ({name}): nothing was written yet."


@pytest.mark.slow
def test_sigterm_a_second_writer_and_a_killed_writers_leftovers(tmp_path):
  """make_dataset of a store that takes a while: a second one to the same --out stops at
  once naming the first; SIGTERM ends the first with one line and nothing left (exit 143);
  one killed by SIGKILL leaves `<out>.partial-<pid>`, which the next make_dataset removes,
  saying so, before it writes the store."""
  out = str(tmp_path / "big.zarr")
  big = [sys.executable, "-m", "launch.make_dataset", f"--out={out}", "--end=2020-02-29",
         "--resolution=1.40625", "--variables=2m_temperature,temperature"]
  first = Started(big)
  try:
    first.wait_for(r"times \d+/\d+ \|", timeout=120)  # writing
    first.pause()  # alive, holding the lock, its store unfinished (Ctrl-Z)
    second = run("make_dataset", f"--out={out}", "--end=2020-01-01")
    assert_user_error(second, f"--out={out}: is being written by another command (pid "
                      f"{first.process.pid}, since ", "wait for it to end, or choose another "
                      "--out")
    first.process.send_signal(signal.SIGTERM)  # delivered once resumed
    first.resume()
    assert first.finish(timeout=120) == 128 + signal.SIGTERM, first.stderr[-3000:]
  finally:
    first.kill()
  assert "Traceback" not in first.stderr
  assert first.stderr.strip().splitlines()[-1] == (f"Interrupted (SIGTERM): nothing was left "
                                                   f"at {out}.")
  assert os.listdir(tmp_path) == []  # no partial store, no lock

  killed = Started(big)
  try:
    killed.wait_for(r"times \d+/\d+ \|", timeout=120)
    killed.pause()  # killed mid-write, however fast the machine writes
    killed.process.kill()
    killed.process.wait(timeout=60)
  finally:
    killed.kill()
  leftover = f"{out}.partial-{killed.process.pid}"
  assert os.path.isdir(leftover)
  again = run("make_dataset", f"--out={out}", "--end=2020-01-01", "--variables=2m_temperature")
  assert again.returncode == 0, again.stderr[-3000:]
  assert (f"Removed {leftover}: what process {killed.process.pid}, which is no longer running "
          f"(killed?), left of {out} being built.") in again.stderr
  assert sorted(os.listdir(tmp_path)) == ["big.zarr"]
