"""Batches read and placed on the devices ahead of the step, by a background thread.

`DevicePrefetch(iterator, place, depth)` takes a data iterator's batches (a Grain
iterator: `next` and `get_state`) and places each on the devices with `place` (e.g.
`ShardedLayout.global_batch`) in a thread of its own, keeping up to `depth` placed
batches ready: while the devices run a step, the next batches are read, normalized and
batched (by Grain's threads, `pipeline.make_iterator`) and transferred. At most `depth`
placed batches wait on the devices, and the thread holds one more, read, on the host
until there is room. `depth=0`: no thread; `next` reads and places the batch it returns.

Exact resume: `get_state()` is the iterator's state right after the last batch that
`next` returned (the thread records it with each batch), never after batches prefetched
but not yet taken, so a checkpoint of it continues with exactly the next batch.

Stopping: `close()` (idempotent) stops the thread, after the batch it is reading, and
drops the batches prefetched; the iterator may then be closed. An error in the thread
(reading, placing) is raised by the `next` that would have returned that batch.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator

THREAD_NAME = "wnscale-device-prefetch"


class DevicePrefetch:
  """An iterator of `place(batch)` of `iterator`'s batches, `depth` ahead (module docstring).

  Args:
    iterator: yields host batches; `get_state()` is its position (a Grain iterator).
    place: host batch -> batch on the devices.
    depth: placed batches kept ready; 0: none, each read and placed when asked for.
  """

  def __init__(self, iterator: Iterator, place: Callable[[dict], dict], depth: int = 2):
    if depth < 0:
      raise ValueError(f"depth must be >= 0, got {depth}")
    self._iterator, self._place = iterator, place
    self._state = iterator.get_state()  # after the batches taken: none yet
    self._error = None  # the thread's error, once `next` has raised it
    self._closed = threading.Event()
    self._thread = None
    if depth:
      self._ready = queue.SimpleQueue()  # `(batch, state)` or the thread's error
      self._room = threading.Semaphore(depth)  # placed batches not yet taken: <= depth
      self._thread = threading.Thread(target=self._fill, name=THREAD_NAME, daemon=True)
      self._thread.start()

  def _read(self) -> tuple[dict, dict]:
    """The next host batch and the iterator's state after it."""
    batch = next(self._iterator)
    return batch, self._iterator.get_state()

  def _fill(self):
    """The thread: read, wait for room, place, hand over; until closed or an error."""
    try:
      while not self._closed.is_set():
        batch, state = self._read()
        self._room.acquire()
        if self._closed.is_set():
          return
        self._ready.put((self._place(batch), state))
    except BaseException as error:  # noqa: BLE001 (StopIteration too: raised by `next`)
      self._ready.put(error)

  def __iter__(self) -> DevicePrefetch:
    return self

  def __next__(self) -> dict:
    if self._closed.is_set():
      raise RuntimeError("DevicePrefetch is closed")
    if self._error is not None:
      raise self._error
    if self._thread is None:
      batch, state = self._read()
      batch = self._place(batch)
    else:
      item = self._ready.get()
      if isinstance(item, BaseException):
        self._error = item
        raise item
      self._room.release()
      batch, state = item
    self._state = state
    return batch

  def get_state(self) -> dict:
    """The iterator's state after the last batch `next` returned (where it was, before any)."""
    return self._state

  def close(self):
    """Stops the thread (after the batch it is reading) and drops the batches prefetched."""
    self._closed.set()
    if self._thread is not None:
      self._room.release()  # a thread waiting for room wakes, and sees it is closed
      self._thread.join()
      while not self._ready.empty():  # the placed batches' device memory, now
        self._ready.get_nowait()
