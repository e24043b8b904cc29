"""wnscale against the reference GraphCast, side by side: one loss + gradient step each.

  python bench/reference_speed.py [--resolution=1.0 --mesh_levels=5 --latent=128 --steps=8]

The problem is `configs/mid_1p0.py` (1 deg grid with poles, multi-mesh levels
0..5, latent 128, 8 message-passing steps, 4 atmospheric variables on 3 levels
plus 2 m temperature, float32, batch 1, no remat). The reference is GraphCast's
classic `graphcast/` package (google-deepmind/graphcast), its training loss as
its demo computes it: `GraphCast` inside `normalization.InputsAndResiduals`,
`predictor.loss(inputs, targets, forcings)` and its gradient, jitted, on
random fields of the same shapes (its fixed loss weights cut to the variables
present); wnscale's step is its loss and gradient as `launch.train` computes them on one
device (the graphs laid out by `ShardedLayout`). Its steps and wnscale's alternate, so both see the same machine load;
printed: compiled peak memory and the median step time of each, their ratios,
and wnscale's utilization (`step_figures`: by GraphCast's FLOP count and the
hardware rate) with, given `--profile`, where its time goes by kind of op.
`bench/accelerator_check.py` runs `compare` for the chip's table.

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

import functools  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import xarray as xr  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import mid_problem  # noqa: E402
import step_figures  # noqa: E402
from mid_problem import problems  # noqa: E402
from wnscale import specs as specs_lib  # noqa: E402
from wnscale.model import setup  # noqa: E402
from wnscale.planner import xla_stats  # noqa: E402
from wnscale.sharding import sharded_model  # noqa: E402

try:
  import haiku as hk  # noqa: E402
  from graphcast import graphcast, losses, normalization, xarray_jax, xarray_tree  # noqa: E402
  REFERENCE_MISSING = ""
except ImportError as error:
  REFERENCE_MISSING = (f"The reference GraphCast is not importable ({error}); see "
                       "bench/reference_speed.py's docstring.")


def _present_weights_only(predictions, targets, per_variable_weights, weighted=None):
  """The reference's loss, its fixed per-variable weights cut to the variables present (it
  refuses a weight of a variable the task lacks, e.g. 10 m wind here)."""
  return weighted(predictions, targets, {
      name: weight for name, weight in per_variable_weights.items() if name in targets})


if not REFERENCE_MISSING:
  losses.weighted_mse_per_level = functools.partial(
      _present_weights_only, weighted=losses.weighted_mse_per_level)

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


def _one_device_training_step(config, constants, positions, batch, params):
  """`(jitted loss and grad, its arguments)`: wnscale's step as `launch.train` runs it on
  one device (the graphs laid out by `ShardedLayout` on a 1 x 1 mesh: nodes in the
  space-filling order that keeps each receiver block's senders near), equal to the plain
  model's (`tests/test_sharding.py`)."""
  layout = problems.sharded_layout(config, constants, positions, 1, 1, "all_gather")
  device_constants, halo_indices = layout.constants(constants)
  graphdef, _ = setup.init_model_shapes(specs_lib.from_config(config))
  program = jax.jit(sharded_model.loss_and_grad_fn(layout, graphdef))
  return program, (jax.device_put(params, layout.sharding(P())), device_constants,
                   halo_indices, problems.device_batch(layout, batch))


def variant_overrides(variant: str, model) -> dict:
  """The `model` overrides of a variant: an aggregation name, then any `/key=value` of other
  keys that change how the step computes, e.g. `fused/scan_layers=false` (values of the
  type of `model`'s, the config section)."""
  name, *others = variant.split("/")
  overrides = {"aggregation": name}
  for entry in others:
    key, _, text = entry.partition("=")
    if key not in model:
      raise SystemExit(f"variant {variant!r}: model has no key {key!r}")
    kind = type(model[key])
    overrides[key] = text.lower() in ("1", "true") if kind is bool else kind(text)
  return overrides


def compare(config, points, repeats: int, profile: bool = False, with_reference: bool = True,
            aggregations: tuple[str, ...] = ()) -> dict:
  """The reference's and wnscale's loss + gradient step on `config`'s problem (batch 1),
  timed alternately.

  `aggregations`: wnscale's step once per variant named (`variant_overrides`: a
  `model.aggregation`, maybe with other model keys; default: the config's aggregation),
  side `wnscale` for the first, `wnscale_<variant>` for the others. Returns
  `{side: figures, "time_ratio", "memory_ratio"}` (the ratios: wnscale's first side to the
  reference's, with the reference): each side's step seconds (median and all), compiled
  peak and temporaries (GiB), compile seconds; wnscale's also its FLOP rates and, with
  `profile`, the op breakdown (`step_figures.measure`).
  """
  config.train.batch_size = 1
  constants, batch, params = problems.synthetic_problem(config, points, batch_size=1)
  model = specs_lib.from_config(config).model
  graphs = setup.graphs_for_grid(model, points)  # for counts
  positions = setup.node_positions(model, points, None)
  programs, variants, names = {}, {}, {}
  for index, name in enumerate(aggregations or (config.model.aggregation,)):
    side = "wnscale" if index == 0 else f"wnscale_{name}"
    names[side] = name
    variants[side] = config.copy_and_resolve_references()
    variants[side].model.update(variant_overrides(name, config.model))
    programs[side] = _one_device_training_step(variants[side], constants, positions, batch,
                                               params)
  if with_reference:
    reference, *reference_args = reference_problem(config, *points.axes())
    programs["reference"] = (reference, tuple(reference_args))
  sides, runs = {}, {}
  for name, (program, arguments) in programs.items():
    start = time.perf_counter()
    compiled = program.lower(*arguments).compile()
    stats = xla_stats.compiled_stats(compiled)
    sides[name] = {"compile_seconds": time.perf_counter() - start,
                   "compiled_peak_gib": stats["peak_bytes"] / 2**30,
                   "temp_gib": stats["temp_bytes"] / 2**30, "step_seconds_all": []}
    runs[name] = functools.partial(lambda c, a: jax.block_until_ready(c(*a)), compiled,
                                   arguments)
    programs[name] = compiled
  for run in runs.values():
    run()  # warm-up
  for _ in range(repeats):
    for name, run in runs.items():
      start = time.perf_counter()
      run()
      sides[name]["step_seconds_all"].append(time.perf_counter() - start)
  for name, side in sides.items():
    side["step_seconds"] = statistics.median(side["step_seconds_all"])
    if name in variants:
      side["variant"] = names[name]
      side["aggregation"] = variants[name].model.aggregation
      side["scan_layers"] = variants[name].model.scan_layers
      side.update(step_figures.measure(
          programs[name], runs[name], times=side["step_seconds_all"], profile=profile,
          graphcast=step_figures.graphcast_flops(config, graphs.counts()),
          hardware=step_figures.hardware_flops(config, graphs)))
  if with_reference:
    sides.update(time_ratio=sides["wnscale"]["step_seconds"]
                 / sides["reference"]["step_seconds"],
                 memory_ratio=(sides["wnscale"]["compiled_peak_gib"]
                               / sides["reference"]["compiled_peak_gib"]))
  return sides


def main():
  args, config, points = mid_problem.parse(__doc__, repeats=5)
  if REFERENCE_MISSING:
    sys.exit(REFERENCE_MISSING)
  print(f"grid {points.name}, mesh levels 0..{args.mesh_levels}, latent "
        f"{args.latent}, {args.steps} steps, float32, batch 1, no remat, jax {jax.__version__}, "
        f"{jax.devices()[0].platform}, {mid_problem.host_pages()}")
  result = compare(config, points, args.repeats, profile=args.profile)
  print(f"{'':<12}{'peak GiB':>10}{'step s (median)':>17}{'steps s (all)':>40}{'compile s':>11}")
  for name in ("reference", "wnscale"):
    side = result[name]
    print(f"{name:<12}{side['compiled_peak_gib']:>10.2f}{side['step_seconds']:>17.4f}"
          f"{' '.join(f'{t:.4f}' for t in side['step_seconds_all']):>40}"
          f"{side['compile_seconds']:>11.1f}")
  print(step_figures.describe("wnscale", result["wnscale"]))
  print(f"wnscale / reference: time {result['time_ratio']:.2f}, memory "
        f"{result['memory_ratio']:.2f}")


if __name__ == "__main__":
  sys.exit(main())
