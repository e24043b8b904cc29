"""Normalization statistics and the example source."""

import os
import pickle

import numpy as np
import pytest
import xarray as xr
from problems import data_spec

from wnscale.data import forcings
from wnscale.data import pipeline
from wnscale.data.making import synthetic
from wnscale.data.reading import normalization
from wnscale.graphs.points import PointSet

LEVELS = (500, 850, 1000)
VARIABLES = ("temperature", "u_component_of_wind", "2m_temperature",
             "total_precipitation_6hr")


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("source") / "era.zarr")
  return synthetic.write_synthetic_store(path, start="2020-01-01",
                                         end="2020-01-03", levels=LEVELS)


def _stats(store_path, start=None, end=None):
  return normalization.load_or_compute_stats(store_path, VARIABLES, LEVELS, start, end)


def test_stats_match_numpy_and_are_computed_once(store_path, monkeypatch):
  stats_file = normalization.cached_stats_path(store_path, VARIABLES, LEVELS, None, None)
  assert not os.path.exists(stats_file)
  stats = _stats(store_path)
  assert os.path.exists(stats_file) and "/stats/era.zarr-" in stats_file
  assert not os.path.exists(store_path + ".stats.nc")  # nothing written beside the store
  temperature = xr.open_zarr(store_path, chunks=None)["temperature"].values
  np.testing.assert_allclose(stats["temperature"].sel(statistic="mean"),
                             temperature.mean(axis=(0, 2, 3)), rtol=1e-6)
  np.testing.assert_allclose(stats["temperature"].sel(statistic="std"),
                             temperature.std(axis=(0, 2, 3)), rtol=1e-4)
  diffs = temperature[1:] - temperature[:-1]
  np.testing.assert_allclose(stats["temperature"].sel(statistic="diff_std"),
                             diffs.std(axis=(0, 2, 3)), rtol=1e-4)
  # Second call reads the file: computing again would fail here.
  monkeypatch.setattr(normalization, "compute_stats", None)
  again = _stats(store_path)
  xr.testing.assert_allclose(stats, again)


def test_stats_cover_only_their_time_range(store_path):
  """The statistics of a training range ignore the times outside it (e.g. held-out days)."""
  stats = _stats(store_path, "2020-01-01", "2020-01-02")
  other = _stats(store_path, "2020-01-03", "2020-01-03")
  temperature = xr.open_zarr(store_path, chunks=None)["temperature"].sel(
      time=slice("2020-01-01", "2020-01-02")).values
  assert temperature.shape[0] == 8
  np.testing.assert_allclose(stats["temperature"].sel(statistic="mean"),
                             temperature.mean(axis=(0, 2, 3)), rtol=1e-6)
  np.testing.assert_allclose(stats["temperature"].sel(statistic="diff_std"),
                             (temperature[1:] - temperature[:-1]).std(axis=(0, 2, 3)),
                             rtol=1e-4)
  assert not np.allclose(stats["temperature"].values, other["temperature"].values)
  assert stats.attrs["last_time"].startswith("2020-01-02T18")


def test_channel_stats_layout_and_floor(store_path):
  stats = _stats(store_path)
  channel = normalization.channel_stats(stats, ["2m_temperature",
                                                "temperature"], [850, 500])
  assert set(channel) == {"mean", "std", "diff_std"}
  assert channel["mean"].shape == (3,) and channel["mean"].dtype == np.float32
  np.testing.assert_allclose(
      channel["mean"][1:], stats["temperature"].sel(statistic="mean",
                                                    level=[850, 500]))
  assert (channel["diff_std"] > 0).all()
  np.testing.assert_allclose(
      normalization.floor_std(np.array([0.0, 0.0, 2.0]),
                              np.array([0.0, 300.0, 300.0])),
      [1e-12, 3e-4, 2.0])
  with pytest.raises(ValueError, match="no variable 'foo'"):
    normalization.channel_stats(stats, ["foo"], [])
  statics = normalization.static_stats(stats)
  assert statics["mean"].shape == (2,)


def _source(store_path, **data):
  """The source of the train split of `data`, by default the whole store and `VARIABLES`."""
  data = dict(variables=VARIABLES, train_start="", train_end="") | data
  return pipeline.make_source(data_spec(path=store_path, pressure_levels=LEVELS, **data),
                              "train")


@pytest.fixture(scope="module")
def source(store_path):
  return _source(store_path, input_steps=2, target_steps=2)


def test_example_shapes(source):
  example = source[0]
  grid, channels = 32 * 64, 3 + 3 + 1 + 1
  assert {k: v.shape for k, v in example.items()} == {
      "inputs": (2, channels, grid),
      "targets": (2, channels, grid),
      "forcings": (4, 5, grid),
      "statics": (2, grid),
  }
  assert all(v.dtype == np.float32 for v in example.values())


def test_example_values_match_xarray(source, store_path):
  index = 5
  dataset = xr.open_zarr(store_path, chunks=None).sortby("latitude")
  window = dataset.isel(time=slice(index, index + 4))
  columns = []
  for name in VARIABLES:
    values = window[name]
    if "level" in values.dims:
      values = values.sel(level=list(LEVELS)).transpose("time", "level", "latitude",
                                                         "longitude")
    else:
      values = values.expand_dims("level", axis=1)
    columns.append(values.values.reshape(4, -1, 32 * 64))
  state = np.concatenate(columns, axis=1)
  stats = source.normalization.channel_stats
  expected = (state - stats["mean"][:, None]) / stats["std"][:, None]
  example = source[index]
  np.testing.assert_allclose(example["inputs"], expected[:2], rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(example["targets"], expected[2:], rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_array_equal(
      example["forcings"],
      forcings.compute_forcings(window["time"].values,
                                PointSet.regular(dataset["latitude"].values,
                                                 dataset["longitude"].values)))
  np.testing.assert_array_equal(example["statics"][1],
                                dataset["land_sea_mask"].values.reshape(-1))
  geopotential = dataset["geopotential_at_surface"].values.reshape(-1)
  statics = normalization.static_stats(source.normalization.stats)
  np.testing.assert_allclose(example["statics"][0] * statics["std"][0] + statics["mean"][0],
                             geopotential, rtol=1e-5, atol=1e-2)


def test_examples_past_the_end_are_not_produced(source):
  assert len(source) == 12 - 4 + 1
  last = source.example_times(len(source) - 1)
  assert last[-1] == source.store.times[-1]
  with pytest.raises(IndexError):
    source[len(source)]


def test_time_range_selects_examples(store_path):
  ranged = _source(store_path, train_start="2020-01-02", train_end="2020-01-02")
  assert len(ranged) == 4 - 3 + 1
  assert ranged.example_times(0)[0] == np.datetime64("2020-01-02T00")
  assert ranged.example_times(1)[-1] == np.datetime64("2020-01-02T18")


def test_too_few_times_for_one_example(store_path):
  with pytest.raises(ValueError, match=r"has 2 time\(s\) at 6 h; one example "
                     r"needs 3 \(2 input \+ 1 target\)"):
    _source(store_path, train_start="2020-01-03T06", train_end="2020-01-03T12")


def test_source_pickles_with_a_stable_repr(source):
  clone = pickle.loads(pickle.dumps(source))
  assert repr(clone) == repr(source)
  assert "0x" not in repr(source)
  np.testing.assert_array_equal(clone[3]["targets"], source[3]["targets"])


def test_grid_slots_reorder_and_pad_every_array(source, store_path):
  """Examples read straight into a sharded layout's slots equal the reordered examples."""
  rng = np.random.default_rng(0)
  slots = np.concatenate([rng.permutation(32 * 64), [-1, -1, -1]])
  rng.shuffle(slots)
  slotted = source.in_layout(slots)
  # The WB2 layout: the gather also flips latitude.
  assert np.diff(xr.open_zarr(store_path)["latitude"].values)[0] < 0
  natural, example = source[4], slotted[4]
  for key, value in natural.items():
    expected = value[..., np.maximum(slots, 0)]
    expected[..., slots < 0] = 0
    assert example[key].shape == value.shape[:-1] + (len(slots),)
    np.testing.assert_array_equal(example[key], expected, err_msg=key)


def test_graphcast_data_contract(store_path):
  """Target-only variables, solar radiation read from the store, every input normalized:
  GraphCast's `InputsAndResiduals`, with statistics computed from the store (forcings
  included) as well as read."""
  state = VARIABLES[:-1]
  source = _source(store_path, variables=state, target_only_variables=VARIABLES[-1:],
                   stored_forcings=("toa_incident_solar_radiation",),
                   input_normalization="all", input_steps=2, target_steps=2)
  stats = normalization.load_or_compute_stats(
      store_path, VARIABLES, LEVELS, forcings=source.forcings,
      stored_forcings=source.stored_forcings)
  assert stats["toa_incident_solar_radiation"].sel(statistic="mean") > 1e5  # J m^-2
  example = source[2]
  dataset = xr.open_zarr(store_path, chunks=None).sortby("latitude")
  window = dataset.sel(time=source.example_times(2))
  num_state = 3 + 3 + 1
  assert example["inputs"].shape == (2, num_state, 32 * 64)
  assert example["targets"].shape == (2, num_state + 1, 32 * 64)  # precipitation last

  def normalized(name, values):
    column = stats[name]
    return (values - float(column.sel(statistic="mean"))) / float(column.sel(statistic="std"))

  rain = window["total_precipitation_6hr"].values[2:].reshape(2, -1)
  np.testing.assert_allclose(example["targets"][:, -1], normalized("total_precipitation_6hr",
                                                                   rain), rtol=1e-5, atol=1e-5)
  scale = source.normalization.residual_scale
  assert scale[-1] == 1.0 and scale[0] != 1.0
  # Forcings: the store's radiation, the computed progresses, all normalized.
  radiation = window["toa_incident_solar_radiation"].values.reshape(4, -1)
  np.testing.assert_allclose(example["forcings"][:, 0],
                             normalized("toa_incident_solar_radiation", radiation),
                             rtol=1e-5, atol=1e-5)
  progress = forcings.compute_forcings(
      window["time"].values,
      PointSet.regular(dataset["latitude"].values, dataset["longitude"].values),
      source.forcings[1:])
  for i, name in enumerate(source.forcings[1:]):
    np.testing.assert_allclose(example["forcings"][:, i + 1], normalized(name, progress[:, i]),
                               rtol=1e-5, atol=1e-5)
  mask = dataset["land_sea_mask"].values.reshape(-1)
  np.testing.assert_allclose(example["statics"][1], normalized("land_sea_mask", mask),
                             rtol=1e-5, atol=1e-5)
  # With "state" normalization the mask and the forcings enter as they are.
  plain = _source(store_path, variables=state)[2]
  np.testing.assert_array_equal(plain["statics"][1], mask)
  assert plain["forcings"].shape[1] == 5 and np.abs(plain["forcings"]).max() <= 1.04
