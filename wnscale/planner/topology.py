"""Target machines to plan for: TPU topologies for ahead-of-time compiles (via libtpu),
local CPU devices, or the devices of this run.

`--topology` strings: `v4:2x2x1`, `v5e:4x4`, `v5p:2x2x2`, `v6e:2x2`, ... (the
generation and the chip grid), or `cpu:N` for N local (fake) CPU devices. A target's
memory is what its devices let XLA use: a live device says (`memory_stats()`); for an
ahead-of-time target, `CHIP_MEMORY_BYTES`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re

import jax

from wnscale.errors import UserError

GIB = 2**30
# Device memory per chip, bytes, for ahead-of-time targets (no device to ask). v5e: its
# `memory_stats()["bytes_limit"]` (15.75 GiB of its 16 GiB of HBM), measured on a v5e
# chip, jax 0.10.2. The others: their HBM as specified (not measured here); a live
# device's own figure is used wherever there is one (`live_target`).
CHIP_MEMORY_BYTES = {"v4": 32 * GIB, "v5e": 16_909_336_064, "v5p": 95 * GIB, "v6e": 32 * GIB,
                     "TPU7x": 192 * GIB}
_EXAMPLES = "v5e:2x2, v5e:4x4, v4:2x2x1, v4:2x2x2, v5p:2x2x2, v6e:2x2, TPU7x:2x2x1"


@dataclasses.dataclass(frozen=True)
class Target:
  """Devices to compile for.

  Attributes:
    name: the topology string.
    devices: the (possibly abstract) devices, one per mesh position.
    device_memory_bytes: memory of one device, or None if unknown.
  """

  name: str
  devices: tuple
  device_memory_bytes: int | None


def host_memory_bytes() -> int:
  """This machine's RAM."""
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def live_target() -> Target:
  """This run's devices (every process's), with the memory the first one lets XLA use:
  its `memory_stats()["bytes_limit"]`; fake CPU devices, which report none, share this
  host's RAM among the process's devices."""
  devices = jax.devices()
  memory = (devices[0].memory_stats() or {}).get("bytes_limit")
  if memory is None and devices[0].platform == "cpu":
    memory = host_memory_bytes() // jax.local_device_count()
  return Target(f"{devices[0].platform}:{len(devices)}", tuple(devices), memory)


def resolve(topology: str) -> Target:
  """The devices and per-device memory of `topology`; a clear error for a bad name."""
  cpu = re.fullmatch(r"cpu:(\d+)", topology)
  if cpu:
    count = int(cpu.group(1))
    devices = jax.devices("cpu")
    if len(devices) < count:
      raise UserError(f"Topology {topology!r} needs {count} CPU devices, this process has "
                      f"{len(devices)} (set jax_num_cpu_devices before JAX starts).")
    # Fake CPU devices share the host's memory.
    return Target(topology, tuple(devices[:count]), host_memory_bytes() // count)
  tpu = re.fullmatch(r"(v4|v5e|v5p|v6e|TPU7x):(\d+(?:x\d+){1,2})", topology)
  if not tpu:
    raise UserError(f"Unknown topology {topology!r}: name a TPU slice <generation>:<chip grid> "
                    f"with generation one of {', '.join(CHIP_MEMORY_BYTES)} (e.g. {_EXAMPLES}), "
                    "or cpu:N for N local CPU devices.")
  if importlib.util.find_spec("libtpu") is None:
    raise UserError(f"TPU topology {topology!r} needs the libtpu wheel: "
                    "pip install -e '.[tpu]'.")
  try:
    from jax.experimental import topologies
    description = topologies.get_topology_desc(topology_name=topology, platform="tpu")
  except Exception as error:  # libtpu refuses the chip grid
    reason = (str(error).splitlines() or [repr(error)])[0]
    raise UserError(f"libtpu has no TPU slice {topology!r} ({reason}); valid names include "
                    f"{_EXAMPLES}.") from error
  devices = tuple(description.devices)
  chips = math.prod(int(n) for n in tpu.group(2).split("x"))
  # v4 topologies expose both TensorCores of a chip, each with half its memory.
  per_chip = max(1, len(devices) // chips)
  return Target(topology, devices, CHIP_MEMORY_BYTES[tpu.group(1)] // per_chip)
