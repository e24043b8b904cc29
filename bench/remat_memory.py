"""Remat configurations side by side: compiled temp memory and step time vs no remat.

  python bench/remat_memory.py [--resolution=1.0 --mesh_levels=5 --latent=128 --steps=8]
  python bench/remat_memory.py --processor=transformer --k_hop=4   # WeatherNext 2's processor

The problem is `configs/mid_1p0.py` (1 deg grid, multi-mesh levels 0..5,
latent 128, 8 message-passing steps, 13 channels, float32, batch 1); with
`--processor=transformer`, 8 transformer blocks (4 heads, feed-forward 512)
attending within `--k_hop` hops of the finest mesh instead. Memory is the
per-device temporary allocation XLA reports for loss + gradients; time is the
median of a few executions on this machine. Published bar (WeatherNext's remat
guide): processor remat alone cuts peak memory 30-40 %, all three stages 50 %+.
"""

import os
import sys

# Memory on CPU: XLA:CPU's concurrency-optimized scheduler hoists the
# recomputation that remat adds, so remat barely shows in its temp bytes; the
# sequential scheduler does not. Set before jax is imported.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_cpu_enable_concurrency_optimized_scheduler=false")

import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

import ml_collections  # noqa: E402

import mid_problem  # noqa: E402
from mid_problem import problems  # noqa: E402
from wnscale import specs as specs_lib
from wnscale.planner import xla_stats  # noqa: E402

ALL = dict(remat_grid_to_mesh_gnn=True, remat_mesh_gnn=True, remat_mesh_to_grid_gnn=True)
VARIANTS = {
    "none": {},
    "encoder": dict(remat_grid_to_mesh_gnn=True),
    "processor": dict(remat_mesh_gnn=True),
    "decoder": dict(remat_mesh_to_grid_gnn=True),
    "all three": ALL,
    "all three + edge_chunks=4": dict(ALL, edge_chunks=4),
    "paper (every 3, chunks 4)": dict(ALL, mesh_remat_every=3, edge_chunks=4),
    "all three, dots_saveable": dict(ALL, remat_policy="dots_saveable"),
    "all three, dots_no_batch": dict(ALL, remat_policy="dots_with_no_batch_dims_saveable"),
    "all three, save node_latents": dict(ALL, remat_policy="save_only_these_names:node_latents"),
    "all three + grid_blocks=8": dict(ALL, edge_chunks=4, grid_blocks=8),
    "paper + grid_blocks=8": dict(ALL, mesh_remat_every=3, edge_chunks=4, grid_blocks=8),
    "paper + grid/mesh-edge blocks": dict(ALL, mesh_remat_every=3, edge_chunks=4,
                                          grid_blocks=8, mesh_edge_chunks=4),
    "all three, offload_carries": dict(ALL, edge_chunks=4, grid_blocks=8,
                                       remat_policy="offload_carries"),
}
# The transformer's own: attention edges in blocks, and its named save points.
TRANSFORMER_VARIANTS = {
    **{name: VARIANTS[name] for name in (
        "none", "encoder", "processor", "decoder", "all three", "paper (every 3, chunks 4)",
        "all three, dots_saveable", "all three, dots_no_batch")},
    "edge blocks of 2^16": dict(transformer_edges_per_block=2**16),
    "processor + edge blocks": dict(remat_mesh_gnn=True, transformer_edges_per_block=2**16),
    "all three, save attn/ffw out": dict(
        ALL, remat_policy="save_only_these_names:attention_output,ffw_output"),
}


def main():
  args, config, points = mid_problem.parse(__doc__, repeats=3)

  def make_config(**model):
    variant = ml_collections.ConfigDict(config)
    variant.model.update(model)
    return variant

  constants, batch, params = jax.device_put(
      problems.synthetic_problem(config, points, batch_size=1))
  graphs = constants.graphs
  channels = len(specs_lib.from_config(config).data.state_channels)
  print(f"grid {points.name}, {graphs.counts()}, latent {args.latent}, "
        f"{args.steps} {args.processor} layers, {channels} channels, float32, batch 1, "
        f"jax {jax.__version__}, {jax.devices()[0].platform}")
  variants = {"interaction_network": VARIANTS, "transformer": TRANSFORMER_VARIANTS}[args.processor]
  names = [n for n in variants if not args.only or n in args.only.split(",")]
  header = f"{'remat':<32}{'temp MiB':>10}{'vs none':>9}{'step s':>9}{'vs none':>9}{'compile s':>11}"
  print(header)
  print("-" * len(header))
  base = None
  for name in names:
    start = time.perf_counter()
    compiled = problems.compile_loss_and_grad(make_config(**variants[name]), constants, batch,
                                              params)
    compile_seconds = time.perf_counter() - start
    temp = xla_stats.compiled_stats(compiled)["temp_bytes"]
    jax.block_until_ready(compiled(params, constants, batch))  # warm-up
    times = []
    for _ in range(args.repeats):
      start = time.perf_counter()
      jax.block_until_ready(compiled(params, constants, batch))
      times.append(time.perf_counter() - start)
    step = statistics.median(times)
    base = base or (temp, step)
    print(f"{name:<32}{temp / 2**20:>10.1f}{temp / base[0]:>9.2f}{step:>9.2f}"
          f"{step / base[1]:>9.2f}{compile_seconds:>11.1f}", flush=True)


if __name__ == "__main__":
  sys.exit(main())
