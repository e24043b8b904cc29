"""The network's layer norm, made in one place so every norm can be swapped at once.

The LayerNorm is the reference GraphCast's (Haiku's defaults): epsilon 1e-5
and the two-pass variance mean((x - mean)^2), not Flax's defaults (1e-6 and
the one-pass E[x^2] - E[x]^2, which loses precision when |mean| >> std):

  y = (x - mean(x)) * rsqrt(mean((x - mean(x))^2) + 1e-5) * scale + bias

Every norm of the model (the MLPs' and the mesh transformer's) comes from
`layer_norm`, so a conditional norm (scale and offset computed from a
conditioning vector, as WeatherNext 2's noise-conditioned norms) replaces this
one function.
"""

from __future__ import annotations

from flax import nnx

LAYER_NORM_EPSILON = 1e-5


def layer_norm(size: int, *, dtype, rngs: nnx.Rngs) -> nnx.LayerNorm:
  """A LayerNorm over the last axis of `size` features, computed in `dtype`."""
  return nnx.LayerNorm(size, epsilon=LAYER_NORM_EPSILON, use_fast_variance=False, dtype=dtype,
                       rngs=rngs)
