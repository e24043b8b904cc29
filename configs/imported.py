"""The config of a run directory (e.g. one written by `launch.import_graphcast`).

  python -m launch.train --config=configs/imported.py:/path/to/imported \
      --config.train.init_from=/path/to/imported --config.data.path=/data/era5.zarr \
      --config.mesh.graph=4 --config.model.remat_mesh_gnn=True --workdir=/path/to/new_run

The part after ":" is the run directory; its `config.json` gives every key,
and the flags after it override them (remat, sharding and training keys are
free to differ; model and data keys must keep the parameters' shapes).
"""

from wnscale.train.run_directory import CONFIG, RunDirectory


def get_config(run_directory: str):
  run = RunDirectory(run_directory)
  if not run.has_config():
    raise ValueError(f"No {CONFIG} in {run_directory}: --config=configs/imported.py:DIR "
                     "takes a run directory.")
  return run.read_config()
