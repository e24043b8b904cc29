"""GraphCast's architecture on a 1 deg grid (181 x 360 with poles), 37 levels.

The paper's model (latent 512, 16 message-passing steps, multi-mesh levels
0..6, 6 atmospheric variables on 37 levels + 5 surface variables, bfloat16
activations) with the paper's remat scheme: checkpoint every 3 processor steps,
the whole encoder and decoder, and the encoder/decoder edges in 4 blocks.

  python -m launch.train --config=configs/graphcast_1p0.py --workdir=DIR \
      --config.data.path=/path/to/era5_1deg_37levels.zarr

Expect: 65,160 grid nodes, 40,962 mesh nodes (`python -m launch.graph_info
--config=configs/graphcast_1p0.py`); on CPU only graph building and compiling
are practical.
"""

from wnscale.config import graphcast_paper_config


def get_config():
  return graphcast_paper_config(resolution=1.0)
