"""A store format is one module implementing `format_interface.StoreFormat` and one entry of
`wnscale.data.reading.store_formats.FORMATS`: opening a store for training (a grid store, a
point store of observations, or a regional cut-out of two grid stores), describing it and
reading the statistics it carries ask the entry of its format (`store_formats.open_store`,
`open_points`, `open_dataset`, `native_time_step_hours`). This file registers two more
formats (a directory that names a WeatherBench2 store beside it and carries its own
statistics; stations in a JSON file, read by a modality) and changes no library file.
"""

import json
import os

import numpy as np
import pytest
import xarray as xr

from problems import data_spec
from wnscale.data import run_data
from wnscale.data.making import stations, synthetic
from wnscale.data.reading import anemoi as anemoi_format
from wnscale.data.reading import cutout, normalization, observations, store_formats
from wnscale.data.reading import store as store_lib
from wnscale.data.reading import weatherbench2_zarr
from wnscale.data.reading.format_interface import POINTS, StoreFormat
from wnscale.errors import UserError
from wnscale.graphs.points import PointSet

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
LEVELS = (500, 850)
T2M = "2m_temperature"


def test_each_store_is_of_the_format_that_recognises_it(tmp_path):
  anemoi = os.path.join(FIXTURES, "anemoi_netcdf", "store.zarr")
  wb2 = synthetic.write_synthetic_store(str(tmp_path / "wb2.zarr"), end="2020-01-02",
                                        levels=LEVELS, variables=["temperature"])
  assert store_formats.format_of(anemoi) is anemoi_format.FORMAT
  assert store_formats.format_of(wb2) is weatherbench2_zarr.FORMAT
  assert store_formats.format_of(str(tmp_path / "none.zarr")) is weatherbench2_zarr.FORMAT


def test_point_stores_and_cut_outs_are_formats_and_each_kind_is_read_as_itself(tmp_path):
  """A point store is recognised by its layout, a cut-out chosen by the regional store named
  beside a store; a store of one kind asked for as the other is one line saying so."""
  wb2 = synthetic.write_synthetic_store(str(tmp_path / "wb2.zarr"), end="2020-01-02",
                                        levels=LEVELS, variables=[T2M])
  points = stations.write_observations(
      str(tmp_path / "obs.zarr"), np.array(["2020-01-01"], "datetime64[ns]"),
      ["B", "A", "C", "D"], [-30.0, 0.0, 30.0, 60.0], [0.0, 90.0, 180.0, 270.0],
      {T2M: np.ones((1, 4))})
  assert store_formats.format_of(points) is observations.FORMAT
  assert store_formats.format_of(wb2, regional_path=wb2) is cutout.FORMAT
  np.testing.assert_array_equal(store_formats.open_points(points, [T2M]).station_id,
                                ["A", "B", "C", "D"])
  assert T2M in store_formats.open_dataset(points)
  with pytest.raises(UserError, match=r"obs.zarr is a point store .*, not a grid store"):
    store_formats.open_store(points, [T2M], ())
  with pytest.raises(UserError, match=r"wb2.zarr is a grid store .*, not a point store"):
    store_formats.open_points(wb2, [T2M])
  with pytest.raises(UserError, match="^Store not found: .*none.zarr"):
    store_formats.open_points(str(tmp_path / "none.zarr"), [T2M])


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



def _open_json_stations(path: str, variables) -> observations.ObservationStore:
  """A directory holding `stations.json`: `{"station_id": [S], "latitude": [S], "longitude":
  [S], "time": [T] ISO times, name: [T][S] values (null: missing)}`, in station order."""
  with open(os.path.join(path, "stations.json")) as f:
    table = json.load(f)
  return observations.ObservationStore(
      path, np.asarray(table["station_id"]),
      PointSet.from_points(np.asarray(table["latitude"]), np.asarray(table["longitude"])),
      np.asarray(table["time"], "datetime64[ns]"),
      {name: np.asarray(table[name], np.float64).astype(np.float32) for name in variables})


JSON_STATIONS = StoreFormat(
    "stations in JSON",
    recognises=lambda path: os.path.exists(os.path.join(path, "stations.json")),
    open=_open_json_stations, yields=POINTS)


def test_a_registered_point_format_feeds_a_modality(tmp_path, monkeypatch):
  """A run's modality reads a store of a point format the library does not know, once it is
  an entry of `FORMATS`: its values, normalized with its training times' statistics."""
  grid = synthetic.write_synthetic_store(str(tmp_path / "grid.zarr"), end="2020-01-02",
                                         levels=(500,), variables=[T2M])
  grid_times = store_formats.open_store(grid, [T2M], ()).times
  stations = tmp_path / "stations"
  stations.mkdir()
  values = [[280.0 + t, None, 290.0 - t, 285.0] for t in range(len(grid_times))]
  (stations / "stations.json").write_text(json.dumps({
      "station_id": ["A", "B", "C", "D"], "latitude": [-30.0, 0.0, 30.0, 60.0],
      "longitude": [0.0, 90.0, 180.0, 270.0], "time": [str(t) for t in grid_times],
      T2M: values}))
  monkeypatch.setattr(store_formats, "FORMATS", (JSON_STATIONS,) + store_formats.FORMATS)
  data = data_spec(path=grid, variables=(T2M,), pressure_levels=(),
                   modalities=(("json", str(stations), (T2M,), (T2M,)),))
  reader, = run_data.modality_readers(data, 0, grid_times, grid_times)
  read = reader.read("targets", np.arange(len(grid_times)))[:, 0]  # [T, stations]
  assert np.isnan(read[:, 1]).all()
  raw = np.asarray(values, np.float64)[:, [0, 2, 3]]
  np.testing.assert_allclose(read[:, [0, 2, 3]] * reader.stats["targets"]["std"][0]
                             + reader.stats["targets"]["mean"][0], raw, rtol=1e-6)
  np.testing.assert_allclose(reader.stats["targets"]["mean"][0], raw.mean(), rtol=1e-6)
