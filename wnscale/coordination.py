"""Waits of one process of several for the others, through the coordination service that
`jax.distributed` starts (its key-value store): each bounded, and in slices, so that a
Ctrl-C is heard within `WAIT_SLICE_S` instead of when the wait ends.

`all_reach(name)` is where the processes meet before the first run of a program they
compiled each on their own: on CPU, JAX's Gloo collectives give a process 30 s to come to
a collective's first rendezvous (not configurable), and a process that compiles a step
anew while another loads it from the persistent compilation cache, or one on a loaded
machine, can be minutes behind. Without the meeting the early one fails ("Gloo context
initialization failed: ... timed out"), and the run with it.
"""

from __future__ import annotations

import time

import jax
from jax._src import distributed  # the coordination service client, as Orbax uses it

WAIT_SLICE_S = 0.5  # the longest a Ctrl-C waits while a process waits for the others
# How long a process waits for the others to reach a point (`all_reach`): a step's
# compile on another process (minutes at 0.25 deg, on a loaded host).
WAIT_FOR_PEERS_S = 3600.0

_reached: dict[str, int] = {}  # how many times each point was reached by this process


def client():
  """The coordination service's client of this process (None in a single process)."""
  return distributed.global_state.client


def wait_for_key(key: str, timeout_s: float, what: str) -> bytes:
  """The value published under `key`, once it is; waits at most `timeout_s` seconds.

  `what`: what is awaited, for the error (e.g. "process 0 to write the statistics").

  Raises:
    TimeoutError: nothing was published under `key` within `timeout_s`.
    jax.errors.JaxRuntimeError: the coordination service is gone (process 0 ended):
      as the client raised it, for the launcher to tell as a peer's absence.
  """
  deadline = time.monotonic() + timeout_s
  while True:  # in slices: the wait holds off this process's Ctrl-C until it returns
    try:
      return client().blocking_key_value_get_bytes(
          key, max(1, int(1000 * min(WAIT_SLICE_S, deadline - time.monotonic()))))
    except Exception as error:  # the client raises a generic error on a deadline
      if "DEADLINE_EXCEEDED" not in str(error):
        raise
      if time.monotonic() < deadline:
        continue
      raise TimeoutError(f"Process {jax.process_index()} waited {timeout_s:.0f} s for "
                         f"{what}; it did not happen: {error}") from error


def all_reach(name: str, timeout_s: float = WAIT_FOR_PEERS_S):
  """Returns once every process has reached this point (the n-th call with `name` of each
  process meets the n-th of the others); at once in a single process.

  Raises:
    TimeoutError: a process did not reach it within `timeout_s` seconds.
  """
  if jax.process_count() == 1:
    return
  _reached[name] = _reached.get(name, 0) + 1
  point = f"wnscale/reached/{name}/{_reached[name]}"
  client().key_value_set_bytes(f"{point}/{jax.process_index()}", b"",
                               allow_overwrite=True)
  deadline = time.monotonic() + timeout_s
  for index in range(jax.process_count()):
    if index != jax.process_index():
      wait_for_key(f"{point}/{index}", max(0.0, deadline - time.monotonic()),
                   f"process {index} to reach '{name}'")
