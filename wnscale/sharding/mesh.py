"""The device mesh: axis names, defined once, and its construction from a `MeshSpec`.

`data` splits the batch; `graph` splits space (grid nodes, mesh nodes, edges).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from wnscale.errors import UserError
from wnscale.specs import MeshSpec

DATA = "data"
GRAPH = "graph"
AXES = (DATA, GRAPH)


def mesh_shape(mesh: MeshSpec, num_devices: int,
               platform: str | None = None) -> tuple[int, int]:
  """`(data, graph)` sizes; -1 takes the devices left over. A clear error if they don't fit.

  `platform` ("cpu", "tpu", ...) only shapes the advice in that error.
  """
  data, graph = mesh.data, mesh.graph
  if data == -1 or graph == -1:
    fixed = graph if data == -1 else data
    if num_devices % fixed:
      raise UserError(f"mesh: {num_devices} devices cannot be split into groups of {fixed} "
                      f"(mesh.data={data}, mesh.graph={graph}).{_advice(fixed, platform)}")
    data, graph = (num_devices // fixed, graph) if data == -1 else (data, num_devices // fixed)
  if data * graph != num_devices:
    raise UserError(f"mesh: mesh.data x mesh.graph = {data} x {graph} = {data * graph} does "
                    f"not match the {num_devices} available devices."
                    f"{_advice(data * graph, platform)}")
  return data, graph


def _advice(wanted: int, platform: str | None) -> str:
  if platform == "cpu":
    return (f" On CPU, `jax_num_cpu_devices={wanted}` gives the process {wanted} fake "
            "devices.")
  return " Set mesh.data and mesh.graph to fit the devices (-1: the devices left over)."


def make_mesh(mesh: MeshSpec, devices=None) -> Mesh:
  """The `(data, graph)` mesh of `mesh` over `devices` (default: all devices of all
  processes).

  Axis types are `Auto`: shard_map then reshards inputs as needed, while
  explicit `in_specs` keep every collective visible in the model code.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(mesh, len(devices), getattr(devices[0], "platform", None))
  # Graph shards of one example sit next to each other (same host where possible),
  # since the exchange between them runs every layer.
  grid = np.array(devices, dtype=object).reshape(shape)
  return Mesh(grid, AXES, axis_types=(AxisType.Auto,) * 2)


def single_device_mesh(device=None) -> Mesh:
  """A `(data, graph)` mesh of one device (default: this process's first), both axes 1."""
  device = jax.local_devices()[0] if device is None else device
  return Mesh(np.array([[device]], dtype=object), AXES, axis_types=(AxisType.Auto,) * 2)


def process_data_group(mesh: Mesh) -> tuple[int, int]:
  """`(group, num_groups)`: which share of each global batch this process reads.

  Processes whose devices hold the same rows of the batch (the same `data`
  coordinates, e.g. the graph shards of one example spread over two hosts)
  form a group and read the same examples; groups read disjoint examples.
  """
  rows_of_process: dict[int, set] = {}
  for (data, _), device in np.ndenumerate(mesh.devices):
    rows_of_process.setdefault(device.process_index, set()).add(data)
  groups = sorted({frozenset(rows) for rows in rows_of_process.values()}, key=min)
  covered = [row for group in groups for row in group]
  if len(covered) != len(set(covered)):
    raise UserError("mesh: processes share some but not all batch rows; make mesh.graph "
                     "divide or be a multiple of the devices per process.")
  return groups.index(frozenset(rows_of_process[jax.process_index()])), len(groups)


def check_batch_size(mesh: Mesh, batch_size: int, accumulation_steps: int = 1):
  """A clear error when the global batch (its rows) does not split over the `data` axis,
  or a data shard's rows into `accumulation_steps` micro-batches (each shard splits its
  own)."""
  shards = mesh.shape[DATA]
  if batch_size % shards:
    raise UserError(f"train.batch_size={batch_size} is not divisible by the "
                    f"{shards} data shards of the mesh (mesh.data); change one of "
                    "them, or give the graph more devices (mesh.graph).")
  per_shard = batch_size // shards
  if per_shard % accumulation_steps:
    raise UserError(f"train.batch_size={batch_size} gives each of the {shards} data shards "
                    f"{per_shard} example(s), which do not split into train.accumulation_steps="
                    f"{accumulation_steps} micro-batches (each data shard splits its own): make "
                    f"the batch a multiple of {shards * accumulation_steps} (mesh.data x "
                    "train.accumulation_steps), or use fewer micro-batches or data shards.")
