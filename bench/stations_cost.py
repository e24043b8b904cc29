"""Stations beside the grid against the grid alone, side by side: the train step's time and memory.

  python bench/stations_cost.py [--problems=tiny,mid --stations=10000 --repeats=5]

Each problem is trained with and without a station modality, everything else
equal: `tiny` is `configs/tiny.py` (5.625 deg, 2,048 grid nodes), `mid` is
`configs/mid_1p0.py` (1 deg with poles, 65,160 grid nodes, 10,242 mesh nodes).
The stations are `--stations` random points observing 2 m temperature (an input and
a target, 10% missing): their own embedder, encoder edges, decoder edges, output MLP
and first-guess interpolation from the grid (`wnscale.model.forecast.point_first_guess`).
The step is `mid_problem.TrainStep`'s (the one training runs, on random batches). Printed per
problem: the edges, compiled temporary memory (`memory_analysis()`), the median step time
of alternating runs (both see the same machine load), the ratios stations / grid alone
(time also fastest to fastest, which load from other work disturbs least),
and one JSON line (appended to bench/results/stations_cost_<platform>.jsonl). Target:
under 1.15x time and 1.10x memory.
"""

import argparse
import json
import os
import statistics
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

import mid_problem  # noqa: E402
from wnscale import config as config_lib  # noqa: E402
from wnscale.data.making import stations as stations_lib  # noqa: E402
from wnscale.graphs import points as points_lib  # noqa: E402

PROBLEMS = {"tiny": os.path.join(mid_problem.REPO, "configs", "tiny.py"),
            "mid": mid_problem.CONFIG}
VARIABLES = ("2m_temperature",)  # a state variable of both problems
RESULTS = os.path.join(mid_problem.REPO, "bench", "results")


def compare(name: str, num_stations: int, repeats: int) -> dict:
  """Builds, compiles and times problem `name` with and without stations; prints the table."""
  config = config_lib.validate(config_lib.load(PROBLEMS[name]))
  points = points_lib.standard("", config.data.resolution)
  stations = stations_lib.random_land_biased_points(num_stations, points,
                                                    np.zeros(points.size, bool))
  with_stations = config_lib.load(PROBLEMS[name])
  with_stations.data.modalities = (("stations", "synthetic", VARIABLES, VARIABLES),)
  steps = {"grid alone": mid_problem.TrainStep(config, points),
           f"{num_stations:,} stations": mid_problem.TrainStep(
               config_lib.validate(with_stations), points, {"stations": stations})}
  mid_problem.run_alternately(steps.values(), repeats)
  print(f"{mid_problem.describe(name, config)}; {points.name}")
  header = (f"{'run':<20}{'grid edges':>12}{'station edges':>15}{'temp MiB':>10}"
            f"{'step s':>9}{'compile s':>11}  steps s (all)")
  print(header)
  print("-" * len(header))
  for label, step in steps.items():
    edges = {k: v for k, v in step.counts.items() if k.endswith("_edges")}
    station_edges = sum(v for k, v in edges.items() if "station" in k)
    grid_edges = sum(edges.values()) - station_edges
    print(f"{label:<20}{grid_edges:>12,}{station_edges:>15,}{step.temp_bytes / 2**20:>10.1f}"
          f"{statistics.median(step.times):>9.3f}{step.compile_seconds:>11.1f}  "
          + " ".join(f"{t:.3f}" for t in step.times))
  alone, with_stations = steps.values()
  ratios = {"temp": with_stations.temp_bytes / alone.temp_bytes,
            "time": statistics.median(with_stations.times) / statistics.median(alone.times),
            "fastest_time": min(with_stations.times) / min(alone.times)}
  print(f"stations / grid alone: memory {ratios['temp']:.3f} (target < 1.10), time "
        f"{ratios['time']:.3f} (target < 1.15; fastest step to fastest step "
        f"{ratios['fastest_time']:.3f}: less of the other load)", flush=True)
  return {"problem": name, "stations": num_stations, "platform": jax.devices()[0].platform,
          "repeats": repeats, **{
              f"{key}_{field}": value for key, step in (("grid", alone),
                                                        ("stations", with_stations))
              for field, value in (("counts", step.counts), ("temp_bytes", step.temp_bytes),
                                   ("step_seconds", statistics.median(step.times)),
                                   ("compile_seconds", round(step.compile_seconds, 1)))},
          **{f"{key}_ratio": round(value, 4) for key, value in ratios.items()}}


def main():
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--problems", default="tiny,mid",
                      help=f"comma-separated, of {', '.join(PROBLEMS)}")
  parser.add_argument("--stations", type=int, default=10_000)
  parser.add_argument("--repeats", type=int, default=5, help="timed steps per run")
  args = parser.parse_args()
  names = args.problems.split(",")
  unknown = [n for n in names if n not in PROBLEMS]
  if unknown or args.repeats < 1 or args.stations < 1:
    parser.error(f"--problems takes {', '.join(PROBLEMS)} (got {args.problems}); "
                 "--repeats and --stations at least 1")
  for name in names:
    line = json.dumps(compare(name, args.stations, args.repeats))
    print(line, flush=True)
    with open(os.path.join(RESULTS, f"stations_cost_{jax.devices()[0].platform}.jsonl"),
              "a") as results:
      results.write(line + "\n")


if __name__ == "__main__":
  sys.exit(main())
