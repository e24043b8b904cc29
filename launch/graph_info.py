"""Prints the node and edge counts of a config's graphs, and the time to build them or,
when they were in the cache already, to read them (`from_cache`).

  python -m launch.graph_info --config=configs/graphcast_0p25.py [--json] [--no_cache]

The grid is data.grid's (an O-grid, HEALPix), or else the regular one of data.resolution;
override any config key as
--config.section.key=value (wnscale/config.py lists them).
With `model.processor='transformer'` the counts include the attention
neighbour lists (`mesh_neighbour_edges`).
"""

import json
import time

from absl import flags

from launch import cli
from wnscale import cache, paths
from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.graphs import points
from wnscale.model import setup

_CONFIG = cli.define_config()
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object instead of a table.")
_NO_CACHE = flags.DEFINE_bool("no_cache", False, "Build even if the graphs are cached.")


def main(argv):
  del argv
  specs = specs_lib.from_config(config_lib.validate(_CONFIG.value))
  # The training grid comes from the store; here, the config's standard grid.
  grid = points.standard(specs.data.grid, specs.data.resolution)
  cached_before = _cached_files()
  start = time.perf_counter()
  graphs = setup.graphs_for_grid(specs.model, grid, use_cache=not _NO_CACHE.value)
  seconds = time.perf_counter() - start
  # Read from the cache when the build wrote no new file there (and --no_cache was not given).
  from_cache = not _NO_CACHE.value and _cached_files() == cached_before
  info = dict(graphs.counts(), from_cache=from_cache,
              **{"read_seconds" if from_cache else "build_seconds": round(seconds, 3)})
  if _JSON.value:
    print(json.dumps(info))
  else:
    for name, value in info.items():
      print(f"{name:>20}: {value:,}" if isinstance(value, int) and not isinstance(value, bool)
            else f"{name:>20}: {value}")


def _cached_files() -> set[str]:
  """The files of the graph caches (graphs and attention neighbourhoods)."""
  files = set()
  for kind in ("graphs", "neighbourhoods"):
    directory = paths.as_epath(cache.cache_path(kind, ""))
    if directory.exists():
      files.update(str(path) for path in directory.iterdir())
  return files


if __name__ == "__main__":
  cli.run(main, required=("config",))
