"""Forecasts of GenCast's denoiser (`launch.forecast --members=N`): each member's each lead
time one run of the sampler with noise drawn from (seed, initial time, member, lead, grid
node), written to the WeatherBench2 forecast zarr along `number`, scored by
`launch.evaluate`.

The imported fixture (`fixtures/gencast_tiny`, made with GenCast's code: a 12 deg grid, 13
levels) forecasts from its example, written as a store (2022-01-01T00 .. 2022-01-02T12,
12 h apart): from 2022-01-01T12, two lead times.
"""

import json
import os
import re
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr

from test_cli import assert_user_error
from test_cli import run as run_launcher
from tiny_runs import REPO, process_env
from test_gencast import FIXTURE, PRECIP, SST, case, imported, stats  # noqa: F401 (fixtures)
from wnscale.errors import ArgumentError
from wnscale.inference import forecast as forecast_lib
from wnscale.inference.rollout import init_hours
from wnscale.interop.graphcast_example import predict_example
from wnscale.model import sampler, spherical_noise

INIT = "2022-01-01T12"
MEMBERS = 2
# Of diffs_stddev (tests/test_gencast.py's measure). The forecast runs the same arithmetic
# in another float32 order (the layout's node order, the inputs in three parts): the
# sampler's 40 calls of this random network carry that to 5.9e-4 at most against the direct
# call (8e-5 at the median node), as a mere split of the direct call's inputs into two parts
# does, and to 8.3e-4 between 2 x 4 devices and one. Another member's noise: > 0.1.
TOLERANCE = 2e-3


@pytest.fixture(scope="module")
def example_store(tmp_path_factory):
  """The fixture's example as a store of the WeatherBench2 layout (SST NaN over land)."""
  example = xr.load_dataset(os.path.join(FIXTURE, "example.nc")).isel(batch=0)
  example = example.assign_coords(time=example["datetime"].values).drop_vars("datetime")
  path = str(tmp_path_factory.mktemp("example") / "example.zarr")
  example.rename({"lat": "latitude", "lon": "longitude"}).to_zarr(path, zarr_format=2,
                                                                   consolidated=True)
  return path


@pytest.fixture(scope="module")
def one_device(imported, example_store, tmp_path_factory):  # noqa: F811 (a fixture)
  """`launch.forecast` of `MEMBERS` members from `INIT`, two lead times, on one device: the
  forecast zarr's path."""
  out = str(tmp_path_factory.mktemp("forecast") / "one_device.zarr")
  result = run_launcher("forecast", "--platform=cpu", "--num_cpu_devices=1",
                        f"--workdir={imported[0]}", f"--out={out}", f"--data.path={example_store}",
                        "--data.resolution=12.0", f"--init_times={INIT}", "--lead=1d",
                        f"--members={MEMBERS}", env=process_env())
  assert result.returncode == 0, result.stderr[-3000:]
  summary = json.loads(result.stdout.strip().splitlines()[-1])
  assert summary["written"] == 1 and summary["lead_times"] == 2
  return out


def test_lead_one_is_the_sampler_on_the_same_inputs_and_noise(case, one_device):  # noqa: F811
  """Member k's lead 1 equals `sampler.sample` run directly (the fixture's denoiser on the
  whole grid in GenCast's node order, one device) on the example's inputs at 2022-01-01T00
  and 12 with the noise of (seed, initial time, k, lead 0), within `TOLERANCE` of each
  variable's diffs_stddev (stddev for precipitation) at every node (SST: NaN over land in
  both); the members differ by far more."""
  predicted = xr.open_zarr(one_device, chunks=None).sortby("latitude")
  assert predicted.sizes["number"] == MEMBERS
  assert predicted.attrs["wnscale_forecast"]["members"] == MEMBERS
  window = case.example.isel(time=slice(0, 3))  # inputs at 0, 12 h; target 24 h
  denoise = case.denoiser(window)
  channels, nodes = len(case.outputs), case.land.size
  keys = sampler.forecast_keys(case.specs.seed, jnp.full(MEMBERS, init_hours(INIT), jnp.int32),
                               jnp.arange(MEMBERS, dtype=jnp.int32), 0)
  grid = spherical_noise.SphericalGrid(np.sin(np.deg2rad(window["lat"].values)),
                                       window.sizes["lon"])  # lat ascending, as the store's
  grid = sampler.noise_grid(case.specs.model.sampler, grid)
  noise = lambda field: sampler.forecast_noise(keys, field, jnp.arange(nodes), channels, grid)
  expected = sampler.sample(lambda x, levels: jnp.swapaxes(denoise(x, levels), 1, 2),
                            noise(0), lambda i: noise(i + 1), case.specs.model.sampler)
  expected = np.swapaxes(np.asarray(expected), 1, 2)  # [member, G, C_out]

  def lead_one(member):
    def values(name, level):
      field = predicted[name].isel(time=0, number=member, prediction_timedelta=0)
      return (field if level is None else field.sel(level=level)).values.reshape(-1)
    return values

  for member in range(MEMBERS):
    worst = case.worst_errors(window, expected[member], lead_one(member), skip_ties=False)
    assert max(worst.values()) < TOLERANCE, (member, worst)
  other = case.worst_errors(window, expected[0], lead_one(1), skip_ties=False)
  assert min(other.values()) > 0.1, other  # each variable: member 1 is not member 0
  for name in predicted.data_vars:
    field = predicted[name].values
    assert np.isfinite(field).all() or name == SST, name


def test_member_k_is_the_same_whatever_the_ensemble_size(imported, example_store,  # noqa: F811
                                                         tmp_path):
  """On the same 2 x 4 devices, `--members=1` writes member 0 of `--members=2` bitwise: a
  member's noise depends on (seed, initial time, member, lead) alone, so a rerun, or a
  resumed forecast recomputing an unfinished initial time, writes the same numbers."""
  one, two = (forecast_lib.run_forecast(
      imported[0], str(tmp_path / f"{members}.zarr"), lead="1d", init_times=[INIT],
      data_path=example_store, resolution=12.0, members=members,
      mesh_overrides={"data": 2, "graph": 4})["out"] for members in (1, 2))
  one, two = (xr.open_zarr(path, chunks=None) for path in (one, two))
  for name in two.data_vars:
    np.testing.assert_array_equal(one[name].values, two[name].isel(number=[0]).values)


@pytest.mark.parametrize("data, graph", [(8, 1), (2, 4)],
                         ids=["members-over-8-devices", "members-and-grid-over-2x4"])
def test_split_over_devices_equals_one_device(imported, example_store, one_device,  # noqa: F811
                                              stats, tmp_path, data, graph):  # noqa: F811
  """The forecast on `data x graph` devices equals one device's within `TOLERANCE` of each
  variable's diffs_stddev (stddev for precipitation): each member on its own data shard (8:
  six rows of padding), drawing its own member's noise; over 4 graph shards the noise drawn
  at each node by its index. Not bitwise: 8 rows a call sum in another float32 order, which
  shows most in the sea-surface temperature (286 K to float32's 3e-5 K: 3.5e-4 of its
  0.087 K diffs_stddev), and 4 graph shards in yet another (8.3e-4, the winds)."""
  split = str(tmp_path / "split.zarr")
  forecast_lib.run_forecast(imported[0], split, lead="1d", init_times=[INIT],
                            data_path=example_store, resolution=12.0, members=MEMBERS,
                            mesh_overrides={"data": data, "graph": graph})
  assert worst_differences(split, one_device, stats) < TOLERANCE


def worst_differences(path, reference_path, stats) -> float:
  """The largest |forecast - reference| / diffs_stddev (stddev for precipitation) of two
  forecast stores, NaN at the same places."""
  ours, reference = (xr.open_zarr(p, chunks=None) for p in (path, reference_path))
  worst = {}
  for name in reference.data_vars:
    kind = "stddev_by_level" if name == PRECIP else "diffs_stddev_by_level"
    assert (np.isnan(ours[name]) == np.isnan(reference[name])).all(), name
    worst[name] = float((np.abs(ours[name] - reference[name]) / stats[kind][name]).max())
  return max(worst.values())


def test_members_over_two_processes_equal_one_device(imported, example_store,  # noqa: F811
                                                     one_device, stats, tmp_path):  # noqa: F811
  """2 processes x 2 devices, `--mesh.data=2 --mesh.graph=2`: each process draws and
  samples its own member, each writes its share of the store; equal to one device's."""
  out = str(tmp_path / "two_processes.zarr")
  launched = subprocess.run(
      [sys.executable, "-m", "launch.local_cluster", "--num_processes=2", "--num_cpu_devices=4",
       "--timeout=300", "--module=launch.forecast", "--", f"--workdir={imported[0]}",
       f"--out={out}", f"--data.path={example_store}", "--data.resolution=12.0",
       f"--init_times={INIT}", "--lead=1d", f"--members={MEMBERS}", "--mesh.data=2",
       "--mesh.graph=2"],
      cwd=REPO, env=process_env(), capture_output=True, text=True, timeout=400)
  assert launched.returncode == 0, launched.stderr[-3000:]
  assert worst_differences(out, one_device, stats) < TOLERANCE


def test_predict_example_samples_the_forecasts_members(imported, one_device, stats,  # noqa: F811
                                                      tmp_path):
  """`predict_example` of the fixture's example (inputs 2022-01-01T00 and 12, as `INIT`'s)
  with `MEMBERS` members: member k's lead 1 is `launch.forecast`'s member k lead 1 (the same
  noise: the run's seed, the initial time, k, lead 0) within `TOLERANCE` of each variable's
  diffs_stddev (its `MEMBERS` rows in one call sum in another float32 order than the
  forecast's one a call: 5e-4 at most), NaN at the same places; the members differ by far
  more (4.2 at least)."""
  predicted = predict_example(imported[0], os.path.join(FIXTURE, "example.nc"),
                              str(tmp_path / "predictions.nc"), steps=1, members=MEMBERS)
  assert predicted.sizes["sample"] == MEMBERS and predicted.sizes["time"] == 1
  forecast = xr.open_zarr(one_device, chunks=None).isel(time=0, prediction_timedelta=0)

  def worst(member, number):
    errors = {}
    for name in forecast.data_vars:
      kind = "stddev_by_level" if name == PRECIP else "diffs_stddev_by_level"
      ours = predicted[name].isel(sample=member, time=0, batch=0).rename(
          {"lat": "latitude", "lon": "longitude"}).sortby("latitude")
      theirs = forecast[name].isel(number=number).sortby("latitude").transpose(*ours.dims)
      assert (np.isnan(ours.values) == np.isnan(theirs.values)).all(), name
      errors[name] = float((abs(ours - theirs.values) / stats[kind][name]).max())
    return errors

  for member in range(MEMBERS):
    assert max(worst(member, member).values()) < TOLERANCE, (member, worst(member, member))
  assert min(worst(0, 1).values()) > 0.1  # each variable: member 1 is not member 0


@pytest.mark.parametrize("members, noise, message", [
    (None, None, "members must be >= 1: the run is an ensemble model (GenCast's denoiser)"),
    (2, "noise.npz", "noise=noise.npz: must be an integer seed for GenCast's denoiser")])
def test_predict_example_of_the_denoiser_needs_members_and_a_seed(
    imported, tmp_path, members, noise, message):  # noqa: F811
  with pytest.raises(ArgumentError, match=re.escape(message)) as error:
    predict_example(imported[0], os.path.join(FIXTURE, "example.nc"),
                    str(tmp_path / "predictions.nc"), members=members, noise=noise)
  assert "\n" not in str(error.value) and not (tmp_path / "predictions.nc").exists()


def test_launch_evaluate_scores_crps_and_spread_skill(example_store, one_device, tmp_path):
  """`launch.evaluate` on the forecast: CRPS, ensemble-mean RMSE, spread and spread/skill
  per variable and lead time, finite."""
  out = tmp_path / "evaluation"
  result = run_launcher("evaluate", f"--forecast={one_device}", f"--truth={example_store}",
                        f"--out={out}")
  assert result.returncode == 0, result.stderr[-3000:]
  scores = xr.open_dataset(out / "forecast.nc")
  metrics = list(scores.metric.values)
  assert {"crps", "rmse", "spread", "spread_skill"} <= set(metrics), metrics
  for name in ("2m_temperature", "geopotential"):
    values = scores[name].sel(metric=["crps", "rmse", "spread", "spread_skill"]).values
    assert np.isfinite(values).all() and (values > 0).all(), (name, values)


def test_another_grid_spacing_says_data_resolution(imported, example_store,  # noqa: F811
                                                   tmp_path):
  """The imported run's config holds the default resolution (GenCast's checkpoint does not
  say its grid): `launch.forecast` on the 12 deg store without `--data.resolution` says
  which to give, on one line."""
  result = run_launcher("forecast", "--platform=cpu", "--num_cpu_devices=1",
                        f"--workdir={imported[0]}", f"--out={tmp_path / 'f.zarr'}",
                        f"--data.path={example_store}", f"--init_times={INIT}", "--lead=1d",
                        f"--members={MEMBERS}", env=process_env())
  assert_user_error(result, "has grid spacing 12 x 12 deg (lat x lon); the config asks for "
                    "resolution 5.625: give the store's spacing, --data.resolution=12")
  assert not (tmp_path / "f.zarr").exists()


def test_members_are_required_in_one_line(imported, example_store, tmp_path):  # noqa: F811
  with pytest.raises(ArgumentError, match="members is required: the run is GenCast's "
                     "denoiser") as error:
    forecast_lib.run_forecast(imported[0], str(tmp_path / "f.zarr"), lead="1d",
                              init_times=[INIT], data_path=example_store, resolution=12.0)
  assert "\n" not in str(error.value)
