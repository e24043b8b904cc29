"""Blocks of consecutive times of a netCDF4 variable, read straight from its HDF5 dataset.

Through xarray and h5netcdf, a block's read goes through dimension look-ups and indexer
composition on every call, which cost more than the read itself; a block of consecutive
times of a variable kept as stored is one hyperslab, which h5py reads straight into the
caller's array (`read_times`). "As stored" means float32 in the file (unpacked: no
`scale_factor` or `add_offset`; no fill value other than NaN, so xarray masks nothing)
and indexed as in the file along every dim (no dim selected or added; sorted only where
sorting reverses it, as the CDS's descending pressure levels: the block is read, then
reversed along those dims).
`era5_files` knows when the latter holds and marks such variables (`mark`).
"""

from __future__ import annotations

import h5py
import numpy as np
import xarray as xr

# A marked variable's encoding holds (file path, HDF5 dataset name) under this key.
SOURCE = "hdf5_dataset"
_PACKING = ("scale_factor", "add_offset")
_FILL_VALUES = ("_FillValue", "missing_value")


def mark(dataset: xr.Dataset, path: str, stored_names: dict[str, str],
         reversed_dims: tuple[str, ...] = ()):
  """Marks the variables of `dataset` (indexed as in the netCDF4 file at local `path`, or
  in its reverse along `reversed_dims`) that are stored as float32 as they are;
  `stored_names` maps a variable to its name in the file where they differ."""
  for name, variable in dataset.data_vars.items():
    encoding = variable.encoding
    if (variable.dtype == np.float32 and np.dtype(encoding.get("dtype")) == np.float32
        and not any(key in encoding for key in _PACKING)
        and all(np.all(np.isnan(encoding[key])) for key in _FILL_VALUES if key in encoding)):
      flipped = tuple(variable.dims.index(dim) for dim in reversed_dims if dim in variable.dims)
      dataset.variables[name].encoding[SOURCE] = (path, stored_names.get(name, name), flipped)


def is_marked(variable: xr.Variable) -> bool:
  return SOURCE in variable.encoding


def read_times(variable: xr.Variable, times: slice, out: np.ndarray):
  """Reads the marked `variable` at the time positions `times` (a slice of its first dim)
  into `out` (C-contiguous float32, of the selection's shape)."""
  path, name, flipped = variable.encoding[SOURCE]
  with h5py.File(path, "r") as file:
    if not flipped:
      file[name].read_direct(out, np.s_[times])
      return
    block = file[name][times]  # one more block in memory, for the reversal
  out[...] = block[tuple(slice(None, None, -1) if axis in flipped else slice(None)
                         for axis in range(block.ndim))]
