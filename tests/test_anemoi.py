"""anemoi-datasets stores (`wnscale.data.reading.anemoi`), read against anemoi-datasets' own
reading.

The stores under `fixtures/anemoi_*` were written by `anemoi-datasets create` itself
(`fixtures/anemoi_make.py`): long names from a netCDF source, ECMWF short names from a
GRIB source on a reduced Gaussian grid (O4), two ensemble members with a missing date, and
a netCDF source with one variable per pressure level (`temperature_500`, ...), which
anemoi-datasets records as surface fields (`levtype: sfc`) with the level in the name.
Beside each, `expected.npz` holds what anemoi-datasets' `open_dataset` read from it
(anemoi-datasets needs zarr < 3, so it is not a test dependency).
"""

import json
import os
import pickle
import shutil
import subprocess
import sys

import gcs
import numpy as np
import pytest
import zarr
from problems import data_spec
from tiny_runs import REPO, process_env, read_metrics

from wnscale import paths
from wnscale.data import pipeline
from wnscale.data.reading import anemoi
from wnscale.data.reading import normalization
from wnscale.data.reading import store_formats
from wnscale.errors import ArgumentError, UserError

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
ATMOSPHERIC = ("temperature", "geopotential", "u_component_of_wind", "v_component_of_wind",
               "specific_humidity")
SURFACE = ("2m_temperature", "mean_sea_level_pressure", "10m_u_component_of_wind",
           "10m_v_component_of_wind")
STATICS = ("geopotential_at_surface", "land_sea_mask")
LEVELS = (500, 850, 1000)
# Each store's name of each catalogue variable (a levelled one: `{param}_{level}`).
LONG_NAMES = {name: name for name in ATMOSPHERIC + SURFACE + STATICS}
SHORT_NAMES = {"temperature": "t", "geopotential": "z", "u_component_of_wind": "u",
               "v_component_of_wind": "v", "specific_humidity": "q", "2m_temperature": "2t",
               "mean_sea_level_pressure": "msl", "10m_u_component_of_wind": "10u",
               "10m_v_component_of_wind": "10v", "geopotential_at_surface": "z",
               "land_sea_mask": "lsm"}
STORES = {"anemoi_netcdf": (LONG_NAMES, "sea_ice_cover"),
          "anemoi_grib": (SHORT_NAMES, "tcw"),
          "anemoi_members": (LONG_NAMES, "sea_ice_cover"),
          "anemoi_levels": (LONG_NAMES, "sea_ice_cover")}


def _store(name: str) -> str:
  return os.path.join(FIXTURES, name, "store.zarr")


def _expected(name: str) -> dict:
  with np.load(os.path.join(FIXTURES, name, "expected.npz")) as expected:
    return dict(expected)


def _check_store(store: anemoi.AnemoiStore, expected: dict, spelling: dict, unknown: str):
  """Everything `store` reads equals anemoi-datasets' reading in `expected`."""
  names = list(expected["variables"])
  present = expected["present"]
  data = expected["data"][:, :, store.member]  # [present dates, variables, values]
  np.testing.assert_array_equal(store.times, expected["dates"])
  np.testing.assert_array_equal(np.flatnonzero(store.missing), expected["missing"])
  np.testing.assert_array_equal(store.latitude, expected["latitudes"])
  np.testing.assert_array_equal(store.longitude, np.mod(expected["longitudes"], 360))
  assert store.longitude.min() >= 0 and store.longitude.max() < 360
  assert store.time_step_hours == 6.0
  assert sorted(store.atmospheric) == sorted(ATMOSPHERIC)
  assert sorted(store.surface) == sorted(SURFACE) and sorted(store.statics) == sorted(STATICS)
  assert store.unknown == {unknown: names.index(unknown)}
  for name in ATMOSPHERIC:
    assert store.atmospheric[name] == (LEVELS, tuple(
        names.index(f"{spelling[name]}_{level}") for level in LEVELS))
    columns = [names.index(f"{spelling[name]}_{level}") for level in LEVELS]
    view = store.view(name)
    assert view.shape == (len(store.times), len(LEVELS), store.num_values)
    np.testing.assert_array_equal(view.read().result()[present], data[:, columns])
    # Levels in the order asked for, e.g. a config's.
    np.testing.assert_array_equal(store.view(name, levels=(850, 500)).read().result()[present],
                                  data[:, columns[1::-1]])
  for name in SURFACE + (unknown,):
    view = store.view(name)
    assert view.shape == (len(store.times), store.num_values)
    np.testing.assert_array_equal(view.read().result()[present],
                                  data[:, names.index(spelling.get(name, name))])
  for name in STATICS:
    assert store.statics[name] == names.index(spelling[name])
    np.testing.assert_array_equal(store.view(name).read().result(),
                                  data[0, names.index(spelling[name])])


@pytest.mark.parametrize("name, member", [("anemoi_netcdf", 0), ("anemoi_grib", 0),
                                          ("anemoi_members", 0), ("anemoi_members", 1),
                                          ("anemoi_levels", 0)])
def test_reads_what_anemoi_datasets_reads(name, member):
  """Names mapped (long and short), levels ascending, statics by name, longitudes in
  [0, 360), each member's values as anemoi-datasets reads them, missing dates marked."""
  path = _store(name)
  assert anemoi.is_anemoi_store(path)
  store = anemoi.open_anemoi(path, member=member)
  expected = _expected(name)
  _check_store(store, expected, *STORES[name])
  assert store.field_shape == tuple(expected["field_shape"])
  assert (store.num_members, store.member) == (2 if name == "anemoi_members" else 1, member)


def test_missing_dates_and_members():
  store = anemoi.open_anemoi(_store("anemoi_members"), member=1)
  np.testing.assert_array_equal(store.times[store.missing],
                                [np.datetime64("2020-01-01T12:00", "ns")])
  assert np.isnan(store.view("temperature").read().result()[2]).all()  # never written
  other = anemoi.open_anemoi(_store("anemoi_members"), member=0)
  present = ~store.missing
  assert not np.array_equal(store.view("2m_temperature").read().result()[present],
                            other.view("2m_temperature").read().result()[present])
  grib = anemoi.open_anemoi(_store("anemoi_grib"))
  assert grib.resolution == "O4" and grib.field_shape == (208,) and not grib.missing.any()
  assert (grib.grid, store.grid) == ("O4, 208 points", "7 x 8, 56 points")
  # Whole through pickling, as into a data-loading worker process.
  copy = pickle.loads(pickle.dumps(store))
  assert copy.member == 1 and copy.atmospheric == store.atmospheric
  np.testing.assert_array_equal(copy.view("temperature", levels=(850,)).read().result()[present],
                                store.view("temperature", levels=(850,)).read().result()[present])
  # Not anemoi's layout: a WeatherBench2-style directory, a missing path.
  assert not anemoi.is_anemoi_store(os.path.join(FIXTURES, "graphcast_5p625"))
  assert not anemoi.is_anemoi_store(os.path.join(FIXTURES, "no_such_store.zarr"))


def test_statistics_in_wnscale_format():
  """mean / std / diff_std (the tendencies' stdev at the model's step) per variable and
  level, read by wnscale's own normalization functions in the config's channel order."""
  expected = _expected("anemoi_netcdf")
  names = list(expected["variables"])
  store = anemoi.open_anemoi(_store("anemoi_netcdf"))
  for step in (6, 12):
    stats = anemoi.anemoi_statistics(store, time_step_hours=step)
    assert stats.attrs["time_step_hours"] == step
    channels = normalization.channel_stats(stats, ["temperature", "2m_temperature"], (850, 500))
    columns = [names.index(n) for n in ("temperature_850", "temperature_500", "2m_temperature")]
    np.testing.assert_allclose(channels["mean"], expected["statistics_mean"][columns], rtol=1e-6)
    np.testing.assert_allclose(channels["std"], expected["statistics_stdev"][columns], rtol=1e-6)
    np.testing.assert_allclose(channels["diff_std"], expected[f"tendencies_{step}h_stdev"][columns],
                               rtol=1e-6)
  statics = normalization.static_stats(stats)
  static_columns = [names.index(name) for name in STATICS]
  np.testing.assert_allclose(statics["std"], expected["statistics_stdev"][static_columns],
                             rtol=1e-6)
  np.testing.assert_array_equal(stats["land_sea_mask"].sel(statistic="diff_std"),
                                stats["land_sea_mask"].sel(statistic="std"))
  assert stats["sea_ice_cover"].dims == ("statistic",)  # kept under its own name
  assert stats.attrs["first_time"] == "2020-01-01T00:00:00"
  # Short names map the same way (the store's default step: its frequency).
  grib_expected = _expected("anemoi_grib")
  grib = anemoi.anemoi_statistics(anemoi.open_anemoi(_store("anemoi_grib")))
  np.testing.assert_allclose(
      grib["geopotential"].sel(statistic="diff_std", level=500),
      grib_expected["tendencies_6h_stdev"][list(grib_expected["variables"]).index("z_500")])
  # A store without tendencies at the step: one line, naming what it has and what to do.
  with pytest.raises(UserError) as caught:
    anemoi.anemoi_statistics(anemoi.open_anemoi(_store("anemoi_members")))
  _one_line(caught, "has no tendency statistics over 6 h (it has: none)", "data.stats_path")
  with pytest.raises(UserError) as caught:
    anemoi.anemoi_statistics(store, time_step_hours=24)
  _one_line(caught, "over 24 h (it has: 6 h, 12 h)", "tendencies: ['1d']")


def _one_line(caught, *parts):
  message = str(caught.value)
  assert "\n" not in message, message
  for part in parts:
    assert part in message, message


def _broken_copy(tmp_path, change=None, remove=None) -> str:
  """A copy of the netCDF fixture with its attributes changed (`change(attributes)`) or a
  file removed (`remove`, a path inside the store)."""
  path = str(tmp_path / "broken.zarr")
  shutil.rmtree(path, ignore_errors=True)
  shutil.copytree(_store("anemoi_netcdf"), path)
  if change:
    with open(os.path.join(path, ".zattrs")) as file:
      attributes = json.load(file)
    change(attributes)
    with open(os.path.join(path, ".zattrs"), "w") as file:
      json.dump(attributes, file)
  if remove:
    target = os.path.join(path, remove)
    shutil.rmtree(target) if os.path.isdir(target) else os.remove(target)
  return path


def _set(key, value):
  return lambda attributes: attributes.__setitem__(key, value)


def _duplicate(attributes):
  attributes["variables"][attributes["variables"].index("10m_u_component_of_wind")] = "2t"


def _irregular_dates(path):
  dates = zarr.open_array(os.path.join(path, "dates"), mode="r+", zarr_format=2)
  values = dates[...]
  values[3] += np.timedelta64(1, "h")
  dates[...] = values


@pytest.mark.parametrize("change, remove, edit, problem", [
    (_set("variables", ["t_850"]), None, None,
     "attribute `variables` (1 names) does not name the 22 variables of `data` [6, 22, 1, 56]"),
    (_set("frequency", "often"), None, None, "attribute `frequency` 'often' is not a time step"),
    (_set("missing_dates", ["2021-01-01T00:00:00"]), None, None,
     "`missing_dates` ['2021-01-01T00:00:00'] are not among its `dates`"),
    (_set("field_shape", [7, 9]), None, None, "`field_shape` [7, 9] does not hold its 56 values"),
    (_duplicate, None, None, "variables '2t' and '2m_temperature' are both 2m_temperature"),
    (None, "latitudes", None, "cannot read its array `latitudes`"),
    (None, "data/.zarray", None, "cannot open its array `data`"),
    (None, ".zattrs", None, "is not an anemoi-datasets store: it has no .zattrs"),
    (None, None, _irregular_dates, "`dates` are not every 6h (its `frequency`)"),
])
def test_malformed_store_is_one_line(tmp_path, change, remove, edit, problem):
  path = _broken_copy(tmp_path, change, remove)
  if edit:
    edit(path)
  with pytest.raises(UserError) as caught:
    anemoi.open_anemoi(path)
  _one_line(caught, path, problem)


def _older(attributes):
  """Attributes as older anemoi-datasets wrote them: `frequency` in hours, no
  `variables_metadata`, no `field_shape`."""
  attributes["frequency"] = 6
  del attributes["variables_metadata"], attributes["field_shape"]


def _model_level(attributes):
  attributes["variables_metadata"]["temperature_850"]["mars"]["levtype"] = "ml"


def test_older_attributes_and_other_level_types(tmp_path):
  expected = _expected("anemoi_netcdf")
  store = anemoi.open_anemoi(_broken_copy(tmp_path, _older))
  assert store.time_step_hours == 6.0 and store.field_shape == (56,)
  _check_store(store, expected, *STORES["anemoi_netcdf"])
  # A levelled variable on model levels is not wnscale's: kept under its own name.
  store = anemoi.open_anemoi(_broken_copy(tmp_path, _model_level))
  names = list(expected["variables"])
  assert store.atmospheric["temperature"] == (
      (500, 1000), (names.index("temperature_500"), names.index("temperature_1000")))
  assert store.unknown == {"sea_ice_cover": names.index("sea_ice_cover"),
                           "temperature_850": names.index("temperature_850")}
  stats = anemoi.anemoi_statistics(store)
  assert np.isnan(stats["temperature"].sel(level=850)).all()
  np.testing.assert_allclose(stats["temperature"].sel(statistic="mean", level=500),
                             expected["statistics_mean"][names.index("temperature_500")])


def test_a_variable_per_level_recorded_as_a_surface_field_is_read_on_its_level():
  """The store anemoi-datasets' `create` made from a netCDF of `temperature_500`, ...: every
  such field has `levtype: sfc` and no `levelist`, yet the run's upper-air variables on
  their levels are read from it, with statistics, as from the store with a level dim."""
  path = _store("anemoi_levels")
  with open(os.path.join(path, ".zattrs")) as f:
    mars = json.load(f)["variables_metadata"]["temperature_500"]["mars"]
  assert mars["levtype"] == "sfc" and "levelist" not in mars  # as anemoi-datasets wrote it
  expected = _expected("anemoi_levels")
  names = list(expected["variables"])
  store = store_formats.open_store(path, ATMOSPHERIC + SURFACE, (850, 500))
  state = store.read_state([0, 1])
  assert state.shape == (2, 2 * len(ATMOSPHERIC) + len(SURFACE), 56)
  np.testing.assert_array_equal(  # temperature at 850 hPa, the second date
      np.sort(state[1, 0]), np.sort(expected["data"][1, names.index("temperature_850"), 0]))
  stats = anemoi.anemoi_statistics(anemoi.open_anemoi(path))
  np.testing.assert_allclose(stats["temperature"].sel(statistic="mean", level=500),
                             expected["statistics_mean"][names.index("temperature_500")])


def test_bad_requests_are_one_line(tmp_path):
  with pytest.raises(ArgumentError) as caught:
    anemoi.open_anemoi(_store("anemoi_members"), member=2)
  assert caught.value.argument == "member"
  _one_line(caught, "member=2: store", "has 2 ensemble member(s): choose one of 0 .. 1")
  with pytest.raises(UserError) as caught:
    anemoi.open_anemoi(str(tmp_path / "absent.zarr"))
  _one_line(caught, "Store not found:", "absent.zarr")
  store = anemoi.open_anemoi(_store("anemoi_grib"))
  with pytest.raises(UserError) as caught:
    store.view("vertical_velocity")
  _one_line(caught, "has no variable 'vertical_velocity'", "'tcw'", "data.variables")
  with pytest.raises(UserError) as caught:
    store.view("temperature", levels=(850, 700))
  _one_line(caught, "Level(s) [700] hPa of 'temperature' not in store",
            "it has [500, 850, 1000]")


def test_store_in_a_bucket():
  """The same reading from gs:// (tensorstore's gcs driver, zarr over gcsfs)."""
  local = _store("anemoi_grib")
  with gcs.emulator() as bucket:
    remote = paths.join(bucket, "grib.zarr")
    for directory, _, files in os.walk(local):
      for file in files:
        source = os.path.join(directory, file)
        paths.upload(source, paths.join(remote, os.path.relpath(source, local)))
    assert anemoi.is_anemoi_store(remote)
    store = anemoi.open_anemoi(remote)
    assert store.data.kvstore.spec().to_json()["driver"] == "gcs"
    _check_store(store, _expected("anemoi_grib"), *STORES["anemoi_grib"])
    stats = anemoi.anemoi_statistics(store)
    np.testing.assert_array_equal(
        stats["temperature"].values,
        anemoi.anemoi_statistics(anemoi.open_anemoi(local))["temperature"].values)


# --- the stores in training: `store_formats.open_store` finds the layout --------------------------


def _expected_fields(name: str, member: int, variables, levels) -> np.ndarray:
  """anemoi-datasets' reading of `variables` on `levels`: `[present dates, channels, values]`
  in wnscale's channel order (each atmospheric variable's levels, then the surface ones)."""
  expected = _expected(name)
  spelling = STORES[name][0]
  names = list(expected["variables"])
  columns = [names.index(f"{spelling[v]}_{level}" if v in ATMOSPHERIC else spelling[v])
             for v in variables for level in (levels if v in ATMOSPHERIC else [None])]
  return expected["data"][:, columns, member], expected


def test_open_store_reads_points_and_a_regular_grid_member_as_anemoi_does():
  """The O4 store as a point set (Voronoi areas); the 7 x 8 store, member 1, as a regular
  grid in internal order (latitude and longitude ascending: its longitudes start at -180),
  its missing date marked; both equal to anemoi-datasets' reading."""
  variables = ("temperature", "2m_temperature")
  points = store_formats.open_store(_store("anemoi_grib"), variables, (850, 500))
  assert points.points.field_shape is None and points.points.size == 208
  assert "O4" in points.points.name
  np.testing.assert_allclose(points.points.area.mean(), 1.0)
  fields, expected = _expected_fields("anemoi_grib", 0, variables, (850, 500))
  np.testing.assert_array_equal(points.read_state(np.arange(6)), fields)
  np.testing.assert_array_equal(points.points.latitude, expected["latitudes"])

  regular = store_formats.open_store(_store("anemoi_members"), variables, (500,), member=1)
  assert regular.points.field_shape == (7, 8)
  lat, lon = regular.points.latitude, regular.points.longitude
  assert np.all(np.diff(lat.reshape(7, 8)[:, 0]) > 0) and np.all(np.diff(lon[:8]) > 0)
  fields, expected = _expected_fields("anemoi_members", 1, variables, (500,))
  present = expected["present"]
  np.testing.assert_array_equal(np.flatnonzero(regular.missing), expected["missing"])
  # The store's value at each internal node: found by its coordinates.
  stored = {(a, b): i for i, (a, b) in enumerate(zip(expected["latitudes"],
                                                      np.mod(expected["longitudes"], 360)))}
  order = [stored[(a, b)] for a, b in zip(lat, lon)]
  np.testing.assert_array_equal(regular.read_state(present), fields[..., order])


def test_missing_dates_are_in_no_example_and_statistics_come_from_the_store():
  source = pipeline.make_source(data_spec(
      path=_store("anemoi_members"), variables=("temperature",), pressure_levels=(500,),
      member=1, train_start="2020-01-01", train_end="2020-01-02T06"), "train")
  missing = set(np.flatnonzero(source.store.missing))
  assert missing and len(source) == sum(
      not missing & set(range(s, s + source.window)) for s in range(6 - source.window + 1))
  for index in range(len(source)):
    assert not missing & set(source.time_indices(index).tolist())
    assert np.isfinite(source[index]["targets"]).all()
  # data.stats_path=STORE: the store's own, floored like computed ones.
  stats = normalization.read_stats(_store("anemoi_grib"), 6)
  raw = anemoi.anemoi_statistics(anemoi.open_anemoi(_store("anemoi_grib")), 6)
  table, raw_table = (normalization.channel_stats(s, ["temperature"], [850])
                      for s in (stats, raw))
  np.testing.assert_allclose(table["std"], normalization.floor_std(raw_table["std"],
                                                                   raw_table["mean"]))
  np.testing.assert_allclose(table["diff_std"], raw_table["diff_std"])


@pytest.mark.slow
def test_launch_train_on_an_anemoi_store_as_it_is(tmp_path):
  """`launch.train --config.data.path=STORE`, nothing else about the store: the members
  store (member 1; its missing date in no example), its grid and member in the log; and,
  at the same time, the store of one variable per level recorded as surface fields, read
  on its levels, with a read-only cache directory (a read-only tmpfs): one warning, and
  the run goes on."""
  from test_existing_data import tmpfs  # noqa: PLC0415

  def train(store, name, *extra, env):
    return subprocess.Popen(
        [sys.executable, "-m", "launch.train", "--platform=cpu", "--config=configs/tiny.py",
         f"--config.data.path={_store(store)}", *extra,
         "--config.data.train_start=2020-01-01", "--config.data.train_end=2020-01-02T06",
         "--config.data.eval_start=2020-01-01", "--config.data.eval_end=2020-01-02T06",
         "--config.train.steps=2", "--config.train.warmup_steps=1",
         "--config.train.eval_every=0", "--config.train.batch_size=1",
         "--config.model.mesh_levels=0", f"--workdir={tmp_path / name}"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

  with tmpfs(tmp_path / "cache", "1m", read_only=True) as cache_dir:
    started = [train("anemoi_members", "members", "--config.data.member=1", env=process_env()),
               train("anemoi_levels", "levels", env={**process_env(),
                                                     "WNSCALE_CACHE_DIR": cache_dir})]
    try:
      logs = [process.communicate(timeout=600)[1] for process in started]
    finally:
      for process in started:
        process.kill()
        process.wait(timeout=30)
  for process, log in zip(started, logs):
    assert process.returncode == 0, log[-3000:]
    assert "Run ended at step 2 of 2" in log
  members, levels = logs
  assert "anemoi-datasets layout, member 1 of 2" in members
  assert "grid regular 45 deg (7 x 8)" in members and "(1 examples)" in members
  assert levels.count(f"The cache directory {cache_dir} cannot be written (Read-only file "
                      "system)") == 1, levels[-3000:]
  for name in ("members", "levels"):
    losses = [m["loss"] for m in read_metrics(str(tmp_path / name)) if "loss" in m]
    assert losses and np.isfinite(losses).all()
