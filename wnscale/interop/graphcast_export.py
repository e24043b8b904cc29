"""`export_graphcast`: a wnscale run directory -> a GraphCast checkpoint file (and statistics).

The way back from `graphcast_import`: a run trained, fine-tuned or imported
here, written as GraphCast's published `.npz` of a `CheckPoint(params,
model_config, task_config, description, license)` (`graphcast_checkpoint`),
which GraphCast's own `checkpoint.load` reads and its `GraphCast` runs, with
optionally the run's statistics as GraphCast's three files.

  * The parameters: the run's newest (or a given step's) checkpoint, its moving
    average when it kept one (`params`), laid out as GraphCast's modules by the
    import's own table run backwards (`graphcast_params.export_params`).
  * The configs: GraphCast's of the run's config (`graphcast_config.graphcast_configs`);
    a run GraphCast cannot express (another processor, an FGN, modalities, inputs
    GraphCast has not) is refused, naming the setting, before anything is read.
    When the run was imported, or started (`train.init_from`, followed back)
    from an import, the import's `graphcast_remainder.npz` gives the original
    configs (when they still describe the run: the published variable orders), the
    parameters wnscale's do not hold, and the description and license.
  * The statistics: the run's `data.stats_path` when it is GraphCast's files
    (copied as they are); else the run's statistics (`run_data.resolve_stats`) in
    their layout (`normalization.to_graphcast`).

Each output is written whole or not at all, and an existing one is replaced only
with `overwrite` (`wnscale.outputs`).
"""

from __future__ import annotations

import logging

import jax
import ml_collections
import numpy as np
from flax import nnx

from wnscale import outputs, paths
from wnscale import specs as specs_lib
from wnscale.data import netcdf, run_data
from wnscale.data.reading import normalization
from wnscale.errors import UserError
from wnscale.interop import graphcast_checkpoint, graphcast_config, graphcast_params
from wnscale.interop import imported_origin
from wnscale.interop.graphcast_import import REMAINDER
from wnscale.model import setup
from wnscale.train import checkpoint as checkpoint_lib
from wnscale.train.run_directory import RunDirectory

# What `--stats_dir` writes.
STATS = outputs.Kind("a directory of GraphCast's statistics files",
                     tuple(normalization.GRAPHCAST_FILES.values()))


def export_graphcast(workdir: str, out: str, step: int | None = None,
                     stats_dir: str | None = None, params: str | None = None,
                     overwrite: bool = False) -> graphcast_checkpoint.GraphCastCheckpoint:
  """Writes the run `workdir` as GraphCast's checkpoint file `out` (and statistics).

  Args:
    workdir: a run directory (of `launch.train` or `launch.import_graphcast`).
    out: the `.npz` file to write (local or URL).
    step: the checkpoint to export; None: the newest.
    stats_dir: a directory to write `mean_by_level.nc`, `stddev_by_level.nc`,
      `diffs_stddev_by_level.nc` into; None: no statistics.
    params: "ema" or "raw" (`run_directory.PARAMS`); None: the moving average when
      the run kept one.
    overwrite: replace an existing `out` / `stats_dir`.

  Returns:
    What was written.

  Raises:
    UserError: the run is not one GraphCast's model can express (naming the
      setting), has no such checkpoint, or an output exists (without `overwrite`).
  """
  outputs.check(out, outputs.NPZ, argument="out", overwrite=overwrite)
  run = RunDirectory(workdir, argument="workdir")
  config = run.read_config()
  specs = specs_lib.from_config(config)
  model_config, task_config = graphcast_config.graphcast_configs(config)  # refusals first
  if stats_dir:
    reads = (specs.data.stats_path,) if specs.data.stats_path else ()
    outputs.check(stats_dir, STATS, argument="stats_dir", overwrite=overwrite, reads=reads)
  origin = imported_origin.find(run, specs.train.init_from, REMAINDER)
  imported = (graphcast_checkpoint.read_checkpoint(paths.join(origin.path, REMAINDER))
              if origin is not None else None)
  if imported is not None and _describes(config, imported):
    model_config, task_config = imported.model_config, imported.task_config

  _, shapes = setup.init_model_shapes(specs)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  restored, restored_step = run.restore_params(checkpoint_lib.abstract_like(shapes, device),
                                               step, which=params)
  tree = jax.tree.map(np.asarray, nnx.to_pure_dict(restored))
  exported = graphcast_params.export_params(
      tree, task_config, specs, imported.params if imported is not None else None)
  description, license_text = imported_origin.texts(run, origin, imported, restored_step,
                                                     params)
  result = graphcast_checkpoint.GraphCastCheckpoint(exported, model_config, task_config,
                                                    description, license_text)
  data = graphcast_checkpoint.to_bytes(result)
  files = _statistics(specs.data) if stats_dir else {}

  if stats_dir:
    with outputs.building(paths.normalize(stats_dir), overwrite) as where:
      for name, contents in files.items():
        paths.write_bytes(paths.join(where, name), contents)
  with outputs.writing(out, "nothing was written"):
    paths.write_bytes(paths.normalize(out), data)
  logging.info("Exported %s (step %d) to %s: %d parameters.", run.path, restored_step, out,
               sum(leaf.size for module in exported.values() for leaf in module.values()))
  return result


def _describes(config: ml_collections.ConfigDict,
               imported: graphcast_checkpoint.GraphCastCheckpoint) -> bool:
  """Whether an import's original configs still describe the run `config`."""
  try:
    graphcast_config.check_expressible(config, imported.model_config, imported.task_config)
  except UserError:
    return False
  return True


def _statistics(data: specs_lib.DataSpec) -> dict[str, bytes]:
  """`{file name: bytes}` of GraphCast's three statistics files of a run of the data
  `data`."""
  stats_path = data.stats_path
  if stats_path and paths.exists(paths.join(stats_path,
                                            normalization.GRAPHCAST_FILES["mean"])):
    return {name: paths.read_bytes(paths.join(stats_path, name))
            for name in normalization.GRAPHCAST_FILES.values()}
  files = normalization.to_graphcast(run_data.resolve_stats(data))
  return {normalization.GRAPHCAST_FILES[statistic]: netcdf.to_bytes(dataset)
          for statistic, dataset in files.items()}
