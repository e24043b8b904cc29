"""`--runner`: the conversion and the climatology as Apache Beam pipelines.

Run here (on Beam's local runner), `launch.make_dataset --from ... --runner=...` and
`launch.make_climatology ... --runner=...` write the very stores the plain path
writes (values, coordinates, attributes, every array's zarr metadata), from several
work items each (one time per block; several blocks of levels and latitude rows). A bad
runner or an unknown Beam option is one line, exit 2, before anything is written.
"""

import concurrent.futures
import json
import os
import pathlib

import apache_beam  # noqa: F401  (the test extra installs it: without it, fail, not skip)
import numpy as np
import pandas as pd
import pytest
import xarray as xr
import zarr

import cds_files
import page_cache
from test_cli import assert_user_error, run
from wnscale.data.making import beam_pipelines, convert
from wnscale.errors import UserError
from wnscale.evaluation import climatology


TIMES = pd.date_range("2020-01-01", periods=4, freq="6h")
# What the DirectRunner runs when it cannot fetch the Prism runner from GitHub (as here);
# named, so that the tests never download it.
RUNNER = "--runner=FnApiRunner"
CLIMATOLOGY_MEMORY_GIB = 0.00015  # 2 of the 3 latitude rows a block: 2 blocks a level


def _assert_same_store(path, expected):
  """The same values and coordinates, and byte for byte the same metadata: attributes,
  every array's chunks, dtype, fill value and compressor."""
  xr.testing.assert_identical(xr.open_zarr(path, chunks=None),
                              xr.open_zarr(expected, chunks=None))
  assert json.loads((path / ".zmetadata").read_text()) == json.loads(
      (expected / ".zmetadata").read_text())


def _write_sources(directory) -> list[str]:
  """Levels, hourly precipitation in two files (the block of 06:00 reads hours of both),
  a static in its own file, and 2m temperature in two files that share a time."""
  cds_files.current_netcdf(["t"], TIMES, levels=(850.0, 500.0)).to_netcdf(
      directory / "pl.nc", engine="h5netcdf")
  hourly = pd.date_range(TIMES[0] - pd.Timedelta(hours=5), TIMES[-1], freq="1h")
  split = hourly.get_loc(TIMES[1] - pd.Timedelta(hours=3))  # 06:00 sums 01:00 .. 06:00
  cds_files.current_netcdf(["tp"], hourly[:split + 1]).to_netcdf(directory / "tp_a.nc",
                                                               engine="h5netcdf")
  cds_files.current_netcdf(["tp"], hourly[split + 1:]).to_netcdf(directory / "tp_b.nc",
                                                               engine="h5netcdf")
  cds_files.current_netcdf(["lsm"], TIMES[:1]).to_netcdf(directory / "lsm.nc",
                                                        engine="h5netcdf")
  cds_files.current_netcdf(["2t"], TIMES[:3]).to_netcdf(directory / "t2m_a.nc",
                                                       engine="h5netcdf")
  cds_files.current_netcdf(["2t"], TIMES[2:]).to_netcdf(directory / "t2m_b.nc",
                                                       engine="h5netcdf")
  return [str(directory / "*.nc")]


def _write_small_store(path):
  """A 3 x 4 grid, daily, December 2019 to January 2020, a few values missing."""
  times = pd.date_range("2019-12-01", "2020-01-31", freq="D")
  rng = np.random.default_rng(0)
  surface = rng.normal(280, 5, (len(times), 3, 4)).astype(np.float32)
  surface[3, 1, 2] = np.nan
  xr.Dataset({"2m_temperature": (("time", "latitude", "longitude"), surface),
              "temperature": (("time", "level", "latitude", "longitude"),
                              rng.normal(250, 5, (len(times), 2, 3, 4)).astype(np.float32))},
             coords={"time": times, "level": [500, 850], "latitude": [30.0, 0.0, -30.0],
                     "longitude": [0.0, 90.0, 180.0, 270.0]}).to_zarr(
                         path, zarr_format=2, consolidated=True)
  return str(path)


def test_beam_pipelines_write_the_stores_the_plain_path_writes(tmp_path):
  sources = _write_sources(tmp_path)
  plain = convert.convert_era5(sources, str(tmp_path / "plain.zarr"), block_bytes=1)
  store = _write_small_store(tmp_path / "small.zarr")
  memory = int(CLIMATOLOGY_MEMORY_GIB * 2**30)
  plain_climatology = climatology.compute_climatology(
      store, str(tmp_path / "plain_clim.zarr"), window=5, memory_bytes=memory)
  beam, beam_climatology = tmp_path / "beam.zarr", tmp_path / "beam_clim.zarr"
  with concurrent.futures.ThreadPoolExecutor(2) as pool:  # two processes, mostly waiting
    converted = pool.submit(run, "make_dataset", f"--from={sources[0]}", f"--out={beam}",
                            "--block_mb=0", RUNNER)
    computed = pool.submit(run, "make_climatology", f"--store={store}",
                           f"--out={beam_climatology}", "--window=5",
                           f"--memory_gib={CLIMATOLOGY_MEMORY_GIB}", RUNNER)
    converted, computed = converted.result(), computed.result()
  for result, work in ((converted, "write times: 4 work items"),  # a block a time
                       (computed, "climatology blocks: 6 work items")):  # 2 + 2 x 2 levels
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{work}, as a Beam pipeline on FnApiRunner" in result.stderr
  if page_cache.evicts(tmp_path):  # each work item's chunks left the page cache, as plainly
    assert page_cache.cached_chunks(beam, ["temperature", "2m_temperature"]) == []
  _assert_same_store(beam, pathlib.Path(plain))
  assert zarr.open_group(beam, mode="r").attrs["conversion"]["complete"]
  assert not convert.is_converting(str(beam))
  _assert_same_store(beam_climatology, pathlib.Path(plain_climatology))
  assert xr.open_zarr(beam_climatology)["temperature"].notnull().any()  # not all NaN


def test_a_bad_runner_or_beam_option_is_one_line(tmp_path):
  source = tmp_path / "t2m.nc"
  cds_files.current_netcdf(["2t"], TIMES).to_netcdf(source, engine="h5netcdf")
  out = tmp_path / "out.zarr"
  common = [f"--from={source}", f"--out={out}"]
  cases = [  # one --out each: one command at a time writes an output (`outputs.lock`)
      ([f"--from={source}", f"--out={tmp_path / 'other.zarr'}", "--runner=Dataflw"],
       ["--runner=Dataflw: Unexpected pipeline runner", "DataflowRunner"]),
      (common + [RUNNER, "--", "--direct_num_workrs=2"],
       ["--direct_num_workrs=2 is not one of Beam's pipeline options",
        "did you mean --direct_num_workers?"]),
  ]
  with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
    results = list(pool.map(lambda case: run("make_dataset", *case[0]), cases))
  for (_, fragments), result in zip(cases, results):
    assert_user_error(result, *fragments)
  assert sorted(os.listdir(tmp_path)) == ["t2m.nc"]  # nothing written, no lock left


def test_a_library_caller_is_told_of_its_arguments_not_of_flags():
  """`options` names its `runner`, and Beam's options as given; `--runner=...` and the like
  are the launcher's (`launch/cli.py`; the command's lines: the test above)."""
  for runner, args, said in (
      ("Dataflw", [], "runner=Dataflw: Unexpected pipeline runner"),
      ("DirectRunner", ["--runner=DirectRunner"], "name the runner again; give it once, as "
       "`runner` alone"),
      ("DirectRunner", ["--no_wait_until_finish"], "Beam's option no_wait_until_finish: "
       "the command marks its output complete")):
    with pytest.raises(UserError) as library:
      beam_pipelines.options(runner, args)
    assert said in str(library.value)
    assert "--" not in str(library.value).replace(" ".join(args), "")  # but Beam's own
