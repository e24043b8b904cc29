"""Batches prefetched to the devices (`wnscale.data.prefetch`) and the loop's time shares
(`wnscale.train.loop_time`): order and position, exact resume from a checkpoint of the
position, the bound, stopping, errors; the steps overlap the reads, and a slow input or a
slow step shows in the shares, as the training loop takes them (one step in flight)."""

import threading
import time

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from problems import data_spec

from wnscale.data import pipeline, prefetch
from wnscale.data.making import synthetic
from wnscale.train import checkpoint
from wnscale.train.loop_time import LoopClock


class Counted:
  """A Grain iterator of 0, 1, 2, ... counting the batches read, each read taking `seconds`
  (as a slow store would), raising `error` instead of element `fail_at`."""

  def __init__(self, length=100, seconds=0.0, fail_at=None, error=None):
    self.iterator = iter(grain.MapDataset.range(length).to_iter_dataset())
    self.seconds, self.fail_at, self.error = seconds, fail_at, error
    self.read = 0

  def __next__(self):
    time.sleep(self.seconds)
    if self.read == self.fail_at:
      raise self.error
    value = next(self.iterator)
    self.read += 1
    return value

  def get_state(self):
    return self.iterator.get_state()


def _wait_until(condition, timeout=30.0):
  deadline = time.monotonic() + timeout
  while not condition():
    assert time.monotonic() < deadline, "timed out"
    time.sleep(0.01)


def _continuation(state) -> int:
  """The element a fresh iterator set to `state` yields next."""
  iterator = Counted().iterator
  iterator.set_state(state)
  return next(iterator)


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_batches_come_in_order_and_the_position_is_after_the_last_taken(depth):
  source = Counted()
  batches = prefetch.DevicePrefetch(source, lambda x: 10 * x, depth)
  try:
    assert _continuation(batches.get_state()) == 0  # none taken yet
    for taken in range(1, 6):
      assert next(batches) == 10 * (taken - 1)
      assert _continuation(batches.get_state()) == taken
  finally:
    batches.close()


def test_a_checkpoint_of_the_prefetch_resumes_with_exactly_the_next_batch(tmp_path):
  """Four batches taken, and the thread four more ahead (three placed, one read): the
  checkpoint holds the position after the fourth, where the iterator's own state is
  after the eighth: saving that would skip four batches."""
  depth, taken = 3, 4
  source = Counted()
  placed = []
  batches = prefetch.DevicePrefetch(source, lambda x: placed.append(x) or x, depth)
  try:
    assert [next(batches) for _ in range(taken)] == [0, 1, 2, 3]
    _wait_until(lambda: source.read == taken + depth + 1 and len(placed) == taken + depth)
    saver = checkpoint.Checkpointer(str(tmp_path), max_to_keep=1)
    saver.save(taken, {"step": jnp.array(taken)}, batches, {"step": taken})
    saver.close()
    assert _continuation(source.get_state()) == taken + depth + 1  # what a bug would save
  finally:
    batches.close()
  saver = checkpoint.Checkpointer(str(tmp_path), max_to_keep=1)
  try:
    restored = saver.restore_latest(checkpoint.abstract_like(
        {"step": jnp.array(0)}, jax.sharding.SingleDeviceSharding(jax.devices()[0])))
  finally:
    saver.close()
  assert _continuation(restored.data_state) == taken


def test_the_thread_stays_within_its_bound():
  source = Counted()
  placed = []
  batches = prefetch.DevicePrefetch(source, lambda x: placed.append(x) or x, depth=2)
  try:
    _wait_until(lambda: source.read == 3 and len(placed) == 2)
    time.sleep(0.3)  # time to go further, were it unbounded
    assert (source.read, len(placed)) == (3, 2)  # 2 placed and 1 read, waiting for room
    next(batches)
    _wait_until(lambda: source.read == 4 and len(placed) == 3)
    time.sleep(0.3)
    assert (source.read, len(placed)) == (4, 3)
  finally:
    batches.close()


def _prefetch_threads() -> list[threading.Thread]:
  return [t for t in threading.enumerate() if t.name == prefetch.THREAD_NAME]


def test_close_stops_the_thread_waiting_for_room_or_reading():
  before = len(_prefetch_threads())
  source, placed = Counted(), []
  waiting = prefetch.DevicePrefetch(source, lambda x: placed.append(x) or x, depth=1)
  next(waiting)
  _wait_until(lambda: source.read == 3 and len(placed) == 2)  # the third waits for room
  waiting.close()
  waiting.close()  # again: nothing more to do
  source = Counted(seconds=1.0)
  reading = prefetch.DevicePrefetch(source, lambda x: x, depth=2)
  start = time.perf_counter()
  reading.close()  # it finishes the read it is in (1 s), then stops
  assert time.perf_counter() - start < 5.0 and source.read <= 1
  assert len(_prefetch_threads()) == before
  with pytest.raises(RuntimeError, match="closed"):
    next(reading)


@pytest.mark.parametrize("depth", [0, 2])
def test_an_error_reading_is_raised_where_its_batch_would_be(depth):
  batches = prefetch.DevicePrefetch(Counted(fail_at=3, error=OSError("disk gone")),
                                    lambda x: x, depth)
  try:
    assert [next(batches) for _ in range(3)] == [0, 1, 2]
    for _ in range(2):  # and again: the thread is gone, the error stays
      with pytest.raises(OSError, match="disk gone"):
        next(batches)
    assert _continuation(batches.get_state()) == 3
  finally:
    batches.close()
  finite = prefetch.DevicePrefetch(Counted(length=5), lambda x: x, depth)
  assert list(finite) == [0, 1, 2, 3, 4]  # the end of the data ends the iteration
  finite.close()


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("prefetch") / "era.zarr")
  return synthetic.write_synthetic_store(path, start="2020-01-01", end="2020-01-03",
                                         levels=(500, 1000),
                                         variables=("temperature", "2m_temperature"))


@pytest.mark.parametrize("worker_count", [0, 2])
def test_a_grain_pipeline_prefetched_and_resumed_gives_the_uninterrupted_batches(
    store_path, worker_count):
  """Grain's own readers (threads, or worker processes) under the prefetch thread; the
  batches placed on the device; resumed from the position after the third batch."""
  data = data_spec(path=store_path, variables=("temperature", "2m_temperature"),
                   pressure_levels=(500, 1000), train_start="", train_end="",
                   worker_count=worker_count)

  def pipeline_from(state=None):
    made = pipeline.make_pipeline(data, "train", batch_size=2, seed=3, process_index=0,
                                  process_count=1)
    if state is not None:
      made.restore(state)
    return made, prefetch.DevicePrefetch(made.iterator, jax.device_put, depth=2)

  def take(batches, count):
    return [{key: np.asarray(value) for key, value in next(batches).items()}
            for _ in range(count)]

  plain = pipeline.make_pipeline(data, "train", batch_size=2, seed=3, process_index=0,
                                 process_count=1)
  expected = [next(plain.iterator) for _ in range(6)]
  plain.close()
  first, batches = pipeline_from()
  got = take(batches, 3)
  state = batches.get_state()
  batches.close()
  first.close()
  second, batches = pipeline_from(state)
  got += take(batches, 3)
  batches.close()
  second.close()
  for a, b in zip(got, expected, strict=True):
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])


def _device_work(seconds: float):
  """A jitted step that keeps the CPU device busy about `seconds` (calibrated here), and
  its argument: the step call returns at once (asynchronous dispatch)."""
  @jax.jit
  def work(x, repeats):
    return jax.lax.fori_loop(0, repeats, lambda _, y: jnp.tanh(y @ y * 1e-3), x)

  x = jnp.ones((384, 384), jnp.float32)
  jax.block_until_ready(work(x, 1))
  start = time.perf_counter()
  jax.block_until_ready(work(x, 20))
  repeats = max(1, round(20 * seconds / (time.perf_counter() - start)))
  return lambda batch: work(x + batch, repeats)


def _run_loop(batches, step, count: int) -> tuple[float, dict, float]:
  """`count` steps as the training loop takes them (one in flight): the wall time, the
  clock's figures, and the seconds a step kept the loop (its device time)."""
  clock = LoopClock()
  start = time.perf_counter()
  for _ in range(count):
    with clock.input_wait():
      batch = next(batches)
    with clock.step():
      jax.block_until_ready(step(batch))
  wall, shares = time.perf_counter() - start, clock.interval(count)
  stepping = wall * (1 - shares["input_wait_fraction"] - shares["host_fraction"])
  return wall, shares, stepping / count


def test_steps_overlap_the_reads_and_the_shares_say_which_waits():
  """N steps of a step taking s, on batches taking t each to read: about N * max(t, s)
  with prefetch, N * (t + s) without (s as measured in the same run: the machine's load
  moves it). A slow input shows as input wait either way; a slow step with a quick input
  as almost none, though its call returns at once."""
  count, read = 8, 0.25
  step = _device_work(0.25)
  start = time.perf_counter()
  result = step(0.0)
  dispatched = time.perf_counter() - start
  jax.block_until_ready(result)
  assert dispatched < (time.perf_counter() - start) / 4  # the call is not the step's time

  def run(depth, step, seconds=read):
    batches = prefetch.DevicePrefetch(Counted(seconds=seconds), jax.device_put, depth)
    try:
      return _run_loop(batches, step, count)
    finally:
      batches.close()

  wall, in_turn, s = run(0, step)
  assert wall > 0.9 * count * (read + s), (wall, read, s)  # read, then step
  assert in_turn["input_wait_fraction"] == pytest.approx(read / (read + s), abs=0.15)
  wall, overlapping, s = run(2, step)
  sequential, overlapped = count * (read + s), count * max(read, s)
  assert wall < (sequential + overlapped) / 2, (wall, overlapped, sequential)
  for shares in (in_turn, overlapping):
    assert 0 <= shares["input_wait_fraction"] <= 1 and 0 <= shares["host_fraction"] <= 1

  slow_input = run(2, _device_work(0.02), seconds=0.3)[1]
  assert slow_input["input_wait_fraction"] > 0.6, slow_input
  slow_step = run(2, step, seconds=0.01)[1]
  assert slow_step["input_wait_fraction"] < 0.15, slow_step
  assert slow_step["host_fraction"] < 0.15, slow_step


def test_the_clock_splits_an_interval_and_leaves_out_what_is_no_training():
  clock = LoopClock()
  with clock.input_wait():
    time.sleep(0.2)
  with clock.step():
    time.sleep(0.4)
  with clock.left_out():
    time.sleep(0.5)
  time.sleep(0.2)  # the host's own work
  figures = clock.interval(4)
  assert figures["steps_per_sec"] == pytest.approx(4 / 0.8, rel=0.25)
  assert figures["input_wait_fraction"] == pytest.approx(0.25, abs=0.08)
  assert figures["host_fraction"] == pytest.approx(0.25, abs=0.08)
  time.sleep(0.1)  # the next interval starts afresh: host time alone
  assert clock.interval(1)["host_fraction"] > 0.9
