"""The WeatherNext 2 runs the export tests share, and the export the WN2 check was made of.

`fine_tuned(imported, out)` stands for a fine-tune of the imported fixture
(`fixtures/weathernext2_tiny`): a run started from it (`train.init_from`) whose parameters
are the import's moved by a fixed random step (numpy, so the same on every machine) and
whose training settings differ (loss weights, rollout remat). Its export is what
`fixtures/weathernext2_export` was made of, with WeatherNext 2's own code (its README):

  python tests/weathernext2_runs.py --out=DIR    # DIR/imported, DIR/fine_tuned, DIR/export
"""

import argparse
import copy
import hashlib
import json
import os

import numpy as np

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
TINY = os.path.join(FIXTURES, "weathernext2_tiny")
EXPORT_FIXTURE = os.path.join(FIXTURES, "weathernext2_export")
STEP_SIZE = 0.02  # the fine-tune's step: N(0, STEP_SIZE) on every parameter
SEED = 11


def import_fixture(out: str):
  """The tiny fixture imported into `out`; its config."""
  from wnscale.interop.weathernext2_import import import_weathernext2  # noqa: PLC0415
  return import_weathernext2(os.path.join(TINY, "params.npz"),
                             os.path.join(TINY, "config.json"), out)


def fine_tuned(imported: str, out: str):
  """A run in `out` started from the run `imported` (see the module docstring)."""
  import jax  # noqa: PLC0415
  from flax import nnx  # noqa: PLC0415
  from wnscale import config as config_lib  # noqa: PLC0415
  from wnscale import specs as specs_lib  # noqa: PLC0415
  from wnscale.model import setup  # noqa: PLC0415
  from wnscale.train import checkpoint as checkpoint_lib  # noqa: PLC0415
  from wnscale.train.run_directory import RunDirectory  # noqa: PLC0415
  source = RunDirectory(imported)
  config = copy.deepcopy(source.read_config())
  config.train.update(init_from=source.path, remat_rollout=False,
                      variable_loss_weights=("geopotential:0.25", "2m_temperature:0.5"))
  config_lib.validate(config)
  _, shapes = setup.init_model_shapes(specs_lib.from_config(config))
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  params, _ = source.restore_params(checkpoint_lib.abstract_like(shapes, device))
  rng = np.random.default_rng(SEED)
  moved = jax.tree.map(lambda x: np.asarray(x) + rng.normal(0.0, STEP_SIZE, np.shape(x)).astype(
      np.float32), nnx.to_pure_dict(params))
  nnx.replace_by_pure_dict(params, moved)
  run = RunDirectory(out)
  run.save_params(params, {"step": 1, "fine_tuned_from": source.path}, step=1)
  run.write_config(config_lib.to_json(config))
  return config


def digest(export_dir: str) -> dict:
  """sha256 of an export's parameters (names, dtypes, shapes, bytes, in order; not its
  description, which names the run's path) and of its config file: what the WN2 check's
  predictions were made of."""
  arrays = hashlib.sha256()
  with np.load(os.path.join(export_dir, "params.npz")) as npz:
    for key in [key for key in npz.files if key.startswith("params:")]:  # not the texts
      value = npz[key]
      arrays.update(f"{key}|{value.dtype.str}|{value.shape}|".encode() + value.tobytes())
  with open(os.path.join(export_dir, "config.json"), "rb") as f:
    config = hashlib.sha256(f.read()).hexdigest()
  return {"params_sha256": arrays.hexdigest(), "config_sha256": config}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="A directory to write the runs into.")
  out = parser.parse_args().out
  from wnscale.interop.weathernext2_export import export_weathernext2  # noqa: PLC0415
  import_fixture(os.path.join(out, "imported"))
  fine_tuned(os.path.join(out, "imported"), os.path.join(out, "fine_tuned"))
  export_weathernext2(os.path.join(out, "fine_tuned"), os.path.join(out, "export"))
  print(json.dumps(digest(os.path.join(out, "export")), indent=2))


if __name__ == "__main__":
  main()
