"""The benchmarks' shared problem: `configs/mid_1p0.py`, with size flags, on its standard grid."""

import argparse
import os
import sys

from wnscale import config as config_lib
from wnscale.graphs import grid
from wnscale.graphs.points import PointSet

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CONFIG = os.path.join(REPO, "configs", "mid_1p0.py")
# The benchmarks measure the tests' problems (random batches on a real graph).
sys.path.insert(0, os.path.join(REPO, "tests"))
import problems  # noqa: E402,F401  pylint: disable=g-import-not-at-top,unused-import


def parse(description: str, repeats: int):
  """`(args, config, points)` from the command line (see `--help`); `points` is the regular
  grid of `--resolution` (`PointSet`)."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--resolution", type=float, default=1.0)
  parser.add_argument("--mesh_levels", type=int, default=5)
  parser.add_argument("--latent", type=int, default=128)
  parser.add_argument("--steps", type=int, default=8,
                      help="processor layers (message-passing steps or transformer blocks)")
  parser.add_argument("--processor", default="interaction_network",
                      help="interaction_network or transformer")
  parser.add_argument("--k_hop", type=int, default=4, help="transformer: attention hops")
  parser.add_argument("--repeats", type=int, default=repeats, help="timed executions")
  parser.add_argument("--only", default="", help="comma-separated variant names")
  args = parser.parse_args()
  config = config_lib.load(CONFIG)
  config.model.update(latent_size=args.latent, mesh_levels=args.mesh_levels,
                      message_passing_steps=args.steps, processor=args.processor,
                      transformer_layers=args.steps, transformer_k_hop=args.k_hop,
                      transformer_ffw_size=4 * args.latent)
  config.data.resolution = args.resolution
  points = PointSet.regular(*grid.regular_grid(args.resolution, include_poles=True))
  return args, config_lib.validate(config), points
