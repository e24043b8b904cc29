"""Tiny: a GraphCast-shaped model that trains on 2 CPU cores in minutes.

5.625 deg grid (32 x 64, WeatherBench2's coarsest), multi-mesh levels 0..2
(162 nodes), latent 32, 4 message-passing steps, 7 variables, 5 of them on 2
levels (12 state channels), on the synthetic ERA5-like store made on first use.

  python -m launch.train --config=configs/tiny.py --workdir=/tmp/wnscale_tiny

Expect (2 CPU cores): the synthetic store (144 MB) is written once into the cache
directory ($WNSCALE_CACHE_DIR/datasets, by default ~/.cache/wnscale/datasets: ~6 s),
the step compiles in 10-25 s, then 5-12 steps/s; the loss is 10.99 at step 10, 2.15 at
step 100 and 1.55 at step 200; 47 s in all the first time (load average ~3), 82 s for a
later run at a load average of ~5. The run's last lines name the store it trained on.
"""

from wnscale.config import default_config


def get_config():
  config = default_config()  # the defaults are this model: every knob is documented there
  config.data.synthetic = True
  return config
