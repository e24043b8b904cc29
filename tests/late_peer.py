"""A launcher of several processes whose process 1 comes late to their first collective:
the soak's fault (`bench/soak.py`), where one process compiled the train step anew while
the other loaded it from the compilation cache.

  python -m launch.local_cluster --num_processes=2 --num_cpu_devices=4 --module=late_peer

Each process joins the cluster (`launch.process.start`), compiles a sum over every
device of every process (a collective: on CPU, Gloo's, whose first rendezvous gives a
process 30 s to come), and runs it; process 1 first sleeps `LATE_S` seconds (default
40), as a slow compile would. With `MEET=1` the processes meet first
(`wnscale.coordination.all_reach`, as the trainer does after each compile). Each prints
`loaded <n>` once compiled (programs it loaded from the persistent compilation cache so
far) and `sum <value>` once it has the result.
"""

import os
import time

from launch import cli, process


def main(argv):
  del argv
  process.start()
  import jax  # noqa: PLC0415 (started above, as a launcher does)
  import jax.numpy as jnp  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from wnscale import compilation_cache, coordination  # noqa: PLC0415
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("devices",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("devices"))
  ones = jax.make_array_from_callback((jax.device_count(),), sharding,
                                      lambda index: np.ones((1,), np.float32))
  total = jax.jit(jnp.sum).lower(ones).compile()
  print(f"loaded {compilation_cache.hits()}", flush=True)
  if jax.process_index() == 1:
    time.sleep(float(os.environ.get("LATE_S", "40")))
  if os.environ.get("MEET") == "1":
    coordination.all_reach("late_peer compiled")
  print(f"sum {float(total(ones)):g}", flush=True)
  process.stop()


if __name__ == "__main__":
  cli.run(main)
