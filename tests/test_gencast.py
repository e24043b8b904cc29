"""GenCast parity: the fixture's checkpoint (made with GenCast's released code) imported,
and wnscale's denoiser and sampler equal to GenCast's.

The fixture (`fixtures/gencast_tiny`, its README says how it was made) is a tiny
GenCast with random perturbed parameters, one example, GenCast's preconditioned
denoiser `D(x; sigma)` at three noise levels (80, 3.68, 0.03) on noisy targets
`x = r + sigma n` (`r` the normalized targets, `n` the fixture's noise), and its
sampled 2-step forecast with given noise fields. The measure is the README's:
|wnscale - GenCast| / diffs_stddev (stddev for precipitation, which has no residual),
below 1e-3 at every grid node (SST: off the land, where both are NaN); the denoiser
with wnscale's own graphs off the 30 mesh-to-grid ties (where GenCast's triangle is
float rounding: `graphs.npz`), the sampler with GenCast's triangles there.
"""

import os
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from flax import nnx

from test_cli import run as run_launcher
from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.data import forcings as forcings_lib
from wnscale.errors import UserError
from wnscale.graphs import features
from wnscale.graphs import grid as grid_lib
from wnscale.graphs.graph import EdgeSet
from wnscale.graphs.points import PointSet
from wnscale.interop import gencast_checkpoint, gencast_config, gencast_params
from wnscale.model import sampler, setup
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
  # GenCast's sampler defaults; its churn_max_noise_level inf is wnscale's 0 (no maximum).
  assert (m.sampler_max_noise_level, m.sampler_min_noise_level, m.sampler_noise_levels,
          m.sampler_rho, m.sampler_churn_rate, m.sampler_churn_min_noise_level,
          m.sampler_churn_max_noise_level, m.sampler_noise_level_inflation) == (
              80.0, 0.03, 20, 7.0, 2.5, 0.75, 0.0, 1.05)
  assert d.time_step_hours == 12 and d.input_steps == 2
  t = config.train  # GenCast's noise_config: the diffusion loss's training noise levels
  assert (t.loss, t.training_noise_level_rho, t.training_min_noise_level,
          t.training_max_noise_level, t.eval_every) == ("diffusion", 7.0, 0.02, 88.0, 0)
  assert tuple(d.target_only_variables) == (PRECIP,)
  assert tuple(d.nan_fill_values) == (f"{SST}:271.46",)


def test_every_parameter_is_mapped():
  """Each of the checkpoint's leaves but the decoder's unused mesh MLP lands in wnscale's
  tree, with its values (rows and columns permuted, the mesh embedder's padding dropped)."""
  checkpoint = gencast_checkpoint.read_checkpoint(os.path.join(FIXTURE, "params.npz"))
  config = gencast_config.wnscale_config(checkpoint.configs, os.path.join(FIXTURE, "stats"))
  specs = specs_lib.from_config(config)
  tree = nnx.to_pure_dict(gencast_params.convert_params(
      checkpoint.params, checkpoint.configs["task_config"], specs))
  leaves = [np.asarray(x) for x in jax_leaves(tree)]
  ours = sum(x.size for x in leaves)
  theirs = {module: sum(np.size(v) for v in leaf.values())
            for module, leaf in checkpoint.params.items()}
  unused = sum(theirs[module] for module in gencast_params.UNUSED)
  num_inputs = len(gencast_params.wnscale_input_channels(specs.data))
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


class Case(NamedTuple):
  """The imported denoiser and the fixture's example (SST filled with its min_by_level)."""

  config: object  # the imported run's
  specs: specs_lib.Specs
  model: nnx.Module
  graphs: object
  grid: PointSet  # latitude ascending: GenCast's node order
  outputs: list  # wnscale's output channels, (name, step, level)
  example: xr.Dataset  # times 0, 12, 24, 36 h
  land: np.ndarray  # [G]
  stats: dict

  def inputs(self, window: xr.Dataset) -> np.ndarray:
    """`[C_in, G]` normalized inputs in wnscale's order of a `window` of 3 times: the two
    input times and the target's (its forcings)."""
    d, stats = self.specs.data, self.stats
    forcings = forcings_lib.compute_forcings(window["datetime"].isel(batch=0).values,
                                             self.grid, d.forcings)  # [time, F, G]

    def normalized(name, step, level):
      if name in d.forcings:
        return ((forcings[step + 1, d.forcings.index(name)] - _stat(stats, "mean_by_level",
                                                                    name))
                / _stat(stats, "stddev_by_level", name))
      time = None if step is None else step + 1
      return ((_field(window, name, time, level) - _stat(stats, "mean_by_level", name, level))
              / _stat(stats, "stddev_by_level", name, level))

    return np.stack([normalized(*key) for key in gencast_params.graphcast_config
                     .wnscale_input_channels(self.specs.data)]).astype(np.float32)

  def denoiser(self, window: xr.Dataset):
    """`(noisy [B, C_out, G], levels [B]) -> D [B, G, C_out]` given `window`'s inputs."""
    inputs = jnp.asarray(self.inputs(window))
    return lambda noisy, levels: self.model(
        self.graphs, (jnp.broadcast_to(inputs, (noisy.shape[0],) + inputs.shape),),
        jnp.asarray(noisy), jnp.asarray(levels))

  def noise(self, kind, index=()):
    """The fixture's noise `noise.npz` `<kind>/<var>`, item `index`, as `[C_out, G]`."""
    noise = np.load(os.path.join(FIXTURE, "noise.npz"))
    levels = list(self.specs.data.pressure_levels)
    return np.stack([noise[f"{kind}/{name}"][index].astype(np.float32)[0, 0].reshape(
        (-1, self.land.size))[0 if level is None else levels.index(level)]
        for name, _, level in self.outputs])

  def with_gencasts_triangles(self):
    """This case with GenCast's mesh-to-grid edges (`graphs.npz`, its mesh's nodes found
    among wnscale's by position) and their features: the same triangles at the ties."""
    positions = setup.node_positions(self.specs.model, self.grid)
    reference = np.load(os.path.join(FIXTURE, "graphs.npz"))
    distances = np.linalg.norm(reference["mesh_vertices"][:, None] - positions["mesh"][None],
                               axis=-1)
    assert distances.min(axis=1).max() < 1e-6
    order = np.argsort(reference["mesh2grid_receivers"], kind="stable")
    senders = distances.argmin(axis=1)[reference["mesh2grid_senders"][order]].astype(np.int32)
    receivers = reference["mesh2grid_receivers"][order].astype(np.int32)
    # As the graphs' builder: positions of the nodes' float32 latitudes and longitudes.
    mesh_lat_lon = grid_lib.xyz_to_lat_lon(positions["mesh"])
    grid_lat_lon = (self.grid.latitude.astype(np.float32),
                    self.grid.longitude.astype(np.float32))
    edge_features = features.edge_features(
        grid_lib.lat_lon_to_xyz(*mesh_lat_lon), grid_lib.lat_lon_to_xyz(*grid_lat_lon),
        *grid_lat_lon, senders, receivers)
    edges = dict(self.graphs.edges, mesh_to_grid=EdgeSet(senders, receivers, edge_features,
                                                         "mesh", "grid"))
    return self._replace(graphs=self.graphs._replace(edges=edges))

  def worst_errors(self, window, normalized, reference, skip_ties=True):
    """`{variable: max |physical - reference| / scale}` of `normalized` `[..., G, C_out]`
    (wnscale's outputs given `window`'s inputs) against `reference` `[..., G]` per
    variable (and level) at every node, or off the ties with `skip_ties` (SST: off the
    land, where `reference` must be NaN)."""
    d = self.specs.data
    off_ties = np.ones(self.land.size, bool)
    if skip_ties:
      off_ties[np.load(os.path.join(FIXTURE, "graphs.npz"))["tie_grid_indices"]] = False
    worst = {}
    for channel, (name, _, level) in enumerate(self.outputs):
      if name in d.target_only_variables:
        scale = _stat(self.stats, "stddev_by_level", name, level)
        physical = (_stat(self.stats, "mean_by_level", name, level)
                    + normalized[..., channel] * scale)
      else:
        scale = _stat(self.stats, "diffs_stddev_by_level", name, level)
        physical = _field(window, name, 1, level) + normalized[..., channel] * scale
      theirs = reference(name, level)
      assert np.isnan(theirs).reshape(-1, self.land.size).any(axis=0).tolist() == (
          self.land if name == SST else np.zeros(self.land.size, bool)).tolist()
      compared = off_ties & ~self.land if name == SST else off_ties
      error = np.abs(physical - theirs)[..., compared] / scale
      worst[name] = max(worst.get(name, 0.0), float(error.max()))
    return worst


@pytest.fixture(scope="module")
def case(imported, stats):
  run, config = imported
  specs = specs_lib.from_config(config)
  example = _open("example.nc")
  land = np.isnan(example[SST].isel(batch=0, time=0).values).reshape(-1)
  example[SST] = example[SST].fillna(float(stats["min_by_level"][SST]))
  grid = PointSet.regular(example["lat"].values, example["lon"].values)
  graphdef, shapes = setup.init_model_shapes(specs)
  params, _ = RunDirectory(run).restore_params(shapes)
  graphs = setup.with_masks(specs.model, setup.graphs_for_grid(specs.model, grid))
  return Case(config, specs, nnx.merge(graphdef, params), graphs, grid,
              gencast_params.graphcast_config.wnscale_output_channels(specs.data), example, land,
              stats)


def _reference(name_of_file, **isel):
  reference = _open(name_of_file)

  def values(name, level):
    field = reference[name].isel(batch=0, **isel)
    if level is not None:
      field = field.sel(level=level)
    return field.values.reshape(field.shape[:-2] + (-1,))

  return values


def test_denoiser_equals_gencasts(case):
  d = case.specs.data
  window = case.example.isel(time=slice(0, 3))  # inputs at 0, 12 h; target 24 h

  def residual(name, level):  # the normalized target, as InputsAndResiduals makes it
    target = _field(window, name, 2, level)
    if name in d.target_only_variables:
      return (target - _stat(case.stats, "mean_by_level", name, level)) / _stat(
          case.stats, "stddev_by_level", name, level)
    return (target - _field(window, name, 1, level)) / _stat(
        case.stats, "diffs_stddev_by_level", name, level)

  residuals = np.stack([residual(name, level) for name, _, level in case.outputs])
  levels = np.load(os.path.join(FIXTURE, "noise.npz"))["denoiser_noise_levels"]
  noisy = (residuals.astype(np.float32)[None]
           + levels[:, None, None] * case.noise("denoiser")[None])  # [sigma, C_out, G]
  denoised = np.asarray(case.denoiser(window)(noisy, levels))  # [sigma, G, C_out]
  worst = case.worst_errors(window, denoised, _reference("denoised.nc", time=0))
  assert max(worst.values()) < TOLERANCE, worst


@pytest.mark.parametrize("lead", [1, 2])
def test_sampled_forecast_equals_gencasts(case, lead):
  """GenCast's sampler (20 levels, churn) with the fixture's noise of that step, at every
  node. With GenCast's triangles at the 30 ties: the sampler feeds its noisy targets back
  into the encoder 40 times, so a tie's other triangle would spread to its neighbours.
  Lead 2 is one step from GenCast's own lead 1 (its 24 h state, SST over land filled
  again, as GenCast's NaNCleaner does)."""
  case = case.with_gencasts_triangles()
  window = case.example.isel(time=slice(lead - 1, lead + 2))
  if lead == 2:
    previous = _open("forecast.nc").isel(time=[0]).fillna(
        float(case.stats["min_by_level"][SST]))
    window = window.copy()
    for name in previous.data_vars:
      if name in window:
        window[name].loc[{"time": window.time[1]}] = previous[name].isel(time=0).values
  noise = np.load(os.path.join(FIXTURE, "noise.npz"))
  churning = noise[f"sampler_churn/{SST}"].shape[1]
  churn = np.stack([case.noise("sampler_churn", (lead - 1, i)) for i in range(churning)])
  churn = np.concatenate([churn, np.zeros((case.specs.model.sampler.noise_levels - churning,)
                                          + churn.shape[1:], np.float32)])[:, None]
  denoise = case.denoiser(window)
  forecast = sampler.sample(
      lambda x, levels: jnp.swapaxes(denoise(x, levels), 1, 2),
      jnp.asarray(case.noise("sampler_init", (lead - 1,)))[None],
      lambda i: jnp.asarray(churn)[i], case.specs.model.sampler)  # [1, C_out, G]
  worst = case.worst_errors(window, np.swapaxes(np.asarray(forecast), 1, 2)[0],
                            _reference("forecast.nc", time=lead - 1), skip_ties=False)
  assert max(worst.values()) < TOLERANCE, worst
