"""The xarray predictor: same numbers as the pure rollout, coordinates put back."""

import numpy as np
import pytest
import xarray as xr
from flax import nnx

from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.assembly import assemble
from wnscale.data import pipeline, run_data
from wnscale.data.making import synthetic
from wnscale.graphs import grid
from wnscale.graphs.points import PointSet
from wnscale.inference import predictor
from wnscale.model import forecast, setup
from wnscale.sharding import mesh as mesh_lib

VARIABLES = ("temperature", "u_component_of_wind", "2m_temperature")
LEVELS = (850, 500)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("store") / "era5.zarr")
  return synthetic.write_synthetic_store(path, resolution=5.625, start="2020-01-01",
                                         end="2020-01-03", levels=(500, 700, 850), seed=2)


# What the model reads and predicts: wnscale's defaults, GraphCast's way (a target-only
# variable, the solar radiation read from the data, every input normalized), and with
# global forcings.
CONTRACTS = {
    "wnscale": {},
    "graphcast": {"target_only_variables": ("10m_u_component_of_wind",),
                  "stored_forcings": ("toa_incident_solar_radiation",),
                  "input_normalization": "all"},
    # WeatherNext 2's global forcings (the batch's optional `globals`).
    "globals": {"global_forcings": ("year_progress_cos",)},
}


@pytest.fixture(scope="module", params=sorted(CONTRACTS))
def model(store_path, request):
  config = config_lib.default_config()
  config.model.update(latent_size=16, message_passing_steps=2)
  config.data.update(variables=VARIABLES, pressure_levels=LEVELS, target_steps=2,
                     train_start="2020-01-01", train_end="2020-01-03",  # the store's days
                     **CONTRACTS[request.param])
  config_lib.validate(config)
  config.data.path = store_path
  specs = specs_lib.from_config(config)
  stats = run_data.resolve_stats(specs.data)
  source = pipeline.make_source(specs.data, "train")
  assembly = assemble(specs, source.store.points, stats, mesh_lib.single_device_mesh(),
                      params="init")
  np.testing.assert_array_equal(assembly.constants.residual_scale,
                                source.normalization.residual_scale)
  run = predictor.Predictor(specs, assembly, assembly.params)
  return source, assembly.graphdef, assembly.params, assembly.constants, run


def test_predictor_matches_pure_rollout(store_path, model):
  source, graphdef, params, constants, run = model
  example = source[3]
  times = source.example_times(3)
  pure = forecast.rollout(nnx.merge(graphdef, params), constants,
                          {k: v[None] for k, v in example.items()})
  stats = source.normalization.channel_stats
  pure = np.asarray(pure)[0] * stats["std"][:, None] + stats["mean"][:, None]

  dataset = xr.open_zarr(store_path)
  inputs = dataset[list(VARIABLES)].sel(time=times[:2])
  statics = dataset[["geopotential_at_surface", "land_sea_mask"]]
  forcings = (dataset[list(source.stored_forcings)].sel(time=times)
              if source.stored_forcings else None)
  forecast_ds = run(inputs, statics, num_steps=2, forcings=forcings)

  np.testing.assert_array_equal(forecast_ds.time.values, times[2:])
  np.testing.assert_array_equal(forecast_ds.latitude.values, dataset.latitude.values)  # 90 -> -90
  np.testing.assert_array_equal(forecast_ds.level.values, LEVELS)
  assert forecast_ds.temperature.dims == ("time", "level", "latitude", "longitude")
  assert forecast_ds["2m_temperature"].dims == ("time", "latitude", "longitude")
  outputs = source.store.variables  # the state, then any target-only variable
  assert list(forecast_ds.data_vars) == list(outputs)
  channels = predictor.dataset_to_channels(forecast_ds.sortby("latitude"), outputs, LEVELS)
  np.testing.assert_allclose(channels, pure, rtol=1e-4, atol=1e-3)
  # Plausible physical values come back (K), not normalized ones.
  assert 150 < float(forecast_ds.temperature.mean()) < 350
  if source.stored_forcings:  # they cannot be computed
    with pytest.raises(ValueError, match="reads \\['toa_incident_solar_radiation'\\] from"):
      run(inputs, statics, num_steps=2)


def test_channel_layout_round_trips(store_path):
  dataset = xr.open_zarr(store_path).isel(time=slice(0, 2)).sortby("latitude")
  array = predictor.dataset_to_channels(dataset, VARIABLES, LEVELS)
  assert array.shape == (2, 2 + 2 + 1, 32 * 64)
  coords = {"batch": [0], "time": dataset.time.values, "latitude": dataset.latitude.values,
            "longitude": dataset.longitude.values}
  back = predictor.channels_to_dataset(array[None], VARIABLES, LEVELS, coords)
  expected = dataset.temperature.sel(level=list(LEVELS)).transpose(
      "time", "level", "latitude", "longitude")
  np.testing.assert_allclose(back.temperature.isel(batch=0).values, expected.values, rtol=1e-6)
  np.testing.assert_array_equal(back.level.values, LEVELS)
  np.testing.assert_allclose(back["2m_temperature"].isel(batch=0).values,
                             dataset["2m_temperature"].values, rtol=1e-6)


def test_missing_input_variable_is_named(store_path, model):
  dataset = xr.open_zarr(store_path)
  run = model[-1]
  with pytest.raises(ValueError, match="lacks variable 'u_component_of_wind'"):
    run(dataset[["temperature", "2m_temperature"]].isel(time=slice(0, 2)),
        dataset[["geopotential_at_surface", "land_sea_mask"]])


def test_target_only_channels_are_predicted_outright():
  """GraphCast's InputsAndResiduals: the state is the last input plus the scaled residual;
  a target-only channel is the network's output itself (scale 1, nothing added), and only
  the state is fed back."""
  config = config_lib.default_config()
  config.model.update(latent_size=8, message_passing_steps=1)
  config.data.update(variables=("2m_temperature",), target_only_variables=(
      "total_precipitation_6hr",), pressure_levels=(), target_steps=2)
  config_lib.validate(config)
  points = PointSet.regular(*grid.regular_grid(5.625))
  graphs = setup.graphs_for_grid(specs_lib.from_config(config).model, points)
  constants = setup.make_constants(specs_lib.from_config(config).data, graphs, points,
                                   np.array([0.5, 1.0], np.float32))
  graphdef, params = setup.init_model(specs_lib.from_config(config))
  model = nnx.merge(graphdef, params)
  rng = np.random.default_rng(0)
  batch = {key: rng.standard_normal(shape.shape).astype(np.float32) for key, shape in
           setup.batch_shapes(specs_lib.from_config(config), graphs.num_nodes("grid"), 1).items()}
  assert batch["inputs"].shape[2] == 1 and batch["targets"].shape[2] == 2
  outputs = model(constants.graphs, (forecast._stack_steps(batch["inputs"]),
                                     forecast._stack_steps(batch["forcings"][:, :3]),
                                     batch["statics"]))
  first = np.asarray(forecast.rollout(model, constants, batch))[:, 0]  # [B, C_out, G]
  np.testing.assert_allclose(first[:, 0], batch["inputs"][:, -1, 0] + 0.5 * outputs[..., 0],
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(first[:, 1], outputs[..., 1], rtol=1e-5, atol=1e-5)
