"""What a compiled program costs, as XLA reports it: memory per device and FLOPs.

Figures come from `compiled.memory_analysis()` / `cost_analysis()`, not
estimates. On CPU, run with `--xla_cpu_enable_concurrency_optimized_scheduler=false`
or rematerialization hardly shows (the scheduler hoists recomputation); on TPU,
read `peak_bytes` (XLA's own peak) rather than `temp_bytes`.
"""

from __future__ import annotations


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
  stats["xla_peak_bytes"] = reported_peak
  # XLA:CPU reports argument + output as its "peak" (no temporaries): take the sum.
  # XLA:TPU reports the peak of its buffer assignment, which is what it checks against
  # HBM: a program whose sum exceeds HBM compiles when that peak fits.
  stats["peak_bytes"] = (reported_peak if reported_peak > stats["argument_bytes"]
                         + stats["output_bytes"] else computed_peak)
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  stats["flops"] = float((cost or {}).get("flops", 0.0))
  return stats
