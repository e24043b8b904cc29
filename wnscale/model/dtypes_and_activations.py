"""What the names of `model.dtype` and `model.output_activations` stand for in JAX.

Apart from the network (JAX without Flax), so that validating a config checks these
names without building a model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# `model.dtype`: the activations' dtype (parameters stay float32).
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# What `model.output_activations` may apply to a normalized outright prediction.
OUTPUT_ACTIVATIONS = {"sigmoid": jax.nn.sigmoid, "softplus": jax.nn.softplus,
                      "relu": jax.nn.relu, "tanh": jnp.tanh}
