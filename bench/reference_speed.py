"""wnscale against the reference GraphCast, side by side: one loss + gradient step each.

  python bench/reference_speed.py [--resolution=1.0 --mesh_levels=5 --latent=128 --steps=8]

The problem is `configs/mid_1p0.py` (1 deg grid with poles, multi-mesh levels
0..5, latent 128, 8 message-passing steps, 4 atmospheric variables on 3 levels
plus 2 m temperature, float32, batch 1, no remat). The reference is GraphCast's
classic `graphcast/` package (google-deepmind/graphcast), its training loss as
its demo computes it: `GraphCast` inside `normalization.InputsAndResiduals`,
`predictor.loss(inputs, targets, forcings)` and its gradient, jitted, on
random fields of the same shapes (its fixed loss weights cut to the variables
present). Its steps and wnscale's alternate, so both
see the same machine load; printed: compiled temporary memory, the median
step time of each, and their ratio.

Needs the reference importable next to wnscale (not a dependency of this
project): a virtual environment with this project's requirements plus
`dm-haiku jraph trimesh rtree chex dm-tree`, and the reference's sources on
PYTHONPATH, e.g.

  git clone https://github.com/google-deepmind/graphcast /tmp/refsrc  # classic package
  PYTHONPATH=$PWD:/tmp/refsrc /tmp/refvenv/bin/python bench/reference_speed.py
"""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import xarray as xr  # noqa: E402

import mid_problem  # noqa: E402
from mid_problem import problems  # noqa: E402
from wnscale.planner import xla_stats  # noqa: E402

try:
  import haiku as hk  # noqa: E402
  from graphcast import graphcast, losses, normalization, xarray_jax, xarray_tree  # noqa: E402
except ImportError as error:
  sys.exit(f"The reference GraphCast is not importable ({error}); see this script's docstring.")

_weighted_mse_per_level = losses.weighted_mse_per_level


def _present_weights_only(predictions, targets, per_variable_weights):
  """The reference's loss, its fixed per-variable weights cut to the variables present (it
  refuses a weight of a variable the task lacks, e.g. 10 m wind here)."""
  return _weighted_mse_per_level(predictions, targets, {
      name: weight for name, weight in per_variable_weights.items() if name in targets})


losses.weighted_mse_per_level = _present_weights_only

STATS = os.path.join(mid_problem.REPO, "tests", "fixtures", "graphcast_5p625", "stats")
FORCINGS = ("toa_incident_solar_radiation", "year_progress_sin", "year_progress_cos",
            "day_progress_sin", "day_progress_cos")
STATICS = ("geopotential_at_surface", "land_sea_mask")


def reference_problem(config, latitude, longitude):
  """`(jitted loss and grad, params, inputs, targets, forcings)` of the reference."""
  d, m = config.data, config.model
  model_config = graphcast.ModelConfig(
      resolution=d.resolution, mesh_size=m.mesh_levels, latent_size=m.latent_size,
      gnn_msg_steps=m.message_passing_steps, hidden_layers=1,
      radius_query_fraction_edge_length=m.radius_fraction)
  task_config = graphcast.TaskConfig(
      input_variables=tuple(d.variables) + FORCINGS + STATICS,
      target_variables=tuple(d.variables), forcing_variables=FORCINGS,
      pressure_levels=tuple(d.pressure_levels), input_duration="12h")
  rng = np.random.default_rng(0)
  sizes = {"batch": 1, "level": len(d.pressure_levels), "lat": len(latitude),
           "lon": len(longitude)}

  def fields(names, times, with_levels=True):
    data = {}
    for name in names:
      dims = ("batch", "time") + (("level",) if with_levels and name in (
          "temperature", "geopotential", "u_component_of_wind", "v_component_of_wind",
          "specific_humidity") else ()) + ("lat", "lon")
      shape = tuple(len(times) if dim == "time" else sizes[dim] for dim in dims)
      data[name] = (dims, rng.standard_normal(shape).astype(np.float32))
    coords = {"time": times, "lat": latitude.astype(np.float32),
              "lon": longitude.astype(np.float32), "level": np.asarray(d.pressure_levels)}
    return xr.Dataset(data, coords=coords)

  hours = lambda *h: pd.to_timedelta(list(h), unit="h").values
  inputs = fields(tuple(d.variables) + FORCINGS, hours(-6, 0))
  for name in STATICS:
    inputs[name] = (("lat", "lon"), rng.standard_normal((sizes["lat"], sizes["lon"]))
                    .astype(np.float32))
  targets = fields(d.variables, hours(6))
  forcings = fields(FORCINGS, hours(6))
  stats = {name: xr.load_dataset(os.path.join(STATS, f"{name}.nc"))
           for name in ("mean_by_level", "stddev_by_level", "diffs_stddev_by_level")}

  @hk.transform_with_state
  def loss(inputs, targets, forcings):
    predictor = normalization.InputsAndResiduals(
        graphcast.GraphCast(model_config, task_config), **stats)
    value, _ = predictor.loss(inputs, targets, forcings)
    return xarray_tree.map_structure(
        lambda x: xarray_jax.unwrap_data(x.mean(), require_jax=True), value)

  params, state = jax.jit(loss.init)(jax.random.PRNGKey(0), inputs, targets, forcings)

  def loss_and_grad(params, inputs, targets, forcings):
    return jax.value_and_grad(lambda p: loss.apply(p, state, None, inputs, targets,
                                                   forcings)[0])(params)

  return jax.jit(loss_and_grad), params, inputs, targets, forcings


def main():
  args, config, points = mid_problem.parse(__doc__, repeats=5)
  print(f"grid {points.name}, mesh levels 0..{args.mesh_levels}, latent "
        f"{args.latent}, {args.steps} steps, float32, batch 1, no remat, jax {jax.__version__}, "
        f"{mid_problem.host_pages()}")
  ours_inputs = problems.synthetic_problem(config, points, batch_size=1)
  constants, batch, params = jax.device_put(ours_inputs)
  ours = jax.jit(lambda p, c, b: problems.loss_and_grad_fn(config, c, b)(p))
  start = time.perf_counter()
  ours = ours.lower(params, constants, batch).compile()
  ours_compile = time.perf_counter() - start
  reference, *reference_args = reference_problem(config, *points.axes())
  start = time.perf_counter()
  reference = reference.lower(*reference_args).compile()
  reference_compile = time.perf_counter() - start
  runs = {"reference": lambda: reference(*reference_args),
          "wnscale": lambda: ours(params, constants, batch)}
  times = {name: [] for name in runs}
  for name, run in runs.items():
    jax.block_until_ready(run())  # warm-up
  for _ in range(args.repeats):
    for name, run in runs.items():
      start = time.perf_counter()
      jax.block_until_ready(run())
      times[name].append(time.perf_counter() - start)
  temps = {"reference": xla_stats.compiled_stats(reference)["temp_bytes"],
           "wnscale": xla_stats.compiled_stats(ours)["temp_bytes"]}
  compiles = {"reference": reference_compile, "wnscale": ours_compile}
  print(f"{'':<12}{'temp GiB':>10}{'step s (median)':>17}{'steps s (all)':>40}{'compile s':>11}")
  for name in runs:
    print(f"{name:<12}{temps[name] / 2**30:>10.2f}{statistics.median(times[name]):>17.2f}"
          f"{' '.join(f'{t:.2f}' for t in times[name]):>40}{compiles[name]:>11.1f}")
  speed = statistics.median(times["wnscale"]) / statistics.median(times["reference"])
  print(f"wnscale / reference: time {speed:.2f}, memory "
        f"{temps['wnscale'] / temps['reference']:.2f}")


if __name__ == "__main__":
  sys.exit(main())
