"""Target machines for ahead-of-time compiles: TPU topologies (via libtpu) or local CPU devices.

`--topology` strings: `v4:2x2x1`, `v5e:4x4`, `v5p:2x2x2`, `v6e:2x2`, ... (the
generation and the chip grid), or `cpu:N` for N local (fake) CPU devices.
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
# HBM per chip, GiB.
CHIP_MEMORY_GIB = {"v4": 32, "v5e": 16, "v5p": 95, "v6e": 32, "TPU7x": 192}
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
                    f"with generation one of {', '.join(CHIP_MEMORY_GIB)} (e.g. {_EXAMPLES}), "
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
  return Target(topology, devices, CHIP_MEMORY_GIB[tpu.group(1)] * GIB // per_chip)
