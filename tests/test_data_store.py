"""Reading stores of every supported shape, and each bad-input error."""

import re

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr
from problems import data_spec

from wnscale.data import pipeline
from wnscale.data.making import synthetic
from wnscale.data.reading import normalization
from wnscale.data.reading import store_formats
from wnscale.errors import UserError
from wnscale.graphs.points import named_grid

LEVELS = (500, 850, 1000)
VARIABLES = ("temperature", "geopotential", "2m_temperature",
             "total_precipitation_6hr")
TINY = dict(start="2020-01-01", end="2020-01-02", levels=LEVELS,
            variables=VARIABLES)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
  """Paths of the same weather written in several layouts."""
  root = tmp_path_factory.mktemp("stores")
  write = synthetic.write_synthetic_store
  paths = {
      "v2": write(str(root / "v2.zarr"), **TINY),
      "v3": write(str(root / "v3.zarr"), zarr_format=3, **TINY),
      "poles": write(str(root / "poles.zarr"), include_poles=True, **TINY),
      "hourly": write(str(root / "hourly.zarr"), time_step_hours=1, **TINY),
      "ascending": str(root / "asc.zarr"),
  }
  # The same data with latitude ascending, as some non-WB2 stores have it.
  flipped = xr.open_zarr(paths["v2"], chunks=None).isel(
      latitude=slice(None, None, -1)).load()
  for variable in flipped.variables.values():
    variable.encoding.pop("chunks", None)
    variable.encoding.pop("preferred_chunks", None)
  flipped.to_zarr(paths["ascending"], zarr_format=2)
  return paths


def _read_all(path, **kwargs):
  store = store_formats.open_store(path, VARIABLES, LEVELS, **kwargs)
  return store, store.read_state(np.arange(len(store.times)))


def test_v2_and_v3_read_the_same(stores):
  _, v2 = _read_all(stores["v2"])
  store, v3 = _read_all(stores["v3"])
  assert store.handles["temperature"].spec().to_json()["driver"] == "zarr3"
  np.testing.assert_array_equal(v2, v3)


def test_latitude_order_does_not_matter(stores):
  descending, from_descending = _read_all(stores["v2"])
  ascending, from_ascending = _read_all(stores["ascending"])
  np.testing.assert_array_equal(descending.points.latitude, ascending.points.latitude)
  assert np.all(np.diff(descending.points.axes()[0]) > 0)
  np.testing.assert_array_equal(from_descending, from_ascending)
  np.testing.assert_array_equal(descending.read_statics(),
                                ascending.read_statics())


def test_state_matches_xarray_in_channel_layout(stores):
  store, state = _read_all(stores["v2"])
  dataset = xr.open_zarr(stores["v2"], chunks=None).sortby("latitude")
  assert state.shape == (8, 3 + 3 + 1 + 1, 32 * 64)
  assert store.channel_names[:4] == ["temperature@500", "temperature@850",
                                     "temperature@1000", "geopotential@500"]
  # Node i * num_lon + j is (lat[i], lon[j]); channel 1 is temperature@850.
  expected = dataset["temperature"].sel(level=850).values[5, 3, 7]
  assert state[5, 1, 3 * 64 + 7] == expected
  np.testing.assert_array_equal(
      state[:, 7], dataset["total_precipitation_6hr"].values.reshape(8, -1))
  statics = store.read_statics()
  np.testing.assert_array_equal(
      statics[1], dataset["land_sea_mask"].values.reshape(-1))


def test_grid_with_pole_rows(stores):
  store, state = _read_all(stores["poles"])
  latitude = store.points.axes()[0]
  assert latitude.size == 33 and store.num_grid_nodes == 33 * 64
  assert latitude[0] == -90 and latitude[-1] == 90
  weather = synthetic.SyntheticWeather(store.points, LEVELS)
  expected = weather.fields(store.times[2:3], ["2m_temperature"])
  np.testing.assert_allclose(state[2, 6],
                             expected["2m_temperature"][0].reshape(-1),
                             rtol=1e-6)


def test_hourly_store_subsampled_equals_six_hourly(stores):
  six_hourly, expected = _read_all(stores["v2"])
  hourly, state = _read_all(stores["hourly"], time_step_hours=6)
  assert hourly.time_stride == 6
  np.testing.assert_array_equal(hourly.times, six_hourly.times)
  # Equal but for float32 rounding of the generator's blocked matmul.
  np.testing.assert_allclose(state, expected, rtol=1e-5, atol=1e-12)


def test_level_subset_and_order_and_extra_variables(stores):
  store = store_formats.open_store(stores["v2"], ["temperature"], [1000, 500])
  full = store_formats.open_store(stores["v2"], ["temperature"], LEVELS)
  np.testing.assert_array_equal(store.read_state([1])[:, 0],
                                full.read_state([1])[:, 2])
  np.testing.assert_array_equal(store.read_state([1])[:, 1],
                                full.read_state([1])[:, 0])


def test_resolution_check(stores):
  store_formats.open_store(stores["v2"], VARIABLES, LEVELS, resolution=5.625)
  with pytest.raises(ValueError, match="grid spacing 5.625 x 5.625.*1"):
    store_formats.open_store(stores["v2"], VARIABLES, LEVELS, resolution=1.0)


def test_missing_store():
  with pytest.raises(ValueError, match="Store not found: /nonexistent"):
    store_formats.open_store("/nonexistent.zarr", VARIABLES, LEVELS)


def test_missing_variable_is_named(stores):
  with pytest.raises(ValueError, match=r"lacks variable\(s\) \['vertical_velo"
                     r"city'\]; it has \['2m_temperature', 'geopotential'"):
    store_formats.open_store(stores["v2"], ["vertical_velocity"], LEVELS)


def test_missing_level_is_named(stores):
  with pytest.raises(ValueError, match=r"Level\(s\) \[700\] hPa not in"):
    store_formats.open_store(stores["v2"], VARIABLES, (500, 700))


def _custom_store(path, times, dims=("time", "level", "latitude", "longitude")):
  """A minimal store (temperature + statics) with the given times and dims."""
  latitude, longitude = synthetic.store_coordinates(45.0)
  shape = {"time": len(times), "level": 1, "latitude": latitude.size,
           "longitude": longitude.size}
  coords = {"time": pd.DatetimeIndex(times).values, "level": [500],
            "latitude": latitude, "longitude": longitude}
  dataset = xr.Dataset(
      {"temperature": (dims, np.zeros([shape.get(d, 2) for d in dims],
                                      np.float32)),
       "geopotential_at_surface": (("latitude", "longitude"),
                                   np.zeros((latitude.size, longitude.size))),
       "land_sea_mask": (("latitude", "longitude"),
                         np.zeros((latitude.size, longitude.size)))},
      coords={k: v for k, v in coords.items()})
  dataset.to_zarr(path, mode="w", zarr_format=2)
  return str(path)


def test_wrong_dims_are_named(tmp_path):
  path = _custom_store(tmp_path / "dims.zarr",
                       pd.date_range("2020-01-01", periods=4, freq="6h"),
                       dims=("time", "latitude", "longitude"))
  with pytest.raises(ValueError, match=r"'temperature' .* has dims \('time', "
                     r"'latitude', 'longitude'\); expected \('time', 'level', 'latitude', "
                     r"'longitude'\) in any order"):
    store_formats.open_store(path, ["temperature"], [500])


@pytest.mark.parametrize("times, problem", [
    (["2020-01-01T00", "2020-01-01T06", "2020-01-01T18"],
     "are not evenly spaced: every 6 h up to 2020-01-01 06:00:00, then 2020-01-01 18:00:00 "
     "(12 h later)"),
    (["2020-01-01T00", "2020-01-01T06", "2020-01-01T06", "2020-01-01T12"],
     "are not in order: 2020-01-01 06:00:00 (position 2) is there twice"),
    (["2020-01-01T00", "2020-01-01T12", "2020-01-01T06", "2020-01-01T18"],
     "are not in order: 2020-01-01 06:00:00 (position 2) comes after 2020-01-01 12:00:00"),
], ids=["uneven", "duplicate", "unsorted"])
def test_times_out_of_order_name_the_first_bad_one(tmp_path, times, problem):
  path = _custom_store(tmp_path / "times.zarr", pd.to_datetime(times))
  with pytest.raises(UserError, match=f"^Times of {path} {re.escape(problem)}"):
    store_formats.open_store(path, ["temperature"], [500])


def test_too_coarse_time_step(tmp_path):
  path = _custom_store(tmp_path / "coarse.zarr",
                       pd.date_range("2020-01-01", periods=4, freq="12h"))
  with pytest.raises(ValueError, match="time step of 12 h, which does not "
                     "divide time_step_hours=6"):
    store_formats.open_store(path, ["temperature"], [500])


@pytest.fixture()
def nan_store(tmp_path):
  path = synthetic.write_synthetic_store(
      str(tmp_path / "nan.zarr"), start="2020-01-01", end="2020-01-01",
      levels=LEVELS, variables=["temperature"])
  array = zarr.open_array(f"{path}/temperature", mode="r+")
  array[2, 1, 4, 5] = np.nan
  return path


def test_nan_raises_naming_variable_and_time(nan_store):
  store = store_formats.open_store(nan_store, ["temperature"], LEVELS)
  store.read_state([0, 1])
  with pytest.raises(ValueError, match=r"NaN in variable 'temperature@850' "
                     r"at time 2020-01-01T12.*fill_nan=True"):
    store.read_state([1, 2])


def test_a_nan_in_the_time_range_stops_the_source_as_it_opens(tmp_path):
  path = synthetic.write_synthetic_store(
      str(tmp_path / "nan.zarr"), start="2020-01-01", end="2020-01-03", levels=LEVELS,
      variables=["temperature"])
  zarr.open_array(f"{path}/temperature", mode="r+")[9, 1, 4, 5] = np.nan  # 2020-01-03T06
  stats = normalization.load_or_compute_stats(path, ["temperature"], LEVELS)  # every time
  first, last = normalization.nan_hours(stats, ["temperature"], LEVELS)
  hour = (np.datetime64("2020-01-03T06") - np.datetime64(0, "h")) / np.timedelta64(1, "h")
  assert np.isnan(first[[0, 2]]).all() and first[1] == last[1] == hour
  with pytest.raises(UserError, match=r"'temperature@850' at time 2020-01-03T06.*"
                     r"data.fill_nan=True"):
    _temperature_source(path, train_start="2020-01-02", train_end="2020-01-03")
  # Outside the range the NaN is never read: the source opens.
  _temperature_source(path, train_start="2020-01-01", train_end="2020-01-02")


def _temperature_source(path, **data):
  """The source of the train split of `path`'s temperature (by default all its times)."""
  data = dict(train_start="", train_end="") | data
  return pipeline.make_source(data_spec(path=path, variables=("temperature",),
                                        pressure_levels=LEVELS, **data), "train")


def test_fill_nan_uses_the_channel_mean(nan_store):
  source = _temperature_source(nan_store, fill_nan=True)
  store = source.store
  np.testing.assert_array_equal(store.fill["temperature"], source.normalization.mean)
  state = store.read_state([2])
  # Row 4 from the north of 32 is row 27 from the south.
  assert state[0, 1, 27 * 64 + 5] == store.fill["temperature"][1]
  assert 250 < store.fill["temperature"][1] < 300
  assert np.isfinite(state).all()


def test_point_store_in_its_own_order_with_voronoi_areas(tmp_path):
  """A `values` store without cell areas: its points in its order, their Voronoi cells'
  areas, its data as stored (any dimension order); `resolution` is not asked."""
  grid = named_grid("H4")  # 192 points
  order = np.random.default_rng(0).permutation(grid.size)
  latitude, longitude = grid.latitude[order], grid.longitude[order]
  times = pd.date_range("2020-01-01", periods=4, freq="6h")
  temperature = np.random.default_rng(1).standard_normal((4, grid.size, 1)).astype(np.float32)
  mask = (latitude > 0).astype(np.float32)
  dataset = xr.Dataset(
      {"temperature": (("time", "values", "level"), temperature),
       "geopotential_at_surface": (("values",), np.zeros(grid.size, np.float32)),
       "land_sea_mask": (("values",), mask)},
      coords={"time": times.values, "level": [500], "latitude": (("values",), latitude),
              "longitude": (("values",), longitude)})
  path = str(tmp_path / "points.zarr")
  dataset.to_zarr(path, zarr_format=2)
  store = store_formats.open_store(path, ["temperature"], [500], resolution=1.0)
  assert store.points.name == "192 points" and store.num_grid_nodes == 192
  np.testing.assert_array_equal(store.points.latitude, latitude)
  np.testing.assert_allclose(store.points.area, 1.0, rtol=0.05)  # HEALPix: equal areas
  np.testing.assert_array_equal(store.read_state([2])[0, 0], temperature[2, :, 0])
  np.testing.assert_array_equal(store.read_statics()[1], mask)
  assert store.forcings_at([1], ["day_progress_sin"]).shape == (1, 1, 192)
  # Latitude along another dimension: not a point store's.
  dataset.assign_coords(latitude=(("level",), [0.0])).to_zarr(
      str(tmp_path / "bad.zarr"), zarr_format=2)
  with pytest.raises(UserError, match=r"'values' dimension but its 'latitude' is not one "
                     r"value per point along it \(dims: \('level',\)\)"):
    store_formats.open_store(str(tmp_path / "bad.zarr"), ["temperature"], [500])
