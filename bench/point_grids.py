"""A point grid against the regular grid, side by side: the train step's time and memory.

  python bench/point_grids.py [--problems=tiny,mid --repeats=5]

Each problem is trained on its regular grid and on the octahedral reduced
Gaussian grid O<N> with the nearest number of points, everything else equal:
`tiny` is `configs/tiny.py` (5.625 deg, 32 x 64 = 2,048 points; O19 has
2,128), `mid` is `configs/mid_1p0.py` (1 deg with poles, 181 x 360 = 65,160
points; O123 has 64,944). The step is the one training runs
(`train.step.make_train_step`: loss, gradients and the AdamW update, on a
one-device layout, the config's batch), on random batches. Printed per
problem: the grids' points and edges, compiled temporary memory
(`memory_analysis()`), the median step time of alternating runs (both grids
see the same machine load), the ratios O-grid / regular, and one JSON line.
Target: within 1.2x of the regular grid on both.
"""

import argparse
import json
import os
import statistics
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import mid_problem  # noqa: E402
from wnscale import config as config_lib  # noqa: E402
from wnscale.graphs import points as points_lib  # noqa: E402

PROBLEMS = {"tiny": os.path.join(mid_problem.REPO, "configs", "tiny.py"),
            "mid": mid_problem.CONFIG}


def octahedral_points(n: int) -> int:
  """Points of O<n> (`points.octahedral`)."""
  return 4 * n * (n + 9)


def nearest_octahedral(num_points: int) -> int:
  """The N of the O<N> grid whose point count is nearest `num_points`."""
  n = 1
  while octahedral_points(n + 1) <= num_points:
    n += 1
  return min((n, n + 1), key=lambda k: abs(octahedral_points(k) - num_points))


def compare(name: str, repeats: int) -> dict:
  """Builds, compiles and times problem `name` on both grids; prints the table."""
  config = config_lib.validate(config_lib.load(PROBLEMS[name]))
  regular = points_lib.standard("", config.data.resolution)
  ogrid = points_lib.octahedral(nearest_octahedral(regular.size))
  grids = {"regular": mid_problem.TrainStep(config, regular),
           "O-grid": mid_problem.TrainStep(config, ogrid)}
  mid_problem.run_alternately(grids.values(), repeats)
  print(mid_problem.describe(name, config))
  header = (f"{'grid':<32}{'points':>8}{'g2m edges':>11}{'m2g edges':>11}{'temp MiB':>10}"
            f"{'step s':>9}{'compile s':>11}  steps s (all)")
  print(header)
  print("-" * len(header))
  for grid in grids.values():
    print(f"{grid.points.name:<32}{grid.points.size:>8,}{grid.counts['grid_to_mesh_edges']:>11,}"
          f"{grid.counts['mesh_to_grid_edges']:>11,}{grid.temp_bytes / 2**20:>10.1f}"
          f"{statistics.median(grid.times):>9.3f}{grid.compile_seconds:>11.1f}  "
          + " ".join(f"{t:.3f}" for t in grid.times))
  reg, og = grids["regular"], grids["O-grid"]
  ratios = {"points": og.points.size / reg.points.size,
            "temp": og.temp_bytes / reg.temp_bytes,
            "time": statistics.median(og.times) / statistics.median(reg.times)}
  print(f"O-grid / regular: points {ratios['points']:.3f}, memory {ratios['temp']:.3f}, "
        f"time {ratios['time']:.3f} (target: within 1.2); per point: memory "
        f"{ratios['temp'] / ratios['points']:.3f}, time {ratios['time'] / ratios['points']:.3f}",
        flush=True)
  return {"problem": name, **{
      f"{key}_{field}": value for key, grid in (("regular", reg), ("ogrid", og))
      for field, value in (("grid", grid.points.name), ("points", grid.points.size),
                           ("counts", grid.counts), ("temp_bytes", grid.temp_bytes),
                           ("step_seconds", statistics.median(grid.times)))},
      **{f"{key}_ratio": round(value, 4) for key, value in ratios.items()}}


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--problems", default="tiny,mid",
                      help=f"comma-separated, of {', '.join(PROBLEMS)}")
  parser.add_argument("--repeats", type=int, default=5, help="timed steps per grid")
  args = parser.parse_args()
  names = args.problems.split(",")
  unknown = [n for n in names if n not in PROBLEMS]
  if unknown or args.repeats < 1:
    parser.error(f"--problems takes {', '.join(PROBLEMS)} (got {args.problems}); "
                 "--repeats at least 1")
  for name in names:
    print(json.dumps(compare(name, args.repeats)), flush=True)


if __name__ == "__main__":
  sys.exit(main())
