"""`convert.convert_era5` with the store's blocks of times written by a Beam pipeline.

  for_each = beam_pipelines.for_each(beam_pipelines.options("DataflowRunner", [...]), "..")
  convert_beam.convert_era5(for_each, ["gs://bucket/era5/*.nc"], "gs://bucket/era5.zarr")

All but the writing of the times is `convert.convert_era5`'s, in this process: the
files are opened and checked (grids, levels, overlaps in time, gaps), the store is
laid out (its `conversion` attribute marking it incomplete) and the statics are
written. Each block of times is then one work item on the runner's workers: a
worker opens only the files holding the block's times (and the hours before them
that `total_precipitation_6hr` sums), then reads and writes the block with
`convert.start_block`, as the plain conversion does, so the store is the same. It
is marked complete once every block is written. A run cut short leaves it marked
incomplete; the same command writes the blocks again (those after the times a plain
conversion into it recorded).
"""

from __future__ import annotations

import copy
import functools

import pandas as pd

from wnscale.data.making import convert, era5_files, writer

# `convert._Plan.read`: total_precipitation_6hr sums the hours t-5 .. t of each time t.
_SUMMED_HOURS = 6
_OPEN_FILES = 4  # source files a worker keeps open (a bucket's file is read whole)


def convert_era5(for_each, sources: list[str], out: str, *, member: int | None = None,
                 **kwargs) -> str:
  """`convert.convert_era5(sources, out, member=member, **kwargs)`, the blocks of times
  written by `for_each` (`beam_pipelines.for_each`: `(function, items)`, calls
  `function(item)` for each item on the runner's workers); returns `out`."""
  return convert.convert_era5(sources, out, member=member, **kwargs, write_times=(
      functools.partial(_write_times, for_each, member)))


def _write_times(for_each, member, where, plan, done, per_block, out):
  """The `write_times` of `convert.convert_era5`: each block of times a work item."""
  del out  # the runner shows the progress
  spans = [(times[0], times[-1]) if len(times) else None for times in (
      pd.DatetimeIndex(dataset["time"].values) if "time" in dataset.dims else []
      for dataset in plan.datasets)]
  lookback = pd.Timedelta(hours=_SUMMED_HOURS - 1 if convert.PRECIPITATION_6HR
                          in plan.time_variables else 0)
  items = []
  for first in range(done, len(plan.times), per_block):
    last = min(first + per_block, len(plan.times))
    begin, end = plan.times[first] - lookback, plan.times[last - 1]
    items.append((first, last, [path for path, span in zip(plan.files, spans)
                                if span and span[0] <= end and span[1] >= begin]))
  reader = copy.copy(plan)
  reader.datasets = None  # each worker opens the files of its blocks
  try:
    for_each(functools.partial(_write_block, where, reader, member), items)
  finally:
    _open.cache_clear()  # a DirectRunner runs here: the next conversion may read new files
  convert.finish(where, plan)


def _write_block(where: str, reader, member: int | None, item):
  """Writes the times `first:last` of `item = (first, last, files)`, read from `files`."""
  first, last, files = item
  plan = copy.copy(reader)
  plan.files, plan.datasets = files, [_open(path, member) for path in files]
  handles = {name: writer.open_variable(where, name) for name in plan.time_variables}
  writes = convert.start_block(plan, handles, first, last)
  convert.wait_block(handles, writes, first, last)


@functools.lru_cache(maxsize=_OPEN_FILES)
def _open(path: str, member: int | None):
  return era5_files.open_era5_file(path, member)
