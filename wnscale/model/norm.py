"""The network's layer norms, made in one place: plain, or conditioned on a noise embedding.

Every layer norm of the model (the MLPs' and the mesh transformer's) comes
from `layer_norm`: GraphCast's (epsilon 1e-5, two-pass variance, with a
gradient that keeps only its input; `wnscale.model.low_memory_layers`) with a learned scale
and offset, or, with `conditioning_size > 0`, WeatherNext 2's noise-conditioned
norm: no scale or offset of its own; a linear layer of the conditioning
vector `c` (the member's noise embedding) gives both,

  y = layer_norm(x) * (1 + (W_s c + b_s)) + (W_o c + b_o)

with `W` initialised near zero (truncated normal, std 1e-8) and `b` at zero,
so a fresh conditioned norm is the plain norm at its initial scale 1 and
offset 0, and a fresh FGN computes what the deterministic model computes.

GenCast's denoiser conditions the same norms on its noise-level encoding
(`wnscale.model.noise_level_encoder`) instead of a noise embedding.

The conditioning vector is an input of the whole network: every norm is called
as `norm(x, conditioning)`, and the modules between the network and its norms
pass it on as an argument (inside the batch `vmap`, so it is one example's
`[conditioning_size]` vector, and scale and offset are that example's `[D]`);
`None` for a deterministic model, whose plain norms ignore it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wnscale.model import low_memory_layers

CONDITIONING_INIT_STD = 1e-8  # WeatherNext 2's: near zero, not zero, so gradients differ


class LayerNorm(low_memory_layers.LayerNorm):
  """GraphCast's layer norm, called like a conditioned one; the conditioning is unused."""

  def scale_and_offset(self, conditioning: jax.Array | None = None):
    return super().scale_and_offset()

  def __call__(self, x: jax.Array, conditioning: jax.Array | None = None) -> jax.Array:
    return super().__call__(x)


class ConditionalLayerNorm(nnx.Module):
  """`low_memory_layers.layer_norm` with scale `1 + f(c)` and offset `g(c)`, `f`, `g` linear
  in `c`."""

  def __init__(self, size: int, conditioning_size: int, *, rngs: nnx.Rngs,
               epsilon: float = low_memory_layers.LAYER_NORM_EPSILON):
    self.conditioning = nnx.Linear(
        conditioning_size, 2 * size,
        kernel_init=nnx.initializers.truncated_normal(CONDITIONING_INIT_STD), rngs=rngs)
    self.epsilon = epsilon

  def scale_and_offset(self, conditioning: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """The `[size]` scale `1 + f(c)` and offset `g(c)` of `conditioning` `[conditioning_size]`."""
    if conditioning is None:
      raise ValueError("A noise-conditioned layer norm ran without its conditioning: the "
                       "model with model.noise_channels > 0 needs noise inputs, a denoiser "
                       "(model.denoiser_noise_frequencies > 0) noise levels.")
    scale_minus_one, offset = jnp.split(
        self.conditioning(conditioning.astype(jnp.float32)), 2, axis=-1)
    return 1.0 + scale_minus_one, offset

  def __call__(self, x: jax.Array, conditioning: jax.Array | None = None) -> jax.Array:
    """`x` `[..., size]` normalized with the scale and offset of `conditioning`."""
    return low_memory_layers.layer_norm(x, *self.scale_and_offset(conditioning), self.epsilon)


def layer_norm(size: int, conditioning_size: int = 0, *,
               rngs: nnx.Rngs | None = None) -> nnx.Module:
  """A layer norm over the last axis of `size` features.

  `conditioning_size` 0: learned scale and offset (GraphCast's); else
  conditioned on the `[conditioning_size]` vector each call is given.
  """
  if conditioning_size:
    return ConditionalLayerNorm(size, conditioning_size, rngs=rngs)
  return LayerNorm(size)
