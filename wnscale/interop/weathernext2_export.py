"""`export_weathernext2`: a wnscale run directory -> WeatherNext 2's checkpoint and config.

The way back from `weathernext2_import`: a WeatherNext 2 model imported, fine-tuned or
trained here, written in WeatherNext 2's released layout, which its own code loads
(`checkpoint.load(f, fgn.CheckPoint)`, `fiddle_config_io.get_fiddle_config(text)`) and
runs (its demo notebook, ECMWF's ai-models plugin):

  <out>/params.npz    the parameters, `fgn.CheckPoint(params, description, license)`
                      (`weathernext2_checkpoint`): the run's newest (or a given step's)
                      checkpoint, its moving average when it kept one, laid out as
                      WeatherNext 2's modules (`weathernext2_params.export_params`)
  <out>/config.json   the fiddle JSON of its `PredictorConfig` (`fiddle_json.dump` of
                      `weathernext2_predictor.predictor_config`), the run's statistics
                      inside

When the run was imported, or started (`train.init_from`, followed back) from an import,
the import's remainder gives the parameters wnscale's model does not hold (the decoder's
unused mesh MLP), the texts, and the config it came from (the settings wnscale does not
express): an import exported again gives back every array of its checkpoint, and its
config. A run WeatherNext 2 cannot express is refused, naming the setting, before anything
is read or written. The directory is written whole or not at all, and an existing one is
replaced only with `overwrite` (`wnscale.outputs`).
"""

from __future__ import annotations

import logging

import jax
import numpy as np
from flax import nnx

from wnscale import outputs, paths
from wnscale import specs as specs_lib
from wnscale.data import run_data
from wnscale.data.reading import normalization
from wnscale.interop import fiddle_json, imported_origin, weathernext2_checkpoint
from wnscale.interop import weathernext2_params, weathernext2_predictor
from wnscale.interop.weathernext2_import import CONFIG, REMAINDER
from wnscale.model import setup
from wnscale.train import checkpoint as checkpoint_lib
from wnscale.train.run_directory import CHECKPOINTS, RunDirectory

PARAMS_FILE, CONFIG_FILE = "params.npz", "config.json"
# What `--out` writes: told from a run directory (which holds a config.json too) by its
# params.npz.
KIND = outputs.Kind("a WeatherNext 2 checkpoint directory", (PARAMS_FILE,),
                    excludes=(CHECKPOINTS,))


def export_weathernext2(workdir: str, out: str, step: int | None = None,
                        params: str | None = None, overwrite: bool = False) -> dict:
  """Writes the run `workdir` as WeatherNext 2's `params.npz` and `config.json` in `out`.

  Args:
    workdir: a run directory (of `launch.train` or `launch.import_weathernext2`).
    out: the directory to write (local or URL).
    step: the checkpoint to export; None: the newest.
    params: "ema" or "raw" (`run_directory.PARAMS`); None: the moving average when the run
      kept one.
    overwrite: replace an existing `out`.

  Returns:
    `{"params": {module: {leaf: array}}, "config": Buildable}`: what was written.

  Raises:
    UserError: the run is not one WeatherNext 2's model can express (naming the setting),
      has no such checkpoint, or `out` exists (without `overwrite`).
  """
  out = paths.normalize(out)
  outputs.check(out, KIND, argument="out", overwrite=overwrite)
  run = RunDirectory(workdir, argument="workdir")
  config = run.read_config()
  specs = specs_lib.from_config(config)
  weathernext2_predictor.check_kind(config, specs)  # before anything is read
  origin = imported_origin.find(run, specs.train.init_from, REMAINDER)
  imported = (weathernext2_checkpoint.read_checkpoint(paths.join(origin.path, REMAINDER))
              if origin is not None else None)
  template = fiddle_json.load(paths.join(origin.path, CONFIG)) if origin is not None else None
  predictor = weathernext2_predictor.predictor_config(config, specs,
                                                      run_statistics(specs.data), template)

  _, shapes = setup.init_model_shapes(specs)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  restored, restored_step = run.restore_params(checkpoint_lib.abstract_like(shapes, device),
                                               step, which=params)
  exported = weathernext2_params.export_params(
      jax.tree.map(np.asarray, nnx.to_pure_dict(restored)), specs,
      imported.params if imported is not None else None)
  description, license_text = imported_origin.texts(run, origin, imported, restored_step,
                                                    params)
  data = weathernext2_checkpoint.to_bytes(weathernext2_checkpoint.WeatherNext2Checkpoint(
      exported, description, license_text))
  text = fiddle_json.dump(predictor)
  with outputs.building(out, overwrite) as where:
    paths.write_bytes(paths.join(where, PARAMS_FILE), data)
    paths.write_text(paths.join(where, CONFIG_FILE), text)
  logging.info("Exported %s (step %d) to %s: %d parameters.", run.path, restored_step, out,
               sum(leaf.size for module in exported.values() for leaf in module.values()))
  return {"params": exported, "config": predictor}


def run_statistics(data: specs_lib.DataSpec) -> dict:
  """The statistics of a run of the data `data` in GraphCast's layout
  (`{statistic: Dataset}`)."""
  return normalization.to_graphcast(run_data.resolve_stats(data))
