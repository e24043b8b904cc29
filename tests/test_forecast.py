"""Forecasting pieces in one process: the sharded streaming step equals the training
rollout on any mesh, the forecast store's layout and resume rules, params-only restore,
initial-time selection and the progress display; and an ensemble forecast by 2 processes
equal to the one of this process."""

import io
import json
import os
import subprocess
import sys

import grain
import jax
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from flax import nnx

from problems import data_spec, device_batch, random_batch, spread_members
from tiny_runs import REPO, process_env
from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.assembly import assemble
from wnscale.data import pipeline
from wnscale.data.making import synthetic
from wnscale.errors import UserError
from wnscale.graphs import grid
from wnscale.graphs.points import PointSet
from wnscale.inference import forecast as forecast_lib
from wnscale.inference.forecast_store import ForecastStore, forecast_settings
from wnscale.inference.rollout import StreamingForecaster
from wnscale.model import forecast, setup
from wnscale.progress import ForecastProgress
from wnscale.sharding import mesh as mesh_lib
from wnscale.sharding import sharded_model
from wnscale.sharding.layout import ShardedLayout
from wnscale.train import checkpoint, optimizer as optimizer_lib
from wnscale.train.run_directory import RunDirectory
from wnscale.train.state import initial_state

VARIABLES = ("temperature", "geopotential", "2m_temperature")
LEVELS = (850, 500)
LEADS = 3


def small_config(**data):
  config = config_lib.default_config()
  config.model.update(latent_size=16, message_passing_steps=2)
  # Inside the stores below (2020-01-01 .. 2020-01-04): a range outside is an error.
  config.data.update(dict(variables=VARIABLES, pressure_levels=LEVELS,
                          train_start="2020-01-01", train_end="2020-01-03",
                          eval_start="2020-01-04", eval_end="2020-01-04"), **data)
  return config_lib.validate(config)


def make_layout(config, points, graph, exchange="all_gather", data=1):
  config.mesh.update(data=data, graph=graph, exchange=exchange)
  mesh = mesh_lib.make_mesh(specs_lib.from_config(config).mesh, jax.devices()[:data * graph])
  graphs = setup.graphs_for_grid(specs_lib.from_config(config).model, points)
  return ShardedLayout(mesh, graphs, setup.node_positions(specs_lib.from_config(config).model, points),
                       exchange), graphs


@pytest.mark.parametrize("graph, exchange", [(1, "all_gather"), (4, "halo")])
def test_sharded_step_repeats_the_training_rollout(graph, exchange):
  """Three calls of the one-step function, history on the device, = `forecast.rollout`."""
  config = small_config(target_steps=LEADS)
  points = PointSet.regular(*grid.regular_grid(10.0, include_poles=True))
  layout, graphs = make_layout(config, points, graph, exchange, data=2)
  constants = setup.make_constants(specs_lib.from_config(config).data, graphs, points,
                                   np.linspace(0.3, 1.0, len(VARIABLES) * 2 - 1))
  graphdef, params = setup.init_model(specs_lib.from_config(config))
  batch = random_batch(config, graphs.num_nodes("grid"), batch_size=2, seed=1)
  expected = np.asarray(forecast.rollout(nnx.merge(graphdef, params), constants, batch))
  step = jax.jit(sharded_model.forecast_step_fn(layout, graphdef), donate_argnums=3)
  device_constants, halo_indices = layout.constants(constants)
  laid_out = device_batch(layout, batch)
  history = laid_out["inputs"]
  for lead in range(LEADS):
    window = laid_out["forcings"][:, lead:lead + config.data.input_steps + 1]
    history, state, points, point_state = step(params, device_constants, halo_indices,
                                               {"inputs": history, "forcings": window,
                                                "statics": laid_out["statics"]})
    assert points == {} and point_state == {}  # no modalities
    got = layout.grid.from_slots(np.asarray(state), -1)
    np.testing.assert_allclose(got, expected[:, lead], rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def store_source(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("store") / "era5.zarr")
  synthetic.write_synthetic_store(path, resolution=5.625, start="2020-01-01",
                                  end="2020-01-04", levels=(500, 700, 850), seed=3)
  source = pipeline.make_source(data_spec(path=path, variables=VARIABLES, pressure_levels=LEVELS,
                                          target_steps=LEADS, train_start="", train_end=""),
                                "train")
  return path, source


def test_streaming_forecast_equals_rollout_of_the_store_example(store_source):
  """From the store, the streamed states equal the rollout of the training pipeline's
  example (same normalization, forcings and statics), on one device and on four."""
  _, source = store_source
  config = small_config(target_steps=LEADS)
  graphdef, params = setup.init_model(specs_lib.from_config(config))
  stats = source.normalization.channel_stats
  index = 5  # the example whose inputs end at store time index + 1
  example = {k: v[None] for k, v in source[index].items()}
  results = []
  for graph in (1, 4):
    config.mesh.update(data=1, graph=graph)
    specs = specs_lib.from_config(config)
    assembly = assemble(specs, source.store.points, source.normalization.stats,
                        mesh_lib.make_mesh(specs.mesh, jax.devices()[:graph]))
    constants = assembly.constants
    np.testing.assert_allclose(constants.residual_scale, stats["diff_std"] / stats["std"])
    forecaster = StreamingForecaster(specs, assembly, params, source.store)
    states = {lead: grid for lead, grid, _ in forecaster.run([index + 1], LEADS)}
    assert sorted(states) == list(range(LEADS))
    results.append(np.stack([states[lead][0] for lead in range(LEADS)]))
  expected = np.asarray(forecast.rollout(nnx.merge(graphdef, params), constants, example))[0]
  expected = expected * stats["std"][:, None] + stats["mean"][:, None]
  np.testing.assert_allclose(results[0], expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
  np.testing.assert_allclose(results[1], results[0], rtol=1e-5,
                             atol=1e-5 * np.abs(expected).max())


def test_writers_of_a_forecast_store_each_write_their_own_share(tmp_path, store_source):
  """Two writers (the processes of a multi-process forecast), given the same state: each
  writes only its own chunks, no chunk by both; together the whole state; writer 0
  records the initial time only after the barrier."""
  _, source = store_source
  store = source.store
  init_times, leads = store.times[[1, 3]], pd.timedelta_range("6h", periods=1, freq="6h")
  settings = forecast_settings(workdir="run", checkpoint_step=7, initial_conditions=store.path,
                               init_times=init_times, leads=leads, variables=VARIABLES,
                               levels=LEVELS)
  path = str(tmp_path / "forecast.zarr")
  barriers = []
  kwargs = dict(init_times=init_times, leads=leads, variables=VARIABLES, levels=LEVELS,
                latitude=store.points.axes()[0], longitude=store.points.axes()[1],
                flip_latitude=False, num_writers=2, barrier=barriers.append)
  with pytest.raises(RuntimeError, match="writer 0 makes it first"):
    ForecastStore(path, settings, writer_index=1, **kwargs)
  first = ForecastStore(path, settings, writer_index=0, **kwargs)
  second = ForecastStore(path, settings, writer_index=1, **kwargs)
  state = np.arange(5 * store.num_grid_nodes, dtype=np.float32).reshape(5, -1)
  second.write(0, 0, state)
  second.finish_init(0)
  written = xr.open_zarr(path, chunks=None).isel(time=0, prediction_timedelta=0)
  mine = {name for name in VARIABLES if np.isfinite(written[name].values).all()}
  untouched = {name for name in VARIABLES if np.isnan(written[name].values).all()}
  assert mine and untouched and mine | untouched == set(VARIABLES)
  # Writer 1 reached the barrier and did not record the initial time: writer 0 does that.
  assert barriers == ["wnscale forecast: initial times [0] written"]
  assert written.attrs["wnscale_completed_inits"] == []
  first.write(0, 0, state)
  first.finish_init(0)
  written = xr.open_zarr(path, chunks=None).isel(time=0, prediction_timedelta=0)
  assert written.attrs["wnscale_completed_inits"] == [0]
  channel = 0
  for name in VARIABLES:  # the whole state, each variable as given
    width = len(LEVELS) if written[name].ndim == 3 else 1
    np.testing.assert_array_equal(written[name].values.reshape(width, -1),
                                  state[channel:channel + width])
    channel += width
  assert first.wait_seconds >= 0 and second.wait_seconds >= 0


def test_forecast_store_layout_and_resume_rules(tmp_path, store_source):
  _, source = store_source
  store = source.store
  init_times = store.times[[1, 3]]
  leads = pd.timedelta_range("6h", periods=2, freq="6h")
  settings = forecast_settings(workdir="run", checkpoint_step=7, initial_conditions=store.path,
                               init_times=init_times, leads=leads, variables=VARIABLES,
                               levels=LEVELS)
  path = str(tmp_path / "forecast.zarr")
  kwargs = dict(init_times=init_times, leads=leads, variables=VARIABLES, levels=LEVELS,
                latitude=store.points.axes()[0][::-1], longitude=store.points.axes()[1],
                flip_latitude=True)
  output = ForecastStore(path, settings, **kwargs)
  state = np.arange(5 * store.num_grid_nodes, dtype=np.float32).reshape(5, -1)
  output.write(1, 0, state)
  output.finish_init(1)
  dataset = xr.open_zarr(path, chunks=None)
  assert dataset["temperature"].dims == ("time", "prediction_timedelta", "level", "latitude",
                                         "longitude")
  assert dataset["2m_temperature"].dims == ("time", "prediction_timedelta", "latitude",
                                            "longitude")
  assert dataset["temperature"].attrs["units"] == "K"
  assert dataset["geopotential"].attrs["units"] == "m^2 s^-2"
  assert dataset["temperature"].encoding["chunks"] == (1, 1, 2, 32, 64)
  assert dataset.prediction_timedelta.dtype.kind == "m"
  np.testing.assert_array_equal(dataset.level, LEVELS)
  assert dataset.latitude.values[0] > dataset.latitude.values[-1]  # the store's order
  # Written channel 0 (temperature@850) comes back, flipped to the store's latitude order.
  np.testing.assert_array_equal(dataset["temperature"].isel(time=1, prediction_timedelta=0)
                                .sel(level=850).values, state[0].reshape(32, 64)[::-1])
  assert np.isnan(dataset["temperature"].isel(time=0).values).all()
  assert dataset.attrs["wnscale_completed_inits"] == [1]
  # Reopened with the same settings: it continues; with others: an error, untouched.
  assert ForecastStore(path, settings, **kwargs).completed == [1]
  with pytest.raises(ValueError, match="^path=.*: holds a forecast with other settings "
                     "\\(checkpoint_step differ\\); choose another `path`") as library:
    ForecastStore(path, dict(settings, checkpoint_step=8), **kwargs)
  assert "--" not in str(library.value)
  # Ensemble members: a `number` dim after `time`.
  members = ForecastStore(str(tmp_path / "ensemble.zarr"), settings, members=2, **kwargs)
  members.write(0, 1, state, member=1)
  members.finish_init(0)
  ensemble = xr.open_zarr(members.path, chunks=None)
  assert ensemble["temperature"].dims[:3] == ("time", "number", "prediction_timedelta")
  assert np.isfinite(ensemble["temperature"].isel(time=0, number=1, prediction_timedelta=1)).all()
  assert np.isnan(ensemble["temperature"].isel(time=0, number=0)).all()
  # On points (the grid's 2048 nodes as a list): a `values` dim with a latitude and a
  # longitude per point, in the states' order; continued the same way.
  on_points = dict(kwargs, latitude=store.points.latitude, longitude=store.points.longitude,
                   flip_latitude=False, on_points=True)
  points = ForecastStore(str(tmp_path / "points.zarr"), settings, **on_points)
  points.write(0, 1, state)
  points.finish_init(0)
  listed = xr.open_zarr(points.path, chunks=None)
  assert listed["temperature"].dims == ("time", "prediction_timedelta", "level", "values")
  assert listed["2m_temperature"].encoding["chunks"] == (1, 1, 2048)
  assert listed["latitude"].dims == listed["longitude"].dims == ("values",)
  np.testing.assert_array_equal(listed.longitude.values, store.points.longitude)
  np.testing.assert_array_equal(listed["temperature"].isel(time=0, prediction_timedelta=1)
                                .sel(level=850).values, state[0])
  assert ForecastStore(points.path, settings, **on_points).completed == [0]


def test_init_times_and_leads(store_source):
  _, source = store_source
  times = source.store.times  # 2020-01-01T00 .. 2020-01-04T18, every 6 h
  select = lambda **kw: forecast_lib.select_init_times(times, path="S", **kw)  # noqa: E731
  np.testing.assert_array_equal(select(start="2020-01-02", end="2020-01-03", every="12h"),
                                [4, 6, 8, 10])
  np.testing.assert_array_equal(select(init_times=["2020-01-02T06", "2020-01-01T06"]), [5, 1])
  with pytest.raises(ValueError, match="needs the 1 earlier state"):
    select(init_times=["2020-01-01T00"])
  with pytest.raises(ValueError, match="2020-01-09 00:00:00 is not a time of the store S"):
    select(init_times=["2020-01-09"])
  with pytest.raises(ValueError, match="init_every=9h: must be a positive multiple of the "
                     "model's 6 h step"):
    select(start="2020-01-02", end="2020-01-03", every="9h")
  with pytest.raises(ValueError, match="init_every=24: a duration needs a unit, e.g. 24h"):
    select(start="2020-01-02", end="2020-01-03", every="24")
  # A range reaching past the store is not clipped to it.
  with pytest.raises(ValueError, match="init_end=2020-01-05: is after the last time of the "
                     "store S, which covers 2020-01-01 00:00:00 .. 2020-01-04 18:00:00"):
    select(start="2020-01-02", end="2020-01-05", every="12h")
  with pytest.raises(ValueError, match="init_start=2019-12-31T18: is before the first"):
    select(start="2019-12-31T18", end="2020-01-02", every="12h")
  assert forecast_lib.lead_steps("10d", 6) == 40
  assert forecast_lib.lead_steps("18h", 6) == 3
  with pytest.raises(ValueError, match="lead=5h: must be a positive multiple"):
    forecast_lib.lead_steps("5h", 6)


def test_params_only_restore_and_clear_errors(tmp_path):
  config = small_config()
  graphdef, params = setup.init_model(specs_lib.from_config(config))
  state = initial_state(params, optimizer_lib.make_optimizer(
      specs_lib.from_config(config).train))
  saver = checkpoint.Checkpointer(str(tmp_path), max_to_keep=3)
  iterator = iter(grain.MapDataset.range(4).to_iter_dataset())
  for step in (3, 6):
    saver.save(step, state, iterator, {"step": step})
  saver.close()
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = checkpoint.abstract_like(
      setup.init_model_shapes(specs_lib.from_config(config))[1], sharding)
  restored, step = checkpoint.restore_params(str(tmp_path), abstract)
  assert step == 6
  jax.tree.map(np.testing.assert_array_equal, restored, params)
  assert checkpoint.restore_params(str(tmp_path), abstract, step=3)[1] == 3
  with pytest.raises(ValueError, match=r"No checkpoint of step 4 .* steps \[3, 6\]"):
    checkpoint.restore_params(str(tmp_path), abstract, step=4)
  with pytest.raises(ValueError, match="No checkpoint in"):
    checkpoint.restore_params(str(tmp_path / "nothing"), abstract)
  other = small_config()
  other.model.latent_size = 24
  wider = checkpoint.abstract_like(
      setup.init_model_shapes(specs_lib.from_config(other))[1], sharding)
  with pytest.raises(checkpoint.CheckpointMismatchError, match="parameters of another model"):
    checkpoint.restore_params(str(tmp_path), wider)


def test_run_config_round_trips_through_json(tmp_path):
  config = config_lib.load(os.path.join(os.path.dirname(__file__), "..", "configs",
                                        "mid_1p0.py"))
  (tmp_path / "config.json").write_text(config.to_json_best_effort(indent=2))
  loaded, path = forecast_lib.load_run_specs(RunDirectory(str(tmp_path)), {"graph": 4},
                                              "/other.zarr")
  assert loaded.data.variables == config.data.variables  # tuples again
  assert loaded.mesh.graph == 4 and path == "/other.zarr"
  with pytest.raises(ValueError, match="unknown key 'model.nonsense'"):
    data = json.loads(config.to_json_best_effort())
    data["model"]["nonsense"] = 1
    config_lib.from_json(json.dumps(data))
  with pytest.raises(ValueError, match="workdir=.*missing: not a run directory: it holds no "
                     "config.json"):
    forecast_lib.load_run_specs(RunDirectory(str(tmp_path / "missing"), argument="workdir"))


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def test_progress_bar_on_a_terminal_and_log_lines_otherwise(caplog):
  terminal = _Terminal()
  progress = ForecastProgress(2, 4, terminal)
  for lead in range(4):
    progress.leads_done(lead, 1)
  progress.init_done("2020-01-01T00")
  progress.close()
  text = terminal.getvalue()
  assert "\r[" in text and "initial times 1/2 | lead 4/4" in text and "ETA" in text
  plain = io.StringIO()
  caplog.set_level("INFO")
  progress = ForecastProgress(2, 4, plain)
  progress.leads_done(3, 1)
  progress.init_done("2020-01-01T00")
  assert plain.getvalue() == ""
  assert "initial time 2020-01-01T00 done (1/2)" in caplog.text


def make_run(tmp_path, config, params=None):
  """A run directory holding `config` and a checkpoint (step 5) of `params` (default: fresh)."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(config.to_json_best_effort())
  params = setup.init_model(specs_lib.from_config(config))[1] if params is None else params
  saver = checkpoint.Checkpointer(str(workdir / "checkpoints"), max_to_keep=1)
  saver.save(5, initial_state(params, optimizer_lib.make_optimizer(
      specs_lib.from_config(config).train)),
             iter(grain.MapDataset.range(2).to_iter_dataset()), {"step": 5})
  saver.close()
  return workdir


def test_ensemble_forecast_is_reproducible_and_member_k_ignores_the_size(tmp_path,
                                                                         store_source):
  """An FGN run (with global forcings and stations beside the grid) forecasts --members=N
  along `number`, on the grid and at the stations; members 0, 1 of 3 equal those of 2
  (another forecast: reproducible); members differ; --members is required for an FGN;
  the 3 members forecast by 2 processes (members across them) equal those of 1."""
  run_store, _ = store_source
  config = small_config(global_forcings=("year_progress_sin", "year_progress_cos"),
                        modalities=(("stations", "synthetic:30", ("2m_temperature",),
                                     ("2m_temperature",), 1.0),))
  config.model.noise_channels = 4
  config.data.path = run_store
  workdir = str(make_run(tmp_path, config, spread_members(
      setup.init_model(specs_lib.from_config(config))[1])))
  inits = ["2020-01-01T12", "2020-01-02T06"]
  forecast = lambda name, members: xr.open_zarr(forecast_lib.run_forecast(  # noqa: E731
      workdir, str(tmp_path / name), lead="12h", init_times=inits, members=members,
      mesh_overrides={"graph": 4})["out"], chunks=None)  # 2 x 4 mesh: 2 rows a call
  # Two forecasts whose members 0 and 1 are equal: reproducible, whatever the member count.
  three, two = forecast("f3.zarr", 3), forecast("f2.zarr", 2)
  assert three["temperature"].dims == ("time", "number", "prediction_timedelta", "level",
                                       "latitude", "longitude")
  assert three.sizes["number"] == 3 and three.attrs["wnscale_forecast"]["members"] == 3
  for name in config.data.variables:
    np.testing.assert_array_equal(three[name].isel(number=[0, 1]).values, two[name].values)
    assert np.isfinite(three[name].values).all()
  spread = np.abs(three["temperature"].isel(number=0) - three["temperature"].isel(number=2))
  assert float(spread.max()) > 1e-3
  stations = lambda name: xr.open_zarr(str(tmp_path / name), group="stations",  # noqa: E731
                                       chunks=None)["2m_temperature"]
  at_stations = stations("f3.zarr")
  assert at_stations.dims == ("time", "number", "prediction_timedelta", "station")
  assert at_stations.shape == (2, 3, 2, 30) and np.isfinite(at_stations.values).all()
  np.testing.assert_array_equal(at_stations.isel(number=[0, 1]).values,
                                stations("f2.zarr").values)
  assert float(np.abs(at_stations.isel(number=0) - at_stations.isel(number=2)).max()) > 1e-3
  # Members across processes: 2 processes x 2 devices, rows (initial time, member) on
  # mesh.data=2, so each process draws the noise of its own members.
  out = str(tmp_path / "f3_two_processes.zarr")
  launched = subprocess.run(
      [sys.executable, "-m", "launch.local_cluster", "--num_processes=2", "--num_cpu_devices=4",
       "--timeout=300", "--module=launch.forecast", "--", f"--workdir={workdir}",
       f"--out={out}", "--lead=12h", f"--init_times={','.join(inits)}", "--members=3",
       "--mesh.data=2", "--mesh.graph=2"],
      cwd=REPO, env=process_env(), capture_output=True, text=True, timeout=400)
  assert launched.returncode == 0, launched.stderr[-3000:]
  across = xr.open_zarr(out, chunks=None)
  for name in config.data.variables:
    scale = float(abs(three[name]).max())
    np.testing.assert_allclose(across[name].values, three[name].values, rtol=1e-5,
                               atol=1e-5 * scale)
  np.testing.assert_allclose(stations("f3_two_processes.zarr").values, at_stations.values,
                             rtol=1e-5, atol=1e-5 * float(abs(at_stations).max()))
  with pytest.raises(UserError, match="members is required: the run is an FGN"):
    forecast_lib.run_forecast(workdir, str(tmp_path / "none.zarr"), lead="12h",
                              init_times=inits)


def test_run_forecast_from_a_run_directory_with_another_store(tmp_path, store_source):
  """Initial conditions from another store, normalized with the run's statistics; a 4 x 2
  mesh (four initial times per call: two are padding); a second call finds all written."""
  run_store, _ = store_source
  other = synthetic.write_synthetic_store(str(tmp_path / "other.zarr"), resolution=5.625,
                                          start="2020-01-01", end="2020-01-02",
                                          levels=(500, 850), seed=9)
  config = small_config()
  config.data.path = run_store
  workdir = make_run(tmp_path, config)
  out = str(tmp_path / "forecast.zarr")
  summary = forecast_lib.run_forecast(str(workdir), out, lead="12h",
                                      init_times=["2020-01-01T12", "2020-01-02T06"],
                                      data_path=other, mesh_overrides={"graph": 2})
  assert summary["written"] == 2 and summary["checkpoint_step"] == 5
  assert summary["peak_live_device_bytes"] > 0 and summary["steps_per_sec"] > 0
  dataset = xr.open_zarr(out, chunks=None)
  assert dataset.attrs["wnscale_forecast"]["initial_conditions"] == other
  assert dataset.sizes["time"] == 2 and dataset.sizes["prediction_timedelta"] == 2
  assert np.isfinite(dataset["temperature"].values).all()
  assert not os.path.exists(other + ".stats.nc")  # the run's statistics were used
  again = forecast_lib.run_forecast(str(workdir), out, lead="12h",
                                    init_times=["2020-01-01T12", "2020-01-02T06"],
                                    data_path=other)
  assert again["already_written"] == 2 and "written" not in again
