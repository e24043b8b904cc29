"""Tiny with stations: configs/tiny.py's model with a station network beside the grid.

500 synthetic stations (80% on land) observe the synthetic grid store's
2 m temperature and mean sea-level pressure, interpolated plus noise (10% of each
quantity's std), 10% of the values missing (`wnscale.data.making.stations`). They are
inputs (their own embedder and encoder onto the shared mesh; a missing value enters
as 0 with a mask channel) and targets (their own decoder and output MLP, predicting a
change on the grid's forecast interpolated to the stations), with loss weight 1
beside the grid's loss.

  python -m launch.train --config=configs/tiny_stations.py --workdir=/tmp/wnscale_stations

Its first run writes the synthetic grid store (as configs/tiny.py's does) and then the
observation store (a few seconds) into the cache directory
($WNSCALE_CACHE_DIR/datasets, by default ~/.cache/wnscale/datasets); the log's
"Store and statistics ready" line names both. To train on a network of your own,
make it with

  python -m launch.make_dataset --stations=500 --from_store=GRID_STORE --out=OBS_STORE

and give --config.data.path=GRID_STORE and the modality's source OBS_STORE (or any
observation store of the same layout: `wnscale.data.reading.observations`).

Expect (2 CPU cores, loaded by other work): the network is written in about a second,
the step compiles in 20-45 s, then 3-6 steps/s; the loss (grid plus stations) is 11.4 at
step 10, 2.19 at step 100 and 1.58 at step 200 (configs/tiny.py's: 10.99, 2.15, 1.55);
about 130 s in all. metrics.jsonl's evaluation lines add eval/rmse/stations/2m_temperature
and eval/rmse/stations/mean_sea_level_pressure (K, Pa) beside the grid's: 2.47 K and 83.3 Pa
at step 200 (the grid's own 1.80 K and 47.6 Pa), 1.78 K and 74.5 Pa at step 1000.
bench/stations_baseline.py scores them against the grid-only model's forecast interpolated
to the stations: 2.54 K and 83.8 Pa against 2.62 K and 82.8 Pa at 200 steps, 1.774 K and
74.49 Pa against 1.793 K and 74.54 Pa at 1000, where the observations' own noise is
1.65 K and 73.4 Pa.
"""

from wnscale.config import default_config

STATION_VARIABLES = ("2m_temperature", "mean_sea_level_pressure")


def get_config():
  config = default_config()  # configs/tiny.py's model and store
  config.data.synthetic = True
  config.data.modalities = (("stations", "synthetic", STATION_VARIABLES, STATION_VARIABLES,
                             1.0),)
  return config
