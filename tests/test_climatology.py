"""The day-of-year x hour climatology: WeatherBench2's method, by hand and against an
xarray re-statement of it; its lookup by valid time."""

import logging

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from wnscale.errors import UserError
from wnscale.evaluation import climatology

LAT, LON = [30.0, 0.0, -30.0], [0.0, 90.0, 180.0, 270.0]


def write_store(path, times, surface, atmospheric=None):
  """A WB2-layout store: `2m_temperature` `[time, lat, lon]`, optional `temperature`."""
  data = {"2m_temperature": (("time", "latitude", "longitude"), surface)}
  coords = {"time": times, "latitude": LAT, "longitude": LON}
  if atmospheric is not None:
    data["temperature"] = (("time", "level", "latitude", "longitude"), atmospheric)
    coords["level"] = [500, 850]
  xr.Dataset(data, coords=coords).to_zarr(path, zarr_format=2, consolidated=True)
  return str(path)


def wb2_explicit_climatology(dataset: xr.Dataset, window: int) -> xr.Dataset:
  """WeatherBench2's "explicit" climatology, re-stated with xarray: per hour, stack years
  by day of year, fill day 366 from day 365, wrap-pad, rolling window, weighted mean."""
  half = window // 2
  weights = xr.DataArray(1 - np.abs(np.arange(-half, half + 1)) / half, dims="window")
  hours = sorted(set(dataset.time.dt.hour.values.tolist()))
  per_hour = []
  for hour in hours:
    at_hour = dataset.isel(time=dataset.time.dt.hour == hour)
    years = []
    for year in np.unique(at_hour.time.dt.year):
      one = at_hour.sel(time=str(year))
      years.append(one.assign_coords(time=one.time.dt.dayofyear.values)
                   .rename(time="dayofyear"))
    stacked = xr.concat(years, "year", join="outer")
    stacked = stacked.fillna(stacked.sel(dayofyear=365, drop=True))
    rolled = stacked.pad(dayofyear=half, mode="wrap").rolling(
        dayofyear=window, center=True).construct("window")
    per_hour.append(rolled.weighted(weights).mean(("window", "year"))
                    .isel(dayofyear=slice(half, -half)))
  return xr.concat(per_hour, pd.Index(hours, name="hour"))


def test_window_weights():
  np.testing.assert_allclose(climatology.window_weights(5), [0, 0.5, 1, 0.5, 0])
  assert len(climatology.window_weights(61)) == 61
  with pytest.raises(ValueError, match="odd"):
    climatology.window_weights(60)


@pytest.mark.parametrize("memory_bytes", [2**30, 200_000], ids=["one-block", "row-blocks"])
def test_matches_weatherbench2_explicit_method(tmp_path, memory_bytes, caplog):
  # Two whole years, one of them a leap year, 6-hourly, so days 1..366 all exist.
  times = pd.date_range("2019-01-01", "2020-12-31T18", freq="6h")
  rng = np.random.default_rng(0)
  seasonal = np.sin(2 * np.pi * np.arange(len(times)) / (4 * 365.25))[:, None, None]
  surface = (280 + 10 * seasonal + rng.normal(size=(len(times), 3, 4))).astype(np.float32)
  upper = rng.normal(size=(len(times), 2, 3, 4)).astype(np.float32)
  store = write_store(tmp_path / "store.zarr", times, surface, upper)
  with caplog.at_level(logging.INFO):
    out = climatology.compute_climatology(store, str(tmp_path / "clim.zarr"),
                                          memory_bytes=memory_bytes)
  # Progress in words a user reads (not `slice(0, 2, None)`).
  progress = [r.getMessage() for r in caplog.records
              if r.getMessage().startswith(f"Climatology of {store}: blocks ")]
  assert progress and not any("slice(" in message for message in progress), progress
  assert all(" | ETA " in message for message in progress), progress
  if memory_bytes == 2**30:  # one block per variable
    assert [message.split(" | ")[0] for message in progress] == [
        f"Climatology of {store}: blocks 1/2 (temperature, levels 1-2 of 2, latitude rows 1-3 "
        "of 3)", f"Climatology of {store}: blocks 2/2 (2m_temperature, latitude rows 1-3 of 3)"
    ], progress
  ours = xr.open_zarr(out, chunks=None)
  reference = wb2_explicit_climatology(xr.open_zarr(store).astype(np.float64).load(), 61)
  assert ours["temperature"].dims == ("hour", "dayofyear", "level", "latitude", "longitude")
  assert ours["2m_temperature"].attrs["units"] == "K"
  np.testing.assert_array_equal(ours.latitude.values, LAT)  # the store's order
  for name in ("2m_temperature", "temperature"):
    np.testing.assert_allclose(ours[name].values,
                               reference[name].transpose(*ours[name].dims).values,
                               rtol=1e-6, atol=1e-5)


def test_day_366_missing_values_and_smoothing_by_hand(tmp_path, caplog):
  # Daily at 00 UTC through 2019 (no day 366) and the first days of 2020.
  times = pd.date_range("2019-01-01", "2020-01-05", freq="D")
  value = np.asarray(times.day_of_year + 1000 * (times.year - 2019), np.float32)
  surface = np.broadcast_to(value[:, None, None], (len(times), 3, 4)).copy()
  surface[times == pd.Timestamp("2020-01-02"), 0, 0] = np.nan  # skipped, not counted
  store = write_store(tmp_path / "store.zarr", times, surface)
  # Window 3: weights 0, 1, 0, i.e. each day's mean over the years that have it.
  unsmoothed = xr.open_zarr(climatology.compute_climatology(
      store, str(tmp_path / "w3.zarr"), window=3), chunks=None)["2m_temperature"]
  t = unsmoothed.sel(hour=0)
  assert float(t.sel(dayofyear=1)[1, 1]) == pytest.approx((1 + 1001) / 2)
  assert float(t.sel(dayofyear=2)[0, 0]) == 2.0  # 2020's value was NaN
  assert float(t.sel(dayofyear=200)[1, 1]) == 200.0  # 2019 only
  assert float(t.sel(dayofyear=366)[1, 1]) == 365.0  # 2019's day 365 stands in
  # The same store said to be in degC: a climatology in K (what it says it is in), said;
  # units that do not convert: refused before any work.
  for units in ("degC", "Pa"):
    xr.open_zarr(store).load().pipe(lambda d, units=units: d.assign({
        "2m_temperature": d["2m_temperature"].assign_attrs(units=units)})).to_zarr(
            tmp_path / f"{units}.zarr", zarr_format=2)
  with caplog.at_level(logging.WARNING):
    kelvin = xr.open_zarr(climatology.compute_climatology(
        str(tmp_path / "degC.zarr"), str(tmp_path / "k.zarr"), window=3), chunks=None)
  np.testing.assert_allclose(kelvin["2m_temperature"].values, unsmoothed.values + 273.15)
  assert "2m_temperature is in degC (its units attribute): read in K (+273.15)." in caplog.text
  with pytest.raises(UserError, match="2m_temperature' of store .* is in 'Pa'"):
    climatology.compute_climatology(str(tmp_path / "Pa.zarr"), str(tmp_path / "pa.zarr"))
  assert not (tmp_path / "pa.zarr").exists()
  # Window 5: weights 0, 0.5, 1, 0.5, 0 over days d-2..d+2; day 1 wraps to day 366.
  smoothed = xr.open_zarr(climatology.compute_climatology(
      store, str(tmp_path / "w5.zarr"), window=5), chunks=None)["2m_temperature"]
  expected = (0.5 * 365 + 1 * (1 + 1001) + 0.5 * (2 + 1002)) / (0.5 + 2 + 1)
  assert float(smoothed.sel(hour=0, dayofyear=1)[1, 1]) == pytest.approx(expected)
  assert float(smoothed.sel(hour=0, dayofyear=100)[1, 1]) == pytest.approx(100.0)
  # Days far from any data are NaN.
  missing = climatology.compute_climatology(
      store, str(tmp_path / "w5_short.zarr"), "2019-01-01", "2019-01-10", window=5)
  assert np.isnan(xr.open_zarr(missing, chunks=None)["2m_temperature"]
                  .sel(hour=0, dayofyear=100).values).all()


def test_lookup_by_valid_time_and_errors(tmp_path):
  times = pd.date_range("2020-01-01", "2020-01-10T18", freq="6h")
  value = np.asarray(times.hour + 100.0 * times.day, np.float32)
  surface = np.broadcast_to(value[:, None, None], (len(times), 3, 4))
  store = write_store(tmp_path / "store.zarr", times, surface)
  clim = xr.open_zarr(climatology.compute_climatology(store, str(tmp_path / "c.zarr"),
                                                      window=3), chunks=None)
  valid = pd.DatetimeIndex(["2021-01-03T06", "2020-01-05T18"])
  picked = climatology.at_valid_times(clim, valid, dim="lead")["2m_temperature"]
  assert picked.dims == ("lead", "latitude", "longitude")
  np.testing.assert_allclose(picked.values[:, 0, 0], [306.0, 518.0])
  with pytest.raises(ValueError, match="no hour 3 .*it has hours \\[0, 6, 12, 18\\]"):
    climatology.at_valid_times(clim, pd.DatetimeIndex(["2020-01-02T03"]))
  with pytest.raises(ValueError, match="lacks variable 'temperature'"):
    climatology.compute_climatology(store, str(tmp_path / "x.zarr"), variables=["temperature"])
  with pytest.raises(ValueError, match="exists"):
    climatology.compute_climatology(store, str(tmp_path / "c.zarr"))
