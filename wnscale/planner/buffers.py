"""What is alive at the peak of a compiled step, from XLA's own buffer assignment.

`compile_with_breakdown(lowered)` compiles with XLA's dumps switched on for that
compile only (`xla_dump_to`, a temporary folder), then reads two of the files
XLA writes:

* `*-live-range.txt`: the buffers live at the peak of the buffer assignment
  ("Live ranges at N (peak):"), each with its size;
* `*-buffer-assignment.txt`: where each buffer lives (allocation and offset):
  the live-range list names a loop's buffers twice (the loop's own value and
  its body's parameter, one piece of memory), so buffers at the same place
  count once;
* `*after_optimizations.txt`: the optimized HLO, which gives each buffer's
  shape and the JAX name stack of the operation that made it (`op_name`).

The peak of this HLO-level analysis is close to, not equal to, the peak the
compiler reports (`memory_analysis()`): TPU compilers move buffers between
memory spaces after it. It says what the bytes are, the report says how many.

The name stack says which part of the model made a buffer: the model and the
train step open named scopes (`encoder`, `processor`, `decoder`, `loss`,
`optimizer`), a backward value carries `transpose(...)`, and the step's own
arguments carry their argument path (`state.params...`, `batch[...]`). The
same dumps exist for TPU topologies (compiled ahead of time) and CPU.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import tempfile

import jax

# Named scopes of the model and train step, in the order a reader meets them.
PARTS = ("encoder", "processor", "decoder", "loss", "optimizer")
# A step argument's path prefix -> the part it is.
ARGUMENT_PARTS = (("state.params", "parameters"), ("state.opt_state", "optimizer state"),
                  ("state", "train state"), ("batch", "inputs"),
                  ("constants", "graphs and constants"), ("halo_indices", "graphs and constants"))

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$")
_LIVE_AT_PEAK = re.compile(r"^\s+([\w.\-]+)\{([\d,]*)\}: (\d+) bytes")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_ALLOCATION = re.compile(r"^allocation (\d+):")
_VALUE = re.compile(
    r"^ value: <\d+ ([\w.\-]+(?:\{[\d,]*\})?)(?: \(\w+\))? @\d+> \(size=\d+,offset=(\d+)\)")


@dataclasses.dataclass(frozen=True)
class Buffer:
  """One buffer live at the peak.

  Attributes:
    bytes: its size.
    shape: dtype and dimensions, e.g. `bf16[1038240,512]`.
    part: what made it (`encoder`, `processor (backward)`, `inputs`, ...).
    op_name: the JAX name stack of the operation that made it ('' if none).
  """

  bytes: int
  shape: str
  part: str
  op_name: str


def compile_with_breakdown(lowered: jax.stages.Lowered):
  """`(compiled, buffers live at the peak, largest first)` of `lowered`.

  When the compiler refuses the program (a TPU compile-time out-of-memory), its
  buffer assignment was still dumped: the error is raised with the peak buffers
  attached as `error.peak_buffers`, since that is when they matter most.
  """
  with tempfile.TemporaryDirectory(prefix="wnscale-xla-dump-") as folder:
    try:
      compiled = lowered.compile(compiler_options={"xla_dump_to": folder,
                                                   "xla_dump_hlo_as_text": True})
    except jax.errors.JaxRuntimeError as error:
      try:
        error.peak_buffers = read_peak_buffers(folder)
      except (OSError, ValueError):
        pass  # nothing dumped: the error as it is
      raise
    return compiled, read_peak_buffers(folder)


def read_peak_buffers(folder: str) -> list[Buffer]:
  """The peak buffers of the (largest) module XLA dumped into `folder`."""
  live_ranges = sorted(glob.glob(os.path.join(folder, "*after_optimizations-live-range.txt")),
                       key=os.path.getsize)
  if not live_ranges:
    raise ValueError(f"XLA wrote no buffer live ranges into {folder}.")
  live_range = live_ranges[-1]
  with open(live_range.replace("-live-range.txt", ".txt")) as f:
    instructions = _parse_instructions(f)
  with open(live_range.replace("-live-range.txt", "-buffer-assignment.txt")) as f:
    places = _places(f)
  with open(live_range) as f:
    peak = _peak_entries(f)
  buffers = {}  # place in memory -> Buffer
  for name, index, size in peak:
    shape, op_name = _describe(name, index, instructions)
    buffer = Buffer(size, shape, part_of(op_name), op_name)
    place = places.get(_value_name(name, index), name + str(index))
    # One piece of memory named several ways: a step argument's name wins (the
    # memory is the argument's), then any name that says what made it.
    if place not in buffers or _rank(buffer) < _rank(buffers[place]):
      buffers[place] = buffer
  return sorted(buffers.values(), key=lambda b: -b.bytes)


def part_of(op_name: str) -> str:
  """The model part a JAX name stack belongs to (see the module docstring)."""
  for prefix, part in ARGUMENT_PARTS:
    if op_name == prefix or op_name.startswith((prefix + ".", prefix + "[")):
      return part
  scopes = op_name.split("/")
  for part in PARTS:
    for scope in scopes:
      if re.search(rf"(^|\(){part}(\)|$)", scope):
        return f"{part} (backward)" if "transpose(" in op_name else part
  return "other"


def _rank(buffer: Buffer) -> int:
  if buffer.part in dict(ARGUMENT_PARTS).values():
    return 0
  return 2 if buffer.part == "other" else 1


def summarize(buffers: list[Buffer]) -> dict[str, int]:
  """Bytes at the peak per part, largest first."""
  totals: dict[str, int] = {}
  for buffer in buffers:
    totals[buffer.part] = totals.get(buffer.part, 0) + buffer.bytes
  return dict(sorted(totals.items(), key=lambda item: -item[1]))


def _peak_entries(lines):
  """`(instruction, tuple index, bytes)` of each buffer listed at the peak."""
  entries, in_peak = [], False
  for line in lines:
    if line.strip().startswith("Live ranges at") and "(peak)" in line:
      in_peak = True
      continue
    if in_peak:
      match = _LIVE_AT_PEAK.match(line)
      if not match:
        break
      index = tuple(int(i) for i in match.group(2).split(",") if i)
      entries.append((match.group(1), index, int(match.group(3))))
  return entries


def _value_name(name: str, index: tuple[int, ...]) -> str:
  """A value's name as the buffer assignment writes it: `fusion.3`, `while.2{1}`."""
  return f"{name}{{{','.join(map(str, index))}}}" if index else name


def _places(lines) -> dict[str, tuple[int, int]]:
  """Value name -> (allocation, offset) from a buffer-assignment dump."""
  places, allocation = {}, None
  for line in lines:
    match = _ALLOCATION.match(line)
    if match:
      allocation = int(match.group(1))
      continue
    match = _VALUE.match(line)
    if match and allocation is not None:
      places[match.group(1)] = (allocation, int(match.group(2)))
  return places


def _parse_instructions(lines) -> dict[str, tuple[str, list[str], str]]:
  """Instruction name -> (result shape, operand names, op_name) of an HLO module's text."""
  instructions = {}
  for line in lines:
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    rest = re.sub(r"/\*index=\d+\*/", "", match.group(2))
    shape, rest = _split_shape(rest)
    call = rest[:_closing(rest, rest.find("("))] if "(" in rest else ""
    operands = re.findall(r"%([\w.\-]+)", call)
    op_name = _OP_NAME.search(rest)
    instructions[match.group(1)] = (shape, operands, op_name.group(1) if op_name else "")
  return instructions


def _describe(name, index, instructions, depth: int = 0):
  """`(shape, op_name)` of a buffer; an instruction without an op_name (a copy, a
  bitcast) takes its operands' (depth-limited)."""
  shape, operands, op_name = instructions.get(name, ("?", [], ""))
  for i in index:
    shape = _tuple_elements(shape)[i] if shape.startswith("(") else shape
  shape = re.sub(r"\{[^}]*\}", "", shape)  # layouts
  if not op_name and depth < 8:
    for operand in operands:
      _, op_name = _describe(operand, (), instructions, depth + 1)
      if op_name:
        break
  return shape, op_name


def _split_shape(text: str):
  """`("f32[3]{0}", " add(...)")` from an instruction's right-hand side."""
  if text.startswith("("):
    end = _closing(text, 0) + 1
    return text[:end], text[end:]
  shape, _, rest = text.partition(" ")
  return shape, " " + rest


def _closing(text: str, start: int) -> int:
  """Index of the parenthesis closing the one at `start`."""
  depth = 0
  for position in range(start, len(text)):
    depth += {"(": 1, ")": -1}.get(text[position], 0)
    if depth == 0:
      return position
  return len(text)


def _tuple_elements(shape: str) -> list[str]:
  """Top-level elements of a tuple shape `(a, (b, c), d)`."""
  elements, depth, current = [], 0, ""
  for char in shape[1:-1]:
    if char == "," and depth == 0:
      elements.append(current.strip())
      current = ""
      continue
    depth += {"(": 1, ")": -1, "{": 1, "}": -1, "[": 1, "]": -1}.get(char, 0)
    current += char
  return elements + [current.strip()] if current.strip() else elements
