r"""Conversion throughput: `launch.make_dataset --from` against plain xarray, side by side.

  python bench/convert.py [--gb=2] [--repeats=3] [--settle=6] [--workdir=/tmp/convert_bench]

Writes `--gb` of ERA5-like input as the Climate Data Store delivers it (one netCDF4 file,
written by h5netcdf, per month of 6-hourly fields at 1 deg: 5 pressure-level variables on
13 levels and 3 surface ones, in the CDS's current layout), then converts it twice, each in a fresh
process: with wnscale (`convert_era5`, blocks of 256 MB) and with the plain xarray
recipe, `xr.open_mfdataset(files).rename(...)...to_zarr(out)` (dask; needs
`pip install -e '.[bench]'`). Prints MB/s read (input bytes / seconds), MB/s written
(store bytes / seconds) and each process's peak RSS, and the ratios.

The two take turns, `--repeats` times each (wnscale, xarray, wnscale, ...; each output
removed after it is measured), and the medians are compared. Before each run the bench
waits `--settle` seconds after removing the last output: how long a write takes here
depends on the memory the kernel has at hand (on a virtual machine, pages freed a moment
ago are much cheaper to fill than memory the host has taken back, which it does a few
seconds after they are freed), so without the wait each run inherits the pages its
predecessor's output had just freed, and how many depends on the predecessor (a store
left whole in the page cache frees ~2 GB at its removal; wnscale, which evicts each block
once written, frees little). Measured back to back without it, xarray took 5.5-6.1 s
after the old wnscale and 6.3-8.2 s after the evicting one; with a 6-s wait, 6.1-7.7 s
after either.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import xarray as xr

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, REPO)

LEVELS = (50, 100, 150, 200, 250, 300, 400, 500, 600, 700, 850, 925, 1000)
LATITUDE = np.arange(90, -90.5, -1.0)
LONGITUDE = np.arange(0, 360, 1.0)
PRESSURE = ("t", "z", "u", "v", "q")
SURFACE = ("t2m", "msl", "u10")


def write_inputs(directory: str, gb: float) -> list[str]:
  """Monthly files of 6-hourly fields until `gb` GB are written; returns their paths."""
  os.makedirs(directory, exist_ok=True)
  bytes_per_time = 4 * LATITUDE.size * LONGITUDE.size * (len(PRESSURE) * len(LEVELS)
                                                          + len(SURFACE))
  times = pd.date_range("2020-01-01", periods=int(gb * 1e9 // bytes_per_time), freq="6h")
  rng = np.random.default_rng(0)
  files = []
  for month, month_times in times.to_series().groupby(times.to_period("M")):
    month_times = pd.DatetimeIndex(month_times.values)
    shape = (len(month_times), len(LATITUDE), len(LONGITUDE))
    data = {name: (("valid_time", "pressure_level", "latitude", "longitude"),
                   rng.normal(size=(shape[0], len(LEVELS)) + shape[1:]).astype(np.float32))
            for name in PRESSURE}
    data.update({name: (("valid_time", "latitude", "longitude"),
                        rng.normal(size=shape).astype(np.float32)) for name in SURFACE})
    dataset = xr.Dataset(data, coords={"valid_time": month_times, "pressure_level":
                                       np.asarray(LEVELS, np.float64),
                                       "latitude": LATITUDE, "longitude": LONGITUDE})
    path = os.path.join(directory, f"era5_{month}.nc")
    dataset.to_netcdf(path, engine="h5netcdf")
    files.append(path)
  return files


def _wnscale(files, out):
  from wnscale.data.making import convert  # noqa: PLC0415
  convert.convert_era5(files, out)


def _xarray(files, out):
  names = {"t": "temperature", "z": "geopotential", "u": "u_component_of_wind",
           "v": "v_component_of_wind", "q": "specific_humidity", "t2m": "2m_temperature",
           "msl": "mean_sea_level_pressure", "u10": "10m_u_component_of_wind"}
  dataset = xr.open_mfdataset(files, combine="by_coords")
  dataset = dataset.rename({"valid_time": "time", "pressure_level": "level", **names})
  dataset.sortby("level").to_zarr(out, mode="w-", zarr_format=2, consolidated=True)


def _run_one(method, files, out):
  """In this (fresh) process: converts, prints seconds and peak RSS as JSON."""
  start = time.perf_counter()
  {"wnscale": _wnscale, "xarray": _xarray}[method](files, out)
  seconds = time.perf_counter() - start
  # VmHWM: this process image's own peak (ru_maxrss would include the parent's, whose
  # peak writing the inputs survives fork and exec).
  with open("/proc/self/status") as status:
    peak_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
  print(json.dumps({"seconds": seconds, "peak_rss_mb": peak_kb / 1024}))


def _size(path) -> int:
  if os.path.isfile(path):
    return os.path.getsize(path)
  return sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(path) for n in ns)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--gb", type=float, default=2.0)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--workdir", default="/tmp/convert_bench")
  parser.add_argument("--settle", type=float, default=6.0,
                      help="seconds to wait before each run (see the docstring)")
  parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # method, files, out
  args = parser.parse_args()
  if args.one:
    method, files, out = args.one
    _run_one(method, files.split(","), out)
    return
  inputs = os.path.join(args.workdir, "inputs")
  shutil.rmtree(args.workdir, ignore_errors=True)
  start = time.perf_counter()
  files = write_inputs(inputs, args.gb)
  read_bytes = sum(_size(f) for f in files)
  print(f"inputs: {len(files)} netCDF4 files, {read_bytes / 1e9:.2f} GB, written in "
        f"{time.perf_counter() - start:.0f} s")
  runs = {"wnscale": [], "xarray": []}
  for _ in range(args.repeats):
    for method, measured in runs.items():
      out = os.path.join(args.workdir, f"{method}.zarr")
      time.sleep(args.settle)
      result = subprocess.run([sys.executable, __file__, "--one", method, ",".join(files),
                               out], capture_output=True, text=True, check=True,
                              env=dict(os.environ, JAX_PLATFORMS="cpu"))
      figures = json.loads(result.stdout.strip().splitlines()[-1])
      measured.append(dict(figures, written_bytes=_size(out)))
      shutil.rmtree(out)
  rows = {}
  for method, measured in runs.items():
    median = sorted(measured, key=lambda figures: figures["seconds"])[len(measured) // 2]
    rows[method] = dict(median, read=read_bytes / 1e6 / median["seconds"],
                        written=median["written_bytes"] / 1e6 / median["seconds"])
    print(f"{method}: " + ", ".join(f"{m['seconds']:.1f} s" for m in measured))
  print(f"the median of each ({args.repeats} runs):")
  print(f"{'':10} {'seconds':>8} {'MB/s read':>10} {'MB/s written':>13} {'peak RSS MB':>12}")
  for method, row in rows.items():
    print(f"{method:10} {row['seconds']:8.1f} {row['read']:10.1f} {row['written']:13.1f} "
          f"{row['peak_rss_mb']:12.0f}")
  print(f"wnscale / xarray: speed {rows['xarray']['seconds'] / rows['wnscale']['seconds']:.2f}x, "
        f"peak RSS {rows['wnscale']['peak_rss_mb'] / rows['xarray']['peak_rss_mb']:.2f}x")


if __name__ == "__main__":
  main()
