r"""Writes a WeatherBench2-layout zarr store: ERA5 files from the Climate Data Store
converted (`--from`), or a synthetic one; or an observation store of synthetic stations
observing a grid store (`--stations`, `wnscale.data.reading.observations`).

  # ERA5 as the CDS delivers it (GRIB 1/2, netCDF in either CDS layout), merged
  python -m launch.make_dataset --from='era5_pl_*.grib,era5_sfc_2020.nc' --out=era5.zarr
  # the synthetic store a config trains on: its resolution, variables, levels, time ranges
  python -m launch.make_dataset --config=configs/tiny.py --out=/tmp/era5_5p625.zarr
  # or chosen by hand
  python -m launch.make_dataset --out=/tmp/era_5p625.zarr --resolution=5.625 \
      --start=2020-01-01 --end=2020-12-31 --levels=13
  # on an octahedral reduced Gaussian grid (5,248 points; H16: HEALPix), as a list of points
  python -m launch.make_dataset --out=/tmp/era_o32.zarr --grid=O32
  # a regional store (a 1 deg box) to cut into a global one (data.regional_path)
  python -m launch.make_dataset --out=/tmp/era_box_1deg.zarr --resolution=1 --region=40,60,0,30
  # an observation store: a synthetic network of 500 stations observing a grid store
  # (land-biased points, its surface fields interpolated plus noise, a fraction missing)
  python -m launch.make_dataset --stations=500 --from_store=/tmp/era_5p625.zarr \
      --out=/tmp/stations.zarr

A conversion killed midway continues where it stopped when the same command runs
again (`wnscale.data.making.convert`).

With --runner, the blocks of times are written by an Apache Beam pipeline
(`wnscale.data.making.convert_beam`; the same store), here or on Dataflow, Flink or Spark,
Beam's own options after `--` (`launch.runner`):

  python -m launch.make_dataset --from='gs://B/era5/*.nc' --out=gs://B/era5.zarr \
      --runner=DataflowRunner -- --project=P --region=R --temp_location=gs://B/tmp \
      --setup_file=./pyproject.toml

It says how big the store will be before writing, shows its progress (times
written, MB, ETA) and ends with its size on disk. Train on it with
--config.data.path=<the --out path> (and a config whose data.resolution and time
ranges the store covers). An existing store at --out is replaced only with
--overwrite (`wnscale.outputs`).
"""

import os

from absl import flags

from launch import cli, runner
from wnscale import config as config_lib
from wnscale import outputs, paths
from wnscale import specs as specs_lib
from wnscale.data import run_data
from wnscale.data import variables
from wnscale.data.making import convert, convert_beam, stations, synthetic
from wnscale.errors import ArgumentError, UserError
from wnscale.progress import size_text

flags.adopt_module_key_flags(runner)  # --help lists --runner

_CONFIG = cli.define_config(
    "Write the store this experiment config trains on (its data.resolution or data.grid, "
    "variables, pressure levels, time step and train/eval time ranges); a flag below that "
    "is given (e.g. --grid=O32) replaces the config's setting.")
# A station network (--stations) is an observation store; anything else a dataset store.
_OUT = cli.define_output(
    "out", "Path of the zarr store to write.",
    lambda: outputs.OBSERVATIONS if flags.FLAGS.stations is not None else outputs.DATASET)
_FROM = flags.DEFINE_list(
    "from", None, "ERA5 files to convert, as the Climate Data Store delivers them: GRIB or "
    "netCDF paths or globs, comma-separated (quote globs). Without it: a synthetic store.")
_MEMBER = flags.DEFINE_integer("member", None, "With --from: the ensemble member to keep "
                               "from files that hold several (ERA5's EDA).")
_BLOCK_MB = flags.DEFINE_integer("block_mb", convert.BLOCK_BYTES // 2**20,
                                 "With --from: MB of data held in memory at a time.")
_RESOLUTION = flags.DEFINE_float("resolution", 5.625, "Grid spacing, degrees.")
_GRID = flags.DEFINE_string("grid", "", "A grid of points instead of the regular one of "
                            "--resolution: O<N> (octahedral reduced Gaussian, e.g. O32) or "
                            "H<nside> (HEALPix, e.g. H16).")
_REGION = flags.DEFINE_string("region", "", "A regional store: the regular grid of "
                              "--resolution inside the box lat0,lat1,lon0,lon1 (degrees), e.g. "
                              "40,60,0,30, to cut into a global store (data.regional_path).")
_START = flags.DEFINE_string("start", "2020-01-01", "First day (00 UTC); with --from: the "
                             "first time to keep (default: the files' first).")
_END = flags.DEFINE_string("end", "2020-12-31", "Last day (inclusive); with --from: the last "
                           "time to keep (default: the files' last).")
_LEVELS = flags.DEFINE_list("levels", ["13"],
                            "Pressure levels in hPa (e.g. 500,850), or 13 for WeatherBench2's "
                            "13 levels, 37 for ERA5's 37.")
_VARIABLES = flags.DEFINE_list("variables", None,
                               "Variables to write; default: all.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the synthetic fields.")
_ZARR_FORMAT = flags.DEFINE_enum("zarr_format", "2", ["2", "3"],
                                 "Zarr format (WB2 publishes v2).")
_TIME_STEP_HOURS = flags.DEFINE_integer("time_step_hours", 6,
                                        "Hours between time steps.")
_STATIONS = flags.DEFINE_integer("stations", None, "Write an observation store instead "
                                 "(wnscale.data.reading.observations): a synthetic network of this "
                                 "many stations observing the grid store --from_store.")
_FROM_STORE = flags.DEFINE_string("from_store", None, "With --stations: the grid store the "
                                  "stations observe (its surface variables, or --variables).")
_STATION_NOISE = flags.DEFINE_float("station_noise", stations.NOISE, "With --stations: "
                                    "noise added, a fraction of each quantity's std.")
_STATION_MISSING = flags.DEFINE_float("station_missing", stations.MISSING, "With --stations: "
                                      "the fraction of values missing (NaN).")
_LEVEL_PRESETS = {"13": variables.WB2_LEVELS_13, "37": variables.ERA5_LEVELS_37}
# Flags that say what a synthetic store holds (a conversion keeps what its files hold), and
# flags of a conversion alone: given to the other kind of store, they would do nothing.
_SYNTHETIC_ONLY = ("config", "resolution", "grid", "region", "levels", "variables", "seed",
                   "zarr_format", "time_step_hours")
_CONVERSION_ONLY = ("member", "block_mb")
# Flags of a grid store, which a station network (--stations) takes from --from_store.
_GRID_FLAGS = tuple(sorted(set(_SYNTHETIC_ONLY + _CONVERSION_ONLY + ("from", "start", "end",
                                                                       "runner"))
                           - {"seed", "variables"}))
# `_store_settings`' keys and the flags that set them.
_SETTING_FLAGS = {"resolution": "resolution", "grid_name": "grid", "region": "region",
                  "start": "start",
                  "end": "end", "levels": "levels", "variables": "variables",
                  "time_step_hours": "time_step_hours", "seed": "seed"}


def _check_flags_apply():
  """A flag that does nothing for this kind of store is an error, not silently ignored."""
  if _STATIONS.value is not None or _FROM_STORE.value is not None:
    if _STATIONS.value is None or _FROM_STORE.value is None:
      raise UserError("--stations and --from_store go together: a network of --stations "
                      "stations observing the grid store --from_store.")
    unused = [f"--{name}" for name in _GRID_FLAGS if flags.FLAGS[name].present]
    if unused:
      raise UserError(f"{', '.join(sorted(unused))}: a station network (--stations) takes its "
                      "grid and times from --from_store; drop these flags.")
    return
  for name in ("station_noise", "station_missing"):
    if flags.FLAGS[name].present:
      raise UserError(f"--{name}: this flag is for a station network (--stations).")
  converting = bool(_FROM.value)
  unused = [f"--{name}" for name in (_SYNTHETIC_ONLY if converting else _CONVERSION_ONLY)
            if flags.FLAGS[name].present]
  if unused:
    raise UserError(
        f"{', '.join(unused)}: " + (
            "a conversion (--from) keeps the grid, variables, levels and times of its "
            "files (choose times with --start/--end); drop these flags." if converting else
            "these flags are for converting files (--from); a synthetic store has none."))


def _levels(values: list[str]) -> list[int]:
  if len(values) == 1 and values[0] in _LEVEL_PRESETS:
    return list(_LEVEL_PRESETS[values[0]])
  try:
    return [int(value) for value in values]
  except ValueError:
    raise UserError(f"--levels={','.join(values)}: give pressure levels in hPa (e.g. 500,850), "
                    "13 or 37.") from None


def _store_settings() -> dict:
  """The store's contents: from the flags, or from `--config` with the flags given
  replacing their part of it."""
  if _GRID.value and flags.FLAGS["resolution"].present:
    raise UserError(f"--grid={_GRID.value} and --resolution: a store has one grid; give one.")
  given = dict(resolution=_RESOLUTION.value, grid_name=_GRID.value, region=_REGION.value,
               start=_START.value,
               end=_END.value, levels=_levels(_LEVELS.value), variables=_VARIABLES.value,
               time_step_hours=_TIME_STEP_HOURS.value, seed=_SEED.value)
  if _CONFIG.value is None:
    return given
  data = specs_lib.from_config(config_lib.validate(_CONFIG.value)).data
  start, end, names, levels = run_data.synthetic_store_contents(data)
  settings = dict(resolution=data.resolution, grid_name=data.grid, start=start, end=end,
                  levels=levels, variables=names, time_step_hours=data.time_step_hours,
                  seed=_CONFIG.value.seed)
  if flags.FLAGS["resolution"].present:
    settings["grid_name"] = ""  # the regular grid of --resolution, not the config's grid
  settings.update({key: given[key] for key, flag in _SETTING_FLAGS.items()
                   if flags.FLAGS[flag].present})
  return settings


def _disk_bytes(path: str) -> int | None:
  if paths.is_url(path):
    return None
  return sum(os.path.getsize(os.path.join(root, name))
             for root, _, names in os.walk(path) for name in names)


def main(argv):
  _check_flags_apply()
  if _STATIONS.value is not None:
    if not paths.exists(_FROM_STORE.value):
      raise ArgumentError("from_store", _FROM_STORE.value, "no grid store there.")
    path = stations.write_network(_FROM_STORE.value, _OUT.value, _STATIONS.value,
                                  variables=_VARIABLES.value, seed=_SEED.value,
                                  noise=_STATION_NOISE.value, missing=_STATION_MISSING.value,
                                  overwrite=cli.overwrite())
    print(f"wrote {path} ({_STATIONS.value:,} stations; {size_text(_disk_bytes(path) or 0)} "
          "on disk)")
    return
  for_each = runner.for_each(argv, "write times")
  if for_each is not None and not _FROM.value:
    raise UserError(f"--runner={runner.RUNNER.value}: a Beam pipeline converts files "
                    "(--from); a synthetic store is written here, without --runner.")
  if _FROM.value:
    given = {name: flags.FLAGS[name].present for name in ("start", "end")}
    settings = dict(member=_MEMBER.value, start=_START.value if given["start"] else None,
                    end=_END.value if given["end"] else None, overwrite=cli.overwrite(),
                    block_bytes=_BLOCK_MB.value * 2**20)
    path = (convert.convert_era5(_FROM.value, _OUT.value, **settings) if for_each is None
            else convert_beam.convert_era5(for_each, _FROM.value, _OUT.value, **settings))
  else:
    path = synthetic.write_synthetic_store(_OUT.value, zarr_format=int(_ZARR_FORMAT.value),
                                           overwrite=cli.overwrite(), **_store_settings())
  size = _disk_bytes(path)
  print(f"wrote {path}" + (f" ({size_text(size)} on disk)" if size is not None else ""))


if __name__ == "__main__":
  cli.run(main, required=("out",), writes_workdir=False,
          unknown_flag_hint=runner.UNKNOWN_FLAG_HINT)
