"""A store format is one module implementing `format_interface.StoreFormat` and one entry of
`wnscale.data.reading.store_formats.FORMATS`: opening a store for training, describing it
and reading the statistics it carries ask the entry of its format (`store_formats.open_store`,
`open_dataset`, `native_time_step_hours`). This file registers one more format (a directory
that names a WeatherBench2 store beside it and carries its own statistics) and changes no
library file.
"""

import os

import numpy as np
import xarray as xr

from wnscale.data.making import synthetic
from wnscale.data.reading import anemoi as anemoi_format
from wnscale.data.reading import normalization, store_formats, weatherbench2_zarr
from wnscale.data.reading import store as store_lib
from wnscale.data.reading.format_interface import StoreFormat

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
LEVELS = (500, 850)


def test_each_store_is_of_the_format_that_recognises_it(tmp_path):
  anemoi = os.path.join(FIXTURES, "anemoi_netcdf", "store.zarr")
  wb2 = synthetic.write_synthetic_store(str(tmp_path / "wb2.zarr"), end="2020-01-02",
                                        levels=LEVELS, variables=["temperature"])
  assert store_formats.format_of(anemoi) is anemoi_format.FORMAT
  assert store_formats.format_of(wb2) is weatherbench2_zarr.FORMAT
  assert store_formats.format_of(str(tmp_path / "none.zarr")) is weatherbench2_zarr.FORMAT


def _pointer_format(stats: xr.Dataset) -> StoreFormat:
  """Directories holding a file `target` that names the WeatherBench2 store they stand for;
  their step is 12 h whatever the target's; they carry `stats`."""
  def target(path):
    with open(os.path.join(path, "target")) as f:
      return f.read()

  return StoreFormat(
      "pointer", recognises=lambda path: os.path.exists(os.path.join(path, "target")),
      open=lambda path, *args: weatherbench2_zarr.open_weather_store(target(path), *args),
      dataset=lambda path: store_lib.open_metadata(target(path)),
      time_step_hours=lambda path, default: 12.0,
      statistics=lambda path, time_step_hours: stats.copy(deep=True))


def test_a_registered_format_opens_describes_and_carries_statistics(tmp_path, monkeypatch):
  wb2 = synthetic.write_synthetic_store(str(tmp_path / "wb2.zarr"), end="2020-01-02",
                                        levels=LEVELS, variables=["temperature"])
  pointer = tmp_path / "pointer"
  pointer.mkdir()
  (pointer / "target").write_text(wb2)
  stats = xr.Dataset({"temperature": (("statistic", "level"), [[250.0, 260.0], [5.0, 4.0],
                                                                 [1.0, 0.5]])},
                     coords={"statistic": ["mean", "std", "diff_std"], "level": list(LEVELS)})
  monkeypatch.setattr(store_formats, "FORMATS",
                      (_pointer_format(stats),) + store_formats.FORMATS)
  store = store_formats.open_store(str(pointer), ["temperature"], LEVELS)
  np.testing.assert_array_equal(
      store.times, store_formats.open_store(wb2, ["temperature"], LEVELS).times)
  assert store_formats.open_dataset(str(pointer))["temperature"].shape == (
      store_lib.open_metadata(wb2)["temperature"].shape)
  assert store_formats.native_time_step_hours(str(pointer), 6.0) == 12.0
  assert store_formats.native_time_step_hours(wb2, 6.0) == 6.0
  np.testing.assert_array_equal(
      normalization.read_stats(str(pointer))["temperature"].sel(statistic="mean"), [250, 260])
