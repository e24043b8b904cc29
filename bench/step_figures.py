"""What the speed benchmarks report of a compiled step: time, memory, FLOP rates, where time goes.

Utilization is counted two ways, side by side:

* **GraphCast's count** (`graphcast_flops`): the matrix-product FLOPs of the
  model as GraphCast writes it, every MLP on its concatenated inputs, fixed by
  the problem whatever an implementation does:

    interaction network, per edge set:  edge MLP  8 E d^2   ([edge, sender, receiver]
                                                             3d -> d -> d)
                                        node MLP  6 N d^2   ([node, sum] 2d -> d -> d)
    embedders, grid update, output:     2 rows (in d + d out) each (one hidden layer)
    a training step:                    3 x forward (the backward pass twice the forward),
                                        recomputation not counted

  divided by the step time and the chip's bfloat16 peak (`PEAK_BF16`). This is
  the figure to compare across implementations (and with GraphCast's code).
* **The hardware rate**: the FLOPs wnscale's step performs by the planner's
  count (`wnscale.planner.flops.step_flops`: its node-side projections of the
  edge MLP's first layer, recomputation included) per second. The products of
  the receiver-block aggregation (`wnscale.model.aggregation`) are not in it.

XLA's `cost_analysis()` is not used: it counts a scanned layer once.
"""

from __future__ import annotations

import statistics
import time

import jax

import op_profile
from wnscale.graphs.features import EDGE_FEATURES, NODE_FEATURES
from wnscale.planner import flops as flops_lib
from wnscale.planner import xla_stats
from wnscale import specs as specs_lib

# Dense bfloat16 matrix-product peak per chip (the vendors' figures), by `device_kind`.
PEAK_BF16 = {"TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v5": 459e12,
             "TPU v6 lite": 918e12, "TPU v6e": 918e12, "TPU v4": 275e12}


def peak_flops(device) -> float | None:
  """The device's bfloat16 peak FLOP/s, None where unknown (a CPU)."""
  return PEAK_BF16.get(device.device_kind)


def graphcast_flops(config, counts: dict) -> float:
  """GraphCast's FLOP count of one training step of `train.batch_size` examples (see the
  module doc).

  `counts`: the graphs' node and edge counts (`Graphs.counts()` of the global graphs).
  Defined for the interaction-network processor; the transformer's step is counted
  by the planner alone.
  """
  d = config.model.latent_size
  specs = specs_lib.from_config(config)
  grid, mesh = counts["grid_nodes"], counts["mesh_nodes"]
  mlp = lambda rows, inputs, outputs: 2.0 * rows * (inputs * d + d * outputs)
  network = lambda edges, receivers: 8.0 * edges * d * d + 6.0 * receivers * d * d
  forward = (
      mlp(grid, specs.data.input_channels + NODE_FEATURES, d)  # grid embedder
      + mlp(mesh, NODE_FEATURES + specs.data.global_channels, d)  # mesh embedder
      + mlp(counts["grid_to_mesh_edges"], EDGE_FEATURES, d)  # encoder edge embedder
      + network(counts["grid_to_mesh_edges"], mesh)
      + mlp(grid, d, d)  # the encoder's grid update
      + mlp(counts["mesh_edges"], EDGE_FEATURES, d)  # processor edge embedder
      + config.model.message_passing_steps * network(counts["mesh_edges"], mesh)
      + mlp(counts["mesh_to_grid_edges"], EDGE_FEATURES, d)  # decoder edge embedder
      + network(counts["mesh_to_grid_edges"], grid)
      + mlp(grid, d, len(specs.data.output_channels)))  # output MLP
  return 3.0 * forward * config.data.target_steps * config.train.batch_size


def hardware_flops(config, graphs) -> float:
  """The planner's count of a step of `train.batch_size` examples on one device: forward,
  backward and recomputation."""
  cost = flops_lib.step_flops(specs_lib.from_config(config), graphs, num_devices=1)
  return cost["model"] + cost["recompute"]


def measure(compiled, run, *, graphcast: float | None, hardware: float, timed: int = 5,
            times: list[float] | None = None, profile: bool = True) -> dict:
  """Figures of a compiled step: `run()` runs it once and blocks until it is done.

  Step times: `times` if given (e.g. measured alternately with another program),
  else one untimed run and `timed` timed ones; their median counts. Then (with
  `profile`) three runs under `jax.profiler`: seconds per step by op category and by
  model part, and the costliest ops (`op_profile`).
  """
  device = jax.devices()[0]
  if times is None:
    run()
    times = []
    for _ in range(timed):
      start = time.perf_counter()
      run()
      times.append(time.perf_counter() - start)
  seconds = statistics.median(times)
  stats = xla_stats.compiled_stats(compiled)
  measured = (device.memory_stats() or {}).get("peak_bytes_in_use")
  peak = peak_flops(device)
  figures = {
      "step_seconds": seconds, "step_seconds_all": times,
      "compiled_peak_gib": stats["peak_bytes"] / 2**30,
      "measured_peak_gib": None if measured is None else measured / 2**30,
      "graphcast_tflop": None if graphcast is None else graphcast / 1e12,
      "graphcast_utilization": (None if graphcast is None or peak is None
                                else graphcast / seconds / peak),
      "hardware_tflop": hardware / 1e12,
      "hardware_tflops_per_second": hardware / seconds / 1e12,
      "hardware_utilization": None if peak is None else hardware / seconds / peak,
  }
  if profile:
    seconds, _ = op_profile.profile(compiled, run, steps=3)
    by_category, by_part, ops = op_profile.breakdown(compiled, seconds, steps=3)
    figures.update(op_seconds=by_category, op_seconds_by_part=by_part,
                   device_seconds=sum(by_category.values()),
                   costliest_ops=[dict({key: op[key] for key in (
                       "op", "category", "seconds", "executions", "shape", "part")},
                       source=op["op_name"][-160:]) for op in ops[:60]])
  return figures


def describe(name: str, figures: dict) -> str:
  """One line of a step's figures."""
  parts = [f"{name}: {figures['step_seconds'] * 1e3:.2f} ms/step",
           f"peak {figures['compiled_peak_gib']:.2f} GiB compiled"]
  if figures.get("measured_peak_gib") is not None:
    parts.append(f"{figures['measured_peak_gib']:.2f} GiB measured")
  if figures.get("graphcast_utilization") is not None:
    parts.append(f"{100 * figures['graphcast_utilization']:.1f}% of peak by GraphCast's count "
                 f"({figures['graphcast_tflop']:.2f} TFLOP)")
  parts.append(f"hardware {figures['hardware_tflops_per_second']:.2f} TFLOP/s"
               + (f" ({100 * figures['hardware_utilization']:.1f}%)"
                  if figures.get("hardware_utilization") is not None else ""))
  line = ", ".join(parts)
  if "op_seconds" in figures:
    total = figures["device_seconds"] or 1.0
    shares = sorted(figures["op_seconds"].items(), key=lambda item: -item[1])
    line += (f"\n  traced ops {total * 1e3:.2f} ms: " + ", ".join(
        f"{name} {100 * seconds / total:.0f}%" for name, seconds in shares if seconds > 0))
  return line
