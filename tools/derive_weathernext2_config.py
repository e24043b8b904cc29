"""Writes a wnscale config file for one of WeatherNext 2's released model configs.

  python tools/derive_weathernext2_config.py WeatherNext2.json --resolution=0.25 \
      --out=configs/weathernext2_0p25.py
  python tools/derive_weathernext2_config.py WeatherNextCyclones_Mini.json --resolution=1.0 \
      --out=configs/weathernext2_1p0.py

The released configs are `weathernext/weathernext2/configs/*.json` of
google-deepmind's weathernext repository (v0.3.0). Their model, task and
wrapper settings go through the importer's mapping
(`wnscale.interop.weathernext2_config.wnscale_config`); every model and data
key it sets, and the training keys it derives, are written into the config
file, which adds what the released config does not hold: the grid resolution,
GraphCast's training schedule and time ranges (`graphcast_paper_config`) and,
at 0.25 deg, bfloat16 activations, attention in blocks of edges and the graph
over 8 devices.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from wnscale import config as config_lib  # noqa: E402
from wnscale.interop import fiddle_json, weathernext2_config  # noqa: E402

# What a config at this resolution sets beyond the released model (memory, not function).
AT_RESOLUTION = {0.25: {"model.dtype": "bfloat16", "model.transformer_edges_per_block": 131072,
                        "mesh.graph": 8}}
TRAIN_KEYS = ("loss", "ensemble_members", "remat_rollout", "variable_loss_weights")


def derived_keys(path: str) -> dict:
  """`{"section.key": value}` of the importer's mapping: every model key (remat
  included), the data keys it sets (those that differ from the defaults), the
  training keys it derives."""
  config = weathernext2_config.wnscale_config(fiddle_json.load(path), stats_path="")
  default = config_lib.default_config()
  keys = {f"model.{key}": value for key, value in config.model.items()}
  keys.update({f"data.{key}": value for key, value in config.data.items()
               if value != default.data[key] and key != "stats_path"})
  keys.update({f"train.{key}": config.train[key] for key in TRAIN_KEYS})
  return keys


def module_text(source: str, resolution: float, out: str) -> str:
  name, this = os.path.basename(source), os.path.relpath(out)
  keys = dict(derived_keys(source), **{"data.resolution": resolution},
              **AT_RESOLUTION.get(resolution, {}))
  lines = "\n".join(f"    {key!r}: {value!r}," for key, value in keys.items())
  return f'''"""WeatherNext 2's released model `{name}`, on a {resolution:g} deg grid.

  python -m launch.train --config={this} --workdir=DIR \\
      --config.data.path=/path/to/era5_13levels.zarr --config.data.stats_path=STATS

Generated from the released fiddle config (weathernext v0.3.0) by the importer's
mapping, `python tools/derive_weathernext2_config.py {name} --resolution={resolution:g}
--out={this}`: regenerate, do not edit. Expect: docs/interop.md, "WeatherNext 2's checkpoints".
"""

from wnscale.config import derived_config

DERIVED = {{
{lines}
}}


def get_config():
  return derived_config({resolution!r}, DERIVED)
'''


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("source", help="a released WeatherNext 2 config (.json)")
  parser.add_argument("--resolution", type=float, required=True)
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  with open(args.out, "w") as file:
    file.write(module_text(args.source, args.resolution, args.out))


if __name__ == "__main__":
  main()
