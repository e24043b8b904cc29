"""A stand-in for the processes of launch.local_cluster in its signal test.

  python -m launch.local_cluster --module=signal_child

Prints `ready`, then waits. Process 0 (`--process_id=0`, from local_cluster) prints
`SIGINT <count>` for each SIGINT it gets and exits 0 one second after the first (time
for a duplicate to arrive); the others are ended by SIGINT's default action.
"""

import signal
import sys
import time


def main():
  received = []
  if "--process_id=0" in sys.argv:
    def handle(signum, frame):
      del signum, frame
      received.append(time.monotonic())
      print(f"SIGINT {len(received)}", file=sys.stderr, flush=True)
    signal.signal(signal.SIGINT, handle)
  else:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
  print("ready", file=sys.stderr, flush=True)
  deadline = time.monotonic() + 120
  while time.monotonic() < deadline:
    if received and time.monotonic() > received[0] + 1:
      return 0
    time.sleep(0.05)
  return 1


if __name__ == "__main__":
  sys.exit(main())
