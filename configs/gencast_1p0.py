"""GenCast's 1 deg model (`GenCast 1p0deg <2019`), a denoiser trained with GenCast's
diffusion loss.

  python -m launch.train --config=configs/gencast_1p0.py:GENCAST_STATS_DIR --workdir=DIR \
      --config.data.path=/path/to/era5_1deg_13levels.zarr

The model is what GenCast's released code (google-deepmind/graphcast,
`weathernext/weathernext1_gen`) configures (`gencast_import.released_configs`): its `TASK`
(6 atmospheric variables on 13 levels; 6 surface ones, 12 h precipitation predicted only;
year and day progress forcings; two input times 12 h apart), the defaults of
`DenoiserArchitectureConfig` and `SparseTransformerConfig` (latent 512, 16 blocks of 4
heads, feed-forward 2048, radius 0.6), `NoiseEncoderConfig`, `SamplerConfig` and
`NoiseConfig` (training noise levels rho 7 on [0.02, 88]); the 1 deg model's mesh is 5
times refined (its README). The code sets no default `attention_k_hop` (a checkpoint
carries its own): 16 here, the paper's 32 hops at 6 refinements over the same distance on
a mesh half as fine (WeatherNext 2's released 1 deg model: 16 at 5). The importer's mapping (`gencast_config.wnscale_config`) makes it a
wnscale config, as `launch.import_gencast` does a checkpoint's.

The part after ":" is a directory of GenCast's statistics (`mean_by_level.nc`,
`stddev_by_level.nc`, `diffs_stddev_by_level.nc`, `min_by_level.nc`): the run normalizes
with them and fills the sea-surface temperature over land with its `min_by_level`, as
GenCast does. Without it, the statistics are computed from the training range and the
sea-surface temperature has no fill (`data.nan_fill_values` then needs one for ERA5's NaNs).
Expect: 65,160 grid nodes, 10,242 mesh nodes (`python -m launch.graph_info
--config=configs/gencast_1p0.py`); on CPU only graph building and compiling are practical.
"""

from wnscale.interop import gencast_import


def get_config(stats_dir: str = ""):
  return gencast_import.released_config(mesh_size=5, attention_k_hop=16, resolution=1.0,
                                        stats_dir=stats_dir)
