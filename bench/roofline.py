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

The trace is read with `jax.profiler.ProfileData` (in jaxlib): nothing beyond the project's
dependencies. One JSON line per run is appended to `--out`.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import re
import statistics
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import mid_problem  # noqa: E402
from mid_problem import problems  # noqa: E402
from wnscale import config as config_lib  # noqa: E402
from wnscale import specs as specs_lib  # noqa: E402
from wnscale.graphs import points as points_lib  # noqa: E402
from wnscale.model import setup  # noqa: E402
from wnscale.planner import buffers  # noqa: E402
from wnscale.planner import flops as flops_lib  # noqa: E402

SIZES = {"tiny": os.path.join(mid_problem.REPO, "configs", "tiny.py"), "mid": mid_problem.CONFIG}
RESULTS = os.path.join(mid_problem.REPO, "bench", "results", "roofline_cpu.jsonl")

# Op categories, in the order an op is tested for them: a fusion that holds a dot is a dot,
# one that holds a scatter (and no dot) a scatter, and so on. "transpose/copy" is an op that
# only moves data (transposes, copies, broadcasts, slices, a scan's stacking); "other" is
# what is none of these, a loop's own time among them.
CATEGORIES = ("dot/conv", "scatter/segment sum", "gather", "reduce (layer norm, sums)",
              "transpose/copy", "fused elementwise", "other")
_DOTS = {"dot", "convolution"}
_REDUCES = {"reduce", "reduce-window"}
_MOVES = {"copy", "transpose", "bitcast", "reshape", "broadcast", "slice", "dynamic-slice",
          "dynamic-update-slice", "concatenate", "pad", "reverse", "iota", "parameter",
          "constant", "tuple", "get-tuple-element", "copy-start", "copy-done"}
_CONTROL = {"while", "conditional", "call"}
_OPCODE = re.compile(r"\s*([\w\-]+)\(")
_CALLED = re.compile(r"\b(?:calls|to_apply|body|condition)=%([\w.\-]+)")
_CALLED_LISTS = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%([\w.\-]+) .*\{$")


@dataclasses.dataclass
class Op:
  """One instruction of a compiled module.

  Attributes:
    opcode: e.g. `fusion`, `dot`, `while`.
    shape: its result, without layouts, e.g. `f32[6144,32]`.
    operands: its operands' names.
    called: the computations it calls (a fusion's body, a loop's body and condition).
    op_name: the JAX name stack of the operation that made it.
  """

  opcode: str
  shape: str
  operands: list[str]
  called: list[str]
  op_name: str


def parse_module(text: str) -> tuple[dict[str, Op], dict[str, list[str]]]:
  """`(instructions by name, each computation's instruction names)` of an HLO module's text
  (`compiled.as_text()`)."""
  ops, computations, current = {}, {}, None
  for line in text.splitlines():
    header = _COMPUTATION.match(line)
    if header:
      current = computations.setdefault(header.group(1), [])
      continue
    match = buffers.INSTRUCTION.match(line)
    if not match or current is None:
      continue
    rest = re.sub(r"/\*index=\d+\*/", "", match.group(2))
    shape, rest = buffers.split_shape(rest)
    opcode = _OPCODE.match(rest)
    call = rest[:buffers.closing(rest, rest.find("("))] if "(" in rest else ""
    called = _CALLED.findall(rest) + [name.strip().lstrip("%") for names in
                                      _CALLED_LISTS.findall(rest) for name in names.split(",")]
    op_name = buffers.OP_NAME.search(rest)
    ops[match.group(1)] = Op(opcode.group(1) if opcode else "?", re.sub(r"\{[^}]*\}", "", shape),
                             re.findall(r"%([\w.\-]+)", call), called,
                             op_name.group(1) if op_name else "")
    current.append(match.group(1))
  return ops, computations


def opcodes_within(name: str, ops: dict[str, Op], computations: dict[str, list[str]]) -> set:
  """The opcodes of instruction `name` and of everything in the computations it calls (a
  loop's body excepted: its ops run, and are timed, on their own)."""
  op = ops[name]
  found = {op.opcode}
  if op.opcode in _CONTROL:
    return found
  pending, seen = list(op.called), set()
  while pending:
    computation = pending.pop()
    if computation in seen:
      continue
    seen.add(computation)
    for inner in computations.get(computation, ()):
      found.add(ops[inner].opcode)
      pending.extend(ops[inner].called)
  return found


def category(opcodes: set) -> str:
  """The `CATEGORIES` entry of an op with these opcodes (its own and its fusion's)."""
  if opcodes & _CONTROL:
    return "other"
  if opcodes & _DOTS or any("matmul" in o for o in opcodes):
    return "dot/conv"
  if "scatter" in opcodes:
    return "scatter/segment sum"
  if "gather" in opcodes:
    return "gather"
  if opcodes & _REDUCES:
    return "reduce (layer norm, sums)"
  if opcodes <= _MOVES | {"fusion"}:
    return "transpose/copy"
  if opcodes & {"custom-call", "sort", "rng", "rng-bit-generator", "all-reduce", "infeed",
                "outfeed", "send", "recv", "after-all"}:
    return "other"
  return "fused elementwise"


def op_seconds(xplane: str, module: str) -> dict[str, tuple[float, int]]:
  """`{op name: (seconds, executions)}` of HLO module `module` in a profile (`.xplane.pb`).

  Each op's own time: what ops nested in it on its thread took (a loop's body) is taken
  out of it.
  """
  totals: dict[str, list] = {}
  for plane in jax.profiler.ProfileData.from_file(xplane).planes:
    for line in plane.lines:
      events = []
      for event in line.events:
        stats = dict(event.stats)
        if stats.get("hlo_module") == module and "hlo_op" in stats:
          events.append((event.start_ns, event.start_ns + event.duration_ns, stats["hlo_op"]))
      events.sort(key=lambda e: (e[0], -e[1]))
      stack = []  # [end, name, own ns] of the enclosing events
      for start, end, name in events:
        while stack and stack[-1][0] <= start:
          _close(stack.pop(), totals)
        if stack:
          stack[-1][2] -= end - start
        stack.append([end, name, end - start])
      while stack:
        _close(stack.pop(), totals)
  return {name: (ns / 1e9, count) for name, (ns, count) in totals.items()}


def _close(entry, totals):
  _, name, own = entry
  total = totals.setdefault(name, [0.0, 0])
  total[0] += own
  total[1] += 1


def profile(compiled, args, steps: int) -> tuple[dict[str, tuple[float, int]], float]:
  """`(op_seconds, seconds per step)` of `steps` runs of `compiled(*args)`, traced with
  `jax.profiler` (the step's time without the trace's start and stop)."""
  module = compiled.as_text().split("\n", 1)[0].split()[1].rstrip(",")
  with tempfile.TemporaryDirectory(prefix="wnscale-roofline-") as folder:
    with jax.profiler.trace(folder):
      start = time.perf_counter()
      for _ in range(steps):
        jax.block_until_ready(compiled(*args))
      step_seconds = (time.perf_counter() - start) / steps
    xplanes = glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)
    if not xplanes:
      raise RuntimeError(f"jax.profiler wrote no .xplane.pb into {folder}.")
    return op_seconds(xplanes[0], module), step_seconds


def breakdown(compiled, seconds: dict[str, tuple[float, int]], steps: int):
  """`(seconds per step by category, by model part and category, the ops costliest first)`
  of a profile (`op_seconds`); each op a dict of its name, category, seconds and executions
  per step, shape, operand shapes and model part."""
  ops, computations = parse_module(compiled.as_text())
  by_category = dict.fromkeys(CATEGORIES, 0.0)
  by_part: dict[str, dict[str, float]] = {}
  rows = []
  for name, (total, count) in seconds.items():
    op = ops.get(name, Op("?", "?", [], [], ""))  # (every traced op has been in the text)
    kinds = opcodes_within(name, ops, computations) if name in ops else {"?"}
    kind = category(kinds)
    part = model_part(op.op_name)
    by_category[kind] += total / steps
    part_row = by_part.setdefault(part, dict.fromkeys(CATEGORIES, 0.0))
    part_row[kind] += total / steps
    rows.append({"op": name, "category": kind, "seconds": total / steps,
                 "executions": count / steps, "shape": op.shape,
                 "operands": [ops[o].shape for o in op.operands if o in ops],
                 "holds": sorted(kinds & (_DOTS | {"gather", "scatter", "reduce", "transpose"})),
                 "part": part, "op_name": op.op_name})
  by_part = dict(sorted(by_part.items(), key=lambda item: -sum(item[1].values())))
  return by_category, by_part, sorted(rows, key=lambda r: -r["seconds"])


def model_part(op_name: str) -> str:
  """The model part (`buffers.part_of`) of an op's JAX name stack, its `jit(...)` root cut."""
  return buffers.part_of(op_name.split("/", 1)[1] if op_name.startswith("jit(") and "/" in op_name
                         else op_name)


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
  planner_flops = flops_lib.step_flops(config, graphs, 1)
  constants, batch, params = jax.device_put(problems.synthetic_problem(config, points, 1))
  step = jax.jit(lambda p, c, b: problems.loss_and_grad_fn(config, c, b)(p))
  start = time.perf_counter()
  compiled = step.lower(params, constants, batch).compile()
  compile_seconds = time.perf_counter() - start
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  args = (params, constants, batch)
  times = timed(lambda: jax.block_until_ready(compiled(*args)), repeats)
  seconds, profiled_step = profile(compiled, args, profile_steps)
  by_category, by_part, ops = breakdown(compiled, seconds, profile_steps)
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
  short = ("dot", "scatter", "gather", "reduce", "transpose", "elementwise", "other")
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
