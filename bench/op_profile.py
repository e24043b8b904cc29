"""Where a compiled step's time goes: a `jax.profiler` trace, its ops' time by category.

  seconds, step_seconds = op_profile.profile(compiled, run, steps=2)
  by_category, by_part, ops = op_profile.breakdown(compiled, seconds, steps=2)

Each op the trace timed is an instruction of the compiled module (`compiled.as_text()`):
on a CPU, the events of XLA:CPU's thunks (`hlo_op`); on an accelerator, the events of
its device plane's "XLA Ops" line (a TPU names each by the instruction's whole text,
`%fusion.3 = ...`). An op's category (`CATEGORIES`) is read from the opcodes of the
instruction and of the computations it calls; a loop's own time is its own, its body's
ops count apart. The trace is read with `jax.profiler.ProfileData` (in jaxlib).
`bench/roofline.py` (the CPU's roofline) and `bench/step_figures.py` (the accelerator
check's figures) read their steps with it.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import tempfile
import time

import jax

from wnscale.planner import buffers

# Op categories, in the order an op is tested for them: a fusion that holds a dot is a dot,
# one that holds a scatter (and no dot) a scatter, and so on. "transpose/copy" is an op that
# only moves data (transposes, copies, broadcasts, slices, a scan's stacking); "Pallas
# kernel" a TPU custom call (e.g. `wnscale.model.fused_edges`); "other" is what is none of
# these, a loop's own time among them.
CATEGORIES = ("dot/conv", "scatter/segment sum", "gather", "reduce (layer norm, sums)",
              "transpose/copy", "fused elementwise", "Pallas kernel", "other")
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
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
# A TPU trace's event name: the instruction's text, `%name = ...` (or its name alone).
_EVENT_NAME = re.compile(r"^%?([\w.\-]+)(?: = |$)")


@dataclasses.dataclass
class Op:
  """One instruction of a compiled module.

  Attributes:
    opcode: e.g. `fusion`, `dot`, `while`.
    shape: its result, without layouts, e.g. `f32[6144,32]`.
    operands: its operands' names.
    called: the computations it calls (a fusion's body, a loop's body and condition).
    op_name: the JAX name stack of the operation that made it.
    target: a custom call's target (`tpu_custom_call`: a Pallas kernel), else "".
  """

  opcode: str
  shape: str
  operands: list[str]
  called: list[str]
  op_name: str
  target: str = ""


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
    target = _TARGET.search(rest)
    ops[match.group(1)] = Op(opcode.group(1) if opcode else "?", re.sub(r"\{[^}]*\}", "", shape),
                             re.findall(r"%([\w.\-]+)", call), called,
                             op_name.group(1) if op_name else "",
                             target.group(1) if target else "")
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


def category(opcodes: set, target: str = "") -> str:
  """The `CATEGORIES` entry of an op with these opcodes (its own and its fusion's) and
  custom call `target`."""
  if opcodes & _CONTROL:
    return "other"
  if target == "tpu_custom_call":
    return "Pallas kernel"
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

  Each op's own time: what ops nested in it on its line took (a loop's body) is taken
  out of it.
  """
  totals: dict[str, list] = {}
  planes = list(jax.profiler.ProfileData.from_file(xplane).planes)
  devices = [plane for plane in planes if plane.name.startswith("/device:")]
  for plane in devices or planes:
    for line in plane.lines:
      if devices and line.name != "XLA Ops":
        continue
      events = []
      for event in line.events:
        if devices:  # an accelerator's ops: the one program traced
          name = _EVENT_NAME.match(event.name)
          events.append((event.start_ns, event.start_ns + event.duration_ns,
                         name.group(1) if name else event.name))
          continue
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


def profile(compiled, run, steps: int) -> tuple[dict[str, tuple[float, int]], float]:
  """`(op_seconds, seconds per step)` of `steps` calls of `run()` (which runs `compiled` and
  blocks until it is done), traced with `jax.profiler` (the step's time without the
  trace's start and stop)."""
  module = compiled.as_text().split("\n", 1)[0].split()[1].rstrip(",")
  with tempfile.TemporaryDirectory(prefix="wnscale-trace-") as folder:
    with jax.profiler.trace(folder):
      start = time.perf_counter()
      for _ in range(steps):
        run()
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
    kind = category(kinds, op.target)
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
