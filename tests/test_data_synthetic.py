"""Synthetic WB2-layout stores, the make_dataset entry point, and forcings."""

import os
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr

from wnscale import config as config_lib
from wnscale import paths
from wnscale import specs as specs_lib
from wnscale.data import forcings, run_data
from wnscale.data import variables
from wnscale.data.making import synthetic
from wnscale.data.reading import store_formats
from wnscale.graphs.points import PointSet, named_grid

LEVELS = (500, 850, 1000)


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("synthetic") / "era.zarr")
  return synthetic.write_synthetic_store(path, start="2020-01-01",
                                         end="2020-01-02", levels=LEVELS)


def test_store_has_weatherbench2_layout(store_path):
  dataset = xr.open_zarr(store_path, chunks=None)
  assert os.path.exists(os.path.join(store_path, ".zmetadata"))  # v2
  assert dict(dataset.sizes) == {"time": 8, "level": 3, "latitude": 32,
                                 "longitude": 64}
  assert set(synthetic.DEFAULT_VARIABLES) | set(variables.STATIC_VARIABLES) | set(
      synthetic.STORED_FORCINGS) == set(dataset.data_vars)
  # ERA5's solar radiation: J m^-2 over an hour, up to ~1361 W m^-2 x 3600 s x 1.034.
  radiation = dataset["toa_incident_solar_radiation"]
  assert radiation.dims == ("time", "latitude", "longitude")
  assert 0 <= float(radiation.min()) and 4e6 < float(radiation.max()) < 5.1e6
  assert dataset["temperature"].dims == ("time", "level", "latitude",
                                         "longitude")
  assert dataset["2m_temperature"].dims == ("time", "latitude", "longitude")
  assert dataset["land_sea_mask"].dims == ("latitude", "longitude")
  assert dataset["temperature"].encoding["chunks"] == (1, 3, 32, 64)
  latitude = dataset["latitude"].values
  np.testing.assert_allclose(latitude[[0, -1]], [87.1875, -87.1875])
  assert np.all(np.diff(latitude) < 0)
  np.testing.assert_allclose(dataset["longitude"].values[[0, -1]],
                             [0, 354.375])
  assert list(dataset["level"].values) == list(LEVELS)
  times = dataset["time"].values
  assert times[0] == np.datetime64("2020-01-01T00")
  assert np.all(np.diff(times) == np.timedelta64(6, "h"))
  assert np.isfinite(dataset["temperature"].values).all()


def test_magnitudes_are_weather_like(store_path):
  dataset = xr.open_zarr(store_path, chunks=None)
  temperature = dataset["temperature"].mean(["time", "latitude", "longitude"])
  assert 200 < temperature.sel(level=500) < temperature.sel(level=1000) < 300
  geopotential = dataset["geopotential"].mean(["time", "latitude", "longitude"])
  np.testing.assert_allclose(geopotential.sel(level=500) / 9.81, 5.5e3,
                             rtol=0.15)
  assert (dataset["specific_humidity"].values > 0).all()
  assert (dataset["total_precipitation_6hr"].values >= 0).all()
  mask = dataset["land_sea_mask"].values
  assert set(np.unique(mask)) == {0.0, 1.0}


def test_seed_determines_the_store(tmp_path, store_path):
  kwargs = dict(start="2020-01-01", end="2020-01-02", levels=LEVELS,
                variables=["temperature"])
  same = synthetic.write_synthetic_store(str(tmp_path / "a.zarr"), **kwargs)
  other = synthetic.write_synthetic_store(str(tmp_path / "b.zarr"), seed=1,
                                          **kwargs)
  reference = xr.open_zarr(store_path, chunks=None)["temperature"].values
  np.testing.assert_array_equal(
      xr.open_zarr(same, chunks=None)["temperature"].values, reference)
  assert not np.allclose(
      xr.open_zarr(other, chunks=None)["temperature"].values, reference)


def test_waves_move_so_the_next_state_is_predictable(store_path):
  # A travelling wave satisfies x(t+1) ~ 2 c x(t) - x(t-1); persistence alone
  # must be clearly worse than a linear two-step extrapolation.
  v = xr.open_zarr(store_path, chunks=None)["v_component_of_wind"].values
  persistence = np.abs(v[2:] - v[1:-1]).mean()
  extrapolation = np.abs(v[2:] - (2 * v[1:-1] - v[:-2])).mean()
  assert persistence > 0.1
  assert extrapolation < 0.5 * persistence


def test_grid_with_and_without_poles():
  latitude, longitude = synthetic.store_coordinates(1.0)
  assert (latitude.size, longitude.size) == (181, 360)
  assert latitude[0] == 90 and latitude[-1] == -90
  latitude, _ = synthetic.store_coordinates(5.625, include_poles=True)
  assert latitude.size == 33
  with pytest.raises(ValueError, match="does not divide 360"):
    synthetic.store_coordinates(7.0)


def _make_dataset(*flags):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return subprocess.run([sys.executable, "-m", "launch.make_dataset", *flags], check=True,
                        cwd=root, capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, PYTHONPATH=root))


def test_make_dataset_entry_point_writes_zarr3(tmp_path):
  out = tmp_path / "cli.zarr"
  _make_dataset(f"--out={out}", "--resolution=5.625", "--start=2020-01-01",
                "--end=2020-01-01", "--variables=temperature,2m_temperature",
                "--zarr_format=3")
  assert os.path.exists(out / "zarr.json")
  dataset = xr.open_zarr(out, chunks=None, consolidated=False)
  assert dict(dataset.sizes)["level"] == 13 and dataset.sizes["time"] == 4
  assert "2m_temperature" in dataset and "geopotential" not in dataset


def test_make_dataset_writes_what_a_config_trains_on_and_says_how_big(tmp_path):
  """`--config`: the config's variables, levels and time span, as the trainer's own synthetic
  store; the size before writing, progress to the last time, the size on disk at the end."""
  out = tmp_path / "tiny.zarr"
  result = _make_dataset("--config=configs/tiny.py", f"--out={out}",
                         "--config.data.train_start=2020-01-01",
                         "--config.data.train_end=2020-01-02",
                         "--config.data.eval_start=2020-01-03",
                         "--config.data.eval_end=2020-01-03")
  dataset = xr.open_zarr(out, chunks=None)
  data = config_lib.default_config().data
  assert sorted(dataset.data_vars) == sorted(
      (*data.variables, *data.stored_forcings, "land_sea_mask", "geopotential_at_surface"))
  assert list(dataset.level.values) == [500, 850] and dataset.sizes["time"] == 12
  bytes_per_time = 4 * 32 * 64 * (5 * 2 + 2 + len(data.stored_forcings))
  assert f"Writing {out}: 12 times, {bytes_per_time * 12 / 1e6:.1f} MB uncompressed" in (
      result.stderr)
  assert "times 12/12" in result.stderr
  on_disk = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
  assert result.stdout.strip() == f"wrote {out} ({on_disk / 1e6:.1f} MB on disk)"
  # The config's levels, with flags given replacing its grid, days and variables: on an
  # octahedral grid, WeatherBench2's layout with `values` for the grid, the points' own
  # areas, the grid named.
  points_out = tmp_path / "levels_o16.zarr"
  _make_dataset("--config=configs/tiny.py", f"--out={points_out}", "--start=2020-01-01",
                "--end=2020-01-01", "--variables=temperature", "--grid=O16")
  dataset = xr.open_zarr(points_out)
  assert list(dataset.level.values) == [500, 850]
  assert dataset.temperature.dims == ("time", "level", "values")
  assert dataset.land_sea_mask.dims == ("values",) and dataset.attrs["grid"] == "O16"
  opened = store_formats.open_store(str(points_out), ["temperature"], [850], resolution=5.625)
  o16 = named_grid("O16")
  assert opened.points.name == "O16 (1,600 points)" and opened.points.field_shape is None
  np.testing.assert_array_equal(opened.points.latitude, o16.latitude)
  np.testing.assert_allclose(opened.points.area, o16.area, rtol=1e-12)
  weather = synthetic.SyntheticWeather(o16, [850])
  np.testing.assert_array_equal(opened.read_state([3])[0, 0],
                                weather.fields(opened.times[3:4], ["temperature"])[
                                    "temperature"][0, 0])


def test_fields_on_points_are_the_regular_fields_there():
  """The same analytic functions, evaluated point by point: a regular grid's points as a
  list of points give its fields (to float32 rounding: the sums run in another order)."""
  regular = synthetic.store_points("", 5.625)
  listed = PointSet.from_points(regular.latitude, regular.longitude, regular.area)
  names = ["temperature", "geopotential", "2m_temperature", "toa_incident_solar_radiation",
           "sea_surface_temperature", "total_precipitation_6hr"]
  times = np.array(["2020-03-01T06", "2020-08-01T18"], "datetime64[s]")
  on_grid = synthetic.SyntheticWeather(regular, [500, 850], seed=2).fields(times, names)
  on_points = synthetic.SyntheticWeather(listed, [500, 850], seed=2).fields(times, names)
  for name in names:
    np.testing.assert_allclose(on_points[name], on_grid[name].reshape(on_points[name].shape),
                               rtol=1e-6, atol=1e-6 * np.nanmax(np.abs(on_grid[name])))


def test_forcings_shapes_and_ranges():
  latitude = np.array([-60.0, 0.0, 60.0])
  longitude = np.arange(0, 360, 90.0)
  times = np.array(["2020-06-21T12", "2020-12-21T00"], dtype="datetime64[ns]")
  out = forcings.compute_forcings(times, PointSet.regular(latitude, longitude))
  assert out.shape == (2, 5, 12) and out.dtype == np.float32
  out = np.moveaxis(out.reshape(2, 5, 3, 4), 1, -1)  # [time, lat, lon, channel]
  toa = out[..., 0]
  assert toa.min() >= 0 and toa.max() <= 1.04
  # June 21, 12 UTC: noon at lon 0; the northern point gets more sun.
  assert toa[0, 2, 0] > toa[0, 0, 0] > 0
  # Midnight at lon 180 at 12 UTC: dark everywhere there.
  np.testing.assert_allclose(toa[0, :, 2], 0, atol=1e-6)
  # Day progress: 12 UTC at lon 0 is half a day; at lon 90, 0.75.
  np.testing.assert_allclose(out[0, 0, :2, 2], [-1, 0], atol=1e-6)
  np.testing.assert_allclose(out[0, 0, 1, 1], -1, atol=1e-6)
  np.testing.assert_allclose(out[..., 3]**2 + out[..., 4]**2, 1, atol=1e-6)


def test_year_progress_counts_tropical_years_as_graphcast():
  """Year progress restarts every 365.24219 days from 1970 (a 365.25-day year would be
  0.39 days off after 50 years: sin ~ 6.7e-3 there instead of 0)."""
  seconds = np.round(np.array([0, 50, 50.25]) * 365.24219 * 86400)
  times = np.datetime64("1970-01-01T00:00:00", "s") + seconds.astype("timedelta64[s]")
  names = ("year_progress_sin", "year_progress_cos", "day_progress_sin")
  out = forcings.compute_forcings(times, PointSet.regular(np.zeros(1), np.zeros(1)), names)
  np.testing.assert_allclose(out[:, 0, 0], [0, 0, 1], atol=2e-5)
  np.testing.assert_allclose(out[:, 1, 0], [1, 1, 0], atol=2e-5)
  assert out.dtype == np.float32 and out.shape == (3, 3, 1)
  # Forcings given (e.g. read from a store) are taken as they are.
  given = forcings.compute_forcings(times, PointSet.regular(np.zeros(1), np.zeros(1)), names,
                                    given={"day_progress_sin": np.full((3, 1), 7.0)})
  np.testing.assert_array_equal(given[:, 2, 0], 7.0)
  np.testing.assert_array_equal(given[:, :2], out[:, :2])


def test_never_deletes_a_directory_that_is_not_a_store(tmp_path):
  (tmp_path / "notes.txt").write_text("keep me")
  with pytest.raises(ValueError, match="is not a dataset store \\(it holds notes.txt\\)"):
    synthetic.write_synthetic_store(str(tmp_path), end="2020-01-01", overwrite=True)
  assert (tmp_path / "notes.txt").exists()


def _tiny_config():
  config = config_lib.load(os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.py"))
  config.data.update(train_start="2020-01-01", train_end="2020-01-02",
                     eval_start="2020-01-03", eval_end="2020-01-03")
  return config


def test_synthetic_store_is_written_once_and_logged(tmp_path, monkeypatch, caplog):
  monkeypatch.setenv("WNSCALE_CACHE_DIR", str(tmp_path))
  config = _tiny_config()
  caplog.set_level("INFO")
  path = run_data.resolve_store(specs_lib.from_config(config).data, config.seed)
  assert path.startswith(str(tmp_path / "datasets")) and paths.is_complete(path)
  assert os.listdir(tmp_path / "datasets") == [os.path.basename(path)]  # nothing beside it
  size = run_data.synthetic_store_bytes(specs_lib.from_config(config).data)
  # 12 times of the config's 12 channels (5 variables on 2 levels, 2 surface ones) and
  # 2 statics: the store holds what the config reads, no more.
  assert size == 4 * 32 * 64 * (12 * 12 + 2)
  assert f"Writing the synthetic store {path} (2020-01-01 .. 2020-01-03" in caplog.text
  assert f"Writing {path}: 12 times, {(size - 4 * 32 * 64 * 2) / 1e6:.1f} MB" in caplog.text
  caplog.clear()
  assert run_data.resolve_store(specs_lib.from_config(config).data, config.seed) == path
  assert "Writing" not in caplog.text


def test_synthetic_store_that_does_not_fit_is_refused(tmp_path, monkeypatch):
  monkeypatch.setenv("WNSCALE_CACHE_DIR", str(tmp_path))
  monkeypatch.setattr(run_data.paths, "free_bytes", lambda path: 1000)
  with pytest.raises(ValueError, match=r"needs up to 1.2 MB but the disk holds only 0.0 MB free"):
    config = _tiny_config()
    run_data.resolve_store(specs_lib.from_config(config).data, config.seed)
  assert not os.path.exists(tmp_path / "datasets")


def test_no_path_without_synthetic_names_the_setting():
  config = _tiny_config()
  config.data.synthetic = False
  with pytest.raises(ValueError, match=r"^data.path is required .*`data.path=PATH_OR_URL`"
                     ) as library:
    run_data.resolve_store(specs_lib.from_config(config).data, config.seed)
  assert "--" not in str(library.value)  # a launcher shows its flag (test_cli)
