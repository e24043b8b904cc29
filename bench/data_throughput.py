"""Examples/s of the wnscale data pipeline versus plain xarray loops.

Writes a small 1 deg synthetic store (181 x 360, 13 levels, 40 times) in a
temporary directory, then reads the same shuffled examples (2 inputs +
1 target, all 11 variables, normalized, with forcings and statics) through:
  * wnscale: `source.WeatherExampleSource` (tensorstore, concurrent reads decoded
    straight into the batch's buffers); and the same gathering each example into a
    permuted node order, as a training run reads into its sharded layout's order;
  * xarray default: `xr.open_zarr(path)` + `.isel(time=...)` per example;
  * xarray chunks=None: `xr.open_zarr(path, chunks=None)` likewise;
each in the same Grain pipeline with 0 and 2 worker processes. A last row
reads the same arrays with tensorstore and returns nothing (decompression
only): the ceiling for any loader of this store on this machine.

  python bench/data_throughput.py [--examples=32]
"""

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import absl.flags  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402

from wnscale import config as config_lib  # noqa: E402
from wnscale import specs as specs_lib  # noqa: E402
from wnscale.data import forcings  # noqa: E402
from wnscale.data import pipeline  # noqa: E402
from wnscale.data import variables  # noqa: E402
from wnscale.data.making import synthetic  # noqa: E402
from wnscale.data.reading import normalization  # noqa: E402
from wnscale.graphs.points import PointSet  # noqa: E402

VARIABLES = tuple(v.name for v in variables.ATMOSPHERIC_VARIABLES + variables.SURFACE_VARIABLES)
LEVELS = variables.WB2_LEVELS_13
INPUT_STEPS, TARGET_STEPS = 2, 1


class XarraySource:
  """The same examples as `WeatherExampleSource`, read with plain xarray.

  Opens lazily so it pickles into Grain workers; `chunks` is passed to
  `xr.open_zarr` (`"default"`: not passed at all).
  """

  def __init__(self, path: str, chunks, num_examples: int):
    self.path, self.chunks, self.num_examples = path, chunks, num_examples
    stats = normalization.load_or_compute_stats(path, VARIABLES, LEVELS)
    self.channel = normalization.channel_stats(stats, VARIABLES, LEVELS)
    self.static = normalization.static_stats(stats)
    self._dataset = None

  def __len__(self):
    return self.num_examples

  def __repr__(self):
    return f"XarraySource({self.path!r}, chunks={self.chunks!r})"

  def read_batch(self, indices):
    return _stacked(self, indices)

  def __getitem__(self, index):
    if self._dataset is None:
      kwargs = {} if self.chunks == "default" else {"chunks": self.chunks}
      self._dataset = xr.open_zarr(self.path, **kwargs).sortby("latitude")
    dataset = self._dataset
    window = dataset.isel(time=slice(index, index + INPUT_STEPS + TARGET_STEPS))
    columns = []
    for name in VARIABLES:
      values = window[name]
      if "level" in values.dims:
        values = values.sel(level=list(LEVELS)).transpose(
            "time", "level", "latitude", "longitude")
      else:
        values = values.expand_dims("level", axis=1)
      columns.append(np.asarray(values.values).reshape(
          values.shape[0], values.shape[1], -1))
    state = (np.concatenate(columns, axis=1) - self.channel["mean"][:, None]
            ) / self.channel["std"][:, None]
    statics = np.stack([dataset[name].values.reshape(-1) for name in
                        variables.STATIC_VARIABLES])
    statics[0] = (statics[0] - self.static["mean"][0]) / self.static["std"][0]
    return {
        "inputs": state[:INPUT_STEPS].astype(np.float32),
        "targets": state[INPUT_STEPS:].astype(np.float32),
        "forcings": forcings.compute_forcings(
            window["time"].values,
            PointSet.regular(dataset["latitude"].values, dataset["longitude"].values)),
        "statics": statics.astype(np.float32),
    }


class DecodeOnly:
  """The tensorstore reads of `source`'s examples, decoded and dropped."""

  def __init__(self, source):
    self.source = source

  def __len__(self):
    return len(self.source)

  def read_batch(self, indices):
    return _stacked(self, indices)

  def __getitem__(self, index):
    store = self.source.store
    times = self.source.time_indices(index) * store.time_stride
    futures = [store.handles[name].oindex[times, store.level_indices].read()
               if variables.lookup(name).atmospheric
               else store.handles[name].oindex[times].read() for name in store.variables]
    return {"bytes": np.asarray(sum(f.result().nbytes for f in futures))}


def _stacked(source, indices) -> dict:
  """A batch of per-example reads, stacked (as Grain's `batch` would)."""
  examples = [source[int(index)] for index in indices]
  return {key: np.stack([example[key] for example in examples]) for key in examples[0]}


def examples_per_second(source, worker_count: int, num_examples: int) -> float:
  """Time `num_examples` examples after the first (worker start-up excluded)."""
  dataset = pipeline.make_dataset(source, seed=0)
  iterator = pipeline.make_iterator(source, dataset, batch_size=1,
                                    worker_count=worker_count)
  next(iterator)
  start = time.perf_counter()
  for _ in range(num_examples):
    next(iterator)
  elapsed = time.perf_counter() - start
  if worker_count:
    iterator.close()
  return num_examples / elapsed


def main():
  # Grain workers read absl flags; outside absl.app.run they must be parsed.
  absl.flags.FLAGS.mark_as_parsed()
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--examples", type=int, default=32)
  parser.add_argument("--days", type=int, default=10, help="4 times a day")
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as root:
    os.environ["WNSCALE_CACHE_DIR"] = root  # the statistics are cached there
    path = os.path.join(root, "era_1deg.zarr")
    start = time.perf_counter()
    synthetic.write_synthetic_store(
        path, resolution=1.0, start="2020-01-01",
        end=str(np.datetime64("2020-01-01") + np.timedelta64(args.days - 1,
                                                              "D")),
        levels=LEVELS)
    print(f"wrote 1 deg store ({args.days * 4} times, {len(LEVELS)} levels) "
          f"in {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    config = config_lib.default_config()
    config.data.update(path=path, resolution=1.0, variables=VARIABLES, pressure_levels=LEVELS,
                       train_start="", train_end="", input_steps=INPUT_STEPS,
                       target_steps=TARGET_STEPS)
    ours = pipeline.make_source(specs_lib.from_config(config).data, "train")
    print(f"statistics (one pass) in {time.perf_counter() - start:.1f} s; "
          f"{len(ours)} examples of {ours.store.num_grid_nodes} nodes x "
          f"{ours.store.num_channels} channels")
    # A training run reads into a sharded layout's node order: a gather per variable.
    slots = np.random.default_rng(0).permutation(ours.store.num_grid_nodes)
    loaders = {
        "wnscale (tensorstore)": ours,
        "wnscale, grid gathered": ours.in_layout(slots),
        "xarray open_zarr default": XarraySource(path, "default", len(ours)),
        "xarray open_zarr chunks=None": XarraySource(path, None, len(ours)),
        "tensorstore decode alone": DecodeOnly(ours),
    }
    rows = {name: [examples_per_second(loader, workers, args.examples)
                   for workers in (0, 2)]
            for name, loader in loaders.items()}
  try:
    import dask  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    print("note: dask is not installed, so open_zarr's default (chunks='auto')"
          " falls back to chunks=None")
  print(f"\n{'loader':30s} {'0 workers':>12s} {'2 workers':>12s}   (examples/s)")
  for name, rates in rows.items():
    print(f"{name:30s} {rates[0]:12.2f} {rates[1]:12.2f}")
  ours_rates = rows["wnscale (tensorstore)"]
  for name in list(rows)[2:4]:
    ratios = [a / b for a, b in zip(ours_rates, rows[name])]
    print(f"speed-up vs {name:26s} {ratios[0]:10.1f}x {ratios[1]:11.1f}x")
  ceiling = [a / b for a, b in zip(ours_rates, rows["tensorstore decode alone"])]
  print(f"{'wnscale / decode ceiling':38s} {ceiling[0]:10.2f}x {ceiling[1]:11.2f}x")


if __name__ == "__main__":
  main()
