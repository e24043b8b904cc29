"""The model's loss and gradient, evaluation sums and forecast step with the graph split
over devices.

Each function runs the model inside `jax.shard_map` over the `(data, graph)`
mesh of a `ShardedLayout`: every collective is explicit (the exchange's
`all_gather` / `ppermute`, and the `psum`s of a loss, its counts and its
gradients). Parameters are replicated; the loss's gradient is taken inside the
`shard_map`, each device's of its own share of the loss: JAX sums a replicated
parameter's gradient over both axes where the parameter is used, or, with
micro-batches, each device sums its gradients over them and the sums are summed
over both axes once. The forecast step is one model step: called once per lead
time with the history kept on the devices, a forecast of any length holds one
step's arrays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from wnscale.errors import UserError
from wnscale.model import accumulation, forecast, manual_axis_types
from wnscale.model import loss as loss_lib
from wnscale.model import loss_registry
from wnscale.model import sampler as sampler_lib
from wnscale.sharding.layout import (BATCH_SPECS, CONSTANT_SPECS, POINTS_SPEC, ShardedLayout,
                                     batch_specs)
from wnscale.sharding.mesh import DATA, GRAPH
from wnscale.specs import SamplerSpec


def _typed(layout: ShardedLayout) -> bool:
  """Whether `shard_map` checks how values vary over the mesh axes here.

  Pallas' splash kernel (run where the layout made its masks, `Graphs.masks`) does not
  type how its outputs vary: the check is then off (the same loss and gradients:
  tests/test_splash_attention.py), and so is JAX's own sum of a replicated parameter's
  gradient over the devices: `_summed` does it then.
  """
  return not layout.partitioned.graphs.masks


def _summed(tree, typed: bool):
  """Per-device shares summed over the mesh: by their types (`manual_axis_types.summed`: a
  replicated parameter's gradient JAX has summed already), or, untyped, every array over
  both axes."""
  if typed:
    return manual_axis_types.summed(tree)
  return jax.tree.map(lambda x: jax.lax.psum(x, (DATA, GRAPH)), tree)


def _shard_mapped(layout: ShardedLayout, fn, out_specs, extra_in_specs=()):
  """`fn(params, local constants, exchange, local batch, *extra)` under shard_map.

  The batch is a dict of some of `BATCH_SPECS`' keys, laid out as those say.
  """
  def body(params, constants, halo_indices, batch, *extra):
    local_graphs = jax.tree.map(lambda x: x[0], constants.graphs)  # drop the shard axis
    return fn(params, constants._replace(graphs=local_graphs), layout.exchange(halo_indices),
              batch, *extra)

  check_vma = _typed(layout)

  def shard_mapped(params, constants, halo_indices, batch, *extra):
    return jax.shard_map(body, mesh=layout.mesh,
                         in_specs=(P(), CONSTANT_SPECS, P(GRAPH), batch_specs(batch))
                         + tuple(extra_in_specs),
                         out_specs=out_specs, check_vma=check_vma)(
                             params, constants, halo_indices, batch, *extra)

  return shard_mapped


def loss_and_grad_fn(layout: ShardedLayout, graphdef, *, loss: str = "mse",
                     remat_steps: bool = False, members_on_data: int = 0, modalities=(),
                     micro_batches: int = 1, prepare_params=lambda params: params):
  """`(params, constants, halo_indices, batch) -> (loss, grads)`: the global mean loss and
  its gradient in `params`, both replicated.

  `loss`: a name from `wnscale.model.loss_registry.LOSSES` (`loss_lib.loss_terms`). An
  FGN's batch holds `noise`: `[B, M, T, K]`, each device running the `M` members of its
  examples; or,
  with `members_on_data=M`, the members laid out along `data`: `M * B` rows,
  member-major (`ensemble.members_on_rows`), noise `[M * B, 1, T, K]`, so the
  data shards hold one member each (`mesh.data` a multiple of `M`), and each
  shard gets the same rows' other members from the shards `k, 2k, ...` away
  (`k = data shards / M`) by `ppermute` for the CRPS's spread term. `modalities`:
  `DataSpec.modalities` (their loss weights; the batch holds their arrays).

  Each device differentiates its own share of the mean loss (its loss sums over the whole
  batch's counts: `loss_lib.mean_loss` is linear in the sums). With `micro_batches`
  (`train.accumulation_steps`) each device splits its own rows of the batch into that many
  micro-batches (`wnscale.model.accumulation`) and sums their gradients, summed over the
  mesh once after them: it holds one micro-batch's activations at a time, and the devices
  exchange nothing more than without (with members on `data`, the shards holding an
  example's members hold it in the same micro-batch).
  `prepare_params` is applied to the parameters inside the differentiated function (the
  train step's `stop_gradient` of frozen ones).
  """
  implementation = loss_registry.LOSSES[loss].implementation()
  data_shards = layout.mesh.shape[DATA]
  members = max(members_on_data, 1)
  if data_shards % members:
    raise UserError(f"train.members_on_data: mesh.data={data_shards} must be a multiple of "
                    f"train.ensemble_members={members} (each data shard holds one member).")
  per_member = data_shards // members

  def other_members(prediction):
    return [jax.lax.ppermute(prediction, DATA, [(s, (s + j * per_member) % data_shards)
                                               for s in range(data_shards)])
            for j in range(1, members)]

  def local_loss_and_grads(params, constants, exchange, batch):
    # The whole batch's normalization: (example, lead time, real grid node) triples, and
    # each target modality's weights of present values, summed over the mesh.
    examples, steps = batch["targets"].shape[:2]
    grid_count = examples * data_shards // members * steps * layout.num_grid_nodes
    point_counts = jax.lax.psum(loss_lib.point_weight_sums(batch, constants.point_weights),
                                (DATA, GRAPH))

    def share(params, micro_batch):  # this device's share of the whole batch's mean loss
      grid_sum, point_sums = loss_lib.loss_terms(
          nnx.merge(graphdef, prepare_params(params)), constants, micro_batch,
          loss=implementation,
          remat_steps=remat_steps, exchange=exchange,
          remote_members=other_members if members_on_data else None)
      return loss_lib.mean_loss(grid_sum, grid_count, point_sums, point_counts, modalities)

    if micro_batches > 1:
      # Varying parameters: each device sums its gradients of its own shares over the
      # micro-batches, and the sums are summed over the mesh once, after them. (With one,
      # the parameters stay replicated and JAX sums each gradient over the mesh where the
      # parameter is used, as the backward pass goes: at the mid config compiled for
      # v5e:2x2, graph 2, a 12 % lower peak than one sum at the end.)
      params = jax.lax.pcast(params, (DATA, GRAPH), to="varying")
    return _summed(accumulation.value_and_grad(share, params, batch, micro_batches),
                   _typed(layout))

  return _shard_mapped(layout, local_loss_and_grads, out_specs=(P(), P()))


def error_sums_fn(layout: ShardedLayout, graphdef):
  """`(params, constants, halo_indices, batch, std [C]) -> ([C], {modality: ([C_t], [C_t])})`.

  The grid's area-weighted squared errors: scaled by `std` (normalized -> physical
  units) and summed over examples, lead times and real grid nodes. Each target modality
  of the batch: its squared errors in normalized units and the number of values present,
  per target variable (NaN targets left out, points unweighted); used for evaluation RMSE.
  """
  def local_error_sums(params, constants, exchange, batch, std):
    predictions, points = forecast.rollout_with_points(nnx.merge(graphdef, params), constants,
                                                       batch, exchange=exchange)
    squared = jnp.square((predictions - batch["targets"]) * std[:, None])
    per_channel = jnp.einsum("btcg,g->c", squared, constants.node_weights)
    point_sums = {}
    for name, values in points.items():
      targets = batch[f"{name}/targets"]
      present = ~jnp.isnan(targets)
      error = jnp.where(present, values - jnp.where(present, targets, 0), 0)
      point_sums[name] = (jnp.sum(jnp.square(error).astype(jnp.float32), axis=(0, 1, 3)),
                          jnp.sum(present, axis=(0, 1, 3), dtype=jnp.float32))
    return jax.lax.psum((per_channel, point_sums), (DATA, GRAPH))

  return _shard_mapped(layout, local_error_sums, out_specs=P(), extra_in_specs=(P(),))


STATE_SPEC = P(DATA, None, GRAPH)  # one step's outputs `[B, C_out, G]` (or a modality's)


def fed_back(modality, history, outputs):
  """A modality's `[B, input_steps, C_m, P]` history moved on one step: each input
  variable it also predicts takes its prediction (`outputs [B, C_t, P]`, normalized
  alike), the others are missing (NaN) at the new time."""
  channels = [outputs[:, modality.targets.index(name)] if name in modality.targets
              else jnp.full_like(history[:, -1, 0], jnp.nan) for name in modality.inputs]
  return jnp.concatenate([history[:, 1:], jnp.stack(channels, axis=1)[:, None]], axis=1)


def forecast_step_fn(layout: ShardedLayout, graphdef, modalities=(),
                     sampler: SamplerSpec | None = None):
  """`step(params, constants, halo_indices, inputs) -> (history, outputs, point_history,
  point_outputs)`: one model step.

  `inputs` holds `inputs` `[B, input_steps, C, G]` the latest states (the
  history, oldest first), `forcings` `[B, input_steps + 1, F, G]` at those
  times and the next, `statics` `[B, S, G]`, optionally `globals`
  `[B, input_steps + 1, F_global]` and an FGN's `noise` `[B, K]` (each row's
  member), and `<name>/inputs` `[B, input_steps, C_m, P]` of each of `modalities`
  (`DataSpec.modalities`) with inputs (NaN: missing); all normalized and laid out as
  `BATCH_SPECS` / `POINTS_SPEC`. Returns the history moved on one step (oldest state
  dropped, the new one appended; same layout), the step's outputs `[B, C_out, G]`
  (`STATE_SPEC`: the state, then target-only channels), each input modality's history
  moved on (`fed_back`), by its `<name>/inputs` key, and each target modality's
  outputs `[B, C_t, P]` by name. The same arithmetic as one step of `forecast.rollout`.

  With `sampler`, the model is GenCast's denoiser and the step samples (its
  `sampler.forecast_step`): `inputs` also hold `sampler_keys` `[B, 2]` (each row's noise
  key at this lead) and `grid_nodes` `[B, G]` (each slot's grid node, the same every row);
  its noise is drawn on the layout's grid (`sampler.noise_grid`).
  """
  noise_grid = (None if sampler is None
                else sampler_lib.noise_grid(sampler, layout.spherical_grid))
  with_inputs = [m for m in modalities if m.inputs]
  with_targets = [m for m in modalities if m.targets]

  def local_step(params, constants, exchange, inputs):
    model = nnx.merge(graphdef, params)
    if sampler is not None:  # a denoiser works on the grid alone (config.validate)
      outputs = sampler_lib.forecast_step(
          model, constants.graphs, constants.residual_scale, inputs["inputs"],
          inputs["forcings"], inputs["statics"], inputs["sampler_keys"],
          inputs["grid_nodes"][0], sampler, noise_grid, exchange, inputs.get("globals"))
      return forecast.advance_history(inputs["inputs"], outputs), outputs, {}, {}
    point_history = {m.name: inputs[f"{m.name}/inputs"] for m in with_inputs}
    outputs, point_outputs = forecast.one_step_with_points(
        model, constants, inputs["inputs"], inputs["forcings"],
        inputs["statics"], exchange, inputs.get("globals"), inputs.get("noise"),
        point_history)
    moved = {f"{m.name}/inputs": fed_back(m, point_history[m.name],
                                          point_outputs.get(m.name)) for m in with_inputs}
    return (forecast.advance_history(inputs["inputs"], outputs), outputs, moved,
            {m.name: point_outputs[m.name] for m in with_targets})

  return _shard_mapped(layout, local_step, out_specs=(
      BATCH_SPECS["inputs"], STATE_SPEC, {f"{m.name}/inputs": POINTS_SPEC for m in with_inputs},
      {m.name: STATE_SPEC for m in with_targets}))
