"""`import_graphcast`: a GraphCast checkpoint file and its statistics -> a wnscale run directory.

The run directory holds what a trained run's does, for a model that was never
trained here:
  * `config.json`: the config derived from the checkpoint's model and task
    (`graphcast_config.wnscale_config`); `data.path` is empty (pass a store to
    train or forecast);
  * `stats/`: GraphCast's three statistics files, copied (the run's
    `data.stats_path`, so the directory stands alone);
  * `checkpoints/0`: the converted parameters alone, no optimizer state
    (`train.checkpoint.save_params`), with the checkpoint's description and
    license in its metadata;
  * `graphcast_remainder.npz` (`REMAINDER`): what the conversion leaves out, for
    an export to write back (`graphcast_export`): the checkpoint's configs,
    description and license, and the parameters wnscale's do not hold whole
    (`graphcast_params.remainder`), in the checkpoint's own format.
`launch.predict_example`, forecasts, and a new run's `--config.train.init_from`
read it. The directory is written whole or not at all; an existing run there
is replaced only when asked (`outputs.building`).
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import ml_collections

from wnscale import config as config_lib
from wnscale import outputs, paths
from wnscale import specs as specs_lib
from wnscale.data.reading import normalization
from wnscale.errors import UserError
from wnscale.interop import graphcast_checkpoint, graphcast_config, graphcast_params
from wnscale.train import run_directory

REMAINDER = "graphcast_remainder.npz"


def import_graphcast(checkpoint_path: str, stats_dir: str, out: str,
                     overwrite: bool = False) -> ml_collections.ConfigDict:
  """Writes the run directory `out` for the checkpoint file `checkpoint_path`.

  Args:
    checkpoint_path: a `.npz` of GraphCast's `CheckPoint` (local or URL).
    stats_dir: a directory of `mean_by_level.nc`, `stddev_by_level.nc`,
      `diffs_stddev_by_level.nc` (local or URL).
    out: the run directory to create (local or URL); must not exist (an empty
      directory is fine) unless `overwrite`.
    overwrite: replace the run at `out` (checked first: `outputs.check`).

  Returns:
    The run's config.

  Raises:
    ValueError: naming the problem (a file that is not what it should be, a
      model or task wnscale cannot run, statistics lacking a variable, `out`
      already holding something). Nothing is written then.
  """
  out = paths.normalize(out)
  outputs.check(out, run_directory.KIND, argument="out", overwrite=overwrite)
  checkpoint = graphcast_checkpoint.read_checkpoint(checkpoint_path)
  stats_path = paths.join(out, "stats")
  config = graphcast_config.wnscale_config(checkpoint.model_config, checkpoint.task_config,
                                           stats_path)
  specs = specs_lib.from_config(config)
  check_stats(stats_dir, specs.data)
  params = graphcast_params.convert_params(checkpoint.params, checkpoint.task_config, specs)

  stats = {name: paths.read_bytes(paths.join(paths.normalize(stats_dir), name))
           for name in normalization.GRAPHCAST_FILES.values()}
  kept = graphcast_checkpoint.to_bytes(dataclasses.replace(
      checkpoint, params=graphcast_params.remainder(checkpoint.params)))
  write_run(out, overwrite, config, params, stats, {
      "imported_from": paths.normalize(checkpoint_path), "description": checkpoint.description,
      "license": checkpoint.license, "statistics_from": paths.normalize(stats_dir)},
      files={REMAINDER: kept})
  return config


def write_run(out: str, overwrite: bool, config: ml_collections.ConfigDict, params,
              stats: dict[str, bytes], metadata: dict, files: dict[str, bytes] | None = None):
  """Writes an imported model's run directory `out`, whole or not at all.

  `stats`: `{file name: bytes}` of GraphCast's three statistics files (under
  `stats/`); `files`: `{file name: bytes}` at its top level; `params` (host arrays) go
  alone into `checkpoints/0` with `metadata` (where they came from, description,
  license); the config last.
  """
  params = jax.tree.map(jnp.asarray, params)
  with outputs.building(out, overwrite) as where:  # the config names `out`, not `where`
    for name, data in stats.items():
      paths.write_bytes(paths.join(where, "stats", name), data)
    for name, data in (files or {}).items():
      paths.write_bytes(paths.join(where, name), data)
    run = run_directory.RunDirectory(where)
    run.save_params(params, {"step": 0, **metadata})
    # Last: a directory with a config is a whole run.
    run.write_config(config_lib.to_json(config), history=False)
  logging.info("Imported %s into %s: %d parameters.", metadata["imported_from"], out,
               sum(x.size for x in jax.tree.leaves(params)))


def check_stats(stats_dir: str, d: specs_lib.DataSpec):
  """A clear error unless `stats_dir` holds GraphCast's statistics of every channel of the
  data `d`."""
  if not paths.exists(paths.join(paths.normalize(stats_dir),
                                 normalization.GRAPHCAST_FILES["mean"])):
    raise UserError(f"{stats_dir} does not hold GraphCast's statistics files "
                     f"{sorted(normalization.GRAPHCAST_FILES.values())}")
  stats = normalization.read_stats(stats_dir)
  normalization.channel_stats(stats, d.outputs, d.pressure_levels)
  normalization.input_scales(stats, d.forcings, d.input_normalization, d.global_forcings)
