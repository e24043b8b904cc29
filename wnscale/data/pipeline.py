"""The Grain pipeline: example indices -> shuffle -> per-process share -> batch -> read.

Order of examples: the source's indices are shuffled with `seed` (reshuffled
every epoch), repeated, and the resulting stream is dealt round-robin to the
JAX processes (`stream[process_index::process_count]`), each batching its
share. A batch of indices is then read whole (`source.read_batch`: one buffer
per key, decoded into; in shared memory when Grain worker processes read it).
So every process reads only its own examples, the shares of one epoch are
disjoint, and the global batch sequence is the same for any process count.

Iterator state (`get_state`/`set_state`, or Orbax's
`grain.checkpoint.CheckpointSave/CheckpointRestore`) resumes exactly, with or
without worker processes. `ShardedLayout.global_batch` turns a process's
batches into global `jax.Array`s.
"""

from __future__ import annotations

import dataclasses

import grain
import jax

from wnscale.data import run_data
from wnscale.data import source as source_lib
from wnscale.data.reading import normalization
from wnscale.errors import UserError


@dataclasses.dataclass
class DataPipeline:
  """What `from_config` builds.

  Attributes:
    source: the example source (its `normalization` feeds the model and loss).
    dataset: this process's `grain.MapDataset` of example indices (unbatched).
    iterator: yields per-process batches: dicts of `[batch, ...]` float32
      (see `source.py` for the keys); has `get_state`/`set_state`.
  """

  source: source_lib.WeatherExampleSource
  dataset: grain.MapDataset
  iterator: grain.DatasetIterator

  def restore(self, state: dict):
    """Continues from `iterator.get_state()`'s `state` (e.g. read from a checkpoint)."""
    self.iterator.set_state(state)

  def close(self):
    """Stops the iterator's worker processes, if it has any."""
    if hasattr(self.iterator, "close"):
      self.iterator.close()


def make_dataset(source,
                 *,
                 seed: int = 0,
                 shuffle: bool = True,
                 num_epochs: int | None = None,
                 process_index: int = 0,
                 process_count: int = 1) -> grain.MapDataset:
  """`MapDataset` of this process's share of the (shuffled) stream of example indices.

  Any sized source works (`__len__`). With `num_epochs=None` the stream is
  infinite. The stream is cut to a multiple of `process_count` so every
  process gets the same number of examples.
  """
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} not in "
                     f"[0, process_count={process_count})")
  if len(source) == 0:
    raise UserError(f"Source {source!r} has no examples")
  dataset = grain.MapDataset.range(len(source))
  if shuffle:
    dataset = dataset.shuffle(seed=seed)
  # reseed_each_epoch (the default) gives every epoch a new order.
  dataset = dataset.repeat(num_epochs)
  usable = len(dataset) - len(dataset) % process_count
  return dataset[:usable][process_index::process_count]


def make_iterator(source,
                  dataset: grain.MapDataset,
                  batch_size: int,
                  worker_count: int = 0,
                  num_threads: int = 2,
                  prefetch_batches: int = 2) -> grain.DatasetIterator:
  """Iterator of `source.read_batch` of `batch_size` indices of `dataset` at a time.

  Batches are read by `num_threads` threads (`prefetch_batches` ahead), in
  `worker_count` processes if > 0.
  """
  if batch_size < 1:
    raise ValueError(f"batch size per process must be >= 1, got {batch_size}")
  if len(dataset) < batch_size:
    raise UserError(
        f"This process's share has {len(dataset)} example(s), fewer than one "
        f"batch of {batch_size}")
  read_options = grain.ReadOptions(num_threads=num_threads,
                                   prefetch_buffer_size=max(num_threads, prefetch_batches))
  iter_dataset = dataset.batch(batch_size, drop_remainder=True).map(
      source.read_batch).to_iter_dataset(read_options)
  if worker_count > 0:
    iter_dataset = iter_dataset.mp_prefetch(grain.MultiprocessingOptions(
        num_workers=worker_count, per_worker_buffer_size=prefetch_batches))
  return iter(iter_dataset)


def make_source(data, split: str, *, store=None, norm=None,
                indexed_target_steps: int | None = None) -> source_lib.WeatherExampleSource:
  """The example source of `split` ("train" or "eval") of `data`, a `wnscale.specs.DataSpec`
  (`source.WeatherExampleSource`), with a time range the store lacks said in the config's
  keys.

  `store`: `data`'s grid store, already open (default `run_data.open_example_store`).
  `norm`: the run's `normalization.Normalization`, the same for both splits (default that
  of the training range's statistics, `run_data.resolve_stats`). `indexed_target_steps`:
  examples counted as if this long (a rollout curriculum's longest phase).
  """
  data.split_range(split)  # a clear error for an unknown split, before any reading
  if store is None:
    store = run_data.open_example_store(data)
  if norm is None:
    norm = normalization.Normalization.from_stats(data, run_data.resolve_stats(data))
  with run_data.config_range(split):
    return source_lib.WeatherExampleSource(data, split, store, norm,
                                           indexed_target_steps=indexed_target_steps)


def make_pipeline(data,
                  split: str,
                  *,
                  batch_size: int,
                  seed: int,
                  process_index: int | None = None,
                  process_count: int | None = None,
                  skip_examples: int = 0,
                  source: source_lib.WeatherExampleSource | None = None) -> DataPipeline:
  """The pipeline of `split` of `data`, a `wnscale.specs.DataSpec`.

  Args:
    split: "train" (shuffled with `seed`, endless) or "eval" (in order, one pass).
    batch_size: GLOBAL batch size; each process yields
      `batch_size // process_count` examples per batch (read by
      `data.worker_count` worker processes).
    process_index, process_count: this process's share of the example stream;
      default `jax.process_index()` and `jax.process_count()`.
    skip_examples: examples of this process's share to skip (resuming by step).
    source: this split's source, already open (e.g. `source.in_layout(...)`);
      default: `make_source(data, split)`.
  """
  data.split_range(split)  # a clear error for an unknown split
  process_index = jax.process_index() if process_index is None else process_index
  process_count = jax.process_count() if process_count is None else process_count
  if batch_size % process_count:
    raise UserError(f"Global batch size {batch_size} is not divisible by the "
                    f"{process_count} processes")
  training = split == "train"
  source = source or make_source(data, split)
  dataset = make_dataset(source, seed=seed, shuffle=training,
                         num_epochs=None if training else 1, process_index=process_index,
                         process_count=process_count)[skip_examples:]
  iterator = make_iterator(source, dataset, batch_size // process_count, data.worker_count)
  return DataPipeline(source, dataset, iterator)
