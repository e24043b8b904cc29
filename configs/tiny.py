"""Tiny: a GraphCast-shaped model that trains on 2 CPU cores in minutes.

5.625 deg grid (32 x 64, WeatherBench2's coarsest), multi-mesh levels 0..2
(162 nodes), latent 32, 4 message-passing steps, 7 variables on 2 levels
(12 state channels), on the synthetic ERA5-like store made on first use.

  python -m launch.train --config=configs/tiny.py --workdir=/tmp/wnscale_tiny

Expect (2 CPU cores): the synthetic store is written once into the cache
directory ($WNSCALE_CACHE_DIR or ~/.cache/wnscale, a few seconds), the step
compiles in 8-10 s, then 12-18 steps/s; the loss falls from ~12 at step 10 to ~2.8
at step 100 and ~2.3 at step 200, 30-40 s in all.
"""

from wnscale.config import default_config


def get_config():
  config = default_config()  # the defaults are this model: every knob is documented there
  config.data.synthetic = True
  return config
