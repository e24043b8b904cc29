"""Builds a model, its constants and (for tests, benchmarks, AOT) batch shapes from a config."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from wnscale.data import variables as variables_lib
from wnscale.graphs.build import Graphs, build_graphs
from wnscale.model import forecast
from wnscale.model.graphcast import GraphCast
from wnscale.train import loss as loss_lib


def num_state_channels(data_config: ml_collections.ConfigDict) -> int:
  return len(variables_lib.channel_names(data_config.variables, data_config.pressure_levels))


def build_model(config: ml_collections.ConfigDict) -> GraphCast:
  """A freshly initialized model (parameters from `config.seed`), built eagerly."""
  channels = num_state_channels(config.data)
  return GraphCast(forecast.input_channels(channels, config.data.input_steps), channels,
                   config.model, rngs=nnx.Rngs(config.seed))


def init_model(config: ml_collections.ConfigDict):
  """`(graphdef, params)` of `build_model(config)`, initialized in one compiled call.

  The graphdef carries the config (remat settings included); params are a
  pytree (`nnx.State`) of float32 arrays.
  """
  graphdef, _ = init_model_shapes(config)
  params = jax.jit(lambda: nnx.split(build_model(config))[1])()
  return graphdef, params


def init_model_shapes(config: ml_collections.ConfigDict):
  """`(graphdef, params as jax.ShapeDtypeStruct)`: nothing is computed or allocated."""
  return nnx.split(nnx.eval_shape(lambda: build_model(config)))


def graphs_for_grid(config: ml_collections.ConfigDict, latitude, longitude) -> Graphs:
  return build_graphs(latitude, longitude, config.model.mesh_levels,
                      config.model.radius_fraction)


def make_constants(config: ml_collections.ConfigDict, graphs: Graphs, latitude, longitude,
                   residual_scale: np.ndarray) -> forecast.Constants:
  """Host (numpy) constants; `residual_scale` is `[C]` diff_std / std."""
  d = config.data
  return forecast.Constants(
      graphs=graphs,
      residual_scale=np.asarray(residual_scale, np.float32),
      node_weights=loss_lib.latitude_weights(latitude, len(longitude)),
      channel_weights=variables_lib.loss_channel_weights(d.variables, d.pressure_levels))


def batch_shapes(config: ml_collections.ConfigDict, num_grid_nodes: int,
                 batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
  """Shapes of one batch, following the contract in `wnscale.model.forecast`."""
  d = config.data
  channels = num_state_channels(d)
  shape = lambda *s: jax.ShapeDtypeStruct((batch_size,) + s, jnp.float32)
  return {
      "inputs": shape(d.input_steps, num_grid_nodes, channels),
      "targets": shape(d.target_steps, num_grid_nodes, channels),
      "forcings": shape(d.input_steps + d.target_steps, num_grid_nodes,
                        forecast.NUM_FORCINGS),
      "statics": shape(num_grid_nodes, forecast.NUM_STATICS),
  }


def random_batch(config, num_grid_nodes: int, batch_size: int, seed: int = 0):
  """A batch of standard-normal arrays with the contract's shapes (tests, benchmarks)."""
  rng = np.random.default_rng(seed)
  return {k: rng.standard_normal(s.shape).astype(np.float32)
          for k, s in batch_shapes(config, num_grid_nodes, batch_size).items()}
