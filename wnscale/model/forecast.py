"""Pure forecasting functions: normalized arrays in, normalized arrays out.

A batch (see `wnscale.data.source`) holds float32 arrays, channel-major with
the grid flattened last, as the data stores hold them (so the host assembles
examples with contiguous copies):
  inputs    [B, input_steps, C, G]                 state, normalized (x - mean) / std
  targets   [B, target_steps, C_out, G]            outputs: state, then target-only
  forcings  [B, input_steps + target_steps, F, G]  solar radiation, day/year progress
  statics   [B, S, G]                              surface geopotential, land-sea mask
  globals   [B, input_steps + target_steps, F]     global forcings (only if configured)
  noise     [B, target_steps, K]                   an FGN's noise per lead time (only then)
  <name>/inputs   [B, input_steps, C_m, P]   a modality's inputs at its points, NaN: missing
  <name>/targets  [B, target_steps, C_t, P]  a modality's targets, normalized, NaN: missing
                                             (with its own statistics)
`rollout` returns predictions in the targets' layout, and a step's history stays
channel-major too. The network itself works node-major (`[G, C]`: one row of
features per grid node, what its gathers and MLPs want): its encoder transposes
its inputs block by block, its decoder's outputs are transposed back here.

One step maps the last `input_steps` states (plus forcings at those times and
at the target time, and statics) to the next outputs; global forcings at the same
times join every grid node's inputs and every mesh node's embedding. For the
state the network predicts the residual in units of the std of differences over
one model step, `data.time_step_hours` (`residual_scale = diff_std / std` converts
it to the state's normalized units), for target-only channels the normalized value
itself (`residual_scale` 1): GraphCast's `InputsAndResiduals`. A target modality's
outputs are residuals too, on the grid's predicted outputs interpolated to its points
(`point_first_guess`), scaled by `FirstGuess.residual_scale`. Longer rollouts feed
the predicted state back. No xarray, no coordinates: everything here runs under
jit, remat and shard_map.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from wnscale.data import variables as variables_lib
from wnscale.graphs.graph import Graphs
from wnscale.model.graphcast import GraphCast, local_exchange

NUM_STATICS = len(variables_lib.STATIC_VARIABLES)


class FirstGuess(NamedTuple):
  """How a target modality's predictions are made a change on the grid's: per target variable.

  Attributes:
    channels: `[C_t]` int32 the grid output channel of each target variable (0: none).
    scale, offset: `[C_t]` a grid-normalized value's in the modality's normalization,
      `scale * value + offset` (scale 0: no grid channel, no first guess).
    residual_scale: `[C_t]` what the modality's network outputs are scaled by.
  """

  channels: jax.Array
  scale: jax.Array
  offset: jax.Array
  residual_scale: jax.Array


class Constants(NamedTuple):
  """Arrays that every step needs and no example changes.

  Attributes:
    graphs: the three graphs (index and feature arrays).
    residual_scale: `[C_out]` what the network's outputs are scaled by:
      diff_std / std per state channel, 1 per target-only channel.
    node_weights: `[G]` loss weight of each grid node (cell area, mean 1).
    channel_weights: `[C_out]` loss weight of each output channel.
    point_weights: per target modality (`DataSpec.modalities`), `[P]` the loss
      weight of each of its points (its cell area, mean 1); empty: the grid only.
    first_guesses: per target modality, its `FirstGuess`.
  """

  graphs: Graphs
  residual_scale: jax.Array
  node_weights: jax.Array
  channel_weights: jax.Array
  point_weights: dict = {}  # never mutated: pytree leaf containers
  first_guesses: dict = {}


def _stack_steps(x: jax.Array) -> jax.Array:
  """`[B, T, C, G] -> [B, T * C, G]` (a reshape: no copy)."""
  return x.reshape((x.shape[0], -1, x.shape[-1]))


def one_step(model: GraphCast, constants: Constants, history, forcings, statics,
             exchange=local_exchange, global_forcings=None, noise=None):
  """The next normalized outputs `[B, C_out, G]`: the state, then target-only channels
  (`one_step_with_points`' grid outputs, the modalities all missing)."""
  return one_step_with_points(model, constants, history, forcings, statics, exchange,
                              global_forcings, noise)[0]


def one_step_with_points(model: GraphCast, constants: Constants, history, forcings, statics,
                         exchange=local_exchange, global_forcings=None, noise=None,
                         point_history: dict | None = None):
  """`(the next normalized grid outputs [B, C_out, G], {target modality: [B, C_t, P]})`.

  Args:
    history: `[B, input_steps, C, G]` the latest states, oldest first.
    forcings: `[B, input_steps + 1, F, G]` at the history times and the next time.
    statics: `[B, S, G]`.
    global_forcings: `[B, input_steps + 1, F_global]` at the same times, or None.
    noise: `[B, noise_channels]` an FGN's noise for this step, or None.
    point_history: per input modality, `[B, input_steps, C_m, P]` its values at the
      history times, NaN where missing; a modality left out is missing.

  A target modality's outputs are a change on its first guess (`point_first_guess`): the
  grid's predicted state at its points.
  """
  parts, global_inputs = grid_input_parts(history, forcings, statics, global_forcings)
  outputs, point_outputs = model.predict(
      constants.graphs, parts, exchange, global_inputs, noise,
      {name: _stack_steps(values) for name, values in (point_history or {}).items()})
  outputs = from_residuals(history, jnp.swapaxes(outputs, -1, -2), constants.residual_scale)
  point_outputs = {
      name: point_first_guess(constants, name, outputs, exchange) + jnp.swapaxes(
          values * constants.first_guesses[name].residual_scale, -1, -2)
      for name, values in point_outputs.items()}
  return outputs, point_outputs


def from_residuals(history, residuals, residual_scale):
  """`[B, C_out, G]` the next outputs from the network's `residuals` `[B, C_out, G]` (in
  units of `residual_scale` `[C_out]`): the last state of `history` `[B, input_steps, C, G]`
  plus the change for the state's `C` channels, the value itself for target-only ones."""
  outputs = residuals * residual_scale[:, None]
  num_state = history.shape[2]
  if outputs.shape[1] == num_state:
    return history[:, -1] + outputs
  return jnp.concatenate([history[:, -1] + outputs[:, :num_state], outputs[:, num_state:]],
                         axis=1)


def grid_input_parts(history, forcings, statics, global_forcings=None):
  """`(the network's grid input parts, channel-major [B, C_i, G] each; global inputs
  [B, T * F_global] or None)` of one step (`one_step_with_points`' arguments)."""
  parts = (_stack_steps(history), _stack_steps(forcings), statics)
  if global_forcings is None:
    return parts, None
  global_inputs = global_forcings.reshape(global_forcings.shape[0], -1)
  # Also a part on every grid node.
  return parts + (jnp.broadcast_to(global_inputs[:, :, None], global_inputs.shape
                                   + statics.shape[-1:]),), global_inputs


def point_first_guess(constants: Constants, name: str, outputs, exchange=local_exchange):
  """`[B, C_t, P]` the grid outputs `[B, C_out, G]` (normalized) at target modality `name`'s
  points, in its normalization (`FirstGuess`): the `grid_to_<name>` edges' weighted sum.

  The predicted state rather than the last input: a station's target is the grid's next
  state plus what the grid cannot resolve there, so its outputs learn the latter alone.
  """
  guess, edges = constants.first_guesses[name], constants.graphs.edges[f"grid_to_{name}"]
  batch, channels = outputs.shape[0], guess.channels.shape[0]
  rows = jnp.take(outputs, guess.channels, axis=1).reshape(batch * channels, -1).T
  table = exchange(f"grid_to_{name}", rows)  # [G (+ remote rows), B C_t]
  at_points = jax.ops.segment_sum(table[edges.senders] * edges.features, edges.receivers,
                                  num_segments=constants.graphs.num_nodes(name),
                                  indices_are_sorted=True)  # [P, B C_t]
  at_points = at_points.T.reshape(batch, channels, -1)
  return at_points * guess.scale[:, None] + guess.offset[:, None]


def advance_history(history, prediction):
  """`[B, input_steps, C, G]` history with the oldest state dropped and the predicted
  state (`prediction [B, C_out, G]`'s first `C` channels) appended, in the history's
  dtype (bfloat16 inputs stay bfloat16, as GraphCast feeds them back)."""
  predicted_state = prediction[:, None, :history.shape[2]].astype(history.dtype)
  return jnp.concatenate([history[:, 1:], predicted_state], axis=1)


def rollout(model: GraphCast, constants: Constants, batch, *, exchange=local_exchange):
  """Autoregressive predictions `[B, target_steps, C_out, G]`, normalized
  (`rollout_with_points`' grid predictions)."""
  return rollout_with_points(model, constants, batch, exchange=exchange)[0]


def step_at_lead(model: GraphCast, constants: Constants, batch, history, lead,
                 exchange=local_exchange):
  """Rollout step `lead` (a traced int) of `batch` from `history` `[B, input_steps, C, G]`:
  `one_step_with_points`' `(grid outputs [B, C_out, G], {target modality: [B, C_t, P]})`.

  The step reads the forcings (and global forcings) at the history's times and the next,
  and an FGN's noise of its lead. A modality's observations exist at the input times
  only: at lead `l` its history is its inputs moved on `l` times, NaN (missing) past them.
  """
  input_steps = history.shape[1]
  window = lambda x: jax.lax.dynamic_slice_in_dim(x, lead, input_steps + 1, axis=1)
  global_forcings, noise = batch.get("globals"), batch.get("noise")
  point_histories = {}
  for key, values in batch.items():
    if key.endswith("/inputs"):  # [B, 2 input_steps, ...]: the inputs, then NaN
      padded = jnp.concatenate([values, jnp.full_like(values, jnp.nan)], axis=1)
      point_histories[key.removesuffix("/inputs")] = jax.lax.dynamic_slice_in_dim(
          padded, jnp.minimum(lead, input_steps), input_steps, axis=1)
  return one_step_with_points(
      model, constants, history, window(batch["forcings"]), batch["statics"], exchange,
      None if global_forcings is None else window(global_forcings),
      None if noise is None else jnp.asarray(noise)[:, lead],  # float32
      point_histories)


def rollout_with_points(model: GraphCast, constants: Constants, batch, *,
                        exchange=local_exchange):
  """`(grid predictions [B, target_steps, C_out, G], {target modality: [B, target_steps,
  C_t, P]})`, normalized.

  Each step's predicted state joins the history of the next; forcings slide along
  (`step_at_lead`). Differentiated as it is, a long rollout keeps every step's
  activations; the training loss of `train.remat_rollout` keeps one state a step
  (`wnscale.model.rollout_loss`).
  """
  inputs = batch["inputs"]
  target_steps = batch["forcings"].shape[1] - inputs.shape[1]
  graphdef, state = nnx.split(model)

  def scan_step(history, lead):
    prediction, point_prediction = step_at_lead(nnx.merge(graphdef, state), constants, batch,
                                                history, lead, exchange)
    return advance_history(history, prediction), (prediction, point_prediction)

  _, (predictions, point_predictions) = jax.lax.scan(scan_step, inputs,
                                                     jnp.arange(target_steps))
  # [target_steps, B, C, N] -> [B, target_steps, C, N]
  return jnp.swapaxes(predictions, 0, 1), jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1),
                                                       point_predictions)
