"""Where the train step's time goes: its FLOP/s and bytes/s against this machine's limits, and
its time by op category from a profile.

  python bench/roofline.py [--size=mid --repeats=3 --profile_steps=2]

The step is the one `bench/reference_speed.py` times (the loss and its gradients, jitted, on
a random batch; the optimizer's update is left out), of `--size`: `mid` is
`configs/mid_1p0.py` (1 deg grid with poles, mesh levels 0..5, latent 128, 8
message-passing steps, float32, batch 1, no remat), `tiny` is `configs/tiny.py` (well under
a minute). In one run it measures:

* the step time: the median of `--repeats` steps after a warm-up;
* the step's FLOPs, by the planner's count (`planner.flops`), and its bytes accessed, by
  XLA's (`cost_analysis()`). XLA counts a scan's body once, not once per iteration (its
  FLOPs are printed too, to show by how much), so the bytes are a lower bound;
* this machine's matmul peak (`jnp.dot` of `--matmul_size` square matrices, float32 and
  bfloat16) and memory bandwidth (`x + 1` on `--bandwidth_mib` of float32: bytes read and
  written over time), each the best of several runs after a warm-up;
* the achieved fractions: FLOP/s over the float32 peak (the step is float32) and bytes/s
  over the bandwidth;
* from a `jax.profiler` trace of `--profile_steps` steps: the time of each compiled op
  (XLA:CPU's thunks; a loop's time is its own, its body's ops count apart), by category
  (`CATEGORIES`), and the 10 costliest ops with their shapes and the model part that made
  them, and the time by model part and category. XLA:CPU runs independent ops at once,
  each timed whole, so the traced ops can add up to more than the step. The trace has a
  cost of its own: the profiled step is printed next to the timed one (on the mid problem,
  about 1.05x at a load average of 3.6, 1.4x at 8.7); where it is much slower, the shares are
  those of a slowed step.

The trace is read by `bench/op_profile.py` (`jax.profiler.ProfileData`, in jaxlib): nothing
beyond the project's dependencies. One JSON line per run is appended to `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import mid_problem  # noqa: E402
import op_profile  # noqa: E402
from mid_problem import problems  # noqa: E402
from wnscale import config as config_lib  # noqa: E402
from wnscale import specs as specs_lib  # noqa: E402
from wnscale.graphs import points as points_lib  # noqa: E402
from wnscale.model import setup  # noqa: E402
from wnscale.planner import flops as flops_lib  # noqa: E402

SIZES = {"tiny": os.path.join(mid_problem.REPO, "configs", "tiny.py"), "mid": mid_problem.CONFIG}
RESULTS = os.path.join(mid_problem.REPO, "bench", "results", "roofline_cpu.jsonl")

def timed(run, repeats: int) -> list[float]:
  """Seconds of each of `repeats` calls of `run`, after one untimed (it compiles, warms up)."""
  run()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  return times


def matmul_peak(size: int, dtype, repeats: int = 5) -> float:
  """FLOP/s of a jitted `jnp.dot` of two `size` x `size` matrices of `dtype`."""
  a = jax.random.normal(jax.random.key(0), (size, size), dtype)
  b = jax.random.normal(jax.random.key(1), (size, size), dtype)
  dot = jax.jit(jnp.dot)
  return 2 * size**3 / min(timed(lambda: jax.block_until_ready(dot(a, b)), repeats))


def memory_bandwidth(num_bytes: int, repeats: int = 5) -> float:
  """Bytes/s of a jitted `x + 1` on `num_bytes` of float32 (read once, written once).

  The input is donated and the output fed back: a fresh output buffer per call would time
  the kernel's page faults, not the memory.
  """
  add = jax.jit(lambda x: x + 1, donate_argnums=0)
  state = [jnp.zeros(num_bytes // 4, jnp.float32)]

  def run():
    state[0] = jax.block_until_ready(add(state[0]))

  return 2 * (num_bytes // 4) * 4 / min(timed(run, repeats))


def problem(size: str):
  """`(config, points)` of a `--size`."""
  config = config_lib.validate(config_lib.load(SIZES[size]))
  return config, points_lib.standard("", config.data.resolution)


def measure(size: str, config, points, repeats: int = 3, profile_steps: int = 2,
            matmul_size: int = 2048, bandwidth_mib: int = 256) -> dict:
  """Everything the module docstring lists, as one dict, for the problem named `size`:
  `config` on the grid `points` (`problem(size)`)."""
  specs = specs_lib.from_config(config)
  graphs = setup.graphs_for_grid(specs.model, points)
  planner_flops = flops_lib.step_flops(specs, graphs, 1)
  constants, batch, params = jax.device_put(problems.synthetic_problem(config, points, 1))
  step = jax.jit(lambda p, c, b: problems.loss_and_grad_fn(config, c, b)(p))
  start = time.perf_counter()
  compiled = step.lower(params, constants, batch).compile()
  compile_seconds = time.perf_counter() - start
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  args = (params, constants, batch)
  times = timed(lambda: jax.block_until_ready(compiled(*args)), repeats)
  seconds, profiled_step = op_profile.profile(
      compiled, lambda: jax.block_until_ready(compiled(*args)), profile_steps)
  by_category, by_part, ops = op_profile.breakdown(compiled, seconds, profile_steps)
  peaks = {"float32": matmul_peak(matmul_size, jnp.float32),
           "bfloat16": matmul_peak(matmul_size, jnp.bfloat16)}
  bandwidth = memory_bandwidth(bandwidth_mib * 2**20)
  step_seconds = statistics.median(times)
  flop = planner_flops["model"] + planner_flops["recompute"]
  m = config.model
  return {
      "size": size, "grid": points.name, "mesh_levels": m.mesh_levels,
      "latent": m.latent_size, "message_passing_steps": m.message_passing_steps,
      "dtype": m.dtype, "jax": jax.__version__, "platform": jax.devices()[0].platform,
      "cpus": os.cpu_count(), "load_average": os.getloadavg()[0],
      "host_pages": mid_problem.host_pages(),
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "compile_seconds": round(compile_seconds, 1), "step_seconds": step_seconds,
      "step_times": times, "profiled_step_seconds": profiled_step,
      "flops": flop, "xla_flops": float(cost.get("flops", 0.0)),
      "bytes": float(cost.get("bytes accessed", 0.0)),
      "matmul_peak": peaks, "matmul_size": matmul_size, "bandwidth": bandwidth,
      "flop_fraction": flop / step_seconds / peaks["float32"],
      "bandwidth_fraction": float(cost.get("bytes accessed", 0.0)) / step_seconds / bandwidth,
      "seconds_by_category": by_category, "seconds_by_part": by_part,
      "costliest_ops": ops[:10],
  }


def table(report: dict) -> str:
  """The printed report: the roofline figures, time by category, the 10 costliest ops."""
  r = report
  step = r["step_seconds"]
  lines = [
      f"{r['size']}: {r['grid']}, mesh levels 0..{r['mesh_levels']}, latent {r['latent']}, "
      f"{r['message_passing_steps']} steps, {r['dtype']}, batch 1, no remat; jax {r['jax']}, "
      f"{r['platform']}, {r['cpus']} cores, load average {r['load_average']:.2f}, "
      f"{r['host_pages']}"
      + (f", XLA_FLAGS={r['xla_flags']}" if r["xla_flags"] else ""),
      f"step (loss + gradients): median {step:.3f} s of "
      + " ".join(f"{t:.3f}" for t in r["step_times"])
      + f"; compile {r['compile_seconds']} s",
      "",
      f"{'':<24}{'per step':>14}{'achieved':>16}{'machine':>18}{'fraction':>10}",
      f"{'FLOPs (planner)':<24}{r['flops'] / 1e9:>9.2f} GFLOP{r['flops'] / step / 1e9:>9.2f} "
      f"GFLOP/s{r['matmul_peak']['float32'] / 1e9:>10.1f} GFLOP/s{r['flop_fraction']:>10.3f}"
      f"   (float32 jnp.dot {r['matmul_size']}^2)",
      f"{'':<24}{'':>14}{'':>16}{r['matmul_peak']['bfloat16'] / 1e9:>10.1f} GFLOP/s"
      f"{r['flops'] / step / r['matmul_peak']['bfloat16']:>10.3f}   (bfloat16 jnp.dot)",
      f"{'bytes (XLA)':<24}{r['bytes'] / 1e9:>10.2f} GB{r['bytes'] / step / 1e9:>12.2f} GB/s"
      f"{r['bandwidth'] / 1e9:>13.1f} GB/s{r['bandwidth_fraction']:>10.3f}   (x + 1, "
      "read + written)",
      f"{'FLOPs (XLA, scan once)':<24}{r['xla_flops'] / 1e9:>9.2f} GFLOP"
      f"   planner / XLA {r['flops'] / max(r['xla_flops'], 1):.2f}: XLA's bytes undercount "
      "the scanned processor alike",
      "",
  ]
  traced = sum(r["seconds_by_category"].values())
  short = ("dot", "scatter", "gather", "reduce", "transpose", "elementwise", "Pallas", "other")
  lines.append(f"{'op category':<28}{'s / step':>10}{'share':>8}")
  for name, seconds in r["seconds_by_category"].items():
    lines.append(f"{name:<28}{seconds:>10.3f}{seconds / traced:>8.1%}")
  lines.append(f"{'traced ops':<28}{traced:>10.3f}   (ops run at once count each)")
  slowdown = r["profiled_step_seconds"] / step
  lines.append(f"profiled step {r['profiled_step_seconds']:.3f} s, {slowdown:.2f}x the timed step"
               + (": the shares are those of a step the trace slowed" if slowdown > 1.2
                  else ""))
  lines += ["", f"{'s / step by part':<22}" + "".join(f"{name:>11}" for name in short)]
  for part, row in r["seconds_by_part"].items():
    lines.append(f"{part:<22}" + "".join(f"{seconds:>11.3f}" for seconds in row.values()))
  lines += ["", "10 costliest ops (s / step, share of traced, runs / step, part, op, holds, "
            "shape <- operands)"]
  for op in r["costliest_ops"]:
    operands = ", ".join(op["operands"])
    lines.append(f"{op['seconds']:>8.3f}{op['seconds'] / traced:>7.1%}{op['executions']:>5.0f}  "
                 f"{op['category']:<26}{op['part']:<22}{op['op']:<40}"
                 f"{'+'.join(op['holds']) or '-':<16}{op['shape']} <- {operands[:100]}")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--size", default="mid", help=f"one of {', '.join(SIZES)}")
  parser.add_argument("--repeats", type=int, default=3, help="timed steps after a warm-up")
  parser.add_argument("--profile_steps", type=int, default=2, help="steps traced")
  parser.add_argument("--matmul_size", type=int, default=2048, help="the peak's square matrices")
  parser.add_argument("--bandwidth_mib", type=int, default=256, help="the bandwidth's array")
  parser.add_argument("--out", default=RESULTS, help="results file (one JSON line appended)")
  args = parser.parse_args(argv)
  if args.size not in SIZES or min(args.repeats, args.profile_steps, args.matmul_size,
                                   args.bandwidth_mib) < 1:
    parser.error(f"--size takes {', '.join(SIZES)} (got {args.size}); --repeats, "
                 "--profile_steps, --matmul_size and --bandwidth_mib at least 1")
  report = measure(args.size, *problem(args.size), args.repeats, args.profile_steps,
                   args.matmul_size, args.bandwidth_mib)
  print(table(report), flush=True)
  if args.out:
    with open(args.out, "a") as f:
      f.write(json.dumps(report) + "\n")


if __name__ == "__main__":
  sys.exit(main())
