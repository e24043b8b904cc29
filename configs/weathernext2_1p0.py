"""WeatherNext 2's network (as released) on a 1 deg grid (181 x 360 with poles), 13 levels.

GraphCast's encoder and decoder with node latents 768 and edge latents 32, and
a transformer processor: 24 blocks of width 768, 6 heads, feed-forward 3072,
attention over each mesh node's 32-hop neighbourhood on the finest of 6
refinements (127,019,682 attention edges); bfloat16; year progress as a
global input. See `wnscale.config.weathernext2_config` for what differs from
the released model; its FGN ensembles are off by default: add
--config.model.noise_channels=32 --config.train.loss=crps (2 members per example).

  python -m launch.train --config=configs/weathernext2_1p0.py --workdir=DIR \
      --config.data.path=/path/to/era5_1deg_13levels.zarr

Expect: building the neighbour lists takes ~95 s and 3.7 GB of host memory on 2
CPU cores, once (cached on disk, ~0.5 GB); `python -m launch.graph_info
--config=configs/weathernext2_1p0.py` prints the counts. On CPU only graph
building and compiling are practical.
"""

from wnscale.config import weathernext2_config


def get_config():
  return weathernext2_config(resolution=1.0)
