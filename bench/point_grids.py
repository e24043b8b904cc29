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
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

import mid_problem  # noqa: E402
from mid_problem import problems  # noqa: E402
from wnscale import config as config_lib  # noqa: E402
from wnscale import specs as specs_lib  # noqa: E402
from wnscale.assembly import assemble  # noqa: E402
from wnscale.graphs import points as points_lib  # noqa: E402
from wnscale.planner import xla_stats  # noqa: E402
from wnscale.sharding import mesh as mesh_lib  # noqa: E402
from wnscale.train import optimizer as optimizer_lib  # noqa: E402
from wnscale.train import step as step_lib  # noqa: E402
from wnscale.train.state import initial_state  # noqa: E402

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


class GridStep:
  """A config's compiled train step on one grid, with its state, constants and a batch."""

  def __init__(self, config, points):
    specs = specs_lib.from_config(config)
    mesh = mesh_lib.single_device_mesh()
    assembly = assemble(specs, points, None, mesh, params="init")
    self.points = points
    self.counts = assembly.graphs.counts()
    layout = assembly.layout
    self.constants, self.halo_indices = layout.constants(assembly.constants)
    batch = problems.random_batch(config, points.size, config.train.batch_size)
    self.batch = layout.global_batch(layout.host_batch(batch), config.train.batch_size)
    optimizer = optimizer_lib.make_optimizer(config.train)
    self.state = jax.device_put(initial_state(assembly.params, optimizer),
                                assembly.replicated)
    step = step_lib.make_train_step(
        layout, assembly.graphdef, optimizer,
        optimizer_lib.learning_rate_schedule(config.train), self.constants, self.halo_indices)
    start = time.perf_counter()
    self.step = step.lower(self.state, self.constants, self.halo_indices, self.batch).compile()
    self.compile_seconds = time.perf_counter() - start
    self.temp_bytes = xla_stats.compiled_stats(self.step)["temp_bytes"]
    self.times = []

  def run(self, timed: bool = True):
    start = time.perf_counter()
    self.state, metrics = self.step(self.state, self.constants, self.halo_indices, self.batch)
    jax.block_until_ready(metrics)
    if timed:
      self.times.append(time.perf_counter() - start)


def compare(name: str, repeats: int) -> dict:
  """Builds, compiles and times problem `name` on both grids; prints the table."""
  config = config_lib.validate(config_lib.load(PROBLEMS[name]))
  regular = points_lib.standard("", config.data.resolution)
  ogrid = points_lib.octahedral(nearest_octahedral(regular.size))
  grids = {"regular": GridStep(config, regular), "O-grid": GridStep(config, ogrid)}
  for grid in grids.values():
    grid.run(timed=False)  # warm-up
  for _ in range(repeats):
    for grid in grids.values():
      grid.run()
  m = config.model
  print(f"{name}: mesh levels 0..{m.mesh_levels}, latent {m.latent_size}, "
        f"{m.message_passing_steps} steps, batch {config.train.batch_size}, "
        f"{config.model.dtype}, jax {jax.__version__}, {jax.devices()[0].platform}")
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
