"""The optimizer: the schedule's shape, and AdamW on the raveled parameters equals
optax's AdamW on the parameter tree while keeping its state in a few arrays."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.errors import UserError
from wnscale.train import optimizer


def _train_config():
  train = config_lib.default_config().train
  train.update(steps=100, warmup_steps=10, learning_rate=1e-3, end_learning_rate=1e-5,
               grad_clip_norm=0.5)
  return train


def _train_spec(train):
  """The `TrainSpec` of a validated config's `train` section `train`."""
  return specs_lib.from_config(config_lib.validate(_with_train(train))).train


def _params():
  keys = jax.random.split(jax.random.key(0), 2)
  return {"encoder": {"kernel": jax.random.normal(keys[0], (6, 5)), "bias": jnp.zeros((5,))},
          "processor": {"kernel": jax.random.normal(keys[1], (3, 5, 5))}}


def _train_both(first, second, params, steps, second_grads=lambda grads: grads):
  """`((params, state), (params, state))` of two optimizers after `steps` updates from
  `params`, with gradients large enough that the clipping is active (the second's passed
  through `second_grads`)."""
  trained = []
  for tx, adjust in ((first, lambda grads: grads), (second, second_grads)):
    current, state = params, tx.init(params)
    for step in range(steps):
      grads = adjust(jax.tree.map(lambda p, s=step: jnp.sin(p * (s + 1)) * 3.0, current))
      updates, state = tx.update(grads, state, current)
      current = optax.apply_updates(current, updates)
    trained.append((current, state))
  return trained


def test_schedule_warms_up_then_decays_to_the_end_rate():
  schedule = optimizer.learning_rate_schedule(_train_spec(_train_config()))
  assert float(schedule(0)) == 0.0
  np.testing.assert_allclose(float(schedule(5)), 5e-4, rtol=1e-6)
  np.testing.assert_allclose(float(schedule(10)), 1e-3, rtol=1e-6)
  np.testing.assert_allclose(float(schedule(100)), 1e-5, rtol=1e-5)
  assert float(schedule(10)) > float(schedule(50)) > float(schedule(90))


def test_raveled_adamw_matches_adamw_on_the_tree():
  train = _train_spec(_train_config())
  params = _params()
  on_tree = optax.chain(
      optax.clip_by_global_norm(train.grad_clip_norm),
      optax.adamw(optimizer.learning_rate_schedule(train), b1=train.adam_b1,
                  b2=train.adam_b2, weight_decay=train.weight_decay))
  (flat_params, flat_state), (tree_params, _) = _train_both(
      optimizer.make_optimizer(train), on_tree, params, steps=12)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
               flat_params, tree_params)
  assert not np.allclose(flat_params["encoder"]["kernel"], params["encoder"]["kernel"])
  # The state: two moment vectors of every parameter, plus step counters.
  num_params = sum(x.size for x in jax.tree.leaves(params))
  shapes = sorted(x.shape for x in jax.tree.leaves(flat_state))
  assert shapes == [(), (), (num_params,), (num_params,)]


def test_phase_learning_rates_give_each_phase_its_own_schedule():
  """GraphCast's: warm-up and half-cosine over the first phase, then constant rates."""
  train = _train_config()
  train.update(steps=40, rollout_schedule=((0, 1), (20, 2), (30, 3)),
               phase_learning_rates=("1e-3:4:0", "3e-7", "2e-4:2:1e-4"))
  schedule = optimizer.learning_rate_schedule(_train_spec(train))
  rates = [float(schedule(step)) for step in range(40)]
  np.testing.assert_allclose(rates[:5], [0, 2.5e-4, 5e-4, 7.5e-4, 1e-3], rtol=1e-6)
  assert rates[4] > rates[12] > rates[19] > 0
  np.testing.assert_allclose(rates[20:30], [3e-7] * 10, rtol=1e-6)
  np.testing.assert_allclose(rates[30:33], [0, 1e-4, 2e-4], rtol=1e-6)
  assert 2e-4 > rates[36] > rates[39] > 1e-4


def _with_train(train):
  config = config_lib.default_config()
  config.train = train
  return config


def test_frozen_parameters_get_no_update_and_no_state():
  """`train.freeze`: the frozen leaves stay bitwise, the others follow the unfrozen
  optimizer given zero gradients for the frozen ones, and the moments hold only the
  trained parameters."""
  train = _train_spec(_train_config())
  params = _params()
  frozen_tx = optimizer.make_optimizer(dataclasses.replace(train, freeze=("processor",)))
  (frozen, frozen_state), (plain, _) = _train_both(
      frozen_tx, optimizer.make_optimizer(train), params, steps=6,
      second_grads=lambda grads: dict(grads, processor=jax.tree.map(jnp.zeros_like,
                                                                    grads["processor"])))
  np.testing.assert_array_equal(frozen["processor"]["kernel"], params["processor"]["kernel"])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
               frozen["encoder"], plain["encoder"])
  assert not np.allclose(frozen["encoder"]["kernel"], params["encoder"]["kernel"])
  trained = 6 * 5 + 5
  assert sorted(x.shape for x in jax.tree.leaves(frozen_state)) == [(), (), (trained,),
                                                                     (trained,)]
  assert optimizer.frozen_counts(params, ("processor",)) == {"processor": 75, "trained": 35}
  with pytest.raises(UserError, match=r"\['decoder'\] name\(s\) no parameter; .* one of "
                     r"\['encoder', 'processor'\]"):
    optimizer.frozen_counts(params, ("decoder",))
