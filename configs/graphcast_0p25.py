"""GraphCast 0.25 deg: the paper's model on ERA5's 721 x 1440 grid.

1,038,240 grid nodes, 40,962 mesh nodes (levels 0..6), 327,660 multi-mesh
edges, latent 512, 16 message-passing steps, 37 levels, bfloat16 activations,
the paper's remat scheme, and the graph sharded over 8 devices per example.

  python -m launch.train --config=configs/graphcast_0p25.py --workdir=DIR \
      --config.data.path=/path/to/era5_0p25deg_37levels.zarr

Expect: graph build ~3 s on 2 CPU cores (cached on disk afterwards).
"""

from wnscale.config import graphcast_paper_config


def get_config():
  config = graphcast_paper_config(resolution=0.25)
  config.mesh.graph = 8
  return config
