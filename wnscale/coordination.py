"""Waits of one process of several for the others, through the coordination service that
`jax.distributed` starts (its key-value store): each bounded, and in slices, so that a
Ctrl-C is heard within `WAIT_SLICE_S` instead of when the wait ends.

`all_reach(name)` is where the processes meet before the first run of a program they
compiled each on their own: on CPU, JAX's Gloo collectives give a process 30 s to come to
a collective's first rendezvous (not configurable), and a process that compiles a step
anew while another loads it from the persistent compilation cache, or one on a loaded
machine, can be minutes behind. Without the meeting the early one fails ("Gloo context
initialization failed: ... timed out"), and the run with it.

`barrier` is where the processes meet in a checkpoint's save (Orbax's barriers): one that
fails at once, in every process, when they wait at different ones.
"""

from __future__ import annotations

import time

import jax
from jax._src import distributed  # the coordination service client, as Orbax uses it

from wnscale import errors

WAIT_SLICE_S = 0.5  # the longest a Ctrl-C waits while a process waits for the others
# How long a process waits for the others to reach a point (`all_reach`): a step's
# compile on another process (minutes at 0.25 deg, on a loaded host).
WAIT_FOR_PEERS_S = 3600.0

_reached: dict[str, int] = {}  # how many times each point was reached by this process
_barriers: dict[str, int] = {}  # how many times this process came to each `barrier` key
# The keys of `barrier`: who came to each, each process's latest, why they failed.
_BARRIER, _WAITING_AT, _FAILED = ("wnscale/barrier", "wnscale/barrier_at",
                                  "wnscale/barrier_failed")
_BARRIER_SLICE_MS = 100  # how often a process at a `barrier` looks where the others wait


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


def barrier(*, key: str, timeout_ms: int):
  """Returns once every process has come to `key` (the n-th call with `key` of each
  process meets the n-th of the others); at once in a single process. Orbax's barrier
  for a checkpoint's save (`orbax.checkpoint.AsyncOptions.barrier_sync_fn`).

  Unlike JAX's barrier, Orbax's default, it fails at once, in every process, when the
  processes wait at different barriers, each for the others. A process whose own writes
  of a save failed (a full disk) skips the save's barrier that says they are done and
  waits at its last one, while the others wait at the first: each waited for the other
  until Orbax's timeout (20 minutes), and the next save, or the save of a preempted run,
  with them. Once it failed, every later barrier fails too: the saves cannot go on.

  Raises:
    errors.PeerFailed: processes wait at different barriers, or did before.
    TimeoutError: a process did not come within `timeout_ms`.
  """
  if jax.process_count() == 1:
    return
  _barriers[key] = _barriers.get(key, 0) + 1
  point, me = f"{_BARRIER}/{key}/{_barriers[key]}", jax.process_index()
  client().key_value_set(f"{point}/{me}", "", allow_overwrite=True)
  client().key_value_set(f"{_WAITING_AT}/{me}", point, allow_overwrite=True)
  deadline = time.monotonic() + timeout_ms / 1000
  while True:
    failed = client().key_value_dir_get(_FAILED)
    if failed:
      raise errors.PeerFailed(failed[0][1])
    # Where each waits, read before who came here: one that came and went on to the next
    # barrier is then seen to have come.
    waiting_at = dict(client().key_value_dir_get(f"{_WAITING_AT}/"))
    missing = set(range(jax.process_count())) - _came(point)
    if not missing:
      return
    for index in sorted(missing):
      there = waiting_at.get(f"{_WAITING_AT}/{index}", point)
      if there != point and me not in _came(there):  # each waits for the other
        theirs = there.removeprefix(f"{_BARRIER}/").rsplit("/", 1)[0]
        message = (f"processes {me} and {index} wait at different barriers of a checkpoint's "
                   f"save ({key}; {theirs}): one of them failed to write its part, its log "
                   "says why")
        client().key_value_set(_FAILED, message, allow_overwrite=True)
        raise errors.PeerFailed(message)
    if time.monotonic() > deadline:
      raise TimeoutError(f"Process {me} waited {timeout_ms / 1000:.0f} s at the barrier "
                         f"{key} for process {min(missing)}.")
    try:  # until the first one missing comes, or a slice's end to look again
      client().blocking_key_value_get(f"{point}/{min(missing)}", _BARRIER_SLICE_MS)
    except Exception as error:  # the client raises a generic error on a deadline
      if "DEADLINE_EXCEEDED" not in str(error):
        raise


def _came(point: str) -> set[int]:
  """The processes that came to the barrier `point`."""
  return {int(name.rsplit("/", 1)[1]) for name, _ in client().key_value_dir_get(f"{point}/")}
