"""The GraphCast fixture imported and fine-tuned: the run the fine-tune and export tests share.

No JAX at import: conftest.py imports this module before JAX's flags are set.
"""

import dataclasses
import os

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "graphcast_5p625")


@dataclasses.dataclass(frozen=True)
class Imported:
  """`imported`: the fixture's run directory (`launch.import_graphcast`'s); `config`: a
  config to fine-tune it (`train.init_from=imported`, `fine_tune_config`)."""

  imported: str
  config: object  # ml_collections.ConfigDict


def example_store(example_path: str, path: str) -> str:
  """GraphCast's example file (batch 0) as a zarr store in WeatherBench2's layout."""
  import xarray as xr  # noqa: PLC0415
  example = xr.load_dataset(example_path).isel(batch=0)
  example = example.assign_coords(time=example["datetime"].values).drop_vars("datetime")
  example.rename({"lat": "latitude", "lon": "longitude"}).to_zarr(path, zarr_format=2,
                                                                   consolidated=True)
  return path


def import_fixture(root: str) -> Imported:
  """Imports the fixture into `root/imported`, and the config of a run fine-tuning it: 2
  steps on the fixture's example (its 3 times: one example, with ERA5-style solar
  radiation read from the store, as the imported config says), graph over 8 devices,
  every stage rematerialized, edges in blocks (other settings than the import's), with a
  moving average of the parameters (`train.ema_decay=0.5`)."""
  from wnscale import config as config_lib  # noqa: PLC0415
  from wnscale.interop.graphcast_import import import_graphcast  # noqa: PLC0415
  imported = os.path.join(root, "imported")
  import_graphcast(os.path.join(FIXTURE, "params.npz"), os.path.join(FIXTURE, "stats"),
                   imported)
  store = example_store(os.path.join(FIXTURE, "example.nc"), os.path.join(root, "example.zarr"))
  config = config_lib.from_json(open(os.path.join(imported, "config.json")).read())
  config.data.update(path=store, train_start="2022-01-01", train_end="2022-01-01")
  config.train.update(init_from=imported, steps=2, warmup_steps=0, batch_size=1, log_every=1,
                      eval_every=0, checkpoint_every=2, ema_decay=0.5)
  config.mesh.update(data=1, graph=8)
  config.model.update(remat_grid_to_mesh_gnn=True, remat_mesh_gnn=True, mesh_remat_every=3,
                      remat_mesh_to_grid_gnn=True, edge_chunks=2)
  return Imported(imported, config_lib.validate(config))


def fine_tune(imported: Imported, workdir: str) -> str:
  """Trains `workdir` with `imported.config`; returns it."""
  from wnscale.train import trainer  # noqa: PLC0415
  trainer.train_and_evaluate(imported.config, workdir)
  return workdir
