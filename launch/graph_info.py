"""Prints the node and edge counts of a config's graphs and the build time.

  python -m launch.graph_info --config=configs/graphcast_0p25.py [--json]

The grid is the standard one of data.resolution; override any config key as
--config.section.key=value (wnscale/config.py lists them).
With `model.processor='transformer'` the counts include the attention
neighbour lists (`mesh_neighbour_edges`).
"""

import json
import time

from absl import flags

from launch import cli
from wnscale import config as config_lib
from wnscale.graphs import grid
from wnscale.model import setup

_CONFIG = cli.define_config()
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object instead of a table.")
_NO_CACHE = flags.DEFINE_bool("no_cache", False, "Build even if the graphs are cached.")


def main(argv):
  del argv
  config = config_lib.validate(_CONFIG.value)
  # The training grid comes from the store; here, the standard grid of the resolution.
  latitude, longitude = grid.regular_grid(config.data.resolution)
  start = time.perf_counter()
  graphs = setup.graphs_for_grid(config, latitude, longitude, use_cache=not _NO_CACHE.value)
  seconds = time.perf_counter() - start
  counts = graphs.counts()
  if _JSON.value:
    print(json.dumps(dict(counts, build_seconds=round(seconds, 3))))
  else:
    for name, value in counts.items():
      print(f"{name:>20}: {value:,}")
    print(f"{'build_seconds':>20}: {seconds:.2f}")


if __name__ == "__main__":
  cli.run(main, required=("config",))
