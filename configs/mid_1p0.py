"""Mid-size problem of the benchmarks: 1 deg grid, multi-mesh levels 0..5, latent 128.

181 x 360 grid nodes (poles included), 10,242 mesh nodes, 8 message-passing
steps, 4 atmospheric variables on 3 levels plus 2 m temperature (13 channels),
float32, batch 1: big enough for memory and communication to show, small
enough to compile and run on 2 CPU cores.

  python bench/remat_memory.py    # remat settings side by side
  python bench/sharding.py        # graph shards 1..8, both exchanges
  python -m launch.train --config=configs/mid_1p0.py --workdir=/tmp/wnscale_mid

Expect about 2.5 GiB of temporaries per step without remat, ~4-5 s per step here
(2 cores).
"""

from wnscale.config import default_config


def get_config():
  config = default_config()
  config.model.update(latent_size=128, mesh_levels=5, message_passing_steps=8)
  config.data.update(
      resolution=1.0,
      variables=("temperature", "geopotential", "u_component_of_wind",
                 "v_component_of_wind", "2m_temperature"),
      pressure_levels=(300, 500, 850))
  config.data.synthetic = True  # unless --config.data.path is given
  config.train.batch_size = 1
  return config
