"""GenCast's diffusion training (`train.loss='diffusion'`, `wnscale.model.diffusion`): the
loss is GenCast's formula, its noise a pure function of (seed, step, example, node), the
sharded and rematerialized loss and gradients equal one device's (the spine), a tiny run
trains and resumes exactly, and an imported GenCast checkpoint fine-tunes.
"""

import functools
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from problems import (assert_same, loss_and_grad_fn, sharded_layout, sharded_loss_and_grads,
                      synthetic_problem)
from test_cli import run as run_launcher
from tiny_runs import REPO, losses, process_env
from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.errors import UserError
from wnscale.graphs import grid
from wnscale.graphs.points import PointSet
from wnscale.interop import gencast_checkpoint, gencast_config
from wnscale.model import diffusion, setup, spherical_noise
from wnscale.model.sampler import level_quantiles, noise_grid
from wnscale.train import trainer

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "gencast_tiny")
# 19 x 36 = 684 grid nodes and 162 mesh nodes: neither divides 2 or 4 shards.
POINTS = PointSet.regular(*grid.regular_grid(10.0, include_poles=True))
DENOISER = dict(processor="transformer", latent_size=16, mesh_levels=2, transformer_layers=2,
                transformer_heads=2, transformer_ffw_size=32, transformer_k_hop=2,
                denoiser_noise_frequencies=4, denoiser_noise_hidden_size=8,
                denoiser_noise_encoding_size=8)


def denoiser_config(**model):
  """The default data with a target-only channel (GenCast's precipitation) and a tiny
  GenCast denoiser, trained with the diffusion loss."""
  config = config_lib.default_config()
  config.data.target_only_variables = ("total_precipitation_6hr",)
  config.model.update(DENOISER, **model)
  config.train.update(loss="diffusion", eval_every=0)
  return config_lib.validate(config)


def perturbed(params, seed):
  """`params` plus noise: a fresh transformer block's zero output projection would hide
  every other gradient of the block."""
  leaves, treedef = jax.tree.flatten(params)
  rng = np.random.default_rng(seed)
  return jax.tree.unflatten(treedef, [x + 0.3 * rng.standard_normal(x.shape).astype(np.float32)
                                      for x in leaves])


def training_noise(config, step, examples, grid_slots):
  """As the train step draws it on `POINTS` (the config's spherical white noise or noise
  per node)."""
  specs = specs_lib.from_config(config)
  grid = spherical_noise.grid_of_positions(setup.node_positions(specs.model, POINTS)["grid"])
  return diffusion.training_noise(diffusion.TrainingNoise(
      specs.seed, specs.train.loss, len(specs.data.output_channels), grid_slots,
      noise_grid(specs.model.sampler, grid)), step, examples)


@functools.cache
def problem():
  """`(constants, batch with step 5's noise, perturbed params, node positions)`."""
  config = denoiser_config()
  constants, batch, params = synthetic_problem(config, POINTS, batch_size=2, seed=3)
  levels, fields = training_noise(config, 5, 2, np.arange(POINTS.size))
  batch = dict(batch, noise_levels=np.asarray(levels), diffusion_noise=np.asarray(fields))
  return (constants, batch, perturbed(params, 4),
          setup.node_positions(specs_lib.from_config(config).model, POINTS))


@functools.cache
def reference():
  constants, batch, params, _ = problem()
  return jax.jit(loss_and_grad_fn(denoiser_config(), constants, batch))(params)


# --- the loss and its noise --------------------------------------------------------------

def test_the_loss_is_gencasts_formula():
  """lambda(sigma) sum_c w_c mean_g a_g (D(r + sigma n; sigma) - r)^2, averaged over the
  examples, recomputed in float64 from the network `F` itself with EDM's preconditioning
  D = x / (sigma^2 + 1) + sigma / sqrt(sigma^2 + 1) F(x / sqrt(sigma^2 + 1)), and
  lambda = (sigma^2 + 1) / sigma^2, r the residual targets."""
  constants, batch, params, _ = problem()
  config = denoiser_config()
  d = specs_lib.from_config(config).data
  model = nnx.merge(setup.init_model_shapes(specs_lib.from_config(config))[0], params)
  f64 = lambda x: np.asarray(x, np.float64)
  inputs, targets = f64(batch["inputs"]), f64(batch["targets"][:, 0])
  scale = f64(constants.residual_scale)[:, None]
  num_state = len(d.state_channels)
  assert 0 < num_state < targets.shape[1]  # target-only channels: their value is the target
  residuals = targets.copy()
  residuals[:, :num_state] -= inputs[:, -1]
  residuals /= scale
  sigma = f64(batch["noise_levels"])[:, None, None]
  noisy = residuals + sigma * f64(batch["diffusion_noise"])
  examples, _, _, nodes = inputs.shape
  parts = (batch["inputs"].reshape(examples, -1, nodes),
           batch["forcings"].reshape(examples, -1, nodes), batch["statics"])
  raw = model.network(constants.graphs, parts + (jnp.asarray(
      noisy / np.sqrt(sigma ** 2 + 1), jnp.float32),),
      conditioning=model.noise_level_encoder(jnp.asarray(batch["noise_levels"])))
  denoised = (noisy / (sigma ** 2 + 1)
              + sigma / np.sqrt(sigma ** 2 + 1) * np.swapaxes(f64(raw), 1, 2))
  per_example = np.einsum("c,bcg,g->b", f64(constants.channel_weights),
                          (denoised - residuals) ** 2, f64(constants.node_weights)) / nodes
  expected = np.mean((sigma[:, 0, 0] ** 2 + 1) / sigma[:, 0, 0] ** 2 * per_example)
  np.testing.assert_allclose(float(reference()[0]), expected, rtol=2e-5)


@pytest.mark.parametrize("spherical", [True, False], ids=["spherical", "per_node"])
def test_the_noise_is_a_function_of_seed_step_example_and_node(spherical):
  """Per node: bitwise. Spherical: a batch of another size sums the harmonics in another
  float32 order (rounding, ~1e-6 of values ~1)."""
  config = denoiser_config(sampler_spherical_noise=spherical)
  same = (functools.partial(np.testing.assert_allclose, rtol=0, atol=1e-5) if spherical
          else np.testing.assert_array_equal)
  nodes = np.arange(40)
  levels, fields = training_noise(config, 3, 5, nodes)
  again_levels, again_fields = training_noise(config, 3, 2, nodes[::-1])  # fewer, reversed
  np.testing.assert_array_equal(again_levels, levels[:2])
  same(again_fields, fields[:2, :, ::-1])
  assert not np.allclose(training_noise(config, 4, 2, nodes)[1], fields[:2])
  config.seed += 1
  assert not np.array_equal(training_noise(config, 3, 2, nodes)[0], levels[:2])
  padded = training_noise(denoiser_config(sampler_spherical_noise=spherical), 3, 2,
                          np.array([0, -1, 1]))[1]
  same(padded[:, :, [0, 2]], fields[:2, :, :2])
  assert not padded[:, :, 1].any()  # a padding slot's noise is 0


def test_the_noise_levels_follow_gencasts_distribution():
  """(min^(1/rho) + u (max^(1/rho) - min^(1/rho)))^rho with u uniform, GenCast's defaults:
  the levels' quantiles, and the per-node fields' standard normal moments (the spherical
  fields': tests/test_spherical_noise.py)."""
  config = denoiser_config(sampler_spherical_noise=False)
  t = specs_lib.from_config(config).train.loss
  assert (t.training_noise_level_rho, t.training_min_noise_level,
          t.training_max_noise_level) == (7.0, 0.02, 88.0)
  levels, fields = training_noise(config, 0, 20_000, np.arange(2))
  levels = np.asarray(levels)
  assert 0.02 <= levels.min() and levels.max() <= 88.0
  quantiles = np.array([0.1, 0.25, 0.5, 0.75, 0.9])
  expected = level_quantiles(0.02, 88.0, 7.0, quantiles)
  # The empirical CDF at the distribution's quantiles: binomial std ~0.0035 at 20,000.
  np.testing.assert_allclose([np.mean(levels <= q) for q in expected], quantiles, atol=0.015)
  assert abs(float(np.mean(fields))) < 0.02 and abs(float(np.std(fields)) - 1) < 0.02


# --- the spine: sharded and rematerialized equal one device --------------------------------

REMAT = dict(remat_grid_to_mesh_gnn=True, remat_mesh_gnn=True, remat_mesh_to_grid_gnn=True,
             mesh_remat_every=2, edge_chunks=2, grid_blocks=3)
CASES = [(1, 2, "halo", {}, 1), (2, 2, "all_gather", REMAT, 1), (1, 4, "halo", REMAT, 2)]


@pytest.mark.parametrize("data, graph, exchange, model, micro_batches", CASES, ids=[
    f"{d}x{g}-{e}{'-remat' if m else ''}{'-micro' if a > 1 else ''}"
    for d, g, e, m, a in CASES])
def test_sharded_and_remat_equal_one_device(data, graph, exchange, model, micro_batches):
  constants, batch, params, positions = problem()
  config = denoiser_config(**model)
  layout = sharded_layout(config, constants, positions, data, graph, exchange)
  result = sharded_loss_and_grads(config, layout, constants, batch, params, loss="diffusion",
                                  micro_batches=micro_batches)
  assert_same(result, reference())
  # The train step draws the noise in the layout's node order: the same at every node.
  _, fields = training_noise(config, 5, 2, layout.grid_slots)
  np.testing.assert_array_equal(
      fields, layout.host_batch({"diffusion_noise": batch["diffusion_noise"]})[
          "diffusion_noise"] * (layout.grid_slots >= 0))


def test_remat_equals_plain_on_one_device():
  constants, batch, params, _ = problem()
  assert_same(jax.jit(loss_and_grad_fn(denoiser_config(**REMAT), constants, batch))(params),
              reference())


def test_every_parameter_gets_a_gradient():
  grads = reference()[1]
  assert np.isfinite(float(reference()[0]))
  assert all(np.abs(np.asarray(g)).max() > 0 for g in jax.tree.leaves(grads))


# --- settings and refusals ---------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    (dict(model=dict(denoiser_noise_frequencies=0)), "train.loss='diffusion' trains a denoiser"),
    (dict(train=dict(loss="mse")), "train.loss='mse' scores a forecaster's predictions"),
    (dict(data=dict(target_steps=2)), "train.loss='diffusion' trains one step"),
    (dict(train=dict(eval_every=10)), "a denoiser's evaluation .* is not built yet"),
    (dict(train=dict(training_min_noise_level=90.0)), "must be below train.training_max"),
])
def test_bad_settings_are_one_clear_line(change, message):
  config = config_lib.default_config()
  config.model.update(DENOISER)
  config.train.update(loss="diffusion", eval_every=0)
  for section, values in change.items():
    config[section].update(values)
  with pytest.raises(UserError, match=message) as error:
    config_lib.validate(config)
  assert "\n" not in str(error.value)


def test_the_import_maps_gencasts_noise_config():
  """A checkpoint's `noise_config` becomes the diffusion loss's settings (the fixture's are
  GenCast's defaults: other values show the mapping); a key wnscale lacks is named."""
  configs = dict(gencast_checkpoint.read_checkpoint(os.path.join(FIXTURE, "params.npz")).configs)
  configs["noise_config"] = dict(training_noise_level_rho=5.0, training_min_noise_level=0.05,
                                 training_max_noise_level=60.0)
  t = gencast_config.wnscale_config(configs, os.path.join(FIXTURE, "stats")).train
  assert (t.loss, t.training_noise_level_rho, t.training_min_noise_level,
          t.training_max_noise_level) == ("diffusion", 5.0, 0.05, 60.0)
  configs["noise_config"] = dict(configs["noise_config"], training_noise_schedule="cosine")
  with pytest.raises(UserError, match="noise_config:training_noise_schedule='cosine': "
                     "wnscale's diffusion loss has no such setting"):
    gencast_config.wnscale_config(configs, os.path.join(FIXTURE, "stats"))


def test_the_1p0_config_is_gencasts_released_model():
  """configs/gencast_1p0.py: 16 blocks, width 512, 4 heads, feed-forward 2048, 16 hops on a
  mesh of 5 refinements, GenCast's noise encoding, sampler and training noise, 12 h steps
  from two input times, 13 levels; with a statistics directory, its statistics and the
  sea-surface temperature's fill (the fixture's min_by_level: 271.46)."""
  path = os.path.join(REPO, "configs", "gencast_1p0.py")
  config = config_lib.load(path)
  m, d, t = config.model, config.data, config.train
  assert (m.processor, m.transformer_layers, m.latent_size, m.transformer_heads,
          m.transformer_ffw_size, m.transformer_k_hop, m.mesh_levels, m.radius_fraction) == (
              "transformer", 16, 512, 4, 2048, 16, 5, 0.6)
  assert (m.denoiser_noise_frequencies, m.denoiser_noise_base_period,
          m.denoiser_noise_hidden_size, m.denoiser_noise_encoding_size) == (32, 16.0, 32, 16)
  assert (m.sampler_max_noise_level, m.sampler_min_noise_level, m.sampler_noise_levels,
          m.sampler_churn_rate, m.sampler_churn_max_noise_level) == (80.0, 0.03, 20, 2.5, 0.0)
  assert (t.loss, t.training_noise_level_rho, t.training_min_noise_level,
          t.training_max_noise_level) == ("diffusion", 7.0, 0.02, 88.0)
  assert (d.resolution, d.time_step_hours, d.input_steps, len(d.pressure_levels)) == (
      1.0, 12, 2, 13)
  assert d.target_only_variables == ("total_precipitation_12hr",)
  assert "sea_surface_temperature" in d.variables and "toa_incident_solar_radiation" not in (
      d.forcings)
  assert d.nan_fill_values == () and d.stats_path == ""
  stats = os.path.join(FIXTURE, "stats")
  with_stats = config_lib.load(f"{path}:{stats}")
  assert with_stats.data.nan_fill_values == ("sea_surface_temperature:271.46",)
  assert with_stats.data.stats_path == stats


# --- training runs -----------------------------------------------------------------------

def tiny_run_config(**train):
  """configs/tiny.py's data (5.625 deg, synthetic) with a tiny GenCast denoiser, on 2 x 4
  devices, trained with the diffusion loss."""
  config = config_lib.load(os.path.join(REPO, "configs", "tiny.py"))
  config.model.update(DENOISER)
  config.data.update(train_start="2020-01-01", train_end="2020-01-20")
  config.train.update(dict(loss="diffusion", eval_every=0, steps=4, warmup_steps=1,
                           log_every=1, checkpoint_every=2), **train)
  config.mesh.update(data=2, graph=4)
  return config_lib.validate(config)


def test_a_tiny_denoiser_trains_and_resumes_exactly(tmp_path):
  """Four steps, checkpointed every 2: finite losses; the run as a crash after step 2 leaves
  it resumes with the uninterrupted run's losses, bitwise (a step's noise is drawn anew
  from the seed and the step)."""
  reference_run = str(tmp_path / "reference")
  trainer.train_and_evaluate(tiny_run_config(), reference_run)
  expected = losses(reference_run)
  assert sorted(expected) == [1, 2, 3, 4]
  assert all(np.isfinite(list(expected.values())))
  assert len(set(expected.values())) == 4  # each step its own batch and noise

  crashed = str(tmp_path / "crashed")
  shutil.copytree(reference_run, crashed)
  shutil.rmtree(os.path.join(crashed, "checkpoints", "4"))
  trainer.train_and_evaluate(tiny_run_config(), crashed)
  assert losses(crashed) == expected


def test_an_imported_gencast_fine_tunes(tmp_path):
  """The fixture imported (`launch.import_gencast`), then one step of `launch.train
  --config=imported:RUN --config.train.init_from=RUN` on its example (a 12 deg grid, 4
  times 12 h apart: two examples) over 2 graph shards."""
  import xarray as xr  # noqa: PLC0415
  imported = str(tmp_path / "imported")
  result = run_launcher("import_gencast", f"--checkpoint={FIXTURE}/params.npz",
                        f"--stats_dir={FIXTURE}/stats", f"--out={imported}")
  assert result.returncode == 0, result.stderr[-3000:]
  example = xr.load_dataset(os.path.join(FIXTURE, "example.nc")).isel(batch=0)
  example = example.assign_coords(time=example["datetime"].values).drop_vars("datetime")
  store = str(tmp_path / "example.zarr")
  example.rename({"lat": "latitude", "lon": "longitude"}).to_zarr(store, zarr_format=2,
                                                                   consolidated=True)
  workdir = str(tmp_path / "fine_tuned")
  result = run_launcher(
      "train", "--platform=cpu", "--num_cpu_devices=2", f"--config=imported:{imported}",
      f"--config.train.init_from={imported}", f"--config.data.path={store}",
      "--config.data.train_start=2022-01-01", "--config.data.train_end=2022-01-02",
      "--config.train.steps=1", "--config.train.warmup_steps=0", "--config.train.batch_size=1",
      "--config.train.log_every=1", "--config.data.resolution=12.0", "--config.mesh.graph=2",
      f"--workdir={workdir}",
      env=process_env())
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"from {imported}" in result.stderr
  [(step, loss)] = losses(workdir).items()
  assert step == 1 and np.isfinite(loss)
