"""`import_weathernext2`: a WeatherNext 2 checkpoint and its model config -> a wnscale run.

WeatherNext 2 publishes each model as a parameters file (`.npz` of its
`fgn.CheckPoint(params, description, license)`, flattened as GraphCast's
checkpoints are) and a fiddle JSON config naming the network, its task and
its normalization statistics. The run directory written here holds what
`import_graphcast`'s does (see there): `config.json` (the config derived by
`weathernext2_config`), `stats/` (GraphCast's three files, from the config's
statistics or from `stats_dir`), `checkpoints/0` (the converted parameters), and
what an export writes back (`REMAINDER`: the decoder's unused mesh MLP, the
description and license; `CONFIG`: the config file). Written whole or not at all;
an existing run is replaced only when asked.

Statistics. WeatherNext 2 leaves a variable that its statistics lack as it is
(`normalization.normalize` skips it: its cyclone targets); the run's
statistics give such a variable mean 0 and std 1, the same function.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os

import ml_collections
import numpy as np
import xarray as xr

from wnscale import outputs, paths
from wnscale import specs as specs_lib
from wnscale.data import netcdf
from wnscale.data import variables as variables_lib
from wnscale.data.reading import normalization
from wnscale.errors import ArgumentError, UserError
from wnscale.interop import fiddle_json, graphcast_import
from wnscale.interop import weathernext2_checkpoint, weathernext2_config, weathernext2_params
from wnscale.train import run_directory

# What an import keeps for an export to write back (`weathernext2_export`): the parameters
# wnscale's model does not hold and the checkpoint's texts (a checkpoint file of them), and
# the config file as it was.
REMAINDER = "weathernext2_remainder.npz"
CONFIG = "weathernext2_config.json"


def import_weathernext2(checkpoint_path: str, config_path: str, out: str,
                        stats_dir: str | None = None,
                        overwrite: bool = False) -> ml_collections.ConfigDict:
  """Writes the run directory `out` for WeatherNext 2's checkpoint and config.

  Args:
    checkpoint_path: the parameters `.npz` (local or URL).
    config_path: the model's fiddle JSON config (e.g. `WeatherNext2.json`), or the name
      of a released one in an installed `weathernext` package (`config_file`).
    out: the run directory to create; must not exist (an empty directory is
      fine) unless `overwrite`.
    stats_dir: a directory of GraphCast's three statistics files to use
      instead of those in the config.
    overwrite: replace the run at `out` (checked first: `outputs.check`).

  Returns:
    The run's config.

  Raises:
    ValueError: naming the problem (a file that is not what it should be, a
      setting wnscale cannot express, `out` already holding something).
      Nothing is written then.
  """
  out = paths.normalize(out)
  outputs.check(out, run_directory.KIND, argument="out", overwrite=overwrite)
  config_path = config_file(config_path)
  predictor = fiddle_json.load(config_path)
  config = weathernext2_config.wnscale_config(predictor, paths.join(out, "stats"))
  specs = specs_lib.from_config(config)
  checkpoint = weathernext2_checkpoint.read_checkpoint(checkpoint_path)
  params = weathernext2_params.convert_params(checkpoint.params, specs)
  files = _statistics(predictor, stats_dir, specs.data)
  kept = weathernext2_checkpoint.to_bytes(dataclasses.replace(
      checkpoint, params=weathernext2_params.remainder(checkpoint.params)))
  graphcast_import.write_run(
      out, overwrite, config, params,
      {name: netcdf.to_bytes(files[statistic])
       for statistic, name in normalization.GRAPHCAST_FILES.items()},
      {"imported_from": paths.normalize(checkpoint_path),
       "config_from": paths.normalize(config_path),
       "description": checkpoint.description, "license": checkpoint.license},
      files={REMAINDER: kept, CONFIG: paths.read_bytes(paths.normalize(config_path))})
  return config


def config_file(config: str) -> str:
  """The fiddle JSON file `config` names: a path (local or URL), or the name of a
  released model (`WeatherNext2`, `WeatherNextCyclones`, `WeatherNextCyclones_Mini`)
  looked up, as WeatherNext 2's own `fiddle_config_io` does, in an installed
  `weathernext` package (found without importing it)."""
  if config.endswith(".json") or "/" in config or paths.exists(paths.normalize(config)):
    return config
  spec = importlib.util.find_spec("weathernext")
  searched = []
  for root in (spec.submodule_search_locations or []) if spec else []:
    for candidate in (os.path.join(root, f"{config}.json"),
                      os.path.join(root, "weathernext2", "configs", f"{config}.json")):
      if os.path.isfile(candidate):
        return candidate
      searched.append(candidate)
  raise ArgumentError("config", config, "is neither a config file nor the name of a config of "
                      "an installed weathernext package" + (
                          f" (looked for {searched})" if searched else
                          " (none is installed: pass the .json file)"))


def _statistics(predictor, stats_dir: str | None, data: specs_lib.DataSpec) -> dict:
  """`{"mean" | "std" | "diff_std": Dataset}` with every variable the model reads."""
  if stats_dir is None:
    files = weathernext2_config.statistics(predictor)
  else:
    files = {statistic: netcdf.load(paths.join(paths.normalize(stats_dir), name))
             for statistic, name in normalization.GRAPHCAST_FILES.items()}
  names = (data.outputs + data.forcings + data.global_forcings
           + variables_lib.STATIC_VARIABLES)
  unnormalized = [name for name in names if name not in files["std"]]
  if unnormalized:
    logging.info("The statistics lack %s: mean 0 and std 1 (as WeatherNext 2 leaves them).",
                 unnormalized)
  levels = files["mean"]["level"] if "level" in files["mean"].coords else None
  completed = {}
  for statistic, dataset in files.items():
    dataset = dataset.copy()
    for name in unnormalized:
      value = 0.0 if statistic == "mean" else 1.0
      if variables_lib.is_atmospheric(name):
        if levels is None:
          raise UserError(f"The statistics have no levels for {name}")
        dataset[name] = xr.full_like(levels, value, dtype=np.float64)
      else:
        dataset[name] = xr.DataArray(value)
    completed[statistic] = dataset
  return completed
