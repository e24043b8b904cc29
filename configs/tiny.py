"""Tiny: a GraphCast-shaped model that trains on 2 CPU cores in minutes.

5.625 deg grid (32 x 64, WeatherBench2's coarsest), multi-mesh levels 0..2
(162 nodes), latent 32, 4 message-passing steps, 7 variables, 5 of them on 2
levels (12 state channels), on the synthetic ERA5-like store made on first use.

  python -m launch.train --config=configs/tiny.py --workdir=/tmp/wnscale_tiny

Expect (2 CPU cores, shared with other jobs: load average 5-8): the synthetic
store is written once into the cache directory ($WNSCALE_CACHE_DIR/datasets, by
default ~/.cache/wnscale/datasets: 11-14 s, its statistics 8-10 s), the step
compiles in ~15 s, then 5-10 steps/s; the loss falls from ~11.6 at step 10 to ~2.8
at step 100 and ~2.3 at step 200; 76-83 s in all the first time, 57 s later.
"""

from wnscale.config import default_config


def get_config():
  config = default_config()  # the defaults are this model: every knob is documented there
  config.data.synthetic = True
  return config
