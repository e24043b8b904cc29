"""Backpropagation through a rollout keeping one state a step (`train.remat_rollout`).

A rollout of T steps differentiated as it is keeps every step's activations. A
checkpoint around each step of the scan keeps less, but still what each step was called
with and what it returned: its whole history (`input_steps` states, so each state
`input_steps` times over), and its predictions in float32 for the loss after the scan. At
0.25 deg on two devices that is ~1.1 GiB a step (README, "Training the way GraphCast was
trained").

Here each step computes its own share of the loss, and the rollout's VJP is written out
(`jax.custom_vjp`). The forward pass keeps only each step's new state, in the history's
dtype (as it is fed back), in host memory: the backward pass reads each state once, so
device memory holds one step's work at a time (at 0.25 deg, 12 steps on two v5e chips
fit only so). The backward pass walks the steps in reverse: it carries a step's history
back from the next one's, bringing one state (or input) back a step, runs the step again
under `jax.vjp` (with the model's own remat), and passes the cotangent of each history
state back to the step that made it. Same functions as the plain rollout's gradient, summed in another order.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

# step(params, data, history [B, input_steps, C, G], lead) -> (the new state [B, C, G] in
# the history's dtype, the step's loss sums: any pytree of arrays, summed over the steps).
Step = Callable[..., tuple[jax.Array, object]]


def summed_over_steps(step: Step, params, data, inputs: jax.Array, num_steps: int):
  """The loss sums of `step` over a rollout of `num_steps` from `inputs`
  `[B, input_steps, C, G]`, differentiable in `params` (only), keeping one `[B, C, G]`
  state a step for the backward pass.

  `data`: a pytree of every other array the step reads (the batch, the constants, the
  exchange's indices). `step` must close over none: a custom VJP inside `shard_map` would
  leak the enclosing trace's values into its backward pass.
  """

  def forward(params, data, inputs):
    def body(history, lead):
      state, sums = step(params, data, history, lead)
      # Kept for the backward pass in host memory: it reads each state once, late.
      kept = jax.device_put(state, jax.memory.Space.Host)
      return jnp.concatenate([history[:, 1:], state[:, None]], axis=1), (kept, sums)

    _, (states, sums) = jax.lax.scan(body, inputs, jnp.arange(num_steps))
    return jax.tree.map(lambda x: jnp.sum(x, axis=0), sums), states  # states: [T, B, C, G]

  @jax.custom_vjp
  def loss_sums(params, data, inputs):
    return forward(params, data, inputs)[0]

  def loss_sums_forward(params, data, inputs):
    total, states = forward(params, data, inputs)
    return total, (params, data, inputs, states)

  def loss_sums_backward(residuals, cotangent):
    params, data, inputs, states = residuals

    def body(carry, lead):
      # history: step lead's. state_cotangents: of the states lead - input_steps + 1 ..
      # lead (the last complete: every later step that reads it is done).
      history, state_cotangents, params_cotangent = carry
      _, vjp = jax.vjp(lambda p, h: step(p, data, h, lead), params, history)
      step_params, step_history = vjp((state_cotangents[:, -1], cotangent))
      earlier = jnp.concatenate([jnp.zeros_like(state_cotangents[:, :1]),
                                 state_cotangents[:, :-1]], axis=1)
      # Step lead - 1's history: one state earlier, the rest shared with this one's.
      history = jnp.concatenate([_state_at(inputs, states, lead - 1 - inputs.shape[1])
                                 [:, None], history[:, :-1]], axis=1)
      return (history, earlier + step_history,
              jax.tree.map(jnp.add, params_cotangent, step_params)), None

    last = num_steps - 1
    last_history = jnp.stack([_state_at(inputs, states, last - inputs.shape[1] + slot)
                              for slot in range(inputs.shape[1])], axis=1)
    (_, _, params_cotangent), _ = jax.lax.scan(
        body, (last_history, jnp.zeros_like(inputs), jax.tree.map(jnp.zeros_like, params)),
        jnp.arange(num_steps), reverse=True)
    return params_cotangent, None, None  # nothing else is differentiated

  loss_sums.defvjp(loss_sums_forward, loss_sums_backward)
  return loss_sums(params, data, inputs)


def _state_at(inputs, states, position):
  """`[B, C, G]` the state at rollout `position` (a traced int): a predicted one of `states`
  `[T, B, C, G]` (in host memory, brought back) from 0 on, else input `position +
  input_steps` of `inputs` `[B, input_steps, C, G]` (before those: a value never read)."""
  predicted = jax.device_put(
      jax.lax.dynamic_index_in_dim(states, jnp.maximum(position, 0), axis=0, keepdims=False),
      jax.memory.Space.Device)
  given = jax.lax.dynamic_index_in_dim(inputs, jnp.maximum(position + inputs.shape[1], 0),
                                       axis=1, keepdims=False)
  return jnp.where(position >= 0, predicted, given)
