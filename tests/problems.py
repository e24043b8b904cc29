"""Small model problems for tests and benchmarks: random batches on a graph, no data store."""

from __future__ import annotations

import glob
import os

import jax
import numpy as np
from flax import nnx

from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.data import variables as variables_lib
from wnscale.data.making import stations as stations_lib
from wnscale.model import ensemble
from wnscale.model import loss as loss_lib
from wnscale.model import loss_registry
from wnscale.model import setup
from wnscale.sharding import mesh as mesh_lib
from wnscale.sharding import sharded_model
from wnscale.sharding.layout import ShardedLayout

# Every config file that loads as it is (configs/imported.py takes a run directory:
# test_graphcast_import.py loads it).
CONFIG_FILES = sorted(path for path in glob.glob(os.path.join(os.path.dirname(__file__), "..",
                                                              "configs", "*.py"))
                      if os.path.basename(path) != "imported.py")


def data_spec(**data) -> specs_lib.DataSpec:
  """The `DataSpec` of the default config with `data` keys overridden."""
  config = config_lib.default_config()
  config.data.update(data)
  return specs_lib.from_config(config).data


def random_batch(config, num_grid_nodes: int, batch_size: int, seed: int = 0):
  """A batch of standard-normal arrays with the model's batch shapes and dtype (bfloat16
  where the model's batch is, as the data pipeline delivers it).

  An FGN's batch also holds the noise of its members (as the train step adds
  it at step 0): `train.ensemble_members` per example for the CRPS, else one.
  """
  rng = np.random.default_rng(seed)
  batch = {k: rng.standard_normal(s.shape).astype(np.float32).astype(s.dtype)
           for k, s in setup.batch_shapes(specs_lib.from_config(config), num_grid_nodes,
                                          batch_size).items()}
  if config.model.noise_channels:
    members = config.train.ensemble_members if config.train.loss == "crps" else 1
    batch["noise"] = np.asarray(ensemble.training_noise(
        seed, 0, batch_size, members, config.data.target_steps, config.model.noise_channels))
  return batch


def synthetic_problem(config, points, batch_size: int, *, seed: int = 0,
                      abstract: bool = False):
  """`(constants, batch, params)` of `config` on a grid's points (`PointSet`).

  The residual scales are random in [0.2, 1) (so a wrong scale shows in the loss);
  with `abstract`, batch and params are `jax.ShapeDtypeStruct`s and nothing is
  initialized.
  """
  specs = specs_lib.from_config(config)
  graphs = setup.with_masks(specs.model, setup.graphs_for_grid(specs.model, points))
  rng = np.random.default_rng(seed)
  residual_scale = rng.uniform(0.2, 1.0, len(specs.data.output_channels))
  constants = setup.make_constants(specs.data, graphs, points, residual_scale)
  if abstract:
    return (constants, setup.batch_shapes(specs, graphs.num_nodes("grid"), batch_size),
            setup.init_model_shapes(specs)[1])
  return (constants, random_batch(config, graphs.num_nodes("grid"), batch_size, seed),
          setup.init_model(specs)[1])


def station_problem(config, points, batch_size: int, *, num_stations: int, seed: int = 0,
                    missing: float = 0.2):
  """`(constants, batch, params, point_sets, positions)` of `config`, whose every modality is
  a synthetic station network of `num_stations` points (`wnscale.data.making.stations`)
  observing the batch's grid fields (its variables are grid state variables), a fraction `missing` NaN.

  Station 0 misses every input (it sends nothing), station 1 every target.
  """
  specs = specs_lib.from_config(config)
  d = specs.data
  rng = np.random.default_rng(seed)
  batch = random_batch(config, points.size, batch_size, seed)
  land = batch["statics"][0, variables_lib.STATIC_VARIABLES.index("land_sea_mask")] > 0
  point_sets = {m.name: stations_lib.random_land_biased_points(num_stations, points, land,
                                                               seed + i)
                for i, m in enumerate(d.modalities)}
  for m in d.modalities:
    for kind, names in (("inputs", m.inputs), ("targets", m.targets)):
      if not names:
        continue
      channels = [d.state_channels.index(name) for name in names]
      values = stations_lib.observe(batch[kind][:, :, channels], points, point_sets[m.name],
                                    noise=0.1, missing=missing, seed=seed)
      values[..., 0 if kind == "inputs" else 1] = np.nan
      batch[f"{m.name}/{kind}"] = values
  graphs = setup.graphs_for_grid(specs.model, points, modalities=d.modalities,
                                 point_sets=point_sets)
  constants = setup.make_constants(d, graphs, points, rng.uniform(0.2, 1.0,
                                                                  len(d.output_channels)),
                                   point_sets=point_sets)
  positions = setup.node_positions(specs.model, points, point_sets)
  return constants, batch, setup.init_model(specs)[1], point_sets, positions


def assert_same(result, reference):
  """Equal `(loss, grads)` to float32 rounding (gradients relative to each array's largest)."""
  np.testing.assert_allclose(result[0], reference[0], rtol=1e-5)
  for g, r in zip(jax.tree.leaves(result[1]), jax.tree.leaves(reference[1]), strict=True):
    np.testing.assert_allclose(g, r, rtol=2e-4, atol=1e-5 * float(np.abs(r).max()))


def device_batch(layout, batch: dict) -> dict:
  """A whole host batch as global arrays on `layout`'s mesh (one process holds it all)."""
  return layout.global_batch(layout.host_batch(batch), len(next(iter(batch.values()))))


def sharded_layout(config, constants, positions, data: int, graph: int, exchange: str
                   ) -> ShardedLayout:
  """`config`'s mesh set to `data` x `graph` of the test devices, and the problem's graphs
  laid out on it (`exchange`: the graph shards' mode) with the masks of `config`'s model."""
  config.mesh.data, config.mesh.graph = data, graph
  mesh = mesh_lib.make_mesh(specs_lib.from_config(config).mesh, jax.devices()[:data * graph])
  return ShardedLayout(mesh, constants.graphs, positions, exchange,
                       specs_lib.from_config(config).model)


def sharded_loss_and_grads(config, layout: ShardedLayout, constants, batch, params,
                           **loss_options):
  """`(loss, grads)` of the sharded model (`sharded_model.loss_and_grad_fn`, `config`'s
  modalities, `loss_options` such as `loss="crps"` or `micro_batches=2`) on `layout`, the
  whole batch put on its mesh."""
  specs = specs_lib.from_config(config)
  device_constants, halo_indices = layout.constants(constants)
  graphdef, _ = setup.init_model_shapes(specs)
  fn = jax.jit(sharded_model.loss_and_grad_fn(
      layout, graphdef, modalities=specs.data.modalities, **loss_options))
  return fn(params, device_constants, halo_indices, device_batch(layout, batch))


def spread_members(params, scale: float = 0.3, seed: int = 0):
  """`params` with the noise-conditioning kernels drawn at `scale` instead of ~1e-8.

  At initialisation an FGN's members are equal to float rounding, so the
  CRPS's |x_i - x_j| sit at the kink of |.| and its gradient is the sign of
  rounding noise; with members this far apart, equal computations agree.
  """
  rng = np.random.default_rng(seed)

  def widen(path, x):
    names = [str(getattr(k, "key", k)) for k in path]
    if "conditioning" in names and "kernel" in names:
      return np.asarray(rng.normal(0, scale, np.shape(x)), np.float32)
    return x

  return jax.tree_util.tree_map_with_path(widen, params)


def mean_loss(graphdef, params, constants, batch, *, loss: str = "mse", remat_steps=False,
              modalities=()):
  """Mean loss of the model `nnx.merge(graphdef, params)` on one batch (pure in `params`);
  `modalities`: `DataSpec.modalities`, their loss weights."""
  total, point_sums = loss_lib.loss_terms(nnx.merge(graphdef, params), constants, batch,
                                          loss=loss_registry.LOSSES[loss].implementation(),
                                          remat_steps=remat_steps)
  examples, steps, _, nodes = batch["targets"].shape
  return loss_lib.mean_loss(total, examples * steps * nodes, point_sums,
                            loss_lib.point_weight_sums(batch, constants.point_weights),
                            modalities)


def loss_and_grad_fn(config, constants, batch):
  """`params -> (loss, grads)` of the single-device model with `config`'s remat settings."""
  specs = specs_lib.from_config(config)
  graphdef, _ = setup.init_model_shapes(specs)
  return jax.value_and_grad(lambda params: mean_loss(
      graphdef, params, constants, batch, loss=config.train.loss,
      remat_steps=config.train.remat_rollout, modalities=specs.data.modalities))


def compile_loss_and_grad(config, constants, batch, params):
  """The compiled `loss_and_grad_fn` (for its memory figures)."""
  return jax.jit(lambda p, c, b: loss_and_grad_fn(config, c, b)(p)).lower(
      params, constants, batch).compile()
