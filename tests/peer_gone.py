"""A launcher of two processes one of which is killed while the other waits for it at a
barrier of JAX's coordination service, as Orbax's checkpoint syncs do: the soak's faults
(`bench/soak.py`). Process 0 runs the service: with it gone, process 1's barrier failed
with "Failed to send RPC to coordination service". With process 1 gone, process 0 waits
until the service finds process 1's heartbeats missing.

  python -m peer_gone --coordinator_address=localhost:PORT --num_processes=2 \\
      --process_id=I --platform=cpu --nocompilation_cache

Each process joins the cluster (`launch.process.start`) and prints `waiting`; process
`GONE` (default 0) then sleeps (to be killed), the other waits at a barrier.
"""

import os
import time

from launch import cli, process


def main(argv):
  del argv
  process.start()
  import jax  # noqa: PLC0415 (started above, as a launcher does)

  from wnscale import coordination  # noqa: PLC0415
  print("waiting", flush=True)
  if jax.process_index() == int(os.environ.get("GONE", "0")):
    time.sleep(600)
  coordination.client().wait_at_barrier("peer_gone", 600_000)


if __name__ == "__main__":
  cli.run(main)
