"""The optimizer: the schedule's shape, and AdamW on the raveled parameters equals
optax's AdamW on the parameter tree while keeping its state in a few arrays."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from wnscale import config as config_lib
from wnscale.train import optimizer


def _train_config():
  train = config_lib.default_config().train
  train.update(steps=100, warmup_steps=10, learning_rate=1e-3, end_learning_rate=1e-5,
               grad_clip_norm=0.5)
  return train


def test_schedule_warms_up_then_decays_to_the_end_rate():
  schedule = optimizer.learning_rate_schedule(_train_config())
  assert float(schedule(0)) == 0.0
  np.testing.assert_allclose(float(schedule(5)), 5e-4, rtol=1e-6)
  np.testing.assert_allclose(float(schedule(10)), 1e-3, rtol=1e-6)
  np.testing.assert_allclose(float(schedule(100)), 1e-5, rtol=1e-5)
  assert float(schedule(10)) > float(schedule(50)) > float(schedule(90))


def test_raveled_adamw_matches_adamw_on_the_tree():
  train = _train_config()
  keys = jax.random.split(jax.random.key(0), 2)
  params = {"encoder": {"kernel": jax.random.normal(keys[0], (6, 5)),
                        "bias": jnp.zeros((5,))},
            "processor": {"kernel": jax.random.normal(keys[1], (3, 5, 5))}}
  on_tree = optax.chain(
      optax.clip_by_global_norm(train.grad_clip_norm),
      optax.adamw(optimizer.learning_rate_schedule(train), b1=train.adam_b1,
                  b2=train.adam_b2, weight_decay=train.weight_decay))
  raveled = optimizer.make_optimizer(train)
  tree_params, flat_params = params, params
  tree_state, flat_state = on_tree.init(params), raveled.init(params)
  for step in range(12):
    # Gradients large enough that the clipping is active.
    grads = jax.tree.map(lambda p, s=step: jnp.sin(p * (s + 1)) * 3.0, tree_params)
    updates, tree_state = on_tree.update(grads, tree_state, tree_params)
    tree_params = optax.apply_updates(tree_params, updates)
    updates, flat_state = raveled.update(grads, flat_state, flat_params)
    flat_params = optax.apply_updates(flat_params, updates)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
               flat_params, tree_params)
  assert not np.allclose(flat_params["encoder"]["kernel"], params["encoder"]["kernel"])
  # The state: two moment vectors of every parameter, plus step counters.
  num_params = sum(x.size for x in jax.tree.leaves(params))
  shapes = sorted(x.shape for x in jax.tree.leaves(flat_state))
  assert shapes == [(), (), (num_params,), (num_params,)]
