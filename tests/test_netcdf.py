"""netCDF3 and netCDF4 files read alike, each written by its own library; anything else is
one clear error naming the file."""

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from wnscale.data import netcdf
from wnscale.data.reading import normalization
from wnscale.errors import UserError


def _dataset() -> xr.Dataset:
  rng = np.random.default_rng(0)
  return xr.Dataset(
      {"2m_temperature": (("time", "lat", "lon"), rng.normal(280, 5, (2, 3, 4)).astype(
          np.float32)),
       "temperature": (("level", "lat"), rng.normal(250, 5, (2, 3)))},
      coords={"time": pd.date_range("2020-01-01", periods=2, freq="6h"),
              "level": [500, 850], "lat": [-45.0, 0.0, 45.0], "lon": [0.0, 90, 180, 270]},
      attrs={"source": "test"})


# Each format as its own library writes it: scipy (netCDF3 classic and 64-bit offset),
# h5netcdf (netCDF4/HDF5, xarray's default where it is installed).
WRITERS = {"netcdf3_classic": dict(engine="scipy", format="NETCDF3_CLASSIC"),
           "netcdf3_64bit": dict(engine="scipy", format="NETCDF3_64BIT"),
           "netcdf4": dict(engine="h5netcdf")}


@pytest.mark.parametrize("writer", WRITERS)
def test_both_formats_read_alike_from_files_and_bytes(tmp_path, writer):
  path = tmp_path / "data.nc"
  _dataset().to_netcdf(path, **WRITERS[writer])
  expected_format = netcdf.NETCDF4 if writer == "netcdf4" else netcdf.NETCDF3
  assert netcdf.format_of(path.read_bytes()[:16], str(path)) == expected_format
  for loaded in (netcdf.load(str(path)), netcdf.from_bytes(path.read_bytes(), str(path))):
    xr.testing.assert_identical(loaded.drop_encoding(), _dataset())


def test_statistics_files_of_either_format(tmp_path):
  """`data.stats_path` pointing at a wnscale statistics file, saved as netCDF4 by a user."""
  stats = xr.Dataset({"2m_temperature": (("statistic",), [280.0, 5.0, 1.0])},
                     coords={"statistic": ["mean", "std", "diff_std"]})
  path = tmp_path / "stats.nc"
  stats.to_netcdf(path, engine="h5netcdf")
  xr.testing.assert_identical(normalization.read_stats(str(path)).drop_encoding(), stats)
  # wnscale's own cache files are netCDF3, which every reader reads.
  assert normalization.to_bytes(stats)[:3] == b"CDF"


def test_a_file_of_neither_format_is_named(tmp_path):
  cases = {"zarr.json": b'{"zarr_format": 3}', "empty.nc": b"",
           "params.npz": b"PK\x03\x04" + bytes(20)}
  for name, content in cases.items():
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(UserError, match=f"{path} is not a netCDF file") as raised:
      netcdf.load(str(path))
    assert ("empty" in str(raised.value)) == (content == b"")
  with pytest.raises(UserError, match=f"No netCDF file at {tmp_path / 'missing.nc'}"):
    netcdf.load(str(tmp_path / "missing.nc"))
  with pytest.raises(UserError, match="it is a directory"):
    netcdf.load(str(tmp_path))
