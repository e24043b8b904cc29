"""The config of a run directory (e.g. one written by `launch.import_graphcast`).

  python -m launch.train --config=configs/imported.py:/path/to/imported \
      --config.train.init_from=/path/to/imported --config.data.path=/data/era5.zarr \
      --config.mesh.graph=4 --config.model.remat_mesh_gnn=True --workdir=/path/to/new_run

The part after ":" is the run directory; its `config.json` gives every key,
and the flags after it override them (remat, sharding and training keys are
free to differ; model and data keys must keep the parameters' shapes).
"""

from wnscale import config as config_lib
from wnscale import paths


def get_config(run_directory: str):
  path = paths.join(paths.normalize(run_directory), "config.json")
  if not paths.exists(path):
    raise ValueError(f"No config.json in {run_directory}: --config=configs/imported.py:DIR "
                     "takes a run directory.")
  return config_lib.from_json(paths.read_text(path))
