"""Tiny: a GraphCast-shaped model that trains on 2 CPU cores in minutes.

5.625 deg grid (32 x 64, WeatherBench2's coarsest), multi-mesh levels 0..2
(162 nodes), latent 32, 4 message-passing steps, 7 variables on 2 levels
(17 channels), on the synthetic ERA5-like store made on first use.

  python -m launch.train --config=configs/tiny.py --workdir=/tmp/wnscale_tiny

Expect: the store is written into the workdir (a few seconds), the step compiles
in ~10-20 s, then the loss falls from ~1-2 within the first 100 steps.
"""

from wnscale.config import default_config


def get_config():
  config = default_config()
  config.model.latent_size = 32
  config.model.mesh_levels = 2
  config.model.message_passing_steps = 4
  config.data.resolution = 5.625
  return config
