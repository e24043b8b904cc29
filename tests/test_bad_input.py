"""Bad input through the real launchers: files that are not what they claim, time ranges
that reach outside a store, and messages that must point at what the user can change.

Each case ends with exit status 2 and one `error:` line, last on stderr, naming the
file (or range, or flag) and what is wrong, with no traceback (`test_cli.assert_user_error`);
`--traceback` still shows one. Most stop before JAX starts or before anything compiles;
the forecast cases read the shared `trained_tiny_run` (never write into it). Where two
cases take the same way out of a launcher, the second is checked on the library call the
launcher makes (a launch costs seconds).
"""

import concurrent.futures
import json
import logging
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

from launch import local_cluster
from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.data import run_data
from wnscale.data.making import synthetic
from wnscale.data.reading import normalization
from wnscale.data.reading import store_formats
from wnscale.errors import ArgumentError, UserError
from wnscale.evaluation import climatology
from wnscale.evaluation import scoring
from wnscale.inference import forecast_store
from wnscale.inference.forecast import run_forecast
from wnscale.interop import graphcast_example

from test_cli import TINY, _env, assert_user_error, run, train
from tiny_runs import RUN_FLAGS, fast_compile_env, process_env, read_metrics

VARIABLES = tuple(config_lib.default_config().data.variables)
LEVELS = (500, 850)
# The stores below span 2020-01-01 .. 2020-01-10 (every 6 h).
ON_STORE = ["--config.data.train_start=2020-01-01", "--config.data.train_end=2020-01-07",
            "--config.data.eval_start=2020-01-08", "--config.data.eval_end=2020-01-10"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
  """A good store, one with a NaN in temperature@850 at 2020-01-06T06, a regional one
  (latitude -42..42 only), and a forecast store written for another run."""
  root = tmp_path_factory.mktemp("bad_input")
  write = synthetic.write_synthetic_store
  good = write(str(root / "good.zarr"), start="2020-01-01", end="2020-01-10", levels=LEVELS,
               variables=VARIABLES)
  nan = str(root / "nan.zarr")
  shutil.copytree(good, nan)
  zarr.open_array(f"{nan}/temperature", mode="r+")[21, 1, 4, 5] = np.nan
  regional = str(root / "regional.zarr")
  xr.open_zarr(good).isel(latitude=slice(8, 24)).drop_encoding().to_zarr(regional,
                                                                         zarr_format=2)
  init_times = pd.date_range("2020-01-02", periods=2, freq="12h").values
  leads = pd.timedelta_range("6h", periods=2, freq="6h")
  settings = forecast_store.forecast_settings(
      workdir="/elsewhere/run", checkpoint_step=200, initial_conditions=good,
      init_times=init_times, leads=leads, variables=VARIABLES, levels=LEVELS)
  latitude, longitude = synthetic.store_coordinates(5.625)
  other = forecast_store.ForecastStore(
      str(root / "other_run_forecast.zarr"), settings, init_times=init_times, leads=leads,
      variables=VARIABLES, levels=LEVELS, latitude=latitude, longitude=longitude,
      flip_latitude=False)
  other.finish_init(0)
  other.finish_init(1)
  return {"good": good, "nan": nan, "regional": regional, "other_forecast": other.path}


def on(path):
  return [f"--config.data.path={path}", *ON_STORE]


# --- Files that are not what they claim ----------------------------------------------

@pytest.mark.parametrize("text, fragments", [
    ("def get_config(:\n  pass\n", ["line 1: invalid syntax (SyntaxError)"]),
    ("from wnscale.config import default_config\n\n\ndef get_config():\n"
     "  config = default_config()\n  return confg\n",
     ["line 6: NameError: name 'confg' is not defined"]),
    ("x = 1\n", ["defines no get_config()", "configs/tiny.py"]),
], ids=["syntax_error", "name_error", "no_get_config"])
def test_a_broken_config_file_is_one_line_naming_file_and_line(tmp_path, text, fragments):
  path = tmp_path / "experiment.py"
  path.write_text(text)
  result = run("train", f"--config={path}", f"--workdir={tmp_path / 'run'}")
  assert_user_error(result, f"Config file {path}", *fragments)
  if "NameError" in fragments[0]:  # once: the traceback shows where in get_config
    again = run("train", f"--config={path}", f"--workdir={tmp_path / 'run'}", "--traceback")
    assert again.returncode == 2 and 'experiment.py", line 6, in get_config' in again.stderr


def test_import_graphcast_of_a_file_that_is_no_npz(tmp_path):
  buffer = tmp_path / "whole.npz"
  np.savez(buffer, params=np.zeros(1000))
  truncated = tmp_path / "params.npz"
  truncated.write_bytes(buffer.read_bytes()[:2000])
  (tmp_path / "stats").mkdir()
  result = run("import_graphcast", f"--checkpoint={truncated}", f"--stats_dir={tmp_path}/stats",
               f"--out={tmp_path / 'run'}")
  assert_user_error(result, f"{truncated} is not an .npz file", "cut short (2000 bytes)")
  assert not (tmp_path / "run").exists()


def test_a_stats_path_that_holds_no_statistics(tmp_path, stores):
  path = tmp_path / "stats.nc"
  path.write_text("mean,std\n1,2\n")
  result = train(tmp_path / "run", *on(stores["good"]), f"--config.data.stats_path={path}")
  assert_user_error(result, f"{path} is not a netCDF file")
  assert "Compiled" not in result.stderr
  with pytest.raises(UserError, match="it is a directory without them"):
    normalization.read_stats(str(tmp_path))


def test_init_from_a_directory_that_does_not_exist(tmp_path, stores):
  missing = tmp_path / "no_such_run"
  result = train(tmp_path / "run", *on(stores["good"]), f"--config.train.init_from={missing}")
  assert_user_error(result, f"--config.train.init_from={missing}: no run there")
  assert "RuntimeError" not in result.stderr and "Store and statistics" not in result.stderr


def test_predict_example_of_a_missing_or_non_netcdf_file(tmp_path, trained_tiny_run):
  example, out = tmp_path / "example.nc", tmp_path / "p.nc"
  with pytest.raises(UserError, match=f"No netCDF file at {example}"):
    graphcast_example.predict_example(trained_tiny_run, str(example), str(out))
  example.write_text("not netCDF")
  assert_user_error(run("predict_example", f"--workdir={trained_tiny_run}",
                        f"--example={example}", f"--out={out}"),
                    f"{example} is not a netCDF file")
  assert not out.exists()


# --- Messages that point at what the user can change ---------------------------------

def test_a_regional_store_is_said_to_not_cover_the_globe(tmp_path, stores):
  error = assert_user_error(train(tmp_path, *on(stores["regional"])),
                            "The grid does not cover the globe: latitude -42.1875 .. 42.1875",
                            "a global store")
  assert "too fine" not in error  # not blamed on the mesh


def forecast(workdir, out, *args, env=None):
  return run("forecast", f"--workdir={workdir}", f"--out={out}", "--platform=cpu",
             "--mesh.graph=1", "--mesh.data=1", *args, env=env, timeout=300)


def test_forecast_flags_and_stores_that_do_not_fit(tmp_path, stores, trained_tiny_run):
  """The run's store covers 2020-01-01 .. 2020-01-31; none of these compiles anything.
  `--params=ema` of a run without an EMA is said before any forecast is written.
  (`--init_every=24`, without a unit, is the same way out: test_forecast.py.) The
  launcher's line once; the other mistakes from the library function it calls (a
  launch costs more than the check)."""
  out = tmp_path / "forecast.zarr"
  result = forecast(trained_tiny_run, out, "--init_start=2020-01-25", "--init_end=2020-02-10")
  assert_user_error(result, "--init_end=2020-02-10: is after the last time of the store",
                    "which covers 2020-01-01 00:00:00 .. 2020-01-31 18:00:00 every 6 h")
  all_devices = {"data": -1}  # this process's 8 test devices
  # Another run's forecast at --out: said as such, not as a checkpoint step it lacks.
  with pytest.raises(ArgumentError, match=f"^out={stores['other_forecast']}: holds a forecast "
                     "of another run, /elsewhere/run; choose another `out`") as error:
    run_forecast(trained_tiny_run, stores["other_forecast"], mesh_overrides=all_devices)
  assert "step" not in str(error.value)
  # The moving average of a run that kept none (train.ema_decay=0).
  with pytest.raises(ArgumentError, match=r"^params=ema: the checkpoint .* holds no moving "
                     r"average of the parameters.*read its raw parameters \(`params=raw`\)"):
    run_forecast(trained_tiny_run, str(out), params="ema", init_times=["2020-01-25"],
                 lead="6h", mesh_overrides=all_devices)
  assert not out.exists()


def test_a_nan_in_a_forecast_initial_state_says_what_a_forecast_can_do(tmp_path, stores,
                                                                       trained_tiny_run):
  result = forecast(trained_tiny_run, tmp_path / "f.zarr", f"--data.path={stores['nan']}",
                    "--init_times=2020-01-06T06", "--lead=6h", env=_env(**fast_compile_env()))
  error = assert_user_error(result, "NaN in variable 'temperature@850' at time "
                            "2020-01-06T06:00", "--init_times", "--data.path")
  assert "fill_nan" not in error


def test_evaluate_messages_name_its_own_flags(tmp_path, stores):
  assert_user_error(run("evaluate", f"--forecast={stores['other_forecast']}",
                        f"--truth={stores['good']}", f"--out={tmp_path / 'scores'}",
                        "--init_start=2020-01-02T12", "--init_end=2020-01-03"),
                    "--init_end=2020-01-03: is after the last initial time of the forecast")
  missing = tmp_path / "forecast.zarr"  # no advice about a training config's data.path
  with pytest.raises(UserError, match=r"^Store not found: \S+forecast.zarr \(no such file "
                     r"or directory\)\.$"):
    scoring.evaluate(str(missing), stores["good"], str(tmp_path / "scores"))
  # A climatology given as the truth: said as such (not as a missing time or variable).
  clim = climatology.compute_climatology(stores["good"], str(tmp_path / "clim.zarr"),
                                         variables=["2m_temperature"])
  with pytest.raises(ArgumentError, match=f"^truth={clim}: is a climatology store, not a "
                     "store of states over time"):
    scoring.evaluate(stores["other_forecast"], clim, str(tmp_path / "scores"))
  # A truth, or a climatology's store, with a time twice: the first one named, not wrong
  # rows looked up (or a time counted twice).
  twice = _copy_with(stores["good"], tmp_path / "twice.zarr", lambda d: d.isel(
      time=[0, 1, 2, 2, *range(3, d.sizes["time"])]))
  for call in (lambda: scoring.evaluate(stores["other_forecast"], twice,
                                        str(tmp_path / "scores")),
               lambda: climatology.compute_climatology(twice, str(tmp_path / "c.zarr"))):
    with pytest.raises(UserError, match=f"^Times of {twice} are not in order: 2020-01-01 "
                       r"12:00:00 \(position 3\) is there twice"):
      call()
  assert not (tmp_path / "scores").exists() and not (tmp_path / "c.zarr").exists()


def test_local_cluster_says_where_its_flags_go():
  error = assert_user_error(run("local_cluster", "--num_processes=2", TINY,
                                "--workdir=/tmp/unused"),
                            "Unknown command line flag 'config'", "go after --")
  assert "--num_cpu_devices" not in error
  with pytest.raises(UserError, match=r"^--num_processes=0 must be at least 1\.$"):
    local_cluster.run_cluster(0, 4, "launch.train", [TINY], timeout=1.0)


# --- Stores that are not what training takes ---------------------------------------------

def _copy_with(store, path, change):
  """A copy of the zarr store `store` at `path` with `change(dataset)` applied (xarray)."""
  dataset = change(xr.open_zarr(store).load())
  dataset.drop_encoding().to_zarr(path, zarr_format=2, mode="w")
  return str(path)


def _damage_a_chunk(store, name, time_index):
  """Truncates the chunk file of `name` holding time `time_index` (one time a chunk)."""
  chunk = sorted(p for p in (Path(store) / name).iterdir() if p.name.startswith(
      f"{time_index}."))[0]
  chunk.write_bytes(chunk.read_bytes()[:len(chunk.read_bytes()) // 2])
  return str(chunk)


def _in_parallel(*calls):
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    return list(pool.map(lambda call: call(), calls))


@pytest.mark.slow  # 6 launches
def test_stores_that_do_not_fit_are_one_line_before_any_compile(tmp_path, stores):
  """Each a real store given to launch.train as data.path: one line naming the store and
  the problem, exit 2, before anything compiles (the damaged chunk: when the statistics
  read it; the gs:// store without a network: in seconds, not after the client's minute of
  retries). Times out of order here; repeated, and gaps: test_data_store.py."""
  good = stores["good"]
  cases = {
      "int16": (_copy_with(good, tmp_path / "int16.zarr", lambda d: d.assign(
          mean_sea_level_pressure=(d.mean_sea_level_pressure / 10).astype(np.int16))),
                ["Variable 'mean_sea_level_pressure' of store", "is stored as int16",
                 "write the store again as float32"]),
      "climatology": (climatology.compute_climatology(good, str(tmp_path / "clim.zarr"),
                                                      variables=["2m_temperature"]),
                      ["is a climatology store (launch.make_climatology writes them), not a "
                       "store of states over time"]),
      "unsorted": (_copy_with(good, tmp_path / "unsorted.zarr", lambda d: d.isel(
          time=[0, 1, 2, 3, 4, 6, 5, *range(7, d.sizes["time"])])),
                   ["Times of", "are not in order: 2020-01-02 06:00:00 (position 6) comes "
                    "after 2020-01-02 12:00:00; sort the store by time"]),
      "units": (_copy_with(good, tmp_path / "units.zarr", lambda d: d.assign(
          mean_sea_level_pressure=d.mean_sea_level_pressure.assign_attrs(units="K"))),
                ["Variable 'mean_sea_level_pressure' of store", "is in 'K' (its units "
                 "attribute); wnscale expects 'Pa'"]),
  }
  damaged = str(tmp_path / "damaged.zarr")
  shutil.copytree(good, damaged)
  _damage_a_chunk(damaged, "temperature", 9)
  cases["damaged"] = (damaged, ["Cannot read variable 'temperature' at", "of store "
                                f"{damaged}: a chunk file is damaged", "Invalid blosc"])
  # No network for Cloud Storage: nothing listens at the emulator's address.
  offline = _env(STORAGE_EMULATOR_HOST="http://127.0.0.1:9",
                 TENSORSTORE_GCS_HTTP_URL="http://127.0.0.1:9")
  for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
    offline.pop(proxy, None)
  calls = [lambda name=name, path=path: train(tmp_path / f"run_{name}", *on(path))
           for name, (path, _) in cases.items()]
  calls.append(lambda: train(tmp_path / "run_gs", *on("gs://weather/era5.zarr"), env=offline))
  # A batch larger than the training range's examples: said with the numbers.
  calls.append(lambda: train(tmp_path / "run_batch", *on(good),
                             "--config.data.train_end=2020-01-01",
                             "--config.train.batch_size=8"))
  results = _in_parallel(*calls)
  for (name, (path, fragments)), result in zip(cases.items(), results):
    error = assert_user_error(result, *fragments)
    assert path in error, (name, error)
    assert "Compiled" not in result.stderr, name
  assert_user_error(results[-2], "Cannot reach Cloud Storage for gs://weather/era5.zarr: "
                    "127.0.0.1:9: Connection refused")
  assert_user_error(results[-1], "--config.train.batch_size=8: more than the 2 example(s) of "
                    "the training range 2020-01-01 .. 2020-01-01 (4 times of",
                    "lower --config.train.batch_size to at most 2")
  assert "Statistics" not in results[-1].stderr and "Compiled" not in results[-1].stderr


def test_stores_read_as_they_should_be(tmp_path, stores, caplog):
  """A float64 store is read as float32; degC and hPa are converted into the catalogue's K
  and Pa, with one warning; a -180 .. 180 store reads in wnscale's order (longitude
  ascending in [0, 360)), the same values as the 0 .. 360 one."""
  good = stores["good"]
  names, levels = ("temperature", "2m_temperature", "mean_sea_level_pressure"), (500,)
  want = store_formats.open_store(good, names, levels).read_state([0, 5])
  celsius = _copy_with(good, tmp_path / "celsius.zarr", lambda d: d.assign(
      {"2m_temperature": (d["2m_temperature"] - 273.15).assign_attrs(units="degC"),
       "mean_sea_level_pressure": (d.mean_sea_level_pressure / 100).assign_attrs(units="hPa"),
       "temperature": d.temperature.astype(np.float64)}))
  rolled = _copy_with(good, tmp_path / "rolled.zarr", lambda d: d.roll(
      longitude=32, roll_coords=True).assign_coords(
          longitude=(d.longitude.roll(longitude=32) + 180) % 360 - 180))
  assert xr.open_zarr(rolled).longitude.values[0] == -180
  with caplog.at_level(logging.WARNING):
    got = store_formats.open_store(celsius, names, levels).read_state([0, 5])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)
  assert f"Store {celsius}: 2m_temperature is in degC (its units attribute): read in K " \
      "(+273.15)." in caplog.text
  assert "mean_sea_level_pressure is in hPa (its units attribute): read in Pa (x 100)" in \
      caplog.text
  opened = store_formats.open_store(rolled, names, levels)
  np.testing.assert_array_equal(opened.points.axes()[1], store_formats.open_store(
      good, names, levels).points.axes()[1])
  np.testing.assert_array_equal(opened.read_state([0, 5]), want)


@pytest.mark.slow  # 2 runs of 2 steps
def test_a_store_in_degc_and_hpa_trains_as_the_same_store_in_k_and_pa(tmp_path, stores):
  """Against statistics in K and Pa (GraphCast's files, as the issue's run had), a store
  whose 2 m temperature is in degC and pressure in hPa (said by their units), and whose
  temperature is float64, trains with the losses of the same store in K, Pa and float32:
  converted on reading, and said, not trained 273 K off."""
  good = stores["good"]
  celsius = _copy_with(good, tmp_path / "celsius.zarr", lambda d: d.assign(
      {"2m_temperature": (d["2m_temperature"] - 273.15).assign_attrs(units="degC"),
       "mean_sea_level_pressure": (d.mean_sea_level_pressure / 100).assign_attrs(
           units="hPa"), "temperature": d.temperature.astype(np.float64)}))
  flags = ["--config.data.stats_path=" + os.path.join(os.path.dirname(__file__), "fixtures",
                                                       "graphcast_5p625", "stats"),
           "--config.train.steps=2", "--config.train.eval_every=0",
           "--config.train.warmup_steps=1", "--config.train.log_every=1"]
  results = _in_parallel(*(lambda name=name, path=path: train(
      tmp_path / name, *on(path), *flags, env=_env(**fast_compile_env()))
                           for name, path in (("kelvin", good), ("celsius", celsius))))
  for result in results:
    assert result.returncode == 0, result.stderr[-3000:]
  losses = [[m["loss"] for m in read_metrics(str(tmp_path / name)) if "loss" in m]
            for name in ("kelvin", "celsius")]
  assert len(losses[0]) == 2
  np.testing.assert_allclose(losses[1], losses[0], rtol=1e-3)
  assert f"Store {celsius}: 2m_temperature is in degC (its units attribute): read in K " \
      "(+273.15)." in results[1].stderr
  assert f"Store {celsius}: temperature (float64) read as float32." in results[1].stderr


def test_an_unwritable_cache_is_one_warning(tmp_path, stores, monkeypatch, caplog):
  """A read-only cache directory (a read-only tmpfs) with an explicit store: the statistics
  are computed and used, not cached, and said once."""
  from test_existing_data import tmpfs  # noqa: PLC0415
  with tmpfs(tmp_path / "cache", "1m", read_only=True) as cache_dir:
    monkeypatch.setenv("WNSCALE_CACHE_DIR", cache_dir)
    with caplog.at_level(logging.WARNING):
      stats = normalization.load_or_compute_stats(stores["good"], ["2m_temperature"], [],
                                                  "2020-01-01", "2020-01-05")
    assert "2m_temperature" in stats
    assert caplog.text.count(f"The cache directory {cache_dir} cannot be written "
                             "(Read-only file system)") == 1
    # A synthetic store has nowhere else to go: one line.
    data = specs_lib.from_config(config_lib.load(TINY.split("=", 1)[1])).data
    with pytest.raises(UserError, match=f"^The synthetic store goes into the cache directory "
                       f"{cache_dir}: cannot write there \\(Read-only file system"):
      run_data.resolve_store(data, seed=0)


def test_a_finished_run_says_so_before_opening_its_store(tmp_path, trained_tiny_run):
  workdir = tmp_path / "run"
  shutil.copytree(trained_tiny_run, workdir)
  result = run("train", *RUN_FLAGS, f"--workdir={workdir}", "--platform=cpu",
               env=process_env())
  assert result.returncode == 0, result.stderr[-3000:]
  assert (f"Nothing to train: the newest checkpoint, {workdir}/checkpoints/12, is at step 12, "
          "and train.steps=12.") in result.stderr
  assert "Store" not in result.stderr and "Compiled" not in result.stderr


@pytest.mark.slow  # a forecast compiled
def test_a_forecast_of_a_minus_180_store_is_sorted_and_scores(tmp_path, trained_tiny_run):
  """Initial conditions from the run's store as -180 .. 180 (columns rotated), its 2 m
  temperature in degC (said by its units): the forecast is read in K and written with
  longitude ascending in [0, 360), and evaluate scores it against that -180 .. 180, degC
  store (the same grid, read in K) without a word about grids; a --data.path without the
  run's variables says which store lacks what."""
  own = json.loads(open(os.path.join(trained_tiny_run, "config.json")).read())["data"]["path"]
  rolled = _copy_with(own, tmp_path / "rolled.zarr", lambda d: d.sel(
      time=slice("2020-01-20", "2020-01-23")).roll(longitude=32, roll_coords=True)
      .assign_coords(longitude=(d.longitude.roll(longitude=32) + 180) % 360 - 180)
      .pipe(lambda r: r.assign({"2m_temperature": (r["2m_temperature"] - 273.15)
                                .assign_attrs(units="degC")})))
  lacking = _copy_with(own, tmp_path / "lacking.zarr", lambda d: d.sel(
      time=slice("2020-01-20", "2020-01-23")).drop_vars("specific_humidity"))
  out = tmp_path / "f.zarr"
  made, missing = _in_parallel(
      lambda: forecast(trained_tiny_run, out, f"--data.path={rolled}",
                       "--init_times=2020-01-21T00", "--lead=12h",
                       env=_env(**fast_compile_env())),
      lambda: forecast(trained_tiny_run, tmp_path / "g.zarr", f"--data.path={lacking}",
                       "--init_times=2020-01-21T00", "--lead=12h"))
  assert made.returncode == 0, made.stderr[-3000:]
  converted = f"Store {rolled}: 2m_temperature is in degC (its units attribute): read in K"
  assert converted in made.stderr, made.stderr[-3000:]
  written = xr.open_zarr(out)
  longitude = written.longitude.values
  assert longitude[0] == 0 and np.all(np.diff(longitude) > 0)
  assert 200 < float(written["2m_temperature"].mean()) < 350  # K, from degC inputs
  scored = run("evaluate", f"--forecast={out}", f"--truth={rolled}",
               f"--out={tmp_path / 'scores'}")
  assert scored.returncode == 0, scored.stderr[-3000:]
  assert "Grids differ" not in scored.stderr and converted in scored.stderr
  with open(tmp_path / "scores" / "metrics.json") as f:
    rmse = json.load(f)["scores"]["forecast"]["rmse"]["2m_temperature"]
  assert max(rmse) < 50, rmse  # against the truth in K, not 273 K off
  assert re.search(rf"Scoring {re.escape(str(out))}: initial times 1/1 \(2020-01-21 00:00\) \| "
                   r"\d+:\d\d:\d\d \| ETA 0:00:00", scored.stderr), scored.stderr[-2000:]
  error = assert_user_error(missing, f"The store {lacking} (--data.path) lacks variable(s) "
                            "['specific_humidity'] that the run", "Give --data.path a store "
                            "with the run's variables")
  assert "Choose data.variables" not in error
