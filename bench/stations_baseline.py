"""Station RMSE: the tiny grid + stations model against the grid-only model interpolated.

  python bench/stations_baseline.py --steps=200 --workdir=/tmp/stations_baseline

Trains configs/tiny.py and configs/tiny_stations.py for --steps steps with the same
seed on the same synthetic grid store (a run already in --workdir is resumed, or kept
when done), then scores both over the first --examples examples of the eval range
against the station observations (the 500 synthetic stations of tiny_stations, NaN
skipped), per variable: RMSE of the stations model's station outputs, of its own grid
forecast interpolated to the stations, and of the grid-only model's grid forecast
interpolated to the stations (`stations.interpolate`, the interpolation the synthetic
network was observed with), and of the grid's truth interpolated: the observations'
noise, the floor of any forecast. Printed as a table and one JSON line.
"""

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from wnscale import config as config_lib  # noqa: E402
from wnscale import specs as specs_lib  # noqa: E402
from wnscale.assembly import assemble  # noqa: E402
from wnscale.data import pipeline, run_data  # noqa: E402
from wnscale.data.making import stations  # noqa: E402
from wnscale.model import forecast  # noqa: E402
from wnscale.sharding import mesh as mesh_lib  # noqa: E402
from wnscale.train.run_directory import RunDirectory  # noqa: E402

REPO = os.path.join(os.path.dirname(__file__), "..")
RUNS = {"grid": "configs/tiny.py", "stations": "configs/tiny_stations.py"}


def train(name: str, workdir: str, steps: int):
  """Trains run `name` (`RUNS`) in `workdir` to `steps` steps (resuming what is there)."""
  subprocess.run([sys.executable, "-m", "launch.train", f"--config={RUNS[name]}",
                  f"--workdir={workdir}", f"--config.train.steps={steps}", "--platform=cpu"],
                 cwd=REPO, check=True)


def restored(workdir: str, readers):
  """`(specs, predict(batch) -> (grid, {modality: points}))` of the newest parameters."""
  config = config_lib.from_json(open(os.path.join(workdir, "config.json")).read())
  specs = specs_lib.from_config(config)
  data = specs.data
  source = pipeline.make_source(data, "eval")
  point_sets = {reader.name: reader.points for reader in readers
                if reader.name in [m.name for m in data.modalities]}
  assembly = assemble(specs, source.store.points, source.normalization,
                      mesh_lib.single_device_mesh(), point_sets=point_sets,
                      point_stats={reader.name: reader.stats["targets"] for reader in readers})
  params, _ = RunDirectory(workdir).restore_params(assembly.abstract_params)
  predict = jax.jit(lambda p, batch: forecast.rollout_with_points(
      nnx.merge(assembly.graphdef, p), assembly.constants, batch))
  return specs, lambda batch: predict(params, {key: value for key, value in batch.items()
                                               if "/" not in key or key.split("/")[0]
                                               in point_sets})


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--workdir", default="/tmp/stations_baseline")
  parser.add_argument("--examples", type=int, default=240)
  parser.add_argument("--batch", type=int, default=8)
  args = parser.parse_args()
  workdirs = {name: os.path.join(args.workdir, name) for name in RUNS}
  for name, workdir in workdirs.items():
    train(name, workdir, args.steps)

  station_config = config_lib.from_json(open(os.path.join(workdirs["stations"],
                                                          "config.json")).read())
  data = specs_lib.from_config(station_config).data
  training = pipeline.make_source(data, "train")
  readers = run_data.modality_readers(data, station_config.seed, training.store.times,
                                     training.range_times)
  reader = readers[0]
  source = pipeline.make_source(data, "eval").with_modalities(readers)
  channels = [source.store.channel_names.index(name) for name in reader.targets]
  mean, std = source.normalization.mean[channels], source.normalization.std[channels]
  point_mean, point_std = (reader.stats["targets"][s] for s in ("mean", "std"))
  models = {name: restored(workdir, readers)[1] for name, workdir in workdirs.items()}
  columns = ("stations model: station outputs", "stations model: grid interpolated",
             "grid-only model: grid interpolated", "grid truth interpolated (noise)")
  def at_stations(grid):  # normalized grid outputs [B, T, C_out, G] -> physical [B, T, C, P]
    return stations.interpolate(np.asarray(grid)[:, :, channels] * std[:, None]
                                + mean[:, None], source.store.points, reader.points)

  squared = {column: np.zeros(len(reader.targets)) for column in columns}
  count = np.zeros(len(reader.targets))
  examples = min(args.examples, len(source))
  for first in range(0, examples, args.batch):
    batch = source.read_batch(np.arange(first, min(first + args.batch, examples)))
    truth = batch["stations/targets"] * point_std[:, None] + point_mean[:, None]
    present = ~np.isnan(truth)
    count += present.sum(axis=(0, 1, 3))
    outputs = {"grid truth interpolated (noise)": at_stations(batch["targets"])}
    for name, model in models.items():
      grid, points = model(batch)
      outputs[f"{name}-only model: grid interpolated" if name == "grid" else
              "stations model: grid interpolated"] = at_stations(grid)
      if name == "stations":
        outputs["stations model: station outputs"] = (
            np.asarray(points["stations"]) * point_std[:, None] + point_mean[:, None])
    for column, values in outputs.items():
      error = np.where(present, values - np.where(present, truth, 0), 0)
      squared[column] += np.square(error).sum(axis=(0, 1, 3))
  rmse = {column: dict(zip(reader.targets, np.sqrt(squared[column] / count).tolist()))
          for column in columns}
  print(f"Station RMSE after {args.steps} steps, {examples} eval examples, "
        f"{int(count[0]):,} observations of {reader.targets[0]}:")
  print(f"{'':40s}" + "".join(f"{name:>26s}" for name in reader.targets))
  for column in columns:
    print(f"{column:40s}" + "".join(f"{rmse[column][name]:26.4f}" for name in reader.targets))
  print(json.dumps({"steps": args.steps, "examples": examples, "rmse": rmse}))


if __name__ == "__main__":
  main()
