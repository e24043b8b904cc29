"""The MLP used everywhere in GraphCast: one hidden layer, swish, LayerNorm.

The LayerNorm is the reference's (Haiku's defaults): epsilon 1e-5 and the
two-pass variance mean((x - mean)^2), not Flax's defaults (1e-6 and the
one-pass E[x^2] - E[x]^2, which loses precision when |mean| >> std). Everything
after the first layer is `wnscale.model.low_memory_layers.mlp_tail`: the same function, whose
gradient keeps only the hidden layer's pre-activation; the first layer is
`low_memory_layers.Linear` (its bias gradient a matrix product); the norm's scale and
offset come from `wnscale.model.norm`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from wnscale.model import low_memory_layers, norm


class MLP(nnx.Module):
  """`[..., in_size] -> [..., out_size]`: Linear, swish, Linear, optional LayerNorm.

  Parameters are float32; activations are computed in `dtype`. With
  `conditioning_size > 0` the LayerNorm is noise-conditioned (`norm.layer_norm`).
  """

  def __init__(self, in_size: int, hidden_size: int, out_size: int, *,
               layer_norm: bool = True, conditioning_size: int = 0, dtype=jnp.float32,
               rngs: nnx.Rngs):
    self.hidden = low_memory_layers.Linear(in_size, hidden_size, dtype=dtype, rngs=rngs)
    self.out = low_memory_layers.Linear(hidden_size, out_size, dtype=dtype, rngs=rngs)
    self.norm = (norm.layer_norm(out_size, conditioning_size, rngs=rngs) if layer_norm
                 else None)

  def __call__(self, x: jax.Array, conditioning: jax.Array | None = None) -> jax.Array:
    """`conditioning`: the `[conditioning_size]` vector of a conditioned norm, else None."""
    return self.finish(self.hidden(x), conditioning)

  def kernel_params(self, conditioning: jax.Array | None, dtype) -> tuple:
    """`(W1 [I, H], b1 [H], W2 [H, O], b2 [O], scale [O], offset [O])` in `dtype` (a
    conditioned norm's scale and offset those of `conditioning`): the parameters the fused
    kernels take (`fused_edges`, `fused_encoder_decoder`). Needs the layer norm."""
    params = (self.hidden.kernel[...], self.hidden.bias[...], self.out.kernel[...],
              self.out.bias[...], *self.norm.scale_and_offset(conditioning))
    return tuple(p.astype(dtype) for p in params)

  def finish(self, hidden: jax.Array, conditioning: jax.Array | None = None) -> jax.Array:
    """The rest of the MLP after the first Linear: swish, Linear, LayerNorm.

    Lets a caller build the first layer's pre-activation from parts (see
    `InteractionNetwork`).
    """
    out, norm = self.out, self.norm
    dtype = out.dtype or jnp.result_type(hidden, out.kernel[...])
    return low_memory_layers.mlp_tail(
        hidden.astype(dtype), out.kernel[...].astype(dtype), out.bias[...].astype(dtype),
        *(() if norm is None else norm.scale_and_offset(conditioning)),
        epsilon=getattr(norm, "epsilon", low_memory_layers.LAYER_NORM_EPSILON),
        precision=out.precision)


def mlp_flops(rows: int, in_size: int, hidden_size: int, out_size: int) -> float:
  """Matmul FLOPs of an `MLP` over `rows` rows (the planner's analytic count)."""
  return 2.0 * rows * (in_size * hidden_size + hidden_size * out_size)
