"""Bad input through the real launchers: files that are not what they claim, time ranges
that reach outside a store, and messages that must point at what the user can change.

Each case ends with exit status 2 and one `error:` line, last on stderr, naming the
file (or range, or flag) and what is wrong, with no traceback (`test_cli.assert_user_error`);
`--traceback` still shows one. Most stop before JAX starts or before anything compiles;
the forecast cases read the shared `trained_tiny_run` (never write into it). Where two
cases take the same way out of a launcher, the second is checked on the library call the
launcher makes (a launch costs seconds).
"""

import shutil

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

from launch import local_cluster
from wnscale import config as config_lib
from wnscale.data import normalization, synthetic
from wnscale.errors import ArgumentError, UserError
from wnscale.evaluation import scoring
from wnscale.inference import forecast_store
from wnscale.inference.forecast import run_forecast
from wnscale.interop import graphcast_example

from test_cli import TINY, _env, assert_user_error, run, train
from tiny_runs import fast_compile_env

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


def test_local_cluster_says_where_its_flags_go():
  error = assert_user_error(run("local_cluster", "--num_processes=2", TINY,
                                "--workdir=/tmp/unused"),
                            "Unknown command line flag 'config'", "go after --")
  assert "--num_cpu_devices" not in error
  with pytest.raises(UserError, match=r"^--num_processes=0 must be at least 1\.$"):
    local_cluster.run_cluster(0, 4, "launch.train", [TINY], timeout=1.0)
