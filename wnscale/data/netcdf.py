"""netCDF files in either of their formats, told apart by their first bytes.

A `.nc` file is netCDF3 (classic: starts with `CDF` and a version byte) or
netCDF4 (an HDF5 file: starts with HDF5's signature, at byte 0 or at a user
block of 512, 1024, 2048, ... bytes). The Climate Data Store delivers netCDF4,
and xarray writes netCDF4 wherever netCDF4 or h5netcdf is installed, so both
come in: netCDF3 is read with scipy, netCDF4 with h5netcdf (pure Python over
h5py; no C netCDF library). Anything else is a `UserError` naming the file.

wnscale writes netCDF3 (`to_bytes`): every netCDF reader reads it.
"""

from __future__ import annotations

import io

import xarray as xr

from wnscale import paths
from wnscale.errors import UserError

NETCDF3, NETCDF4 = "netCDF3", "netCDF4"
# The xarray engine that reads each format.
ENGINES = {NETCDF3: "scipy", NETCDF4: "h5netcdf"}
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_HDF5_USER_BLOCKS = (0, 512, 1024, 2048, 4096)  # where HDF5 looks for its signature
HEAD_BYTES = _HDF5_USER_BLOCKS[-1] + len(_HDF5_SIGNATURE)  # what `format_of` needs to read


def format_of(head: bytes, name: str) -> str:
  """`NETCDF3` or `NETCDF4` from a file's first `HEAD_BYTES` (or all of a shorter file).

  Raises:
    UserError: neither format (naming `name` and what the file starts with).
  """
  if head[:3] == b"CDF" and head[3:4] in (b"\x01", b"\x02", b"\x05"):
    return NETCDF3
  if any(head[offset:offset + 8] == _HDF5_SIGNATURE for offset in _HDF5_USER_BLOCKS):
    return NETCDF4
  shown = head[:8]
  raise UserError(f"{name} is not a netCDF file: netCDF3 starts with b'CDF\\x01' (or "
                  f"\\x02, \\x05) and netCDF4 with HDF5's signature, this starts with "
                  f"{shown!r}{' (the file is empty)' if not head else ''}.")


def load(path: str) -> xr.Dataset:
  """The whole dataset of a netCDF3 or netCDF4 file (a local path or a URL), loaded.

  Raises:
    UserError: there is no such file, or it is not netCDF.
  """
  path = paths.normalize(path)
  if not paths.exists(path) or paths.as_epath(path).is_dir():
    raise UserError(f"No netCDF file at {path}" + (" (it is a directory)"
                                                    if paths.exists(path) else ""))
  with paths.local_copy(path) as local:
    with open(local, "rb") as file:
      engine = ENGINES[format_of(file.read(HEAD_BYTES), path)]
    return xr.load_dataset(local, engine=engine)


def from_bytes(data: bytes, name: str) -> xr.Dataset:
  """The dataset of a netCDF3 or netCDF4 file's bytes; `name` names it in errors."""
  engine = ENGINES[format_of(data[:HEAD_BYTES], name)]
  return xr.load_dataset(io.BytesIO(data), engine=engine)


def to_bytes(dataset: xr.Dataset) -> bytes:
  """A netCDF3 file's bytes (64-bit offsets: variables over 2 GiB are allowed)."""
  return dataset.to_netcdf(engine="scipy", format="NETCDF3_64BIT")
