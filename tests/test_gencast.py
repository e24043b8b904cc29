"""GenCast parity: the fixture's checkpoint (made with GenCast's released code) imported,
and wnscale's denoiser equal to GenCast's.

The fixture (`fixtures/gencast_tiny`, its README says how it was made) is a tiny
GenCast with random perturbed parameters, one example and GenCast's preconditioned
denoiser `D(x; sigma)` at three noise levels (80, 3.68, 0.03) on noisy targets
`x = r + sigma n` (`r` the normalized targets, `n` the fixture's noise). The measure
is the README's: |wnscale - GenCast| / diffs_stddev (stddev for precipitation, which
has no residual), below 1e-3 at every grid node (SST: off the land, where both are
NaN) but the 30 mesh-to-grid ties (where GenCast's triangle is float rounding:
`graphs.npz`).
"""

import os

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from flax import nnx

from test_cli import run as run_launcher
from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.data import forcings as forcings_lib
from wnscale.assembly import assemble
from wnscale.errors import UserError
from wnscale.graphs.points import PointSet
from wnscale.interop import gencast_checkpoint, gencast_config, gencast_params
from wnscale.model import setup
from wnscale.sharding import mesh as mesh_lib
from wnscale.train.run_directory import RunDirectory

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "gencast_tiny")
SST = "sea_surface_temperature"
PRECIP = "total_precipitation_12hr"
TOLERANCE = 1e-3


def _open(name):
  with xr.open_dataset(os.path.join(FIXTURE, name)) as ds:
    return ds.load()


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
  """The fixture imported through the launcher: `(run directory, config)`."""
  run = str(tmp_path_factory.mktemp("gencast") / "run")
  result = run_launcher("import_gencast", f"--checkpoint={FIXTURE}/params.npz",
                        f"--stats_dir={FIXTURE}/stats", f"--out={run}")
  assert result.returncode == 0, result.stderr[-3000:]
  return run, config_lib.from_json(open(os.path.join(run, "config.json")).read())


@pytest.fixture(scope="module")
def stats():
  return {name: _open(os.path.join("stats", f"{name}.nc")) for name in
          ("mean_by_level", "stddev_by_level", "diffs_stddev_by_level", "min_by_level")}


def test_config_is_gencasts(imported):
  _, config = imported
  m, d = config.model, config.data
  assert (m.processor, m.latent_size, m.mesh_levels, m.transformer_layers, m.transformer_heads,
          m.transformer_ffw_size, m.transformer_k_hop) == ("transformer", 32, 2, 2, 2, 64, 2)
  assert (m.denoiser_noise_frequencies, m.denoiser_noise_base_period,
          m.denoiser_noise_hidden_size, m.denoiser_noise_encoding_size) == (32, 16.0, 32, 16)
  assert m.noise_channels == 0 and m.mesh_to_grid_edge_normalization == 0
  assert d.time_step_hours == 12 and d.input_steps == 2
  assert tuple(d.target_only_variables) == (PRECIP,)
  assert tuple(d.nan_fill_values) == (f"{SST}:271.46",)


def test_every_parameter_is_mapped():
  """Each of the checkpoint's leaves but the decoder's unused mesh MLP lands in wnscale's
  tree, with its values (rows and columns permuted, the mesh embedder's padding dropped)."""
  checkpoint = gencast_checkpoint.read_checkpoint(os.path.join(FIXTURE, "params.npz"))
  config = gencast_config.wnscale_config(checkpoint.configs, os.path.join(FIXTURE, "stats"))
  tree = nnx.to_pure_dict(gencast_params.convert_params(
      checkpoint.params, checkpoint.configs["task_config"], config))
  leaves = [np.asarray(x) for x in jax_leaves(tree)]
  ours = sum(x.size for x in leaves)
  theirs = {module: sum(np.size(v) for v in leaf.values())
            for module, leaf in checkpoint.params.items()}
  unused = sum(theirs[module] for module in gencast_params.UNUSED)
  num_inputs = len(gencast_params.wnscale_input_channels(config))
  padding = num_inputs * config.model.latent_size  # the mesh embedder's zero inputs' rows
  assert ours == sum(theirs.values()) - unused - padding
  # Values: a permuted first layer, the stacked transformer, the noise-level MLP.
  grid = checkpoint.params["grid2mesh_gnn/~_networks_builder/encoder_nodes_grid_nodes_mlp/~/"
                           "linear_0"]["w"]
  ours_grid = np.asarray(tree["network"]["grid_embedder"]["hidden"]["kernel"])
  assert sorted(map(tuple, ours_grid.round(6))) == sorted(map(tuple, grid.round(6)))
  block = checkpoint.params["mesh_transformer/~/transformer/block_01/mha_proj_v"]["w"]
  np.testing.assert_array_equal(
      tree["network"]["processor"]["layers"]["key_value"]["kernel"][1][:, 32:], block)
  np.testing.assert_array_equal(tree["noise_level_encoder"]["out"]["kernel"],
                                checkpoint.params["fourier_features_mlp/~/mlp/~/linear_1"]["w"])


def jax_leaves(tree):
  if isinstance(tree, dict):
    return [leaf for value in tree.values() for leaf in jax_leaves(value)]
  return [tree]


def test_a_setting_wnscale_cannot_express_is_named():
  checkpoint = gencast_checkpoint.read_checkpoint(os.path.join(FIXTURE, "params.npz"))
  configs = dict(checkpoint.configs)
  configs["denoiser_architecture_config"] = dict(
      configs["denoiser_architecture_config"],
      sparse_transformer_config=dict(
          configs["denoiser_architecture_config"]["sparse_transformer_config"], d_model=64))
  with pytest.raises(UserError, match="sparse_transformer_config:d_model=64: wnscale"):
    gencast_config.wnscale_config(configs, FIXTURE)


def _field(example, name, time, level=None):
  """`[lat * lon]` float64 of the example at `time` (index), `level` if atmospheric."""
  field = example[name] if "time" not in example[name].dims else example[name].isel(
      batch=0, time=time)
  if level is not None:
    field = field.sel(level=level)
  return field.values.astype(np.float64).reshape(-1)


def _stat(stats, kind, name, level=None):
  value = stats[kind][name]
  return float(value.sel(level=level) if level is not None else value)


def test_denoiser_equals_gencasts(imported, stats):
  run, config = imported
  specs = specs_lib.from_config(config)
  d = specs.data
  example = _open("example.nc").isel(time=slice(0, 3))  # inputs at 0, 12 h; target 24 h
  land = np.isnan(example[SST].isel(batch=0, time=0).values)
  example[SST] = example[SST].fillna(float(stats["min_by_level"][SST]))
  grid = PointSet.regular(example["lat"].values, example["lon"].values)  # ascending: GenCast's
  times = example["datetime"].isel(batch=0).values
  forcings = forcings_lib.compute_forcings(times, grid, d.forcings)  # [time, F, G]

  def normalized_input(name, step, level):
    if name in d.forcings:
      return ((forcings[step + 1, d.forcings.index(name)] - _stat(stats, "mean_by_level", name))
              / _stat(stats, "stddev_by_level", name))
    time = None if step is None else step + 1
    return ((_field(example, name, time, level) - _stat(stats, "mean_by_level", name, level))
            / _stat(stats, "stddev_by_level", name, level))

  def residual(name, level):  # the normalized target, as InputsAndResiduals makes it
    target = _field(example, name, 2, level)
    if name in d.target_only_variables:
      return (target - _stat(stats, "mean_by_level", name, level)) / _stat(
          stats, "stddev_by_level", name, level)
    return (target - _field(example, name, 1, level)) / _stat(
        stats, "diffs_stddev_by_level", name, level)

  inputs = np.stack([normalized_input(*key) for key in
                     gencast_params.graphcast_config.wnscale_input_channels(config)])
  outputs = gencast_params.graphcast_config.wnscale_output_channels(config)
  residuals = np.stack([residual(name, level) for name, _, level in outputs]).astype(np.float32)
  noise = np.load(os.path.join(FIXTURE, "noise.npz"))
  unit_noise = np.stack([noise[f"denoiser/{name}"].astype(np.float32)[0, 0].reshape(
      (-1, grid.size))[0 if level is None else list(d.pressure_levels).index(level)]
      for name, _, level in outputs])
  levels = noise["denoiser_noise_levels"]
  noisy = residuals[None] + levels[:, None, None] * unit_noise[None]  # [sigma, C_out, G]

  run_dir = RunDirectory(run)
  graphdef, shapes = setup.init_model_shapes(specs)
  params, _ = run_dir.restore_params(shapes)
  model = nnx.merge(graphdef, params)
  graphs = setup.with_masks(specs.model, setup.graphs_for_grid(specs.model, grid))
  batch = len(levels)
  denoised = np.asarray(model(graphs, (jnp.broadcast_to(jnp.asarray(inputs, jnp.float32),
                                                        (batch,) + inputs.shape),),
                              jnp.asarray(noisy), jnp.asarray(levels)))  # [sigma, G, C_out]

  reference = _open("denoised.nc")
  ties = np.load(os.path.join(FIXTURE, "graphs.npz"))["tie_grid_indices"]
  off_ties = np.ones(grid.size, bool)
  off_ties[ties] = False
  worst = {}
  for channel, (name, _, level) in enumerate(outputs):
    if name in d.target_only_variables:
      scale = _stat(stats, "stddev_by_level", name, level)
      physical = _stat(stats, "mean_by_level", name, level) + denoised[..., channel] * scale
    else:
      scale = _stat(stats, "diffs_stddev_by_level", name, level)
      physical = _field(example, name, 1, level)[None] + denoised[..., channel] * scale
    theirs = reference[name].isel(batch=0, time=0)
    if level is not None:
      theirs = theirs.sel(level=level)
    theirs = theirs.values.reshape(len(levels), -1)
    assert np.isnan(theirs).any(axis=0).tolist() == (
        land.reshape(-1) if name == SST else np.zeros(grid.size, bool)).tolist()
    compared = off_ties & ~land.reshape(-1) if name == SST else off_ties
    error = np.abs(physical - theirs)[:, compared] / scale
    worst[name] = max(worst.get(name, 0.0), float(error.max()))
  assert max(worst.values()) < TOLERANCE, worst


def test_the_denoiser_is_refused_where_it_does_not_run_yet(imported):
  """Training, forecasts and example predictions assemble the model: a clear refusal."""
  _, config = imported
  with pytest.raises(UserError, match="model.denoiser_noise_frequencies=32: GenCast's denoiser"):
    assemble(specs_lib.from_config(config), PointSet.regular(np.linspace(-90, 90, 16),
                                                             np.arange(30) * 12.0),
             None, mesh_lib.single_device_mesh())
