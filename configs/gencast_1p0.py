"""GenCast's 1 deg model (`GenCast 1p0deg <2019`), a denoiser trained with GenCast's
diffusion loss.

  python -m launch.train --config=configs/gencast_1p0.py:GENCAST_STATS_DIR --workdir=DIR \
      --config.data.path=/path/to/era5_1deg_13levels.zarr

`RELEASED` is what GenCast's released code (google-deepmind/graphcast,
`weathernext/weathernext1_gen`) configures: its `TASK` (6 atmospheric variables on 13
levels; 6 surface ones, 12 h precipitation predicted only; year and day progress forcings;
two input times 12 h apart), the defaults of `DenoiserArchitectureConfig` and
`SparseTransformerConfig` (latent 512, 16 blocks of 4 heads, feed-forward 2048, radius
0.6), `NoiseEncoderConfig`, `SamplerConfig` and `NoiseConfig` (training noise levels rho 7
on [0.02, 88]); the 1 deg model's mesh is 5 times refined (its README). The code sets no
default `attention_k_hop` (a checkpoint carries its own): 16 here, the paper's 32 hops at 6
refinements over the same distance on a mesh half as fine (WeatherNext 2's released 1 deg
model: 16 at 5). The importer's mapping (`gencast_config.wnscale_config`) makes it a
wnscale config, as `launch.import_gencast` does a checkpoint's.

The part after ":" is a directory of GenCast's statistics (`mean_by_level.nc`,
`stddev_by_level.nc`, `diffs_stddev_by_level.nc`, `min_by_level.nc`): the run normalizes
with them and fills the sea-surface temperature over land with its `min_by_level`, as
GenCast does. Without it, the statistics are computed from the training range and the
sea-surface temperature has no fill (`data.nan_fill_values` then needs one for ERA5's NaNs).
Expect: 65,160 grid nodes, 10,242 mesh nodes (`python -m launch.graph_info
--config=configs/gencast_1p0.py`); on CPU only graph building and compiling are practical.
"""

from wnscale.interop import gencast_config, gencast_import

SURFACE = ("2m_temperature", "mean_sea_level_pressure", "10m_v_component_of_wind",
           "10m_u_component_of_wind")
ATMOSPHERIC = ("temperature", "geopotential", "u_component_of_wind", "v_component_of_wind",
               "vertical_velocity", "specific_humidity")
FORCINGS = ("year_progress_sin", "year_progress_cos", "day_progress_sin", "day_progress_cos")
RELEASED = {
    "task_config": {
        "input_variables": (SURFACE + ("sea_surface_temperature",) + ATMOSPHERIC + FORCINGS
                            + ("geopotential_at_surface", "land_sea_mask")),
        "target_variables": (SURFACE + ("total_precipitation_12hr", "sea_surface_temperature")
                             + ATMOSPHERIC),
        "forcing_variables": FORCINGS,
        "pressure_levels": (50, 100, 150, 200, 250, 300, 400, 500, 600, 700, 850, 925, 1000),
        "input_duration": "24h",
    },
    "denoiser_architecture_config": {
        "mesh_size": 5, "latent_size": 512, "hidden_layers": 1,
        "radius_query_fraction_edge_length": 0.6,
        "norm_conditioning_features": ("noise_level_encodings",),
        "sparse_transformer_config": {"attention_k_hop": 16, "d_model": 512, "num_layers": 16,
                                      "num_heads": 4, "ffw_hidden": 2048},
    },
    "noise_encoder_config": {"apply_log_first": True, "base_period": 16.0,
                             "num_frequencies": 32, "output_sizes": (32, 16)},
    "sampler_config": {"max_noise_level": 80.0, "min_noise_level": 0.03, "num_noise_levels": 20,
                       "rho": 7.0, "stochastic_churn_rate": 2.5, "churn_min_noise_level": 0.75,
                       "churn_max_noise_level": float("inf"),
                       "noise_level_inflation_factor": 1.05},
    "noise_config": {"training_noise_level_rho": 7.0, "training_max_noise_level": 88.0,
                     "training_min_noise_level": 0.02},
}


def get_config(stats_dir: str = ""):
  fill_values = (gencast_import.nan_fill_values(stats_dir, RELEASED["task_config"])
                 if stats_dir else ())
  config = gencast_config.wnscale_config(RELEASED, stats_dir, fill_values)
  config.data.resolution = 1.0
  return config
