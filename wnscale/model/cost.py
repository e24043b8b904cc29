"""What a compiled loss-and-gradient computation costs: memory per device and FLOPs.

Figures come from XLA (`compiled.memory_analysis()` / `cost_analysis()`), not
estimates. On CPU, run with `--xla_cpu_enable_concurrency_optimized_scheduler=false`
or rematerialization hardly shows (the scheduler hoists recomputation); on TPU,
read `peak_bytes` rather than `temp_bytes`.
"""

from __future__ import annotations

import jax
import ml_collections

from wnscale.model import setup
from wnscale.train import loss as loss_lib


def compiled_stats(compiled) -> dict[str, float]:
  """Per-device bytes and FLOPs of a `jax.stages.Compiled`."""
  memory = compiled.memory_analysis()
  stats = {
      "argument_bytes": memory.argument_size_in_bytes,
      "output_bytes": memory.output_size_in_bytes,
      "temp_bytes": memory.temp_size_in_bytes,
      "alias_bytes": memory.alias_size_in_bytes,
  }
  reported_peak = getattr(memory, "peak_memory_in_bytes", 0)
  computed_peak = (stats["argument_bytes"] + stats["output_bytes"] + stats["temp_bytes"]
                   - stats["alias_bytes"])
  # XLA:CPU reports argument + output as its "peak"; take the larger figure.
  stats["peak_bytes"] = max(reported_peak, computed_peak)
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  stats["flops"] = float((cost or {}).get("flops", 0.0))
  return stats


def compile_loss_and_grad(config: ml_collections.ConfigDict, constants, batch, params):
  """Compiles `value_and_grad` of the forecast loss for `config`'s remat settings."""
  graphdef, _ = setup.init_model_shapes(config)

  def loss(params, constants, batch):
    return loss_lib.forecast_loss(graphdef, params, constants, batch,
                                  remat_steps=config.train.remat_rollout)

  return jax.jit(jax.value_and_grad(loss)).lower(params, constants, batch).compile()
