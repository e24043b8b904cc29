"""Compiles the step of an experiment's specs for a target, with abstract inputs, and
reports its cost.

The step comes from the caller (`step_builder`; the trainer and `launch.compile`
pass `wnscale.train.step.lower_train_step`, the step training runs), lowered
on a `ShardedLayout` whose every input is a `jax.ShapeDtypeStruct` carrying
its sharding: nothing is allocated, so a 0.25 deg model compiles for a TPU pod
slice on a CPU-only machine.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from typing import Callable

import jax
import numpy as np

from wnscale import specs as specs_lib
from wnscale.assembly import assemble
from wnscale.data import run_data
from wnscale.data.making import stations as stations_lib
from wnscale.data.reading import store_formats
from wnscale.graphs import points as points_lib
from wnscale.model import setup
from wnscale.planner import buffers as buffers_lib
from wnscale.planner import flops as flops_lib
from wnscale.planner import xla_stats
from wnscale.planner.topology import GIB, Target
from wnscale.progress import long_step
from wnscale.sharding import mesh as mesh_lib

# `(specs, layout, constants, halo_indices, batch) -> jax.stages.Lowered`.
StepBuilder = Callable[..., jax.stages.Lowered]

BREAKDOWN_ROWS = 30  # largest peak buffers kept in a report
# How a report's error begins when the compiler failed on the setting (not out of memory).
COMPILER_FAILED = "the compiler failed: "


def batch_per_data_shard(batch_size: int, data_shards: int, accumulation_steps: int = 1) -> int:
  """Whole examples per data shard that cover a global `batch_size` and split into
  `accumulation_steps` micro-batches: ceil(batch / shards), rounded up to a multiple of it."""
  per_shard = -(-batch_size // data_shards)
  return -(-per_shard // accumulation_steps) * accumulation_steps


def modality_points(specs: specs_lib.Specs, grid_points: points_lib.PointSet
                    ) -> dict[str, points_lib.PointSet]:
  """Each of `data.modalities`' points by name, for shapes (the planner reads no grid
  store): an observation store's stations, or for a "synthetic:N" source N points drawn
  at random on the sphere (the synthetic network's draw without a store's land mask;
  its edge counts, and so the step's memory, are those of any N points as spread)."""
  points = {}
  for modality in specs.data.modalities:
    count = modality.synthetic_stations
    if count is None:
      names = list(dict.fromkeys(modality.inputs + modality.targets))
      path = run_data.resolve_observations(specs.data, modality, specs.seed)
      points[modality.name] = store_formats.open_points(path, names).points
    else:
      points[modality.name] = stations_lib.random_land_biased_points(
          count, grid_points, np.zeros(grid_points.size, bool), specs.seed)
  return points


class Problem:
  """An experiment's graphs and layout on a target, built once and compiled for many remat
  settings.

  Args:
    specs: the experiment; its grid is `points.standard`'s of `data.grid` and
      `data.resolution`.
    target: the devices to compile for.
    step_builder: lowers the step to measure (see `StepBuilder`).
  """

  def __init__(self, specs: specs_lib.Specs, target: Target, step_builder: StepBuilder):
    self.specs = specs
    self.target = target
    self.step_builder = step_builder
    self.mesh = mesh_lib.make_mesh(specs.mesh, target.devices)
    mesh_lib.check_batch_size(self.mesh, specs.train.batch_size,
                              specs.train.accumulation_steps)
    # No statistics: the residual scale is 1, which changes no shape; no model: the step
    # builder makes it with each compile's remat settings.
    grid_points = points_lib.standard(specs.data.grid, specs.data.resolution)
    point_sets = modality_points(specs, grid_points)
    assembly = assemble(specs, grid_points, None, self.mesh, params=None,
                        point_sets=point_sets)
    self.counts = assembly.graphs.counts()
    # Shapes only: what the FLOP model reads, without holding the arrays.
    self.graph_shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                     assembly.graphs)
    self.layout = assembly.layout
    self.constants = self.layout.abstract_constants(assembly.constants)
    self.batch = self.layout.abstract_batch(setup.batch_shapes(
        specs, assembly.graphs.num_nodes("grid"), specs.train.batch_size,
        {name: points.size for name, points in point_sets.items()}))
    self._reports = {}  # Compiles are minutes at 0.25 deg: one per remat setting.

  @property
  def examples_per_data_shard(self) -> int:
    """The batch's rows on each data shard (what its micro-batches split)."""
    return self.specs.train.batch_size // self.mesh.shape[mesh_lib.DATA]

  def compile(self, remat_overrides: dict | None = None, breakdown: bool = False,
              accumulation_steps: int | None = None, name: str | None = None) -> dict:
    """Compiles the train step with `remat_overrides` (`RematSpec` fields) and `accumulation_steps`
    micro-batches (None: the specs' `train.accumulation_steps`; a divisor of
    `examples_per_data_shard`); returns its figures.

    With `breakdown`, the report adds the buffers live at the peak
    (`peak_buffers`, largest first, and `peak_by_part`; see `planner.buffers`).
    A setting compiled before by this `Problem` is not compiled again. Each compile is
    said before it starts and while it lasts (`progress.long_step`: at 0.25 deg one takes
    minutes), as the remat candidate `name` (else the remat policy compiled).
    """
    accumulation_steps = accumulation_steps or self.specs.train.accumulation_steps
    key = json.dumps([remat_overrides or {}, accumulation_steps], sort_keys=True)
    if key not in self._reports or (breakdown and "peak_buffers" not in self._reports[key]):
      policy = (remat_overrides or {}).get("remat_policy", self.specs.model.remat.remat_policy)
      micro = f" in {accumulation_steps} micro-batches" if accumulation_steps > 1 else ""
      with long_step(f"Compiling the train step for {self.target.name} "
                     f"({self.mesh.shape[mesh_lib.GRAPH]} graph shard(s), batch "
                     f"{self.specs.train.batch_size}{micro}, remat {name or policy})",
                     expected_time(self.specs.data)):
        self._reports[key] = self._compile(remat_overrides, breakdown, accumulation_steps)
    return dict(self._reports[key])

  def _compile(self, remat_overrides: dict | None, breakdown: bool,
               accumulation_steps: int) -> dict:
    model = self.specs.model
    specs = dataclasses.replace(
        self.specs, model=dataclasses.replace(
            model, remat=dataclasses.replace(model.remat, **(remat_overrides or {}))),
        train=dataclasses.replace(self.specs.train, accumulation_steps=accumulation_steps))
    start = time.perf_counter()
    peak_buffers = None
    try:
      lowered = self.step_builder(specs, self.layout, *self.constants, self.batch)
      if breakdown:
        compiled, peak_buffers = buffers_lib.compile_with_breakdown(lowered)
      else:
        compiled = lowered.compile()
      stats = xla_stats.compiled_stats(compiled)
      refused = None  # why the compiler refused the step, if it did
    except jax.errors.JaxRuntimeError as error:
      peak_buffers = getattr(error, "peak_buffers", None)
      if "RESOURCE_EXHAUSTED" in str(error):
        # The TPU compiler refuses programs whose temporaries exceed HBM.
        refused = str(error).split("\n")[0]
      else:
        # The compiler itself failed on this setting (an internal error, not the
        # program's size): the report says so and a search goes on to the next one.
        refused = COMPILER_FAILED + str(error).strip().split("\n")[0][:300]
      stats = _stats_from_oom_message(refused)  # no figures (zeros) in an internal error
    seconds = time.perf_counter() - start
    analytic = flops_lib.step_flops(specs, self.graph_shapes, len(self.target.devices))
    memory = self.target.device_memory_bytes
    report = {
        "topology": self.target.name,
        "num_devices": len(self.target.devices),
        "mesh": {"data": self.mesh.shape[mesh_lib.DATA], "graph": self.mesh.shape[mesh_lib.GRAPH]},
        "batch_size": specs.train.batch_size,
        "accumulation_steps": accumulation_steps,
        "remat": specs.model.remat.section_values(),
        **{k: int(v) for k, v in stats.items() if k.endswith("_bytes")},
        "device_memory_bytes": memory,
        "fits": bool(refused is None
                     and (memory is None or stats["peak_bytes"] <= memory)),
        "flops": analytic["model"] + analytic["recompute"],
        "recompute_flops": analytic["recompute"],
        "offloaded_bytes": analytic["offloaded_bytes"],
        "xla_flops": stats["flops"],
        "compile_seconds": round(seconds, 2),
    }
    if refused:
      report["error"] = refused
      report["compiled"] = not refused.startswith(COMPILER_FAILED)
    if peak_buffers is not None:
      report["peak_by_part"] = buffers_lib.summarize(peak_buffers)
      report["peak_buffers"] = [dataclasses.asdict(b) for b in peak_buffers[:BREAKDOWN_ROWS]]
    return report


def expected_time(data: specs_lib.DataSpec) -> str:
  """How long a compile of the step of a model on `data`'s grid takes, said before it
  starts (a 0.25 deg model's takes minutes on a CPU host: long enough to look hung)."""
  if data.grid or data.resolution > 2.0:
    return "seconds to a minute"
  return (f"at {data.resolution:g} deg this takes minutes, up to 10 or more; a line "
          "follows every minute, and when it is done")


def best_setting(reports: list[dict]) -> str:
  """Which compiled setting to train with, and why, in a sentence.

  The least work per example (per-device FLOPs over the global batch: the
  recomputation differs, the model's share is the same at any shard count)
  among those that fit; then the fewest graph shards (less exchange between
  devices); then the lowest peak.
  """
  fitting = [r for r in reports if r["fits"]]
  if not fitting:
    compiled = [r for r in reports if r.get("compiled", True)]
    if not compiled:
      return "Nothing compiled: " + reports[0]["error"]
    smallest = min(compiled, key=lambda r: r["peak_bytes"])
    return (f"Nothing fits: the smallest peak is {smallest['peak_bytes'] / GIB:.2f} GiB per "
            f"device ('{smallest.get('candidate', '')}', {smallest['mesh']['graph']} graph "
            "shards). Use more graph shards, fewer examples per data shard (or more "
            "micro-batches: train.accumulation_steps), bfloat16 or a smaller model.")

  def per_example(report):
    return report["flops"] / report["batch_size"]

  least = min(per_example(r) for r in fitting)
  best = min((r for r in fitting if per_example(r) <= least * (1 + 1e-6)),
             key=lambda r: (r["mesh"]["graph"], r["peak_bytes"]))
  recompute = best["recompute_flops"] / best["flops"]
  memory = best["device_memory_bytes"]
  of_memory = f" of {memory / GIB:.2f}" if memory else ""
  return (f"Best: '{best.get('candidate', '')}' with {best['mesh']['graph']} graph shard(s) "
          f"({best['mesh']['data']} data shard(s), batch {best['batch_size']}): it fits "
          f"({best['peak_bytes'] / GIB:.2f}{of_memory} GiB per device) and, of the "
          f"{len(fitting)} settings that fit, does the least work per example "
          f"({per_example(best):.3g} FLOPs per device per example, "
          f"{recompute:.0%} of it recomputation); among equals, the fewest graph shards "
          "(the least exchange between devices), then the lowest peak.")


def _stats_from_oom_message(message: str) -> dict:
  """Figures from XLA's compile-time out-of-memory message: the temporaries it needed
  ("HLO temporaries (15.56G)"), or the memory it had used when it gave up ("Used 15.84G
  of 15.75G hbm", a lower bound of the peak)."""
  scale = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
  temp = re.search(r"HLO temporaries \(([\d.]+)([KMGT])\)", message)
  used = re.search(r"Used ([\d.]+)([KMGT]) of", message)
  match = temp or used
  peak = int(float(match.group(1)) * scale[match.group(2)]) if match else 0
  return {"argument_bytes": 0, "output_bytes": 0, "temp_bytes": peak if temp else 0,
          "alias_bytes": 0, "peak_bytes": peak, "xla_peak_bytes": 0 if temp else peak,
          "flops": 0.0}
