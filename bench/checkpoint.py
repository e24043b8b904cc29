"""How long a save blocks the training loop: asynchronous vs synchronous, same state.

  python bench/checkpoint.py [--latent=512 --steps=16]

The state is a GraphCast-sized TrainState (parameters + AdamW moments). The
async figure is the time `Checkpointer.save` takes to return (device-to-host
copy; writing continues in the background); the sync figure is a blocking
Orbax save of the same state. Target: async blocks < 10 % of the sync time.
For scale, a last line saves the same bytes in 4 arrays: Orbax's blocking
cost is per array (~0.4 ms here), and the state has ~90 (the AdamW moments are
two vectors, `wnscale.train.optimizer`; the parameters are a tree of ~80).
"""

import os
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import grain  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402

from wnscale import config as config_lib  # noqa: E402
from wnscale import specs as specs_lib
from wnscale.model import setup  # noqa: E402
from wnscale.train import checkpoint, optimizer, state as state_lib  # noqa: E402


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--latent", type=int, default=512)
  parser.add_argument("--steps", type=int, default=16)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  config = config_lib.graphcast_paper_config(resolution=1.0)
  config.model.update(latent_size=args.latent, message_passing_steps=args.steps)
  specs = specs_lib.from_config(config)
  _, params = setup.init_model(specs)
  tx = optimizer.make_optimizer(specs.train)
  state = state_lib.initial_state(params, tx)
  jax.block_until_ready(state)
  size = sum(x.nbytes for x in jax.tree.leaves(state))
  iterator = iter(grain.MapDataset.range(100).to_iter_dataset())
  next(iterator)
  print(f"state: {size / 2**20:.1f} MiB ({sum(x.size for x in jax.tree.leaves(params)):,} "
        f"parameters + AdamW moments), {args.repeats} saves each")
  with tempfile.TemporaryDirectory() as directory:
    async_saver = checkpoint.Checkpointer(os.path.join(directory, "async"), max_to_keep=2)
    sync_saver = ocp.CheckpointManager(
        os.path.join(directory, "sync"),
        options=ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=False))
    blocked_async, total_async, blocked_sync = [], [], []
    for step in range(1, args.repeats + 1):
      start = time.perf_counter()
      async_saver.save(step, state, iterator, {"step": step})
      blocked_async.append(time.perf_counter() - start)
      async_saver.wait()
      total_async.append(time.perf_counter() - start)
      start = time.perf_counter()
      sync_saver.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          data=grain.checkpoint.CheckpointSave(iterator),
          metadata=ocp.args.JsonSave({"step": step})))
      blocked_sync.append(time.perf_counter() - start)
    async_saver.close()
    sync_saver.close()
    # The same bytes in 4 arrays, through the same asynchronous Checkpointer.
    chunk = size // 4 // 4
    few = {f"part{i}": jnp.ones((chunk,), jnp.float32) for i in range(4)}
    few_saver = checkpoint.Checkpointer(os.path.join(directory, "few"), max_to_keep=2)
    blocked_few = []
    for step in range(1, args.repeats + 1):
      start = time.perf_counter()
      few_saver.save(step, few, iterator, {"step": step})
      blocked_few.append(time.perf_counter() - start)
      few_saver.wait()
    few_saver.close()
  a, t, s = (statistics.median(x) for x in (blocked_async, total_async, blocked_sync))
  print(f"{'save':<34}{'loop blocked s':>16}")
  print(f"{'asynchronous (Checkpointer.save)':<34}{a:>16.3f}   (write done after {t:.3f} s)")
  print(f"{'synchronous (Orbax, same state)':<34}{s:>16.3f}")
  print(f"async / sync blocking: {a / s:.3f}  (target < 0.10)")
  print(f"asynchronous, same bytes in 4 arrays: {statistics.median(blocked_few):.3f} s blocked "
        f"({len(jax.tree.leaves(state))} arrays in the state)")


if __name__ == "__main__":
  sys.exit(main())
