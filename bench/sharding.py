"""Graph sharding side by side: per-device memory, bytes exchanged, step time, G = 1, 2, 4, 8.

  python bench/sharding.py [--resolution=1.0 --mesh_levels=5 --latent=128 --steps=8]

Runs on 8 fake CPU devices. Memory: per-device temporary bytes XLA reports for
the compiled loss + gradients (one example, graph sharded G ways). Bytes
moved: counted from the partition's index lists, per device per step, forward
plus backward (all_gather: (G-1) x rows_per_shard rows per exchange, its
transpose psum_scatter the same; halo: the rows received, its transpose the
same back), over 1 encoder, `steps` processor and 1 decoder exchanges. Step
time on fake devices shares this machine's cores, so it shows overhead, not
speed-up. Targets: memory at G shards within 1.25/G of one device; halo moves
at most a quarter of all_gather's bytes at G = 8.
"""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8"
                           + " --xla_cpu_enable_concurrency_optimized_scheduler=false")

import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

import mid_problem  # noqa: E402
from mid_problem import problems  # noqa: E402
from wnscale import specs as specs_lib
from wnscale.model import setup  # noqa: E402
from wnscale.planner import xla_stats  # noqa: E402
from wnscale.sharding import exchange as exchange_lib  # noqa: E402
from wnscale.sharding import mesh as mesh_lib  # noqa: E402
from wnscale.sharding import sharded_model  # noqa: E402
from wnscale.sharding.layout import ShardedLayout  # noqa: E402


def exchanged_rows(layout, steps: int) -> int:
  """Rows one device receives per forward pass, from the partition's index lists."""
  calls = {"grid_to_mesh": 1, "mesh": steps, "mesh_to_grid": 1}
  return sum(n * layout.partitioned.plans[name].rows_received() for name, n in calls.items())


def main():
  args, config, points = mid_problem.parse(__doc__, repeats=2)
  constants, batch, params = problems.synthetic_problem(config, points, batch_size=1)
  positions = setup.node_positions(specs_lib.from_config(config).model, points)
  graphdef, _ = setup.init_model_shapes(specs_lib.from_config(config))
  print(f"grid {points.name}, {constants.graphs.counts()}, latent "
        f"{args.latent}, {args.steps} steps, float32, batch 1, no remat, jax {jax.__version__}")
  header = (f"{'G':>3}{'exchange':>12}{'temp MiB/dev':>14}{'x G vs 1':>10}"
            f"{'MiB moved/dev/step':>20}{'halo/all_gather':>17}{'step s':>9}")
  print(header)
  print("-" * len(header))
  base_temp, gathered = None, {}
  for shards in (1, 2, 4, 8):
    for exchange in ("all_gather",) if shards == 1 else tuple(exchange_lib.MODES):
      mesh = mesh_lib.make_mesh(specs_lib.MeshSpec(data=1, graph=shards, exchange=exchange),
                                jax.devices()[:shards])
      layout = ShardedLayout(mesh, constants.graphs, positions, exchange)
      device_constants, halo_indices = layout.constants(constants)
      device_batch = layout.global_batch(layout.host_batch(batch), 1)
      step = jax.jit(sharded_model.loss_and_grad_fn(layout, graphdef)).lower(
          params, device_constants, halo_indices, device_batch).compile()
      temp = xla_stats.compiled_stats(step)["temp_bytes"]
      base_temp = base_temp or temp
      moved = 2 * exchanged_rows(layout, args.steps) * args.latent * 4 / 2**20
      gathered.setdefault(shards, moved)
      jax.block_until_ready(step(params, device_constants, halo_indices, device_batch))
      times = []
      for _ in range(args.repeats):
        start = time.perf_counter()
        jax.block_until_ready(step(params, device_constants, halo_indices, device_batch))
        times.append(time.perf_counter() - start)
      ratio = moved / gathered[shards] if gathered[shards] else 1.0
      print(f"{shards:>3}{exchange:>12}{temp / 2**20:>14.1f}{temp * shards / base_temp:>10.2f}"
            f"{moved:>20.1f}{ratio:>17.3f}{statistics.median(times):>9.2f}", flush=True)


if __name__ == "__main__":
  sys.exit(main())
