"""GraphCast's published checkpoint files, read and written without GraphCast.

A checkpoint is the `.npz` that `graphcast.checkpoint.dump` writes of a
`CheckPoint(params, model_config, task_config, description, license)`: the
tree of dataclasses, dicts and tuples flattened to one array per leaf, the
keys of the path joined with ":" (dataclass fields and dict keys by name,
tuple items by their index; a field that is None is left out). So a
parameter is `params:<haiku module>:<w | b | scale | offset>`, a config field
`model_config:latent_size` (a 0-d array), a tuple item
`task_config:input_variables:3` (a 0-d unicode array). `to_bytes`
writes the same layout (keys in `CheckPoint`'s field order, parameters sorted),
which GraphCast's `checkpoint.load(f, CheckPoint)` reads.
"""

from __future__ import annotations

import dataclasses
import io
import zipfile
import zlib

import numpy as np

from wnscale import paths
from wnscale.errors import UserError

SEPARATOR = ":"
MODEL_CONFIG_FIELDS = ("mesh_size", "latent_size", "gnn_msg_steps", "hidden_layers",
                       "radius_query_fraction_edge_length")
# Every field of GraphCast's `ModelConfig`, in its order (the last one optional).
MODEL_CONFIG_ORDER = ("resolution",) + MODEL_CONFIG_FIELDS + (
    "mesh2grid_edge_normalization_factor",)
TASK_CONFIG_FIELDS = ("input_variables", "target_variables", "forcing_variables",
                      "pressure_levels", "input_duration")


@dataclasses.dataclass(frozen=True)
class GraphCastCheckpoint:
  """The contents of a checkpoint file.

  Attributes:
    params: `{haiku module name: {leaf name: array}}`, as Haiku holds them.
    model_config: `ModelConfig`'s fields (python scalars); an optional field
      stored as None is absent (`mesh2grid_edge_normalization_factor`).
    task_config: `TaskConfig`'s fields; tuple fields as tuples.
    description, license: the file's texts.
  """

  params: dict
  model_config: dict
  task_config: dict
  description: str
  license: str


def read_checkpoint(path: str) -> GraphCastCheckpoint:
  """Reads the checkpoint file at `path` (local or URL).

  Raises:
    ValueError: the file is not an `.npz` of a GraphCast `CheckPoint` (naming
      what it lacks).
  """
  tree = read_tree(path)
  missing = [name for name in ("params", "model_config", "task_config") if name not in tree]
  if missing:
    raise UserError(f"{path} is not a GraphCast checkpoint: it has no {missing} (it has "
                     f"{sorted(tree)})")
  model_config, task_config = (to_python(tree["model_config"]),
                               to_python(tree["task_config"]))
  for name, config, fields in [("model_config", model_config, MODEL_CONFIG_FIELDS),
                               ("task_config", task_config, TASK_CONFIG_FIELDS)]:
    absent = [field for field in fields if field not in config]
    if absent:
      raise UserError(f"The {name} of {path} lacks {absent}; it has {sorted(config)}")
  for field in ("input_variables", "target_variables", "forcing_variables",
                "pressure_levels"):  # a one-item tuple reads back as a tuple too
    if not isinstance(task_config[field], tuple):
      raise UserError(f"task_config:{field} of {path} is not a tuple: {task_config[field]!r}")
  return GraphCastCheckpoint(tree["params"], model_config, task_config,
                             str(to_python(tree.get("description", ""))),
                             str(to_python(tree.get("license", ""))))


def to_bytes(checkpoint: GraphCastCheckpoint) -> bytes:
  """The `.npz` of `checkpoint` as `graphcast.checkpoint.dump` writes a `CheckPoint`:
  `params:<module>:<leaf>` (sorted), `model_config:<field>`, `task_config:<field>[:<i>]`
  (fields in the dataclasses' order, a None field left out), `description`, `license`."""
  flat = {f"params{SEPARATOR}{module}{SEPARATOR}{leaf}": np.asarray(value)
          for module in sorted(checkpoint.params)
          for leaf, value in sorted(checkpoint.params[module].items())}
  for name, config, order in [("model_config", checkpoint.model_config, MODEL_CONFIG_ORDER),
                              ("task_config", checkpoint.task_config, TASK_CONFIG_FIELDS)]:
    unknown = sorted(set(config) - set(order))
    if unknown:
      raise ValueError(f"{name} has fields GraphCast's has not: {unknown}")
    for field in order:
      value = config.get(field)
      if isinstance(value, tuple):
        flat.update({f"{name}{SEPARATOR}{field}{SEPARATOR}{i}": np.asarray(item)
                     for i, item in enumerate(value)})
      elif value is not None:
        flat[f"{name}{SEPARATOR}{field}"] = np.asarray(value)
  flat["description"] = np.asarray(checkpoint.description)
  flat["license"] = np.asarray(checkpoint.license)
  buffer = io.BytesIO()
  np.savez(buffer, **flat)
  return buffer.getvalue()


def read_tree(path: str, format_name: str = "GraphCast's checkpoint format") -> dict:
  """The nested dict of the `.npz` checkpoint at `path` (local or URL), not yet interpreted.

  Raises:
    ValueError: no such file, or not a whole `.npz` (naming `format_name`).
  """
  try:
    data = paths.read_bytes(path)
  except FileNotFoundError as error:
    raise UserError(f"Checkpoint file not found: {path}") from error
  if not zipfile.is_zipfile(io.BytesIO(data)):  # else np.load tries it as a pickle
    raise UserError(f"{path} is not an .npz file ({format_name}): it is no "
                    f"zip archive, or one cut short ({len(data)} bytes).")
  try:
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
      return unflatten({key: npz[key] for key in npz.files})
  except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as error:
    raise UserError(f"{path} is a damaged .npz file (cut short?): {error}") from error


def unflatten(flat: dict) -> dict:
  """`{"a:b:c": leaf}` -> `{"a": {"b": {"c": leaf}}}` (the inverse of the dump's flattening)."""
  tree = {}
  for key, value in flat.items():
    node = tree
    *parents, leaf = key.split(SEPARATOR)
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return tree


def to_python(tree):
  """Dicts whose keys are 0..n-1 become tuples; 0-d arrays python scalars or strings."""
  if isinstance(tree, dict):
    if tree and all(key.isdigit() for key in tree) and sorted(map(int, tree)) == list(
        range(len(tree))):
      return tuple(to_python(tree[str(i)]) for i in range(len(tree)))
    return {key: to_python(value) for key, value in tree.items()}
  value = np.asarray(tree)
  return value.item() if value.ndim == 0 else value
