"""`data.nan_fill_values` in a forecast: WeatherNext 2's `NaNCleaner`.

A variable that is NaN where it is undefined (sea-surface temperature over
land) enters the model with its NaN replaced by a fill value; the model's
forecast of it is NaN wherever an input time was; and the state fed back to
the next step is filled again there, so every step sees the fill value where
the first saw it (WeatherNext 2 cleans each step's inputs, and its forecasts
keep the inputs' NaN).

Arrays here are the forecasts' normalized state `[B, (time,) C, grid]`, the
grid axis in whatever order the caller holds it (nodes or slots).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from wnscale.data import variables as variables_lib
from wnscale.specs import DataSpec


class NanFill:
  """The fill values of a run's state channels, normalized.

  Args:
    data: the run's data spec (`nan_fill_values`, variables, levels).
    mean, std: `[C_state]` the state channels' normalization.
  """

  def __init__(self, data: DataSpec, mean: np.ndarray, std: np.ndarray):
    values = dict(data.nan_fill_values)
    names = variables_lib.channel_names(data.variables, data.pressure_levels)
    raw = np.array([values.get(name.split("@")[0], np.nan) for name in names], np.float64)
    self.fill = ((raw - mean) / std).astype(np.float32)  # NaN: a channel without one
    self.active = bool(np.isfinite(self.fill).any())

  def clean(self, history: np.ndarray) -> np.ndarray:
    """`[B, C, grid]` bool: where a fill channel is NaN at some time of `history`
    `[B, T, C, grid]`, which is filled there in place."""
    fillable = np.isfinite(self.fill)[None, :, None]
    mask = np.isnan(history).any(axis=1) & fillable
    np.copyto(history, np.broadcast_to(self.fill[None, None, :, None], history.shape),
              where=mask[:, None])
    return mask

  def refill(self, mask: np.ndarray, put, anywhere: bool | None = None):
    """None where `mask` `[B, C, slots]` (`clean`'s, in the history's grid order) is
    empty; else `history -> history` (on the device, donated) with the fill values
    where it is set. `put(key, array)` lays a host batch array out as `key` says.
    `anywhere`: whether the whole batch's mask is set anywhere, when `mask` is one
    process's rows of it (default: `mask.any()`)."""
    if not (mask.any() if anywhere is None else anywhere):
      return None
    device_mask = put("inputs", mask[:, None])[:, 0] > 0.5  # laid out as the history
    fill = jnp.asarray(np.nan_to_num(self.fill))
    return lambda history: _refill(history, device_mask, fill)

  @staticmethod
  def reintroduce(outputs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """`outputs` `[B, (time,) C_out, grid]` with NaN where `mask` `[B, C, grid]` is set
    (the state channels come first in the outputs)."""
    outputs = np.array(outputs, copy=True)
    channels = mask.shape[1]
    expanded = mask if outputs.ndim == 3 else mask[:, None]
    state = outputs[..., :channels, :]
    state[np.broadcast_to(expanded, state.shape)] = np.nan
    return outputs


@jax.jit(donate_argnums=0)
def _refill(history, mask, fill):
  """`history` `[B, T, C, slots]` with `fill` `[C]` where `mask` `[B, C, slots]` is set."""
  return jnp.where(mask[:, None], fill[None, None, :, None], history)
