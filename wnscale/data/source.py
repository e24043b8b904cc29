"""A Grain random-access source of normalized training examples.

Example `i` of a time range covers `input_steps + target_steps` consecutive
model steps starting at the range's `i`-th time; examples that would run past
the range (or the store) are not produced.

Each example (the batch contract with the model, before batching):
  * `inputs`:   `[input_steps, state channels, grid]` (x - mean) / std
  * `targets`:  `[target_steps, output channels, grid]` (x - mean) / std: the
    state channels, then the target-only variables' (`variables.py`)
  * `forcings`: `[input_steps + target_steps, forcings, grid]` computed
    (`forcings.py`) or read from the store (`stored_forcings`), normalized as
    `input_normalization` says (`normalization.InputScales`)
  * `statics`:  `[2, grid]` geopotential_at_surface, land_sea_mask, likewise
  * `globals`:  `[input_steps + target_steps, F]` global forcings
    (`forcings.GLOBAL_FORCINGS`), only when some are asked for, likewise
  * `<name>/inputs`, `<name>/targets`: `[steps, C_m, points]` a modality's
    observations at the input and target times (`with_modalities`), normalized,
    NaN where missing
all float32, grid flattened latitude-major with latitude ascending.
Channel-major is the stores' own layout, so tensorstore decodes an example
straight into it; the model's encoder transposes it to node-major block by
block on the device (`model.blocks.map_row_blocks`). `read_batch` reads a whole
batch into one buffer per key, which is how the pipeline reads (no per-example
arrays to stack).
"""

from __future__ import annotations

import copy
import re
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from wnscale.data import forcings as forcings_lib
from wnscale.data import variables as variables_lib
from wnscale.data.reading import normalization
from wnscale.data.reading import store as store_lib
from wnscale.errors import ArgumentError, UserError

if TYPE_CHECKING:  # the layer above; only its type here
  from wnscale.specs import DataSpec


def example_starts(store, first_time: int, num_times: int, window: int) -> np.ndarray:
  """Offsets from `first_time` of every example of `window` consecutive times among the
  `num_times` from there whose window holds no missing time of `store`."""
  starts = np.arange(max(num_times - window + 1, 0))
  if store.missing is not None:
    missing = store.missing[first_time:first_time + num_times]
    hit = np.convolve(missing, np.ones(window, int), "valid") > 0
    starts = starts[~hit[:len(starts)]]
  return starts


class WeatherExampleSource:
  """Random-access examples of one store and time range.

  Picklable (tensorstore handles pickle by spec) for Grain's spawn workers,
  with a stable `__repr__` for Grain checkpoints.

  Attributes:
    store: the opened `store.WeatherStore`; its `variables` are the output
      variables (`variables` then `target_only_variables`).
    normalization: the run's `normalization.Normalization`.
  """

  def __init__(self, data: DataSpec, split: str, store: store_lib.WeatherStore,
               norm: normalization.Normalization, *,
               indexed_target_steps: int | None = None):
    """The examples of `data`'s `split` ("train" or "eval") range of `store`, normalized by
    `norm`.

    Without `data.fill_nan`, a NaN that the statistics pass saw inside the time
    range is an error here, before anything is compiled.

    Args:
      data: the run's `wnscale.specs.DataSpec`: the state (`variables`, inputs and targets),
        target-only variables, forcings (computed or stored), their normalization
        (`input_normalization`), global forcings, NaN fills, steps per example.
      split: whose time range: `data.train_start`..`train_end` or `eval_start`..`eval_end`
        (inclusive; empty: the store's ends).
      store: `data`'s grid store opened for its outputs (`run_data.open_example_store`).
      norm: the run's normalization (`run_data.RunData.normalization`: of the training
        range's statistics, for both splits).
      indexed_target_steps: examples are counted as if they had this many
        targets (>= `data.target_steps`; default that): a rollout curriculum's
        longest phase, so that example `i` starts at the same time in every phase
        (`with_target_steps`) and a data iterator's position means one thing.
    """
    if data.input_steps < 1 or data.target_steps < 1:
      raise UserError(f"input_steps ({data.input_steps}) and target_steps "
                      f"({data.target_steps}) must be at least 1")
    outputs = data.outputs
    if tuple(store.variables) != outputs:
      raise ValueError(f"The store holds {store.variables}, not the outputs {outputs} "
                       "(open it with run_data.open_example_store)")
    self.store = store
    self.variables = data.variables
    self.forcings, self.stored_forcings = data.forcings, data.stored_forcings
    self.input_steps, self.target_steps = data.input_steps, data.target_steps
    self.global_forcings = data.global_forcings
    self.start, self.end = data.split_range(split)
    self._first_time, num_times = store_lib.time_range(store.times, self.start, self.end,
                                                       data.path)
    self._num_times = num_times
    indexed = max(self.target_steps, indexed_target_steps or self.target_steps)
    # Example i starts at time `_first_time + _starts[i]`: every start whose (indexed)
    # window holds no missing time.
    window = self.input_steps + indexed
    self._starts = example_starts(store, self._first_time, num_times, window)
    self._num_examples = len(self._starts)
    if self._num_examples <= 0:
      raise UserError(
          f"Time range {self.start} .. {self.end} of {data.path} has {num_times} time(s) at "
          f"{data.time_step_hours} h; one example needs {window} "
          f"({self.input_steps} input + {indexed} target). The store covers "
          f"{store.times[0]} .. {store.times[-1]}: set data.train_start/train_end and "
          "data.eval_start/eval_end inside it.")
    self.normalization = norm
    fill = {name: np.float32(value) for name, value in data.nan_fill_values}
    if data.fill_nan:
      fill = {name: normalization.channel_stats(norm.stats, [name], store.levels)["mean"]
              for name in outputs + variables_lib.STATIC_VARIABLES + self.stored_forcings
              } | fill
    store.fill = fill
    if not data.fill_nan:
      self._check_nan(norm.stats, num_times)
    self.modalities = ()
    self._set_grid_slots(None)

  def _check_nan(self, stats, num_times: int):
    """Raises on the first NaN in this source's time range, if the statistics saw any.

    The statistics note each channel's first and last NaN over the time range
    they were computed from (the training range); only a channel whose NaN
    span meets this source's range is read, from where it meets. Times outside
    the statistics' range (e.g. an evaluation range) are not checked here: a NaN
    there is the same error when it is read.
    """
    spans = normalization.nan_hours(stats, self.store.variables, self.store.levels)
    if spans is None or "first_time" not in stats.attrs:  # statistics without NaN hours
      return
    hours = (self.store.times - np.datetime64(0, "ns")) / np.timedelta64(1, "h")
    times = np.arange(self._first_time, self._first_time + num_times)
    if self.store.missing is not None:  # read by no example
      times = times[~self.store.missing[times]]
    seen = ((self.store.times[times] >= np.datetime64(stats.attrs["first_time"]))
            & (self.store.times[times] <= np.datetime64(stats.attrs["last_time"])))
    times = times[seen]
    if times.size == 0:
      return
    first, last = spans
    filled = np.array([name.split("@")[0] in self.store.fill
                       for name in self.store.channel_names])
    with np.errstate(invalid="ignore"):  # NaN hours: channels without NaN
      suspects = np.flatnonzero((first <= hours[times[-1]]) & (last >= hours[times[0]])
                                & ~filled)
    if suspects.size == 0:
      return
    span = (hours[times] >= first[suspects].min()) & (hours[times] <= last[suspects].max())
    times = times[span]
    block = max(1, normalization.BLOCK_BYTES // (4 * self.store.num_grid_nodes
                                                  * self.store.num_channels))
    for begin in range(0, len(times), block):
      state = self.store.read_state(times[begin:begin + block], allow_nan=True)
      bad = np.argwhere(np.isnan(state[:, suspects]).any(axis=2))
      if bad.size:
        step, channel = bad[0]
        raise store_lib.NanError(self.store.channel_names[suspects[channel]],
                                 f" at time {self.store.times[times[begin + step]]}",
                                 self.store.path)

  @property
  def window(self) -> int:
    return self.input_steps + self.target_steps

  def __len__(self) -> int:
    return self._num_examples

  def __repr__(self) -> str:
    return (f"WeatherExampleSource(store={self.store!r}, "
            f"input_steps={self.input_steps}, target_steps={self.target_steps},"
            f" start={self.start!r}, end={self.end!r})")

  @property
  def range_times(self) -> np.ndarray:
    """`[num_times]` datetime64 the store's times in this source's time range."""
    return self.store.times[self._first_time:self._first_time + self._num_times]

  def time_indices(self, index: int) -> np.ndarray:
    """`[window]` indices into `store.times` of example `index`."""
    if not 0 <= index < self._num_examples:
      raise IndexError(f"example {index} out of range [0, {len(self)})")
    return self._first_time + self._starts[index] + np.arange(self.window)

  def example_times(self, index: int) -> np.ndarray:
    """`[window]` datetime64 times of example `index` (inputs, then targets)."""
    return self.store.times[self.time_indices(index)]

  def __getitem__(self, index) -> dict[str, np.ndarray]:
    return {key: value[0] for key, value in self.read_batch([index]).items()}

  def read_batch(self, indices) -> dict[str, np.ndarray]:
    """Examples `indices` stacked, `{key: [batch, ...]}`: each key one buffer, read into.

    Every variable of every example is in flight at once (`store.read_into`).
    """
    indices = [int(index) for index in np.asarray(indices).reshape(-1)]
    num_points = self.store.num_grid_nodes if self.grid_slots is None else len(self.grid_slots)
    num_outputs = self.store.num_channels
    num_state = self.normalization.num_state
    inputs = np.empty((len(indices), self.input_steps, num_state, num_points), np.float32)
    targets = np.empty((len(indices), self.target_steps, num_outputs, num_points), np.float32)
    mean, std = self.normalization.mean, self.normalization.std
    state = store_lib.Channels(self.variables, mean[:num_state], std[:num_state])
    outputs = store_lib.Channels(self.store.variables, mean, std)
    requests = []
    for row, index in enumerate(indices):
      times = self.time_indices(index)
      requests += [(times[:self.input_steps], inputs[row], state),
                   (times[self.input_steps:], targets[row], outputs)]
    self.store.read_into(requests, grid_index=self.grid_slots)
    forcings = np.stack([self._to_slots(self.forcing_values(index)) for index in indices])
    statics = np.broadcast_to(self.statics(), (len(indices),) + self.statics().shape)
    batch = {"inputs": inputs, "targets": targets, "forcings": forcings,
             "statics": statics.copy()}
    if self.global_forcings:
      batch["globals"] = self.normalization.input_scales.globals(np.stack([
          forcings_lib.compute_global_forcings(self.example_times(index), self.global_forcings)
          for index in indices]))
    for reader in self.modalities:
      for kind, steps in (("inputs", slice(None, self.input_steps)),
                          ("targets", slice(self.input_steps, None))):
        if getattr(reader, kind):
          batch[f"{reader.name}/{kind}"] = np.stack([
              reader.read(kind, self.time_indices(index)[steps]) for index in indices])
    return batch

  def forcing_values(self, index: int) -> np.ndarray:
    """`[window, forcings, grid]` normalized forcings of example `index`, internal grid order."""
    return self.normalization.input_scales.forcings(
        self.store.forcings_at(self.time_indices(index), self.forcings))

  def statics(self) -> np.ndarray:
    """`[2, grid]` normalized statics (`normalization.input_scales`), in the grid-slot
    order."""
    if self._statics is None:
      self._statics = self._to_slots(
          self.normalization.input_scales.statics(self.store.read_statics()))
    return self._statics

  def with_target_steps(self, target_steps: int) -> WeatherExampleSource:
    """This source (same store, normalization and example count) with `target_steps` targets.

    Only as many as it was indexed for (`indexed_target_steps`): every example still fits.
    """
    if self._starts[-1] + self.input_steps + target_steps > self._num_times:
      raise ValueError(f"{target_steps} targets run past the time range this source was "
                       "indexed for (indexed_target_steps)")
    clone = copy.copy(self)
    clone.target_steps = target_steps
    return clone

  def with_modalities(self, readers) -> WeatherExampleSource:
    """This source whose examples also hold each of `readers`' (`observations.ModalityReader`,
    aligned with this store's times) inputs and targets."""
    clone = copy.copy(self)
    clone.modalities = tuple(readers)
    return clone

  def in_layout(self, grid_slots: np.ndarray | None,
                point_slots: dict | None = None) -> WeatherExampleSource:
    """This source (same open store and normalization) yielding examples in `grid_slots`
    order, and each modality's points in its `point_slots` entry's
    (`ShardedLayout.point_slots`).

    `grid_slots`: `[num_slots]` the grid node at each position of the examples' grid axis,
    -1 for padding (zeros): a sharded layout's node order (`ShardedLayout.grid_slots`),
    applied while copying, so the training loop does not reorder batches. None: all nodes
    in order.
    """
    clone = copy.copy(self)
    clone._set_grid_slots(grid_slots)
    clone.modalities = tuple(reader.in_layout((point_slots or {}).get(reader.name))
                             for reader in self.modalities)
    return clone

  def _set_grid_slots(self, grid_slots: np.ndarray | None):
    self.grid_slots = None if grid_slots is None else np.asarray(grid_slots, np.int64)
    self._statics = None  # statics are cached in the grid order

  def _to_slots(self, array: np.ndarray) -> np.ndarray:
    """`[..., grid]` in internal node order -> `[..., num_slots]` (see `in_layout`)."""
    if self.grid_slots is None:
      return array
    out = np.take(array, np.maximum(self.grid_slots, 0), axis=-1)
    out[..., self.grid_slots < 0] = 0.0
    return out


def parse_duration(text, argument: str) -> pd.Timedelta:
  """A duration such as "10d", "36h", "90min" or "1 days 06:00:00".

  Raises:
    ArgumentError: of `argument` (the caller's name for `text`), which is no duration.
  """
  if re.fullmatch(r"\s*\d+(?:\.\d+)?\s*", str(text)):  # pandas would read nanoseconds
    number = str(text).strip()
    raise ArgumentError(argument, text, f"a duration needs a unit, e.g. {number}h (hours) or "
                        f"{number}d (days).")
  match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([dh])\s*", str(text))
  if match:  # pandas is retiring the lower-case "d"
    return pd.Timedelta(**{"days" if match[2] == "d" else "hours": float(match[1])})
  try:
    return pd.Timedelta(text)
  except ValueError as error:
    raise ArgumentError(argument, text, "not a duration (e.g. 10d, 36h).") from error
