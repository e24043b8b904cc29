"""GenCast's 0.25 deg model (`GenCast 0p25deg <2019`, the paper's), a denoiser trained with
GenCast's diffusion loss.

  python -m launch.train --config=configs/gencast_0p25.py:GENCAST_STATS_DIR --workdir=DIR \
      --config.data.path=/path/to/era5_0p25deg_13levels.zarr

The model is what GenCast's released code (google-deepmind/graphcast,
`weathernext/weathernext1_gen`) configures (`gencast_import.released_configs`), as
configs/gencast_1p0.py's: its `TASK` (6 atmospheric variables on 13 levels; 6 surface
ones, 12 h precipitation predicted only; year and day progress forcings; two input times
12 h apart), the defaults of `DenoiserArchitectureConfig` and `SparseTransformerConfig`
(latent 512, 16 blocks of 4 heads, feed-forward 2048, radius 0.6), `NoiseEncoderConfig`,
`SamplerConfig` (20 levels from 80 to 0.03, churn 2.5 at levels >= 0.75, inflation 1.05) and
`NoiseConfig` (training noise levels rho 7 on [0.02, 88]); its noise is spherical white
noise (`model.sampler_spherical_noise`, the default). The 0.25 deg model's mesh is 6 times
refined (the README of GenCast's code). Assumed, as the code gives no value: 32 attention
hops (`attention_k_hop` has no default; a checkpoint carries its own), the paper's
neighbourhood of each mesh node on this mesh (the 1 deg config's 16 hops on 5 refinements
span the same distance).

The part after ":" is a directory of GenCast's statistics (`mean_by_level.nc`,
`stddev_by_level.nc`, `diffs_stddev_by_level.nc`, `min_by_level.nc`), as for
configs/gencast_1p0.py: the run normalizes with them and fills the sea-surface temperature
over land with its `min_by_level`, as GenCast does.
Expect: 1,038,240 grid nodes, 40,962 mesh nodes (`python -m launch.graph_info
--config=configs/gencast_0p25.py`); on CPU only graph building is practical.
"""

from wnscale.interop import gencast_import


def get_config(stats_dir: str = ""):
  return gencast_import.released_config(mesh_size=6, attention_k_hop=32, resolution=0.25,
                                        stats_dir=stats_dir)
