"""GenCast's noise-level encoding: Fourier features of log(sigma), then an MLP.

A denoiser's noise level sigma (one per example) becomes the vector every layer
norm of the network is conditioned on (`wnscale.model.norm`):

  u = log(sigma)
  features = [cos(2 pi f_1 u), ..., cos(2 pi f_F u), sin(2 pi f_1 u), ..., sin(2 pi f_F u)]
  encoding = W_2 gelu(W_1 features + b_1) + b_2

with frequencies `f_k = k / base_period`, `k = 1..F` (no zero frequency: a constant
feature adds nothing to a bias). Shapes: sigma `[B]` -> features `[B, 2F]` -> hidden
`[B, noise_hidden_size]` -> encoding `[B, noise_encoding_size]`. The weights start
as GenCast's (variance scaling 2 over fan-in, uniform; biases zero).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from wnscale.specs import DenoiserSpec


def fourier_features(values: jax.Array, base_period: float, num_frequencies: int) -> jax.Array:
  """`[...] -> [..., 2 num_frequencies]`: the cosines, then the sines, of `values` times
  `2 pi k / base_period`, `k = 1..num_frequencies`."""
  angular = jnp.asarray(2 * np.pi * np.arange(1, num_frequencies + 1) / base_period,
                        values.dtype)
  phases = values[..., None] * angular
  return jnp.concatenate([jnp.cos(phases), jnp.sin(phases)], axis=-1)


class NoiseLevelEncoder(nnx.Module):
  """`noise levels [B] -> encodings [B, noise_encoding_size]` (float32)."""

  def __init__(self, spec: DenoiserSpec, *, rngs: nnx.Rngs):
    self.spec = spec
    init = nnx.initializers.variance_scaling(2.0, "fan_in", "uniform")
    self.hidden = nnx.Linear(2 * spec.noise_frequencies, spec.noise_hidden_size,
                             kernel_init=init, rngs=rngs)
    self.out = nnx.Linear(spec.noise_hidden_size, spec.noise_encoding_size, kernel_init=init,
                          rngs=rngs)

  def __call__(self, noise_levels: jax.Array) -> jax.Array:
    features = fourier_features(jnp.log(noise_levels.astype(jnp.float32)),
                                self.spec.noise_base_period, self.spec.noise_frequencies)
    return self.out(jax.nn.gelu(self.hidden(features)))
