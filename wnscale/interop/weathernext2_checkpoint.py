"""WeatherNext 2's checkpoint files (`.npz` of its `fgn.CheckPoint(params, description,
license)`), read and written without WeatherNext 2.

WeatherNext 2's `checkpoint.dump` flattens the dataclass as GraphCast's does
(`graphcast_checkpoint`): `params:<haiku module>:<leaf>`, then `description` and `license`
(0-d unicode arrays). `to_bytes` writes that layout, modules and leaves sorted as Haiku
holds them, which WeatherNext 2's `checkpoint.load(f, fgn.CheckPoint)` reads.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np

from wnscale.errors import UserError
from wnscale.interop import graphcast_checkpoint

SEPARATOR = graphcast_checkpoint.SEPARATOR


@dataclasses.dataclass(frozen=True)
class WeatherNext2Checkpoint:
  """A checkpoint file's contents: `params` `{haiku module: {leaf: array}}`, its texts."""

  params: dict
  description: str
  license: str


def read_checkpoint(path: str) -> WeatherNext2Checkpoint:
  """The checkpoint at `path` (local or URL); a `UserError` if it is none."""
  tree = graphcast_checkpoint.read_tree(path, "WeatherNext 2's checkpoint format")
  if "params" not in tree:
    raise UserError(f"{path} is not a WeatherNext 2 checkpoint: it has no params "
                    f"(it has {sorted(tree)})")
  return WeatherNext2Checkpoint(
      tree["params"], str(graphcast_checkpoint.to_python(tree.get("description", ""))),
      str(graphcast_checkpoint.to_python(tree.get("license", ""))))


def to_bytes(checkpoint: WeatherNext2Checkpoint) -> bytes:
  """The `.npz` of `checkpoint` as WeatherNext 2's `checkpoint.dump` writes it."""
  flat = {f"params{SEPARATOR}{module}{SEPARATOR}{leaf}": np.asarray(value)
          for module in sorted(checkpoint.params)
          for leaf, value in sorted(checkpoint.params[module].items())}
  flat["description"] = np.asarray(checkpoint.description)
  flat["license"] = np.asarray(checkpoint.license)
  buffer = io.BytesIO()
  np.savez(buffer, **flat)
  return buffer.getvalue()
