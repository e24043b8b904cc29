"""Writes WeatherBench2-layout zarr stores piece by piece: forecasts, climatologies.

Paths may be local or URLs (`gs://`; `wnscale.paths`).

`create_store` lays a store out (coordinates, attributes, every data variable
with its dims, chunks and `units`, filled with NaN) in one go; the data then
goes in block by block through tensorstore (`open_variable`), so a writer
never holds more than a block in memory. Zarr v2, as WeatherBench2 publishes,
with consolidated metadata.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os

import numpy as np
import tensorstore as ts
import xarray as xr
import zarr

from wnscale import paths


@dataclasses.dataclass(frozen=True)
class VariableLayout:
  """One float32 data variable of a store being laid out.

  Attributes:
    dims: dimension names, each a coordinate of the store.
    chunks: chunk shape, one entry per dim.
    attrs: attributes, e.g. `{"units": "K"}`.
  """

  dims: tuple[str, ...]
  chunks: tuple[int, ...]
  attrs: dict


def create_store(path: str, coords: dict, variables: dict[str, VariableLayout],
                 attrs: dict | None = None) -> str:
  """Writes the layout of a new zarr v2 store at `path` (which must not exist).

  Args:
    coords: `{dim: 1-D values}` (datetime64 and timedelta64 are encoded by xarray), or
      `{name: (dims, values)}` for a coordinate along other dims (a point set's
      `latitude` along `values`).
    variables: `{name: VariableLayout}`; data is NaN until written.
    attrs: the store's attributes (JSON-serializable).

  Returns:
    `path`, normalized (`paths.normalize`).
  """
  path = paths.normalize(path)  # tensorstore refuses paths with ".."
  dataset = xr.Dataset(coords={name: values if isinstance(values, tuple) else
                               (name, np.asarray(values)) for name, values in coords.items()},
                       attrs=attrs or {})
  dataset.to_zarr(path, mode="w-", zarr_format=2, consolidated=False)
  group = zarr.open_group(path, mode="r+", zarr_format=2)
  for name, layout in variables.items():
    shape = tuple(dataset.sizes[dim] for dim in layout.dims)
    group.create_array(name, shape=shape, chunks=layout.chunks, dtype="float32",
                       fill_value=np.nan,
                       attributes={"_ARRAY_DIMENSIONS": list(layout.dims), **layout.attrs})
  zarr.consolidate_metadata(path, zarr_format=2)
  return path


def consolidate(path: str):
  """Rewrites the store's consolidated metadata, e.g. after groups were laid out inside it
  (`create_store` at `<path>/<group>`), so that readers of it see them."""
  zarr.consolidate_metadata(paths.normalize(path), zarr_format=2)


def open_variable(path: str, name: str):
  """A tensorstore handle for writing variable `name` of the store at `path`."""
  return ts.open({"driver": "zarr", "kvstore": paths.kvstore_spec(paths.join(path, name))},
                 write=True).result()


def wait_all(writes, raise_error: bool = True):
  """Waits for every tensorstore write in `writes`, then raises the first one's error.

  All of them end before anything is raised: a store is renamed into place or
  removed only once no write can still land in it. `raise_error=False`: wait only
  (while another error is already on its way).
  """
  for write in writes:
    write.exception()
  if raise_error:
    for write in writes:
      write.result()


def evict_written(handle, first: int, last: int):
  """Evicts the chunk files of `handle` (`open_variable`) holding positions `first:last` of its
  first dim from the operating system's page cache, once their writes are done; a store in a
  bucket has none.

  A conversion writes far more than memory holds and does not read it back. Left cached,
  every chunk is copied into fresh pages of the cache, which on a virtual machine cost
  more to fill than the compression (memory the host has not backed yet faults on first
  touch: docs/benchmarks.md, "Figures behind the code"); evicted, the next chunks reuse
  the same pages. Eviction drops clean
  pages only (tensorstore syncs each chunk it writes; a dirty page is written first, never
  lost).
  """
  if handle.kvstore.spec().to_json()["driver"] != "file":
    return
  chunk = handle.chunk_layout.write_chunk.shape
  shape = handle.domain.shape
  separator = handle.spec().to_json()["metadata"]["dimension_separator"]
  grid = [range(first // chunk[0], -(-last // chunk[0]))] + [
      range(-(-size // size_of_chunk)) for size, size_of_chunk in zip(shape[1:], chunk[1:])]
  for index in itertools.product(*grid):
    try:
      descriptor = os.open(handle.kvstore.path + separator.join(map(str, index)), os.O_RDONLY)
    except FileNotFoundError:  # all fill value: not stored
      continue
    try:
      os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
      os.close(descriptor)


def read_attrs(path: str) -> dict:
  """The store's own attributes: the group's `.zattrs` (not the consolidated copy), read as
  the JSON it is (zarr's `open_group` costs far more, and a conversion reads them after
  every block)."""
  attrs = paths.join(path, ".zattrs")
  return json.loads(paths.read_text(attrs)) if paths.exists(attrs) else {}


def update_attrs(path: str, attrs: dict):
  """Sets store attributes: the group's `.zattrs`, then its copy in the consolidated
  `.zmetadata` that readers such as `xarray.open_zarr` see, each file replaced whole
  (`paths.write_text`). Edited as the JSON they are: zarr's `consolidate_metadata` reads
  every array's metadata again, and a conversion or a forecast records its progress
  after every block."""
  consolidated = paths.join(path, ".zmetadata")
  current = {**read_attrs(path), **attrs}
  paths.write_text(paths.join(path, ".zattrs"), _zarr_json(current))
  if not paths.exists(consolidated):
    zarr.consolidate_metadata(path, zarr_format=2)
    return
  metadata = json.loads(paths.read_text(consolidated))
  metadata["metadata"][".zattrs"] = current
  paths.write_text(consolidated, _zarr_json(metadata))


def _zarr_json(value) -> str:
  """JSON laid out as zarr writes its v2 metadata."""
  return json.dumps(value, indent=2)
