"""Builds a model, its constants and (for AOT compiles) batch shapes from a config."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from wnscale.data import variables as variables_lib
from wnscale.graphs import build
from wnscale.graphs.edge_sets import graphcast_edge_sets
from wnscale.graphs.graph import Graphs
from wnscale.model import forecast
from wnscale.model.graphcast import GraphCast
from wnscale.model import loss as loss_lib
from wnscale.model.processors import PROCESSORS


def output_variables(data_config: ml_collections.ConfigDict) -> tuple[str, ...]:
  """The variables the model predicts: the state, then the target-only ones."""
  return tuple(data_config.variables) + tuple(data_config.target_only_variables)


def num_state_channels(data_config: ml_collections.ConfigDict) -> int:
  return len(variables_lib.channel_names(data_config.variables, data_config.pressure_levels))


def num_output_channels(data_config: ml_collections.ConfigDict) -> int:
  return len(variables_lib.channel_names(output_variables(data_config),
                                         data_config.pressure_levels))


def build_model(config: ml_collections.ConfigDict) -> GraphCast:
  """A freshly initialized model (parameters from `config.seed`), built eagerly."""
  d = config.data
  num_globals = len(d.global_forcings)
  inputs = forecast.input_channels(num_state_channels(d), d.input_steps, len(d.forcings),
                                   num_globals)
  return GraphCast(inputs, num_output_channels(d), config.model, rngs=nnx.Rngs(config.seed),
                   global_channels=forecast.global_channels(d.input_steps, num_globals))


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


def graphs_for_grid(config: ml_collections.ConfigDict, latitude, longitude,
                    use_cache: bool = True) -> Graphs:
  """The model's graphs on a grid: GraphCast's edge sets and those its processor adds."""
  m = config.model
  edge_sets = dict(graphcast_edge_sets(m.radius_fraction, m.mesh_to_grid_edge_normalization),
                   **PROCESSORS[m.processor].edge_sets(m))
  return build.build_graphs(latitude, longitude, m.mesh_levels, edge_sets, use_cache=use_cache)


def node_positions(config: ml_collections.ConfigDict, latitude, longitude):
  """Per node set, `[num_nodes, 3]` unit vectors (`build.node_positions`)."""
  return build.node_positions(latitude, longitude, config.model.mesh_levels)


def make_constants(config: ml_collections.ConfigDict, graphs: Graphs, latitude, longitude,
                   residual_scale: np.ndarray) -> forecast.Constants:
  """Host (numpy) constants; `residual_scale` is `[C_out]` (`source.residual_scale`)."""
  d = config.data
  return forecast.Constants(
      graphs=graphs,
      residual_scale=np.asarray(residual_scale, np.float32),
      node_weights=loss_lib.latitude_weights(latitude, len(longitude)),
      channel_weights=variables_lib.loss_channel_weights(output_variables(d),
                                                         d.pressure_levels))


def batch_dtype(config: ml_collections.ConfigDict):
  """The dtype batches are carried in on the device: bfloat16 where the activations are.

  At 0.25 deg a float32 example is ~2.7 GiB of inputs and targets; the network
  casts them to its activation dtype anyway, and the loss accumulates in float32.
  """
  return jnp.bfloat16 if config.model.dtype == "bfloat16" else jnp.float32


def batch_shapes(config: ml_collections.ConfigDict, num_grid_nodes: int,
                 batch_size: int) -> dict[str, jax.ShapeDtypeStruct]:
  """Shapes of one batch, following the contract in `wnscale.model.forecast`."""
  d = config.data
  dtype = batch_dtype(config)
  shape = lambda *s: jax.ShapeDtypeStruct((batch_size,) + s, dtype)
  shapes = {
      "inputs": shape(d.input_steps, num_state_channels(d), num_grid_nodes),
      "targets": shape(d.target_steps, num_output_channels(d), num_grid_nodes),
      "forcings": shape(d.input_steps + d.target_steps, len(d.forcings), num_grid_nodes),
      "statics": shape(forecast.NUM_STATICS, num_grid_nodes),
  }
  if d.global_forcings:
    shapes["globals"] = shape(d.input_steps + d.target_steps, len(d.global_forcings))
  return shapes
