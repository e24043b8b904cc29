"""The benchmarks' shared problem: `configs/mid_1p0.py`, with size flags, on its standard grid;
and `TrainStep`, a config's compiled train step to time and measure."""

import argparse
import os
import sys
import time

from wnscale import host_memory

# As the launchers run (wnscale/host_memory.py); both sides of a comparison in one process.
host_memory.use_huge_pages()

import jax  # noqa: E402

from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.assembly import assemble
from wnscale.data.making import stations as stations_lib
from wnscale.graphs import grid
from wnscale.graphs.points import PointSet
from wnscale.planner import xla_stats
from wnscale.sharding import mesh as mesh_lib
from wnscale.train import optimizer as optimizer_lib
from wnscale.train import step as step_lib
from wnscale.train.state import initial_state

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
  parser.add_argument("--aggregation", default="auto",
                      help="model.aggregation: auto, matmul or segment_sum")
  parser.add_argument("--profile", action="store_true",
                      help="where the step's time goes (jax.profiler, by kind of op)")
  args = parser.parse_args()
  config = config_lib.load(CONFIG)
  config.model.update(latent_size=args.latent, mesh_levels=args.mesh_levels,
                      message_passing_steps=args.steps, processor=args.processor,
                      transformer_layers=args.steps, transformer_k_hop=args.k_hop,
                      transformer_ffw_size=4 * args.latent, aggregation=args.aggregation)
  config.data.resolution = args.resolution
  points = PointSet.regular(*grid.regular_grid(args.resolution, include_poles=True))
  return args, config_lib.validate(config), points


class TrainStep:
  """A config's compiled train step on one grid, with its state, constants and a batch.

  The step is the one training runs (`train.step.train_step_of`: the config's loss,
  gradients and the AdamW update), on a one-device layout, the config's batch, random values.
  """

  def __init__(self, config, points: PointSet, point_sets: dict | None = None):
    """`point_sets`: the points of `config`'s modalities by name, each observing the
    batch's grid state (`stations.observe`, 10% missing)."""
    # The set-up's parts, in seconds (`setup_parts`): what training's set-up does
    # (graphs, layout, parameters), the benchmark's random batch, the state on the device.
    self.setup_parts = {}
    clock = time.perf_counter()

    def lap(part: str):
      nonlocal clock
      now = time.perf_counter()
      self.setup_parts[part] = round(now - clock, 2)
      clock = now

    specs = specs_lib.from_config(config)
    mesh = mesh_lib.single_device_mesh()
    assembly = assemble(specs, points, None, mesh, params="init", point_sets=point_sets)
    lap("assembly")
    self.points = points
    self.counts = assembly.graphs.counts()
    layout = assembly.layout
    self.constants, self.halo_indices = layout.constants(assembly.constants)
    batch = problems.random_batch(config, points.size, config.train.batch_size)
    for m in specs.data.modalities:
      for kind, names in (("inputs", m.inputs), ("targets", m.targets)):
        if names:
          batch[f"{m.name}/{kind}"] = stations_lib.observe(
              batch[kind][:, :, [specs.data.state_channels.index(n) for n in names]], points,
              point_sets[m.name], noise=0.1, missing=0.1)
    self.batch = layout.global_batch(layout.host_batch(batch), config.train.batch_size)
    lap("random batch")
    optimizer = optimizer_lib.make_optimizer(specs.train)
    self.state = jax.device_put(
        initial_state(assembly.params, optimizer, bool(specs.train.ema_decay)),
        assembly.replicated)
    jax.block_until_ready(self.state)
    lap("state")
    # The config's loss (an FGN's members, a denoiser's noise drawn in the step), as the
    # planner's compile (`step.lower_train_step`) and training run it.
    step = step_lib.train_step_of(specs, layout, assembly.graphdef, optimizer, self.constants,
                                  self.halo_indices)
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


def describe(name: str, config) -> str:
  """A heading line of problem `name`: its model's size, its batch, the JAX platform."""
  m = config.model
  return (f"{name}: mesh levels 0..{m.mesh_levels}, latent {m.latent_size}, "
          f"{m.message_passing_steps} steps, batch {config.train.batch_size}, {m.dtype}, "
          f"jax {jax.__version__}, {jax.devices()[0].platform}, {host_pages()}")


def host_pages() -> str:
  """Whether this process's large host buffers get huge pages (`wnscale.host_memory`)."""
  return "host huge pages" if host_memory.in_use() else "host 4 KiB pages"


def run_alternately(steps, repeats: int):
  """One warm-up run of each `TrainStep`, then `repeats` timed rounds of them in turn (all
  see the same machine load)."""
  for step in steps:
    step.run(timed=False)
  for _ in range(repeats):
    for step in steps:
      step.run()
