"""WeatherBench2 stores as published: the same weather in each published layout gives the
same batches, and GraphCast's published statistics files load.

The stores here are written directly with xarray in each layout (not through wnscale's
synthetic writer), with the real stores' dtypes: `time` datetime64, `level` int64,
latitude/longitude float64, zarr v2 with consolidated metadata (v3 for one):
  * `wb2_64x32`: WB2's low-resolution regridded stores, e.g.
    `1959-2023_01_10-6h-64x32_equiangular_conservative.zarr`: `(time, level, longitude,
    latitude)`, latitude ascending, no pole rows, several time steps per chunk;
  * `era5_0p25_like`: ERA5 / WB2's 0.25 and 1 deg stores: `(time, level, latitude,
    longitude)`, latitude descending, one time step per chunk;
  * `latitude_ascending_v3`: `(time, level, latitude, longitude)`, latitude ascending,
    as GraphCast's example files, in zarr v3;
  * `mixed`: each variable (and static) in its own dimension order.
And `wb2_240x121`: WB2's 1.5 deg store, longitude-major with both pole rows.
"""

import os

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from problems import data_spec

from wnscale.data import pipeline
from wnscale.data.reading import normalization
from wnscale.data.reading import store_formats

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
GRAPHCAST_STATS = os.path.join(FIXTURES, "graphcast_5p625", "stats")
VARIABLES = ("temperature", "geopotential", "2m_temperature", "mean_sea_level_pressure")
STORE_LEVELS = np.array([50, 500, 850, 1000], np.int64)
LEVELS = (850, 500)  # a subset, out of store order
TIMES = pd.date_range("2020-01-01", periods=14, freq="6h").values  # datetime64[ns]
LAT_LON = ("latitude", "longitude")
LON_LAT = ("longitude", "latitude")


def _weather(num_lat: int, num_lon: int, include_poles: bool):
  """Random fields `{name: [time, (level,) lat, lon]}`, latitude ascending, and coordinates."""
  if include_poles:
    latitude = np.linspace(-90.0, 90.0, num_lat)
  else:
    spacing = 180.0 / num_lat
    latitude = np.linspace(-90.0 + spacing / 2, 90.0 - spacing / 2, num_lat)
  longitude = np.arange(num_lon) * (360.0 / num_lon)
  rng = np.random.default_rng(num_lat)
  fields = {}
  for name in VARIABLES:
    level_shape = (len(STORE_LEVELS),) if name in ("temperature", "geopotential") else ()
    scale = 1e4 if "geopotential" in name or "pressure" in name else 10.0
    fields[name] = (scale * (1 + rng.standard_normal((len(TIMES),) + level_shape +
                                                     (num_lat, num_lon)))).astype(np.float32)
  fields["geopotential_at_surface"] = rng.uniform(0, 3e4, (num_lat, num_lon)).astype(np.float32)
  fields["land_sea_mask"] = (rng.uniform(size=(num_lat, num_lon)) > 0.7).astype(np.float32)
  return fields, latitude, longitude


def _write(path, fields, latitude, longitude, *, grid_dims, descending=False, time_chunk=1,
           zarr_format=2):
  """Writes `fields` with xarray; `grid_dims(name)` is each variable's grid dims order."""
  if descending:
    latitude = latitude[::-1]
    fields = {name: value[..., ::-1, :] for name, value in fields.items()}
  data, encoding = {}, {}
  for name, value in fields.items():
    if value.ndim == 2:
      dims = LAT_LON
    else:
      dims = ("time", "level", *LAT_LON) if value.ndim == 4 else ("time", *LAT_LON)
    array = xr.DataArray(value, dims=dims).transpose(*dims[:-2], *grid_dims(name))
    data[name] = array
    encoding[name] = {"chunks": tuple(min(time_chunk, len(TIMES)) if dim == "time" else size
                                      for dim, size in zip(array.dims, array.shape))}
  dataset = xr.Dataset(data, coords={"time": TIMES, "level": STORE_LEVELS,
                                     "latitude": latitude, "longitude": longitude})
  dataset.to_zarr(path, mode="w", zarr_format=zarr_format, consolidated=zarr_format == 2,
                  encoding=encoding)
  return str(path)


@pytest.fixture(scope="module")
def weather():
  return _weather(32, 64, include_poles=False)


@pytest.fixture(scope="module")
def stores(tmp_path_factory, weather):
  fields, latitude, longitude = weather
  root = tmp_path_factory.mktemp("layouts")
  orders = iter([LON_LAT, LAT_LON] * 4)
  mixed = {name: next(orders) for name in fields}
  assert set(mixed.values()) == {LAT_LON, LON_LAT}
  return {
      "wb2_64x32": _write(root / "wb2.zarr", fields, latitude, longitude,
                          grid_dims=lambda name: LON_LAT, time_chunk=4),
      "era5_0p25_like": _write(root / "era5.zarr", fields, latitude, longitude,
                               grid_dims=lambda name: LAT_LON, descending=True),
      "latitude_ascending_v3": _write(root / "v3.zarr", fields, latitude, longitude,
                                      grid_dims=lambda name: LAT_LON, time_chunk=3,
                                      zarr_format=3),
      "mixed": _write(root / "mixed.zarr", fields, latitude, longitude,
                      grid_dims=mixed.get, descending=True, time_chunk=5),
  }


def test_fixtures_have_the_published_layouts(stores):
  wb2 = xr.open_zarr(stores["wb2_64x32"], chunks=None)
  assert wb2["temperature"].dims == ("time", "level", "longitude", "latitude")
  assert wb2["2m_temperature"].dims == ("time", "longitude", "latitude")
  assert wb2["land_sea_mask"].dims == ("longitude", "latitude")
  assert wb2["temperature"].encoding["chunks"][0] == 4
  assert np.all(np.diff(wb2["latitude"].values) > 0)
  assert wb2["time"].dtype == "datetime64[ns]" and wb2["level"].dtype == np.int64
  assert wb2["latitude"].dtype == wb2["longitude"].dtype == np.float64
  assert os.path.exists(os.path.join(stores["wb2_64x32"], ".zmetadata"))
  era5 = xr.open_zarr(stores["era5_0p25_like"], chunks=None)
  assert era5["temperature"].dims == ("time", "level", "latitude", "longitude")
  assert np.all(np.diff(era5["latitude"].values) < 0)
  assert os.path.exists(os.path.join(stores["latitude_ascending_v3"], "zarr.json"))


def test_state_in_every_layout_is_the_weather(stores, weather):
  """Channel c, node i * num_lon + j is (variable, level) at (lat[i] ascending, lon[j])."""
  fields, _, _ = weather
  level = list(STORE_LEVELS).index(500)
  for name, path in stores.items():
    store = store_formats.open_store(path, VARIABLES, LEVELS)
    state = store.read_state([3, 4, 9])
    np.testing.assert_array_equal(state[0, 1], fields["temperature"][3, level].reshape(-1),
                                  err_msg=name)
    np.testing.assert_array_equal(state[2, 4], fields["2m_temperature"][9].reshape(-1),
                                  err_msg=name)
    np.testing.assert_array_equal(
        store.read_statics(),
        np.stack([fields["geopotential_at_surface"].reshape(-1),
                  fields["land_sea_mask"].reshape(-1)]), err_msg=name)


def test_every_layout_gives_the_same_batches(stores):
  """The same shuffled batches, normalized with the same statistics, in and out of a
  sharded layout's grid order."""
  stats = normalization.load_or_compute_stats(stores["era5_0p25_like"], VARIABLES, LEVELS)
  slots = np.concatenate([np.random.default_rng(1).permutation(32 * 64), [-1, -1]])
  batches = {}
  for name, path in stores.items():
    data = _data_config(path)
    source = pipeline.make_source(data, "train",
                                  norm=normalization.Normalization.from_stats(data, stats))
    for grid_slots in (None, slots):
      train = pipeline.make_pipeline(data, "train", batch_size=3, seed=5, process_index=0,
                                     process_count=1, source=source.in_layout(grid_slots))
      batches[name, grid_slots is None] = [next(train.iterator) for _ in range(4)]
    own = normalization.load_or_compute_stats(path, VARIABLES, LEVELS)
    for variable in VARIABLES:  # summed in the same order: equal to rounding
      np.testing.assert_allclose(own[variable].values, stats[variable].values, rtol=1e-6)
  expected = batches["era5_0p25_like", True]
  for (name, natural), got in batches.items():
    reference = expected if natural else batches["era5_0p25_like", False]
    for a, b in zip(got, reference):
      for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=f"{name} {key}")
  assert expected[0]["inputs"].shape == (3, 2, 2 + 2 + 1 + 1, 32 * 64)


def _data_config(path, **overrides):
  return data_spec(path=path, variables=VARIABLES, pressure_levels=LEVELS, train_start="",
                   train_end="", **overrides)


def test_wb2_240x121_store_with_pole_rows(tmp_path):
  fields, latitude, longitude = _weather(121, 240, include_poles=True)
  path = _write(tmp_path / "wb2_240x121.zarr", fields, latitude, longitude,
                grid_dims=lambda name: LON_LAT, time_chunk=6)
  store = store_formats.open_store(path, VARIABLES, LEVELS, resolution=1.5)
  assert store.points.latitude[0] == -90 and store.points.latitude[-1] == 90
  state = store.read_state([7])
  np.testing.assert_array_equal(state[0, 0], fields["temperature"][7, 2].reshape(-1))
  np.testing.assert_array_equal(state[0, 4], fields["2m_temperature"][7].reshape(-1))


def test_graphcast_published_statistics(tmp_path):
  """GraphCast's three files: variables by name, levels by value out of 37, statics scalar."""
  stats = normalization.read_stats(GRAPHCAST_STATS)
  mean = xr.load_dataset(os.path.join(GRAPHCAST_STATS, "mean_by_level.nc"))
  std = xr.load_dataset(os.path.join(GRAPHCAST_STATS, "stddev_by_level.nc"))
  diffs = xr.load_dataset(os.path.join(GRAPHCAST_STATS, "diffs_stddev_by_level.nc"))
  assert mean.sizes["level"] == 37 and "year_progress_sin" in mean  # names we do not use
  channel = normalization.channel_stats(stats, ["2m_temperature", "temperature"], [850, 500])
  np.testing.assert_array_equal(
      channel["mean"], np.float32([mean["2m_temperature"], *mean["temperature"].sel(
          level=[850, 500]).values]))
  np.testing.assert_array_equal(channel["std"][1], np.float32(std["temperature"].sel(level=850)))
  np.testing.assert_array_equal(channel["diff_std"][2],
                                np.float32(diffs["temperature"].sel(level=500)))
  statics = normalization.static_stats(stats)
  np.testing.assert_array_equal(statics["mean"],
                                np.float32([mean["geopotential_at_surface"],
                                            mean["land_sea_mask"]]))
  with pytest.raises(ValueError, match=r"no level\(s\) \[501\] for 'temperature'"):
    normalization.channel_stats(stats, ["temperature"], [501])


def test_stats_path_feeds_the_source(stores):
  """`data.stats_path` replaces computed statistics (train and eval alike)."""
  data = _data_config(stores["wb2_64x32"], stats_path=GRAPHCAST_STATS,
                      eval_start="2020-01-03", eval_end="")
  for split in ("train", "eval"):
    source = pipeline.make_source(data, split)
    mean = xr.load_dataset(os.path.join(GRAPHCAST_STATS, "mean_by_level.nc"))
    assert source.normalization.mean[0] == np.float32(mean["temperature"].sel(level=850))


def test_bad_stats_path_is_named(tmp_path):
  with pytest.raises(ValueError, match="Statistics not found: .*nothing.nc"):
    normalization.read_stats(str(tmp_path / "nothing.nc"))
  (tmp_path / "partial").mkdir()
  for name in ("mean_by_level.nc", "stddev_by_level.nc"):
    (tmp_path / "partial" / name).write_bytes(
        open(os.path.join(GRAPHCAST_STATS, name), "rb").read())
  with pytest.raises(ValueError, match="has mean_by_level.nc but no diffs_stddev_by_level.nc"):
    normalization.read_stats(str(tmp_path / "partial"))
