"""The jitted training and evaluation steps, on the sharded layout.

`train_step(state, constants, halo_indices, batch) -> (state, metrics)` is
compiled once with explicit input and output shardings; the state is donated,
and nothing in it syncs with the host.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from wnscale import specs as specs_lib
from wnscale.model import diffusion, ensemble, setup
from wnscale.model import sampler as sampler_lib
from wnscale.model.loss_registry import DiffusionSpec
from wnscale.sharding import sharded_model
from wnscale.sharding.layout import ShardedLayout, batch_spec
from wnscale.train import optimizer as optimizer_lib
from wnscale.train.state import TrainState, initial_state


def _shardings(layout: ShardedLayout, constants, halo_indices):
  """`(params, constants, halo_indices, batch)` shardings of a step's arguments.

  The batch's are None, i.e. as given: batches are always laid out by
  `ShardedLayout` (`global_batch`, `abstract_batch`) in `BATCH_SPECS`, and
  which keys they have depends on the config (`globals` is optional).
  """
  replicated = layout.sharding(P())
  return (replicated, jax.tree.map(lambda x: x.sharding, constants),
          jax.tree.map(lambda x: x.sharding, halo_indices), None)


def _stop_frozen_gradients(params, prefixes: tuple[str, ...]):
  """`params` with the parameters under `prefixes` behind `stop_gradient`: their gradients
  are zeros that XLA does not compute (no weight gradients of a frozen processor)."""
  if not prefixes:
    return params
  labels = optimizer_lib.freeze_labels(params, prefixes)
  return jax.tree.map(lambda label, p: jax.lax.stop_gradient(p)
                      if label == optimizer_lib.FROZEN else p, labels, params)


def make_train_step(layout: ShardedLayout, graphdef, optimizer, schedule, constants,
                    halo_indices, *, remat_steps: bool = False, loss: str = "mse",
                    members: ensemble.TrainingMembers | None = None, ema_decay: float = 0.0,
                    freeze: tuple[str, ...] = (), modalities=(), accumulation_steps: int = 1,
                    diffusion_noise: diffusion.TrainingNoise | None = None):
  """Compiles-on-first-call train step; `constants`/`halo_indices` fix their shardings.

  `loss`: a name from `wnscale.model.loss_registry.LOSSES`; `members`: an FGN's (`ensemble.training_members`):
  the step draws its members' noise from the seed and `state.step`, so a
  resumed run draws what the uninterrupted run drew. With `members.on_data`
  the batch's rows are the members (`ensemble.members_on_rows` order).
  `ema_decay` > 0: `state.ema` becomes `decay * ema + (1 - decay) * new params`.
  `freeze`: `train.freeze`'s prefixes (the optimizer leaves those parameters alone):
  their gradients are not computed, and `grad_norm` is the trained parameters' norm,
  the one the clipping sees. `modalities`: `DataSpec.modalities` (the batch holds their
  arrays; their loss weights). `accumulation_steps` (`train.accumulation_steps`): each
  data shard runs its examples in that many micro-batches, one after another, and the
  optimizer sees the gradient of the whole batch (`sharded_model.loss_and_grad_fn`); the
  metrics are the whole batch's. `diffusion_noise` (`loss="diffusion"`): the step draws its
  denoiser's noise levels and fields from it and `state.step`
  (`diffusion.with_training_noise`), as it draws an FGN's members' noise.
  The step is traced anew for each shape of batch (a rollout phase's targets).
  """
  on_data = members.members if members is not None and members.on_data else 0
  loss_and_grads = sharded_model.loss_and_grad_fn(
      layout, graphdef, loss=loss, remat_steps=remat_steps, members_on_data=on_data,
      modalities=modalities, micro_batches=accumulation_steps,
      prepare_params=lambda params: _stop_frozen_gradients(params, freeze))

  def train_step(state: TrainState, constants, halo_indices, batch):
    # The whole batch's noise, drawn before it is split into micro-batches.
    batch = ensemble.with_training_noise(batch, members, state.step)
    batch = diffusion.with_training_noise(batch, diffusion_noise, state.step,
                                          lambda key: layout.sharding(batch_spec(key)))
    loss, grads = loss_and_grads(state.params, constants, halo_indices, batch)
    with jax.named_scope("optimizer"):
      updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
      params = optax.apply_updates(state.params, updates)
    first_bad = (state.nonfinite_step < 0) & ~jnp.isfinite(loss)
    ema = state.ema
    if ema_decay:
      with jax.named_scope("ema"):
        ema = jax.tree.map(lambda e, p: ema_decay * e + (1 - ema_decay) * p, ema, params)
    new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                           nonfinite_step=jnp.where(first_bad, state.step,
                                                    state.nonfinite_step), ema=ema)
    metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads),
               "learning_rate": schedule(state.step)}
    return new_state, metrics

  in_shardings = _shardings(layout, constants, halo_indices)
  replicated = in_shardings[0]
  return jax.jit(train_step, in_shardings=in_shardings,
                 out_shardings=(replicated, replicated), donate_argnums=0)


def train_step_of(specs: specs_lib.Specs, layout: ShardedLayout, graphdef, optimizer,
                  constants, halo_indices):
  """`make_train_step` with the settings of `specs` (its `train` section, its members,
  modalities and a denoiser's training noise)."""
  train = specs.train
  diffusion_noise = None
  if isinstance(train.loss, DiffusionSpec):
    diffusion_noise = diffusion.TrainingNoise(
        specs.seed, train.loss, len(specs.data.output_channels), layout.grid_slots,
        sampler_lib.noise_grid(specs.model.sampler, layout.spherical_grid))
  return make_train_step(layout, graphdef, optimizer,
                         optimizer_lib.learning_rate_schedule(train), constants, halo_indices,
                         remat_steps=train.remat_rollout, loss=train.loss.name,
                         members=ensemble.training_members(specs), freeze=train.freeze,
                         ema_decay=train.ema_decay, modalities=specs.data.modalities,
                         accumulation_steps=train.accumulation_steps,
                         diffusion_noise=diffusion_noise)


def lower_train_step(specs: specs_lib.Specs, layout: ShardedLayout, constants, halo_indices,
                     batch) -> jax.stages.Lowered:
  """The train step of `specs` lowered for abstract (or real) constants and batch.

  Nothing is allocated: the state is `jax.ShapeDtypeStruct`s. This is the
  step builder the memory planner compiles (`wnscale.planner.compile.Problem`): with
  `train.accumulation_steps`, the step of micro-batches that training runs.
  """
  train = specs.train
  graphdef, params = setup.init_model_shapes(specs)
  optimizer = optimizer_lib.make_optimizer(train)
  replicated = layout.sharding(P())
  ema = bool(train.ema_decay)
  state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                       jax.eval_shape(lambda p: initial_state(p, optimizer, ema), params))
  train_step = train_step_of(specs, layout, graphdef, optimizer, constants, halo_indices)
  return train_step.lower(state, constants, halo_indices, batch)


def make_eval_step(layout: ShardedLayout, graphdef, constants, halo_indices):
  """`eval_step(params, constants, halo_indices, batch, std) -> ([C], {modality: ...})`
  summed squared errors (`sharded_model.error_sums_fn`).

  The grid's are in physical units (normalized error x `std`), area-weighted over
  grid nodes, summed over examples, lead times and nodes; divide by the
  number of (example, lead time, node) triples for the MSE.
  """
  error_sums = sharded_model.error_sums_fn(layout, graphdef)
  shardings = _shardings(layout, constants, halo_indices)
  return jax.jit(error_sums, in_shardings=shardings + (shardings[0],),
                 out_shardings=shardings[0])
