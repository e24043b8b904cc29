"""`import_gencast`: a GenCast checkpoint file and its statistics -> a wnscale run directory.

The run directory is `import_graphcast`'s (`graphcast_import.write_run`): `config.json`
(`gencast_config.wnscale_config`: the denoiser, `model.denoiser_*`), `stats/` (GenCast's
statistics files, `min_by_level.nc` too) and `checkpoints/0` (the converted parameters,
`gencast_params`), with the checkpoint's description and license in its metadata.

GenCast fills the sea-surface temperature's NaNs (land) with its `min_by_level` before
normalizing (its demo's `NaNCleaner`), and puts them back in the forecasts: the run's
`data.nan_fill_values` is that value, read from `min_by_level.nc`.
"""

from __future__ import annotations

import ml_collections

from wnscale import outputs, paths
from wnscale import specs as specs_lib
from wnscale.data import netcdf
from wnscale.data.reading import normalization
from wnscale.errors import UserError
from wnscale.interop import gencast_checkpoint, gencast_config, gencast_params, graphcast_import
from wnscale.train import run_directory

MIN_FILE = "min_by_level.nc"
# The variables GenCast's NaNCleaner fills (with their min_by_level).
NAN_FILLED = ("sea_surface_temperature",)


def import_gencast(checkpoint_path: str, stats_dir: str, out: str,
                   overwrite: bool = False) -> ml_collections.ConfigDict:
  """Writes the run directory `out` for the GenCast checkpoint file `checkpoint_path`.

  Args:
    checkpoint_path: a `.npz` of GenCast's `CheckPoint` (local or URL).
    stats_dir: a directory of GenCast's `mean_by_level.nc`, `stddev_by_level.nc`,
      `diffs_stddev_by_level.nc` and `min_by_level.nc` (local or URL).
    out: the run directory to create; must not exist (an empty directory is fine)
      unless `overwrite`.
    overwrite: replace the run at `out` (checked first: `outputs.check`).

  Returns:
    The run's config.

  Raises:
    UserError: naming the problem (a file that is not what it should be, a setting
      wnscale cannot express, statistics lacking a variable, `out` holding something).
      Nothing is written then.
  """
  out = paths.normalize(out)
  outputs.check(out, run_directory.KIND, argument="out", overwrite=overwrite)
  checkpoint = gencast_checkpoint.read_checkpoint(checkpoint_path)
  stats_dir = paths.normalize(stats_dir)
  task = checkpoint.configs["task_config"]
  fill_values = nan_fill_values(stats_dir, task)
  config = gencast_config.wnscale_config(checkpoint.configs, paths.join(out, "stats"),
                                         fill_values)
  specs = specs_lib.from_config(config)
  graphcast_import.check_stats(stats_dir, specs.data)
  params = gencast_params.convert_params(checkpoint.params, task, specs)
  stats = {name: paths.read_bytes(paths.join(stats_dir, name))
           for name in tuple(normalization.GRAPHCAST_FILES.values()) + (MIN_FILE,)
           if name != MIN_FILE or fill_values}
  graphcast_import.write_run(out, overwrite, config, params, stats, {
      "imported_from": paths.normalize(checkpoint_path), "description": checkpoint.description,
      "license": checkpoint.license, "statistics_from": stats_dir})
  return config


def nan_fill_values(stats_dir: str, task_config: dict) -> tuple[str, ...]:
  """`data.nan_fill_values` of GenCast's task (`task_config`) with its statistics directory
  `stats_dir`: each of `NAN_FILLED` among its inputs filled with its `min_by_level`.

  Raises:
    UserError: `stats_dir` has no `min_by_level.nc` where a variable needs it.
  """
  filled = [name for name in NAN_FILLED if name in task_config["input_variables"]]
  if not filled:
    return ()
  min_path = paths.join(stats_dir, MIN_FILE)
  if not paths.exists(min_path):
    raise UserError(f"{stats_dir} has no {MIN_FILE}: GenCast fills {filled}'s NaNs with it")
  minima = netcdf.load(min_path)
  return tuple(f"{name}:{float(minima[name])!r}" for name in filled)


_SURFACE = ("2m_temperature", "mean_sea_level_pressure", "10m_v_component_of_wind",
            "10m_u_component_of_wind")
_ATMOSPHERIC = ("temperature", "geopotential", "u_component_of_wind", "v_component_of_wind",
                "vertical_velocity", "specific_humidity")
_FORCINGS = ("year_progress_sin", "year_progress_cos", "day_progress_sin", "day_progress_cos")


def released_configs(mesh_size: int, attention_k_hop: int) -> dict:
  """GenCast's configs as a released checkpoint describes them (`gencast.CheckPoint`'s keys),
  with what its code configures: its `TASK` (6 atmospheric variables on 13 levels; 6 surface
  ones, 12 h precipitation predicted only; year and day progress forcings; two input times
  12 h apart) and the defaults of `DenoiserArchitectureConfig` and `SparseTransformerConfig`
  (latent 512, 16 blocks of 4 heads, feed-forward 2048, radius 0.6), `NoiseEncoderConfig`,
  `SamplerConfig` and `NoiseConfig`; the mesh's refinements and attention hops as given
  (the released models differ in them; the code has no default hops)."""
  return {
      "task_config": {
          "input_variables": (_SURFACE + ("sea_surface_temperature",) + _ATMOSPHERIC
                              + _FORCINGS + ("geopotential_at_surface", "land_sea_mask")),
          "target_variables": (_SURFACE + ("total_precipitation_12hr",
                                           "sea_surface_temperature") + _ATMOSPHERIC),
          "forcing_variables": _FORCINGS,
          "pressure_levels": (50, 100, 150, 200, 250, 300, 400, 500, 600, 700, 850, 925, 1000),
          "input_duration": "24h",
      },
      "denoiser_architecture_config": {
          "mesh_size": mesh_size, "latent_size": 512, "hidden_layers": 1,
          "radius_query_fraction_edge_length": 0.6,
          "norm_conditioning_features": ("noise_level_encodings",),
          "sparse_transformer_config": {"attention_k_hop": attention_k_hop, "d_model": 512,
                                        "num_layers": 16, "num_heads": 4, "ffw_hidden": 2048},
      },
      "noise_encoder_config": {"apply_log_first": True, "base_period": 16.0,
                               "num_frequencies": 32, "output_sizes": (32, 16)},
      "sampler_config": {"max_noise_level": 80.0, "min_noise_level": 0.03,
                         "num_noise_levels": 20, "rho": 7.0, "stochastic_churn_rate": 2.5,
                         "churn_min_noise_level": 0.75,
                         "churn_max_noise_level": float("inf"),
                         "noise_level_inflation_factor": 1.05},
      "noise_config": {"training_noise_level_rho": 7.0, "training_max_noise_level": 88.0,
                       "training_min_noise_level": 0.02},
  }


def released_config(mesh_size: int, attention_k_hop: int, resolution: float,
                    stats_dir: str = "") -> ml_collections.ConfigDict:
  """The wnscale config (`gencast_config.wnscale_config`) of `released_configs` on a grid of
  `resolution` degrees; with `stats_dir` (GenCast's statistics files), normalized with them
  and the sea-surface temperature filled with its `min_by_level`."""
  configs = released_configs(mesh_size, attention_k_hop)
  fill_values = nan_fill_values(stats_dir, configs["task_config"]) if stats_dir else ()
  config = gencast_config.wnscale_config(configs, stats_dir, fill_values)
  config.data.resolution = resolution
  return config
