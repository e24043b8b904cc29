"""What is alive at the peak of a compiled step, from XLA's own buffer assignment.

`compile_with_breakdown(lowered)` compiles with XLA's dumps switched on for that
compile only (`xla_dump_to`, a temporary folder), then reads two of the files
XLA writes:

* `*-live-range.txt`: each buffer's live range in the schedule (`BufferLiveRange`);
* `*-buffer-assignment.txt`: each buffer's size, memory space and place (allocation
  and offset). Only the device's own memory space (0) counts: a remat policy's
  offloaded values live in host memory (space 5) and TPU on-chip scratch has spaces
  of its own. One place can carry several names at once (a loop's own value and its
  body's parameter): it counts once;
* `*after_optimizations.txt`: the optimized HLO, which gives each buffer's
  shape and the JAX name stack of the operation that made it (`op_name`).

The peak is where the device-memory buffers live at one point of the schedule add
up to the most. (XLA's own "peak" in the live-range file mixes memory spaces, so a
step that offloads would show host buffers as if on the device.)

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
import numpy as np

# Named scopes of the model and train step, in the order a reader meets them.
PARTS = ("encoder", "processor", "decoder", "loss", "optimizer")
# A step argument's path prefix -> the part it is.
ARGUMENT_PARTS = (("state.params", "parameters"), ("state.opt_state", "optimizer state"),
                  ("state", "train state"), ("batch", "inputs"),
                  ("constants", "graphs and constants"), ("halo_indices", "graphs and constants"))

# An HLO text line `%name = <shape> <opcode>(...)...` (also read by bench/roofline.py).
INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$")
_LIVE_RANGE = re.compile(r"^\s+([\w.\-]+)\{([\d,]*)\}:(\d+)-(\d+)$")
OP_NAME = re.compile(r'op_name="([^"]*)"')
_ALLOCATION = re.compile(r"^allocation (\d+):")
_VALUE = re.compile(r"^ value: <\d+ ([\w.\-]+(?:\{[\d,]*\})?)(?: \(\w+\))? @(\d+)> "
                    r"\(size=(\d+),offset=(\d+)\)")
DEVICE_MEMORY_SPACE = 0


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
  """The device-memory buffers at the peak of the (largest) module XLA dumped into `folder`."""
  live_ranges = sorted(glob.glob(os.path.join(folder, "*after_optimizations-live-range.txt")),
                       key=os.path.getsize)
  if not live_ranges:
    raise ValueError(f"XLA wrote no buffer live ranges into {folder}.")
  live_range = live_ranges[-1]
  with open(live_range.replace("-live-range.txt", ".txt")) as f:
    instructions = _parse_instructions(f)
  with open(live_range.replace("-live-range.txt", "-buffer-assignment.txt")) as f:
    values = _device_values(f)
  with open(live_range) as f:
    ranges = _live_ranges(f)
  # Place in memory -> [(start, end, bytes, name, index)] of the values it holds.
  places: dict[tuple[int, int], list] = {}
  for name, index, start, end in ranges:
    if (value := values.get(_value_name(name, index))) is not None:
      place, size = value
      places.setdefault(place, []).append((start, end, size, name, index))
  peak = _peak_position(places)
  buffers = {}  # place in memory -> Buffer
  for place, held in places.items():
    for start, end, size, name, index in held:
      if not start <= peak <= end:
        continue
      shape, op_name = _describe(name, index, instructions)
      buffer = Buffer(size, shape, part_of(op_name), op_name)
      # One piece of memory named several ways: a step argument's name wins (the
      # memory is the argument's), then any name that says what made it.
      if place in buffers:
        best = min(buffers[place], buffer, key=_rank)
        buffer = dataclasses.replace(best, bytes=max(buffer.bytes, buffers[place].bytes))
      buffers[place] = buffer
  return sorted(buffers.values(), key=lambda b: -b.bytes)


def _peak_position(places) -> int:
  """The schedule position where the bytes held by all places add up to the most.

  A place's values whose live ranges overlap are one piece of memory then: their
  ranges are merged first, so each place counts once at any position.
  """
  starts, ends, sizes = [], [], []
  for held in places.values():
    merged = []  # [start, end, bytes], disjoint, in order
    for start, end, size, _, _ in sorted(held):
      if merged and start <= merged[-1][1]:
        merged[-1][1] = max(merged[-1][1], end)
        merged[-1][2] = max(merged[-1][2], size)
      else:
        merged.append([start, end, size])
    for start, end, size in merged:
      starts.append(start), ends.append(end), sizes.append(size)
  if not sizes:
    raise ValueError("XLA's dump lists no device-memory buffers.")
  starts, ends, sizes = np.array(starts), np.array(ends), np.array(sizes, np.int64)
  change = np.zeros(ends.max() + 2, np.int64)
  np.add.at(change, starts, sizes)
  np.add.at(change, ends + 1, -sizes)
  return int(np.argmax(np.cumsum(change)))


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


def _live_ranges(lines):
  """`(instruction, tuple index, start, end)` of each buffer in a live-range dump."""
  ranges, in_section = [], False
  for line in lines:
    if line.strip() == "BufferLiveRange:":
      in_section = True
      continue
    if in_section:
      match = _LIVE_RANGE.match(line)
      if not match:
        break
      index = tuple(int(i) for i in match.group(2).split(",") if i)
      ranges.append((match.group(1), index, int(match.group(3)), int(match.group(4))))
  return ranges


def _value_name(name: str, index: tuple[int, ...]) -> str:
  """A value's name as the buffer assignment writes it: `fusion.3`, `while.2{1}`."""
  return f"{name}{{{','.join(map(str, index))}}}" if index else name


def _device_values(lines) -> dict[str, tuple[tuple[int, int], int]]:
  """Value name -> ((allocation, offset), bytes) of the values in device memory, from a
  buffer-assignment dump (`value: <id name @memory_space> (size=...,offset=...)`)."""
  values, allocation = {}, None
  for line in lines:
    match = _ALLOCATION.match(line)
    if match:
      allocation = int(match.group(1))
      continue
    match = _VALUE.match(line)
    if match and allocation is not None and int(match.group(2)) == DEVICE_MEMORY_SPACE:
      values[match.group(1)] = ((allocation, int(match.group(4))), int(match.group(3)))
  return values


def _parse_instructions(lines) -> dict[str, tuple[str, list[str], str]]:
  """Instruction name -> (result shape, operand names, op_name) of an HLO module's text."""
  instructions = {}
  for line in lines:
    match = INSTRUCTION.match(line)
    if not match:
      continue
    rest = re.sub(r"/\*index=\d+\*/", "", match.group(2))
    shape, rest = split_shape(rest)
    call = rest[:closing(rest, rest.find("("))] if "(" in rest else ""
    operands = re.findall(r"%([\w.\-]+)", call)
    op_name = OP_NAME.search(rest)
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


def split_shape(text: str):
  """`("f32[3]{0}", " add(...)")` from an instruction's right-hand side."""
  if text.startswith("("):
    end = closing(text, 0) + 1
    return text[:end], text[end:]
  shape, _, rest = text.partition(" ")
  return shape, " " + rest


def closing(text: str, start: int) -> int:
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
