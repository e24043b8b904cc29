"""The GenCast fixture (`fixtures/gencast_tiny`, made with GenCast's released code) is whole.

Only that its files agree with each other and with its README: keys, shapes, dtypes, finite
values, the SST land mask. The parity tests (wnscale's denoiser and sampler against these
outputs) come with wnscale's GenCast importer (issue 55).
"""

import json
import os

import numpy as np
import pytest
import xarray as xr

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "gencast_tiny")
SST = "sea_surface_temperature"
PRECIP = "total_precipitation_12hr"
SURFACE = ("2m_temperature", "mean_sea_level_pressure", "10m_v_component_of_wind",
           "10m_u_component_of_wind", PRECIP, SST)
ATMOSPHERIC = ("temperature", "geopotential", "u_component_of_wind", "v_component_of_wind",
               "vertical_velocity", "specific_humidity")
TARGETS = SURFACE + ATMOSPHERIC
LEVELS = [50, 100, 150, 200, 250, 300, 400, 500, 600, 700, 850, 925, 1000]


def _open(name):
  with xr.open_dataset(os.path.join(FIXTURE, name)) as ds:
    return ds.load()


@pytest.fixture(scope="module")
def sizes():
  with open(os.path.join(FIXTURE, "sizes.json")) as f:
    return json.load(f)


@pytest.fixture(scope="module")
def example():
  return _open("example.nc")


@pytest.fixture(scope="module")
def land(example):
  """Where the example's SST is NaN (land): [lat, lon]."""
  return np.isnan(example[SST].isel(batch=0, time=0).values)


def _grid(sizes):
  n_lat = int(round(180 / sizes["resolution"])) + 1
  return n_lat, 2 * (n_lat - 1)


def test_example_is_in_gencasts_layout(example, sizes, land):
  n_lat, n_lon = _grid(sizes)
  assert dict(example.sizes) == dict(batch=1, time=4, lat=n_lat, lon=n_lon, level=13)
  np.testing.assert_array_equal(example.lat, np.linspace(-90, 90, n_lat))  # ascending, poles
  np.testing.assert_array_equal(example.lon, np.arange(n_lon) * sizes["resolution"])
  assert example.level.values.tolist() == LEVELS
  assert example.time.dtype == np.dtype("timedelta64[ns]")
  assert (example.time.values // np.timedelta64(1, "h")).tolist() == [0, 12, 24, 36]
  assert example.datetime.dims == ("batch", "time")
  assert set(example.data_vars) == set(TARGETS) | {"geopotential_at_surface", "land_sea_mask"}
  for name in ATMOSPHERIC:
    assert example[name].dims == ("batch", "time", "level", "lat", "lon"), name
  for name in SURFACE:
    assert example[name].dims == ("batch", "time", "lat", "lon"), name
  for name in ("geopotential_at_surface", "land_sea_mask"):
    assert example[name].dims == ("lat", "lon"), name
  for name in example.data_vars:
    values = example[name].values
    assert values.dtype == np.float32, name
    if name == SST:
      assert np.array_equal(np.isnan(values), np.broadcast_to(land, values.shape))
    else:
      assert np.isfinite(values).all(), name
  assert 0 < land.sum() < land.size


def test_checkpoint_holds_gencasts_config_and_parameters(sizes):
  ckpt = np.load(os.path.join(FIXTURE, "params.npz"))
  params = {k: ckpt[k] for k in ckpt.files if k.startswith("params:")}
  assert len({k.split(":")[1] for k in params}) == sizes["num_modules"]
  assert sum(v.size for v in params.values()) == sizes["num_params"]
  assert all(v.dtype == np.float32 and np.isfinite(v).all() for v in params.values())
  assert {k.split(":")[2] for k in params} == {"w", "b"}

  def items(prefix):
    keys = sorted((k for k in ckpt.files if k.startswith(prefix + ":")),
                  key=lambda k: int(k.rsplit(":", 1)[1]))
    return [ckpt[k].item() for k in keys]

  assert items("task_config:target_variables") == list(TARGETS)
  assert items("task_config:pressure_levels") == LEVELS
  assert ckpt["task_config:input_duration"].item() == "24h"
  assert PRECIP not in items("task_config:input_variables")
  arch = "denoiser_architecture_config"
  transformer = f"{arch}:sparse_transformer_config"
  for key in ("attention_type", "mask_type", "attention_k_hop", "d_model", "num_layers",
              "num_heads", "ffw_hidden"):
    assert ckpt[f"{transformer}:{key}"].item() == sizes[key], key
  for key in ("mesh_size", "latent_size", "hidden_layers"):
    assert ckpt[f"{arch}:{key}"].item() == sizes[key], key
  # GenCast's released sampler defaults (gencast.SamplerConfig).
  assert ckpt["sampler_config:num_noise_levels"].item() == 20
  assert ckpt["sampler_config:stochastic_churn_rate"].item() == 2.5
  for name in ("description", "license"):
    assert ckpt[name].item()
  # The transformer's mha projections per block.
  for block in range(sizes["num_layers"]):
    w = params[f"params:mesh_transformer/~/transformer/block_{block:02d}/mha_proj_q:w"]
    assert w.shape == (sizes["d_model"], sizes["d_model"])


def test_statistics_cover_the_task():
  stats = {k: _open(os.path.join("stats", f"{k}.nc"))
           for k in ("mean_by_level", "stddev_by_level", "diffs_stddev_by_level", "min_by_level")}
  for name in TARGETS:
    for kind, ds in stats.items():
      if kind == "diffs_stddev_by_level" and name not in ds:
        continue
      assert name in ds, (kind, name)
      assert np.isfinite(ds[name].values).all(), (kind, name)
  for name in ATMOSPHERIC:
    assert stats["mean_by_level"][name].level.values.tolist() == LEVELS
  assert set(TARGETS) - {PRECIP} <= set(stats["diffs_stddev_by_level"].data_vars)


def test_noise_matches_the_targets_and_the_schedule(example, sizes):
  noise = np.load(os.path.join(FIXTURE, "noise.npz"))
  levels = noise["sampler_noise_levels"]
  churn = noise["sampler_churn_rates"]
  assert levels.shape == (21,) and levels[-1] == 0 and np.all(np.diff(levels) < 0)
  assert levels[0] == np.float32(80.0) and levels[-2] == np.float32(0.03)
  assert churn.shape == (20,) and np.count_nonzero(churn) == sizes["num_churn_steps"]
  assert np.all(churn[:sizes["num_churn_steps"]] == np.float32(0.125))
  assert np.isin(noise["denoiser_noise_levels"], levels).all()
  for name in TARGETS:
    field = example[name].isel(time=[0]).shape  # batch, time 1, (level,) lat, lon
    assert noise[f"denoiser/{name}"].shape == field
    assert noise[f"sampler_init/{name}"].shape == (2,) + field
    assert noise[f"sampler_churn/{name}"].shape == (2, sizes["num_churn_steps"]) + field
    for kind in ("denoiser", "sampler_init", "sampler_churn"):
      values = noise[f"{kind}/{name}"]
      assert values.dtype == np.float16 and np.isfinite(values).all(), (kind, name)
      assert 0.5 < values.astype(np.float32).std() < 2.0, (kind, name)


@pytest.mark.parametrize("name", ["denoised.nc", "forecast.nc"])
def test_outputs_are_finite_off_land(example, land, name):
  ds = _open(name)
  assert set(ds.data_vars) == set(TARGETS)
  lead = 1 if name == "denoised.nc" else 2
  assert (ds.time.values // np.timedelta64(1, "h")).tolist() == [12, 24][:lead]
  for var in TARGETS:
    dims = ("noise_level",) if name == "denoised.nc" else ()
    assert ds[var].dims == dims + example[var].dims, var
    values = ds[var].values
    if var == SST:
      assert np.array_equal(np.isnan(values), np.broadcast_to(land, values.shape))
    else:
      assert np.isfinite(values).all(), var
  if name == "denoised.nc":
    noise = np.load(os.path.join(FIXTURE, "noise.npz"))
    np.testing.assert_array_equal(ds.noise_level.values, noise["denoiser_noise_levels"])


def test_graphs_index_the_grid_and_mesh(sizes):
  graphs = np.load(os.path.join(FIXTURE, "graphs.npz"))
  n_lat, n_lon = _grid(sizes)
  n_grid = n_lat * n_lon
  n_mesh = 10 * 4 ** sizes["mesh_size"] + 2
  assert graphs["mesh_vertices"].shape == (n_mesh, 3)
  assert graphs["mesh_faces"].shape == (20 * 4 ** sizes["mesh_size"], 3)
  for name, senders, receivers in (("grid2mesh", n_grid, n_mesh), ("mesh", n_mesh, n_mesh),
                                   ("mesh2grid", n_mesh, n_grid)):
    s, r = graphs[f"{name}_senders"], graphs[f"{name}_receivers"]
    assert s.shape == r.shape and 0 <= s.min() and s.max() < senders, name
    assert 0 <= r.min() and r.max() < receivers, name
  assert np.array_equal(np.bincount(graphs["mesh2grid_receivers"], minlength=n_grid),
                        np.full(n_grid, 3))
  ties = graphs["tie_grid_indices"]
  assert np.all((0 <= ties) & (ties < n_grid))
