"""WeatherNext 2's network (as released) on ERA5's 0.25 deg grid (721 x 1440), 13 levels.

The model of `configs/weathernext2_1p0.py` at WeatherNext 2's own resolution:
1,038,240 grid nodes, 40,962 mesh nodes, 127,019,682 attention edges; the graph
sharded over 8 devices per example.

  python -m launch.train --config=configs/weathernext2_0p25.py --workdir=DIR \
      --config.data.path=/path/to/era5_0p25deg_13levels.zarr
  python -m launch.compile --config=configs/weathernext2_0p25.py --topology=v5e:4x4
"""

from wnscale.config import weathernext2_config


def get_config():
  config = weathernext2_config(resolution=0.25)
  config.mesh.graph = 8
  return config
