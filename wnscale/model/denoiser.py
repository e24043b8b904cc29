"""GenCast's denoiser: the encoder-processor-decoder network preconditioned as in Karras
et al. 2022 (EDM), conditioned on the noise level.

The denoiser `D(x; sigma)` of noisy targets `x` (the normalized targets plus noise
of standard deviation `sigma`) given the inputs:

  D(x; sigma) = c_skip(sigma) x + c_out(sigma) F(inputs, c_in(sigma) x; e(sigma))
  c_in = (sigma^2 + 1)^-1/2    c_out = sigma (sigma^2 + 1)^-1/2    c_skip = 1 / (sigma^2 + 1)

(the targets' standard deviation taken as 1: they are normalized). `F` is the
network (`wnscale.model.graphcast.GraphCast`, any processor), its grid inputs the
forecaster's (`wnscale.model.forecast.one_step`'s order) followed by the scaled noisy
targets in output-channel order; `e(sigma)` the noise-level encoding
(`wnscale.model.noise_level_encoder`) that every layer norm of the network is
conditioned on (`wnscale.model.norm`), in place of GraphCast's learned scales and
offsets. `model.denoiser_*` (`wnscale.specs.DenoiserSpec`) are its settings.

Shapes (the batch's layout): grid input parts channel-major `[B, C_i, G]`, noisy
targets `[B, C_out, G]`, noise levels `[B]`; the output node-major `[B, G, C_out]`,
float32, as the network's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wnscale.graphs.graph import Graphs
from wnscale.model.graphcast import GraphCast, local_exchange
from wnscale.model.noise_level_encoder import NoiseLevelEncoder
from wnscale.specs import ModelSpec


def preconditioning(noise_levels: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`(c_in, c_out, c_skip)`, each shaped as `noise_levels`."""
  variance = noise_levels ** 2 + 1
  return variance ** -0.5, noise_levels * variance ** -0.5, 1 / variance


class Denoiser(nnx.Module):
  """GenCast's preconditioned denoiser (the module docstring's `D`).

  Args:
    input_channels: the forecaster's grid input channels (the noisy targets come on top).
    output_channels: the denoised channels per grid node (the targets).
    spec: the model's settings, `spec.denoiser.noise_frequencies > 0`.
    global_channels: as `GraphCast`'s.
  """

  def __init__(self, input_channels: int, output_channels: int, spec: ModelSpec, *,
               global_channels: int = 0, rngs: nnx.Rngs):
    if not spec.denoiser.noise_frequencies:
      raise ValueError("A denoiser needs model.denoiser_noise_frequencies > 0.")
    self.spec = spec
    self.noise_level_encoder = NoiseLevelEncoder(spec.denoiser, rngs=rngs)
    self.network = GraphCast(input_channels + output_channels, output_channels, spec,
                             global_channels=global_channels, rngs=rngs)

  def __call__(self, graphs: Graphs, grid_input_parts, noisy_targets: jax.Array,
               noise_levels: jax.Array, exchange=local_exchange,
               global_inputs: jax.Array | None = None) -> jax.Array:
    """`D(noisy_targets; noise_levels)` `[B, G, C_out]` given the inputs (the module
    docstring's shapes)."""
    c_in, c_out, c_skip = (c[:, None, None] for c in preconditioning(
        noise_levels.astype(jnp.float32)))
    raw = self.network(graphs, tuple(grid_input_parts) + (noisy_targets * c_in,), exchange,
                       global_inputs, conditioning=self.noise_level_encoder(noise_levels))
    return c_skip * jnp.swapaxes(noisy_targets, 1, 2).astype(jnp.float32) + c_out * raw
