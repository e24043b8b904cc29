"""A launcher of two processes whose process 0 (which runs JAX's coordination service)
is killed while process 1 waits for it at a barrier, as Orbax's checkpoint syncs do: the
soak's fault (`bench/soak.py`), where process 1's barrier failed with "Failed to send
RPC to coordination service".

  python -m leader_gone --coordinator_address=localhost:PORT --num_processes=2 \\
      --process_id=I --platform=cpu --nocompilation_cache

Each process joins the cluster (`launch.process.start`) and prints `waiting`; process 0
then sleeps (to be killed), process 1 waits at a barrier process 0 never comes to.
"""

import time

from launch import cli, process


def main(argv):
  del argv
  process.start()
  import jax  # noqa: PLC0415 (started above, as a launcher does)

  from wnscale import coordination  # noqa: PLC0415
  print("waiting", flush=True)
  if jax.process_index() == 0:
    time.sleep(600)
  coordination.client().wait_at_barrier("leader_gone", 60_000)


if __name__ == "__main__":
  cli.run(main)
