"""ERA5 files as the Climate Data Store delivers them -> a WeatherBench2-layout store.

The files are written by the formats' own libraries (`cds_files`: ecCodes for GRIB, h5netcdf
and scipy for netCDF), and every value in the store is checked against the source as that
library (or xarray on it) reads it back, not against the project's writer.
"""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

import cds_files
import gcs
import page_cache
from cds_files import LATITUDE, LONGITUDE
from test_cli import assert_user_error, run
from tiny_runs import process_env
from wnscale import paths
from wnscale.data.making import convert, era5_files, hdf5_reads, writer
from wnscale.data.reading import store_formats
from wnscale.errors import UserError

REPO = os.path.join(os.path.dirname(__file__), "..")
TIMES = pd.date_range("2020-01-01", periods=4, freq="6h")


def _open(path) -> xr.Dataset:
  return xr.open_zarr(path, chunks=None)


def test_grib_1_and_2_with_accumulations_and_statics_in_their_own_file(tmp_path):
  """Pressure levels in GRIB 1 (written 850 before 500), surface fields in GRIB 2, hourly
  precipitation as ERA5's forecast steps, the land-sea mask and orography in a file of
  their own: one store in WeatherBench2's names and conventions, values as ecCodes decodes
  them."""
  pl, sfc, tp, static = (str(tmp_path / name) for name in
                         ("pl.grib", "sfc.grib", "tp.grib", "static.grib"))
  cds_files.write_grib(pl, [(n, lev, t) for t in TIMES for n in ("t", "z", "u", "v", "q")
                            for lev in (850, 500)], edition=1)
  cds_files.write_grib(sfc, [(n, None, t) for t in TIMES for n in ("2t", "msl", "tisr")],
                       edition=2)
  hourly = pd.date_range(TIMES[0] - pd.Timedelta(hours=5), TIMES[-1], freq="1h")
  cds_files.write_grib(tp, [("tp", None, t) for t in hourly])
  cds_files.write_grib(static, [(n, None, TIMES[0]) for n in ("lsm", "z")])
  out = convert.convert_era5([str(tmp_path / "*.grib")], str(tmp_path / "era5.zarr"))
  store = _open(out)
  assert sorted(store.data_vars) == sorted([
      "temperature", "geopotential", "u_component_of_wind", "v_component_of_wind",
      "specific_humidity", "2m_temperature", "mean_sea_level_pressure",
      "toa_incident_solar_radiation", "total_precipitation_6hr", "land_sea_mask",
      "geopotential_at_surface"])
  assert list(store.level.values) == [500, 850] and store.level.dtype == np.int64
  np.testing.assert_array_equal(store.latitude.values, LATITUDE)  # the source's order
  np.testing.assert_array_equal(store.longitude.values, LONGITUDE)
  np.testing.assert_array_equal(store.time.values, TIMES.values)
  assert store["temperature"].dims == ("time", "level", "latitude", "longitude")
  assert store["land_sea_mask"].dims == ("latitude", "longitude")
  assert store["temperature"].dtype == np.float32
  assert store["temperature"].attrs["units"] == "K"
  assert store["total_precipitation_6hr"].attrs["units"] == "m"
  decoded = {}
  for path in (pl, sfc, tp, static):
    decoded.update(cds_files.read_grib_values(path))
  for t in TIMES:
    for short, name in (("t", "temperature"), ("q", "specific_humidity")):
      for level in (500, 850):
        np.testing.assert_array_equal(store[name].sel(time=t, level=level).values,
                                      decoded[(short, level, t)].astype(np.float32))
    np.testing.assert_array_equal(store["toa_incident_solar_radiation"].sel(time=t).values,
                                  decoded[("tisr", 0, t)].astype(np.float32))
    six_hours = sum(decoded[("tp", 0, t - pd.Timedelta(hours=k))] for k in range(6))
    np.testing.assert_allclose(store["total_precipitation_6hr"].sel(time=t).values,
                               six_hours, rtol=1e-6)
  np.testing.assert_array_equal(store["geopotential_at_surface"].values,
                                decoded[("z", 0, TIMES[0])].astype(np.float32))
  notes = " ".join(zarr.open_group(out, mode="r").attrs["conversion"]["notes"])
  assert "sum of the hourly total_precipitation of the 6 hours" in notes
  assert "toa_incident_solar_radiation: the hourly integral" in notes
  assert not convert.is_converting(out)


def test_both_netcdf_layouts_members_and_time_limits(tmp_path, caplog):
  """The current CDS netCDF4 layout (valid_time, pressure_level, expver, scalar number) and
  the older netCDF3 one (time, level, packed int16, longitude -180..180) merge into one store;
  an EDA file needs --member."""
  current = tmp_path / "pl_2024.nc"
  cds_files.current_netcdf(["t", "z"], TIMES, levels=(850.0, 500.0)).to_netcdf(
      current, engine="h5netcdf")
  older, encoding = cds_files.older_netcdf(["2t", "msl", "sp"], TIMES)
  older.to_netcdf(tmp_path / "sfc_old.nc", engine="scipy", encoding=encoding)
  out = convert.convert_era5([str(current), str(tmp_path / "sfc_old.nc")],
                             str(tmp_path / "a.zarr"), start=str(TIMES[1]))
  store = _open(out)
  # Surface pressure is not in the name table: kept under its own name, with a warning.
  assert "sp" in store and "'sp' is not in the ERA5 -> WeatherBench2 name table" in caplog.text
  np.testing.assert_array_equal(store.time.values, TIMES[1:].values)
  np.testing.assert_array_equal(store.longitude.values, LONGITUDE)  # 0..360 again
  source = xr.open_dataset(current, engine="h5netcdf")
  np.testing.assert_array_equal(
      store["temperature"].sel(level=500).values,
      source["t"].sel(pressure_level=500.0).isel(valid_time=slice(1, None)).values)
  packed = xr.open_dataset(tmp_path / "sfc_old.nc", engine="scipy")  # decoded by xarray
  np.testing.assert_array_equal(
      store["2m_temperature"].values,
      packed["t2m"].isel(time=slice(1, None)).roll(longitude=32).values.astype(np.float32))

  eda = tmp_path / "eda.nc"
  cds_files.current_netcdf(["2t"], TIMES, members=3).to_netcdf(eda, engine="h5netcdf")
  with pytest.raises(UserError, match=r"^member is required: .* holds ensemble members "
                     r"\[0, 1, 2\].*`member=N`") as library:
    convert.convert_era5([str(eda)], str(tmp_path / "eda.zarr"))
  assert "--" not in str(library.value)
  store = _open(convert.convert_era5([str(eda)], str(tmp_path / "eda.zarr"), member=1))
  np.testing.assert_array_equal(
      store["2m_temperature"].values,
      xr.open_dataset(eda, engine="h5netcdf")["t2m"].sel(number=1).values)
  with pytest.raises(UserError, match=r"^member=5: .* has no such member; it holds \[0, 1, 2\]"):
    convert.convert_era5([str(eda)], str(tmp_path / "eda5.zarr"), member=5)


def test_overlaps_must_agree_and_gaps_are_named(tmp_path):
  first, second = tmp_path / "a.nc", tmp_path / "b.nc"
  cds_files.current_netcdf(["2t"], TIMES[:3]).to_netcdf(first, engine="h5netcdf")
  cds_files.current_netcdf(["2t"], TIMES[2:]).to_netcdf(second, engine="h5netcdf")
  store = _open(convert.convert_era5([str(first), str(second)], str(tmp_path / "ok.zarr")))
  np.testing.assert_array_equal(store.time.values, TIMES.values)  # the shared time agrees
  disagreeing = cds_files.current_netcdf(["2t"], TIMES[2:])
  disagreeing["t2m"] += 1
  disagreeing.to_netcdf(second, engine="h5netcdf")
  with pytest.raises(UserError, match=f"2m_temperature at {TIMES[2]} differs between "
                                      f"{first} and {second}"):
    convert.convert_era5([str(first), str(second)], str(tmp_path / "bad.zarr"))
  cds_files.current_netcdf(["2t"], TIMES[:2]).to_netcdf(first, engine="h5netcdf")
  cds_files.current_netcdf(["2t"], TIMES[3:]).to_netcdf(second, engine="h5netcdf")
  with pytest.raises(UserError, match=f"gap: no data at {TIMES[2]}"):
    convert.convert_era5([str(first), str(second)], str(tmp_path / "gap.zarr"))
  with pytest.raises(UserError, match="No file matches"):
    convert.convert_era5([str(tmp_path / "*.grib")], str(tmp_path / "none.zarr"))
  (tmp_path / "notes.txt").write_text("not data")
  with pytest.raises(UserError, match="notes.txt is not a netCDF file"):
    convert.convert_era5([str(tmp_path / "notes.txt")], str(tmp_path / "none.zarr"))


def test_a_conversion_into_a_bucket_cut_short_continues_in_place(tmp_path, monkeypatch,
                                                                   caplog):
  """In a bucket (a Cloud Storage emulator) the store is built in place: one cut short after
  its first block is refused by readers, and the same call continues it (no --overwrite)."""
  source = tmp_path / "sfc.nc"
  cds_files.current_netcdf(["2t", "msl"], TIMES).to_netcdf(source, engine="h5netcdf")
  one_time = 2 * 4 * LATITUDE.size * LONGITUDE.size  # two variables, float32
  start_block, calls = convert.start_block, []

  def cut_short(*args):
    calls.append(args)
    if len(calls) == 3:
      # As a Ctrl-C while the second block is written: the first block is recorded, the
      # second ends unrecorded (it is written again).
      raise KeyboardInterrupt
    return start_block(*args)

  with gcs.emulator() as bucket:
    out = paths.join(bucket, "era5.zarr")
    monkeypatch.setattr(convert, "start_block", cut_short)
    with pytest.raises(KeyboardInterrupt):
      convert.convert_era5([str(source)], out, block_bytes=one_time)
    monkeypatch.undo()
    assert convert.is_converting(out) and not paths.is_complete(out)
    with pytest.raises(UserError, match="is a conversion cut short \\(1 times written\\); "
                                        "run the make_dataset command that made it again"):
      store_formats.open_store(out, ["2m_temperature"], [])
    caplog.set_level("INFO")
    convert.convert_era5([str(source)], out, block_bytes=one_time)
    assert "after 1 of 4 times" in caplog.text and paths.is_complete(out)
    got = xr.open_zarr(out, chunks=None).load()
  want = xr.open_dataset(source, engine="h5netcdf")
  np.testing.assert_array_equal(got["2m_temperature"].values, want["t2m"].values)
  np.testing.assert_array_equal(got["mean_sea_level_pressure"].values, want["msl"].values)


def test_flags_of_the_other_kind_of_store_are_refused(tmp_path):
  """make_dataset's synthetic-store flags with --from, and conversion flags without it, do
  nothing: each is one line, exit 2, and nothing is written."""
  source = tmp_path / "a.nc"
  cds_files.current_netcdf(["2t"], TIMES).to_netcdf(source, engine="h5netcdf")
  out = tmp_path / "out.zarr"
  assert_user_error(run("make_dataset", f"--from={source}", f"--out={out}",
                        "--resolution=1.0", "--levels=500,850"),
                    "--resolution, --levels: a conversion (--from) keeps the grid")
  assert_user_error(run("make_dataset", f"--out={out}", "--member=3"),
                    "--member: these flags are for converting files (--from)")
  assert sorted(os.listdir(tmp_path)) == ["a.nc"]
def test_netcdf4_variables_stored_as_is_are_read_straight_from_hdf5(tmp_path):
  """Only a float32 variable indexed and stored as in its netCDF4 file (or in reverse along
  its levels, descending as the CDS writes them) is marked for direct reads: levels in
  another order, a selected member, float64 or packed values go through xarray. A
  conversion reads the same values either way."""
  as_is, descending = tmp_path / "as_is.nc", tmp_path / "descending.nc"
  shuffled = tmp_path / "shuffled.nc"
  cds_files.current_netcdf(["t", "2t"], TIMES, levels=(500.0, 850.0)).to_netcdf(
      as_is, engine="h5netcdf")
  cds_files.current_netcdf(["t"], TIMES, levels=(850.0, 500.0, 200.0)).to_netcdf(
      descending, engine="h5netcdf")
  cds_files.current_netcdf(["t"], TIMES, levels=(500.0, 850.0, 200.0)).to_netcdf(
      shuffled, engine="h5netcdf")
  cds_files.current_netcdf(["2t"], TIMES, members=2).to_netcdf(tmp_path / "eda.nc",
                                                               engine="h5netcdf")
  other = cds_files.current_netcdf(["2t", "msl"], TIMES)
  other["t2m"] = other["t2m"].astype(np.float64)
  other.to_netcdf(tmp_path / "other.nc", engine="h5netcdf",
                  encoding={"msl": {"dtype": "int16", "scale_factor": 0.5,
                                          "_FillValue": -32767}})
  opened = era5_files.open_era5_file(str(as_is))
  assert all(hdf5_reads.is_marked(opened[n].variable) for n in ("temperature", "2m_temperature"))
  assert hdf5_reads.is_marked(era5_files.open_era5_file(str(descending))["temperature"].variable)
  assert not hdf5_reads.is_marked(
      era5_files.open_era5_file(str(shuffled))["temperature"].variable)
  for path in (descending, shuffled):  # read straight and reversed, or through xarray
    store = _open(convert.convert_era5([str(path)], str(tmp_path / f"{path.stem}.zarr"),
                                       block_bytes=1))
    source = xr.open_dataset(path, engine="h5netcdf")["t"].sortby("pressure_level")
    np.testing.assert_array_equal(store["temperature"].values, source.values)
    np.testing.assert_array_equal(store.level.values, [200, 500, 850])
  assert not hdf5_reads.is_marked(
      era5_files.open_era5_file(str(tmp_path / "eda.nc"), member=1)["2m_temperature"].variable)
  other = era5_files.open_era5_file(str(tmp_path / "other.nc"))
  assert not any(hdf5_reads.is_marked(other[n].variable) for n in other.data_vars)


def test_written_chunks_are_evicted_from_the_page_cache(tmp_path):
  """A conversion does not read back what it writes: each block's chunk files leave the page
  cache once written, so the next block's reuse its pages (a chunk written and synced
  without that stays cached: the control)."""
  if not page_cache.evicts(tmp_path):
    pytest.skip(f"the filesystem of {tmp_path} keeps no page cache to evict from (tmpfs)")
  source = tmp_path / "era5.nc"
  cds_files.current_netcdf(["t", "2t"], TIMES, levels=(500.0, 850.0)).to_netcdf(
      source, engine="h5netcdf")
  out = convert.convert_era5([str(source)], str(tmp_path / "era5.zarr"), block_bytes=1)
  assert page_cache.cached_chunks(out, ["temperature", "2m_temperature"]) == []
  control = writer.open_variable(out, "temperature")
  control[0].write(np.ones(control.shape[1:], np.float32)).result()
  assert page_cache.cached_chunks(out, ["temperature"]) == [f"{out}/temperature/0.0.0.0"]


@pytest.mark.slow
def test_a_killed_conversion_continues_and_a_converted_store_trains(tmp_path):
  """`kill -9` during `launch.make_dataset --from`: the store is marked incomplete (the
  trainer refuses it), the same command completes it equal to an uninterrupted conversion;
  other sources into it are refused; the tiny config trains on it."""
  times = pd.date_range("2020-01-01", "2020-01-20T18", freq="6h")  # 80: seconds to write
  cds_files.current_netcdf(["t", "z", "u", "v", "q"], times, levels=(500.0, 850.0)).to_netcdf(
      tmp_path / "pl.nc", engine="h5netcdf")
  cds_files.current_netcdf(["2t", "msl"], times).to_netcdf(tmp_path / "sfc.nc",
                                                          engine="h5netcdf")
  cds_files.current_netcdf(["lsm"], times[:1]).to_netcdf(tmp_path / "lsm.nc", engine="h5netcdf")
  z_surface = cds_files.current_netcdf(["z"], times[:1])
  z_surface.to_netcdf(tmp_path / "orography.nc", engine="h5netcdf")
  sources = f"--from={tmp_path}/*.nc"
  env = dict(os.environ, JAX_PLATFORMS="cpu")

  def make(out, *extra):
    return [sys.executable, "-m", "launch.make_dataset", sources, f"--out={out}",
            "--block_mb=0", *extra]  # 0: one time per block, to be killed midway

  whole = tmp_path / "whole.zarr"
  done = subprocess.run(make(whole), cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "times 80/80" in done.stderr
  killed = tmp_path / "killed.zarr"
  partial = tmp_path / "killed.zarr.partial"  # where it is built until whole
  process = subprocess.Popen(make(killed), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
  try:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
      if convert.is_converting(str(killed)) and zarr.open_group(
          partial, mode="r").attrs["conversion"]["times_written"] >= 10:
        break
      time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
  finally:
    process.wait(timeout=30)
  written = zarr.open_group(partial, mode="r").attrs["conversion"]["times_written"]
  assert 10 <= written < 80 and convert.is_converting(str(killed))
  assert not killed.exists()  # nothing at --out until the store is whole
  with pytest.raises(UserError, match="cut short"):  # nor can the partial one be trained on
    store_formats.open_store(str(partial), ["2m_temperature"], [])
  again = subprocess.run(make(killed), cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=300)
  assert again.returncode == 0, again.stderr[-3000:]
  assert f"Continuing the conversion into {killed} after {written} of 80 times" in again.stderr
  xr.testing.assert_identical(_open(killed), _open(whole))
  assert not partial.exists() and not convert.is_converting(str(killed))
  other = subprocess.run([sys.executable, "-m", "launch.make_dataset",
                          f"--from={tmp_path}/sfc.nc", f"--out={whole}"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
  assert other.returncode == 2 and "exists (a dataset store); pass --overwrite" in other.stderr

  train = subprocess.run(
      [sys.executable, "-m", "launch.train", "--platform=cpu", "--num_cpu_devices=1",
       "--config=configs/tiny.py",
       f"--config.data.path={whole}", f"--workdir={tmp_path / 'run'}",
       "--config.train.steps=2", "--config.train.warmup_steps=1",
       "--config.data.train_start=2020-01-01", "--config.data.train_end=2020-01-04",
       "--config.data.eval_start=2020-01-05", "--config.data.eval_end=2020-01-06",
       "--config.train.eval_every=2", "--config.train.eval_batches=1"],
      cwd=REPO, env=process_env(), capture_output=True, text=True, timeout=600)
  assert train.returncode == 0, train.stderr[-3000:]
  assert "Run ended at step 2 of 2" in train.stderr


def test_a_conversion_killed_between_its_last_block_and_its_rename_is_finished(tmp_path):
  source = tmp_path / "t2m.nc"
  cds_files.current_netcdf(["2t"], TIMES).to_netcdf(source, engine="h5netcdf")
  out = tmp_path / "a.zarr"
  expected = _open(convert.convert_era5([str(source)], str(out))).load()
  os.rename(out, tmp_path / "a.zarr.partial")  # complete, but never renamed into place
  assert not convert.is_converting(str(out))  # nothing is left to write...
  xr.testing.assert_identical(_open(convert.convert_era5([str(source)], str(out))), expected)
  assert not (tmp_path / "a.zarr.partial").exists()  # ...and the same command renames it


def test_a_conversion_of_other_sources_cut_short_is_replaced_only_when_asked(tmp_path):
  """What a library caller reads names its argument (`overwrite=True`); `make_dataset`
  shows `--overwrite` (launch/cli.py)."""
  where = tmp_path / "out.zarr"
  zarr.open_group(str(where), mode="w", zarr_format=2).attrs[convert.CONVERSION] = {
      "fingerprint": "theirs", "sources": ["a.nc"], "times_written": 3, "complete": False}
  with pytest.raises(UserError, match=r"is a conversion of other sources cut short "
                     r"\(\['a.nc'\]\); continue it with those, or start afresh with "
                     r"`overwrite=True`\.$") as library:
    convert._resume_point(str(where), "ours", overwrite=False)
  assert "--" not in str(library.value)
  assert convert._resume_point(str(where), "ours", overwrite=True) is None
  assert not where.exists()
