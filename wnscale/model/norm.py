"""The network's layer norm, made in one place so that every norm can be swapped at once.

Every layer norm of the model (the MLPs' and the mesh transformer's) comes
from `layer_norm`: today GraphCast's (epsilon 1e-5, two-pass variance, with a
gradient that keeps only its input; `wnscale.model.lean`). A conditional norm
(scale and offset computed from a conditioning vector, as in WeatherNext 2's
noise-conditioned norms) replaces this one function.
"""

from __future__ import annotations

from wnscale.model import lean


def layer_norm(size: int) -> lean.LayerNorm:
  """A layer norm over the last axis of `size` features, with learned scale and bias."""
  return lean.LayerNorm(size)
