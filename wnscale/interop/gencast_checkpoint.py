"""GenCast's checkpoint files, read without GenCast.

A checkpoint is the `.npz` that `graphcast.checkpoint.dump` writes of GenCast's
`CheckPoint(description, license, params, task_config, denoiser_architecture_config,
sampler_config, noise_config, noise_encoder_config)`, flattened as GraphCast's
(`graphcast_checkpoint`): `params:<haiku module>:<w | b>`, a config field
`denoiser_architecture_config:latent_size`, a nested one
`denoiser_architecture_config:sparse_transformer_config:d_model`, a tuple item
`task_config:input_variables:3`; a field that is None is left out.
"""

from __future__ import annotations

import dataclasses

from wnscale.errors import UserError
from wnscale.interop import graphcast_checkpoint

# The config dataclasses of GenCast's `CheckPoint`, in its order.
CONFIGS = ("task_config", "denoiser_architecture_config", "sampler_config", "noise_config",
           "noise_encoder_config")


@dataclasses.dataclass(frozen=True)
class GenCastCheckpoint:
  """A checkpoint file's contents.

  Attributes:
    params: `{haiku module name: {leaf name: array}}`, as Haiku holds them.
    configs: `{name: fields}` of each of `CONFIGS` (python scalars, tuples, nested
      dicts for nested dataclasses; a field stored as None is absent).
    description, license: the file's texts.
  """

  params: dict
  configs: dict
  description: str
  license: str


def read_checkpoint(path: str) -> GenCastCheckpoint:
  """Reads the checkpoint file at `path` (local or URL).

  Raises:
    UserError: the file is not an `.npz` of a GenCast `CheckPoint` (naming what it lacks).
  """
  tree = graphcast_checkpoint.read_tree(path, "GenCast's checkpoint format")
  missing = [name for name in ("params",) + CONFIGS if name not in tree]
  if missing:
    raise UserError(f"{path} is not a GenCast checkpoint: it has no {missing} (it has "
                    f"{sorted(tree)})")
  configs = {name: graphcast_checkpoint.to_python(tree[name]) for name in CONFIGS}
  task = configs["task_config"]
  absent = [field for field in graphcast_checkpoint.TASK_CONFIG_FIELDS if field not in task]
  if absent:
    raise UserError(f"The task_config of {path} lacks {absent}; it has {sorted(task)}")
  for field in ("input_variables", "target_variables", "forcing_variables",
                "pressure_levels"):
    if not isinstance(task[field], tuple):
      raise UserError(f"task_config:{field} of {path} is not a tuple: {task[field]!r}")
  return GenCastCheckpoint(tree["params"], configs,
                           str(graphcast_checkpoint.to_python(tree.get("description", ""))),
                           str(graphcast_checkpoint.to_python(tree.get("license", ""))))
