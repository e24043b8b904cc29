"""Builds a model, its constants and (for AOT compiles) batch shapes from the specs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wnscale.data import variables as variables_lib
from wnscale.graphs import build, receiver_blocks
from wnscale.graphs.edge_sets import graphcast_edge_sets, modality_edge_sets
from wnscale.graphs.graph import Graphs
from wnscale.graphs.points import PointSet
from wnscale.model import forecast, processors
from wnscale.model.denoiser import Denoiser
from wnscale.model.graphcast import GraphCast, PointModality
from wnscale.specs import DataSpec, ModelSpec, Specs


def build_model(specs: Specs) -> GraphCast | Denoiser:
  """A freshly initialized model (parameters from `specs.seed`), built eagerly: the
  forecaster, or with `model.denoiser_noise_frequencies > 0` GenCast's denoiser."""
  d = specs.data
  if specs.model.denoiser.noise_frequencies:
    return Denoiser(d.input_channels, len(d.output_channels), specs.model,
                    global_channels=d.global_channels, rngs=nnx.Rngs(specs.seed))
  return GraphCast(d.input_channels, len(d.output_channels), specs.model,
                   rngs=nnx.Rngs(specs.seed), global_channels=d.global_channels,
                   output_activations=output_activations(specs),
                   modalities=tuple(PointModality(m.name, m.input_channels(d.input_steps),
                                                  len(m.targets)) for m in d.modalities))


def output_activations(specs: Specs) -> tuple[tuple[int, str, float], ...]:
  """`model.output_activations` as `(output channel, activation, offset)` triples."""
  channels = specs.data.output_channels
  return tuple((index, activation, offset)
               for name, activation, offset in specs.model.output_activations
               for index, channel in enumerate(channels)
               if channel == name or channel.startswith(name + "@"))


def init_model(specs: Specs):
  """`(graphdef, params)` of `build_model(specs)`, initialized in one compiled call on the
  host's CPU.

  The graphdef carries the `ModelSpec` (remat settings included); params are a
  pytree (`nnx.State`) of float32 arrays.
  """
  graphdefs = []  # the graphdef is static: kept from the trace, not built a second time

  def init():
    graphdef, params = nnx.split(build_model(specs))
    graphdefs.append(graphdef)
    return params

  # Computed by this host's CPU where it has one: an accelerator's compiler takes far longer
  # over the many small random initializers (30 s on a TPU v5e's host for the paper model,
  # 4 s by XLA:CPU); the values go to the devices with the train state (`jax.device_put`).
  with jax.default_device(_host_cpu()):
    params = jax.jit(init)()  # a new function: always traced, so graphdefs is filled
  return graphdefs[0], params


def _host_cpu():
  """This process's first CPU device, or None where JAX was started without the CPU."""
  try:
    return jax.local_devices(backend="cpu")[0]
  except RuntimeError:
    return None


def init_model_shapes(specs: Specs):
  """`(graphdef, params as jax.ShapeDtypeStruct)`: nothing is computed or allocated."""
  return nnx.split(nnx.eval_shape(lambda: build_model(specs)))


def graphs_for_grid(m: ModelSpec, points: PointSet, use_cache: bool = True,
                    modalities=(), point_sets: dict[str, PointSet] | None = None) -> Graphs:
  """The model's graphs on a grid's points: GraphCast's edge sets, those its processor
  adds, and each modality's (`DataSpec.modalities`, on `point_sets` by name)."""
  edge_sets = dict(graphcast_edge_sets(m.radius_fraction, m.mesh_to_grid_edge_normalization),
                   **processors.implementation(m).edge_sets(m),
                   **modality_edge_sets(modalities, m.radius_fraction))
  return build.build_graphs(points, m.mesh_levels, edge_sets, use_cache=use_cache,
                            regional_mesh_levels=m.regional_mesh_levels, point_sets=point_sets)


def with_masks(m: ModelSpec, graphs: Graphs, platform: str | None = None,
               graph_shards: int = 1) -> Graphs:
  """`graphs` (one shard's, in their node order) with the masks the processor's attention
  reads (`Graphs.masks`) where it runs on `platform` (None: JAX's default backend) with the
  graph over `graph_shards` devices; made on the host, once."""
  return graphs._replace(masks=processors.implementation(m).masks(
      m, graphs, platform or jax.default_backend(), graph_shards))


def node_positions(m: ModelSpec, points: PointSet,
                   point_sets: dict[str, PointSet] | None = None):
  """Per node set, `[num_nodes, 3]` unit vectors (`build.node_positions`)."""
  return build.node_positions(points, m.mesh_levels, m.regional_mesh_levels, point_sets)


def make_constants(d: DataSpec, graphs: Graphs, points: PointSet,
                   residual_scale: np.ndarray, variable_loss_weights=(),
                   point_sets: dict[str, PointSet] | None = None, output_stats=None,
                   point_stats: dict | None = None) -> forecast.Constants:
  """Host (numpy) constants of one device (the processor's edges in receiver blocks:
  `receiver_blocks.graphs_with_blocks`; `graphs` None: none, for the weights alone); the
  node weights are the points' cell areas (mean 1), a
  cut-out's regional points' times `data.regional_loss_weight`; `residual_scale` is
  `[C_out]` (`normalization.residual_scale`); `variable_loss_weights`: `(variable,
  weight)` pairs (`train.variable_loss_weights`); each target modality's point weights are its
  `point_sets` entry's areas (mean 1), its first guess `first_guesses`' (`output_stats`,
  `point_stats` are its arguments)."""
  point_sets = point_sets or {}
  node_weights = points.area
  if points.region is not None:
    node_weights = np.where(points.region, d.regional_loss_weight * node_weights, node_weights)
  return forecast.Constants(
      point_weights={m.name: point_sets[m.name].area.astype(np.float32)
                     for m in d.modalities if m.targets},
      first_guesses=first_guesses(d, residual_scale, output_stats, point_stats),
      graphs=None if graphs is None else receiver_blocks.graphs_with_blocks(graphs),
      residual_scale=np.asarray(residual_scale, np.float32),
      node_weights=node_weights.astype(np.float32),
      channel_weights=variables_lib.loss_channel_weights(d.outputs, d.pressure_levels,
                                                         dict(variable_loss_weights)))


def first_guesses(d: DataSpec, residual_scale: np.ndarray, output_stats=None,
                  point_stats: dict | None = None) -> dict[str, forecast.FirstGuess]:
  """Per target modality, how its predictions are a change on the grid's (`FirstGuess`).

  A target variable the grid predicts: its grid channel's value, from the grid's
  normalization (`output_stats`: `(mean, std)` `[C_out]`) to the modality's
  (`point_stats`: per modality, `{"mean", "std"}` `[C_t]` of its targets), and its
  residual scaled as the grid channel's (`residual_scale` `[C_out]`, in the modality's
  units: a state variable's by the std of one step's change). A variable the grid lacks is
  predicted outright (no first guess, scale 1). Without statistics (shapes, compiles,
  tests) the two normalizations are taken alike.
  """
  guesses = {}
  for m in d.modalities:
    if not m.targets:
      continue
    known = np.array([name in d.output_channels for name in m.targets])
    channels = np.array([d.output_channels.index(name) if name in d.output_channels else 0
                         for name in m.targets], np.int32)
    if output_stats is None:
      scale, offset = np.ones(len(m.targets)), np.zeros(len(m.targets))
    else:
      mean, std = (np.asarray(x, np.float64)[channels] for x in output_stats)
      point_mean, point_std = (np.asarray(point_stats[m.name][s], np.float64)
                               for s in ("mean", "std"))
      scale, offset = std / point_std, (mean - point_mean) / point_std
    guesses[m.name] = forecast.FirstGuess(
        channels, np.where(known, scale, 0).astype(np.float32),
        np.where(known, offset, 0).astype(np.float32),
        np.where(known, np.asarray(residual_scale)[channels] * scale, 1).astype(np.float32))
  return guesses


def batch_dtype(m: ModelSpec):
  """The dtype batches are carried in on the device: bfloat16 where the activations are.

  At 0.25 deg a float32 example is ~2.7 GiB of inputs and targets; the network
  casts them to its activation dtype anyway, and the loss accumulates in float32.
  """
  return jnp.bfloat16 if m.dtype == "bfloat16" else jnp.float32


def batch_shapes(specs: Specs, num_grid_nodes: int, batch_size: int,
                 num_points: dict[str, int] | None = None) -> dict[str, jax.ShapeDtypeStruct]:
  """Shapes of one batch (`DataSpec.batch_shapes`) in the batch dtype of the model."""
  dtype = batch_dtype(specs.model)
  return {key: jax.ShapeDtypeStruct(shape, dtype) for key, shape in
          specs.data.batch_shapes(num_grid_nodes, batch_size, num_points).items()}
