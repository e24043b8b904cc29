r"""Forecasts from a trained run into a WeatherBench2-layout zarr store.

  python -m launch.forecast --workdir=/tmp/wnscale_tiny --out=/tmp/tiny_forecast.zarr \
      --init_start=2020-11-01 --init_end=2020-11-30 --init_every=12h --lead=5d
  # chosen initial times, a checkpoint step, another store, the graph over 4 devices
  python -m launch.forecast --workdir=DIR --out=F.zarr --init_times=2020-11-01T00,2020-11-02T12 \
      --step=100 --data.path=/data/era5.zarr --mesh.graph=4 --platform=cpu --num_cpu_devices=4
  # an FGN run (model.noise_channels > 0): an 8-member ensemble (a `number` dim)
  python -m launch.forecast --workdir=DIR --out=ENS.zarr --members=8 --lead=5d
  # GenCast's denoiser (imported or trained): 8 members, each lead time one run of its sampler
  python -m launch.forecast --workdir=RUN --out=ENS.zarr --members=8 --lead=15d \
      --data.path=/data/era5_1deg_13levels.zarr --data.resolution=1.0 --init_times=2022-01-01T12
  # one process of several, as launch.train (on Cloud TPU no flags are needed)
  python -m launch.forecast --coordinator_address=host:port --num_processes=2 --process_id=0 ...
  python -m launch.local_cluster --num_processes=2 --num_cpu_devices=4 --module=launch.forecast \
      -- --workdir=DIR --out=F.zarr --mesh.graph=4

A run on a point set (a reduced Gaussian grid, an anemoi-datasets store's points) writes
the same layout with one dim `values` in place of `latitude, longitude`, and
`latitude(values)`, `longitude(values)` coordinates. A run with a target modality
(data.modalities, e.g. configs/tiny_stations.py) adds it as a group, F.zarr/stations:
dims (time, prediction_timedelta, station), latitude, longitude and station_id along
station; its inputs at the initial times come from its observation store, later steps
read the model's own station predictions (launch.evaluate --observations scores them).

Run the same command again after a crash or a full disk: finished initial times are
kept and the rest are forecast. Ctrl-C (or SIGTERM) stops after the lead time being
computed and says how many initial times the store holds (exit status 0; a second
Ctrl-C stops at once). The last line printed is a JSON summary (speed, memory).

On several processes the mesh spans them all; each writes a share of the store. Ctrl-C
or SIGTERM to any one stops every process after the initial times being computed.
"""

import json

from absl import flags

from launch import cli  # before JAX's backend starts: it quiets libtpu
from launch import process
from wnscale import outputs
from wnscale.data.reading.store import NanError, SpacingError
from wnscale.errors import StoreLacks, UserError
from wnscale.inference.forecast import run_forecast
from wnscale.sharding.exchange import MODES as EXCHANGE_MODES

_WORKDIR = flags.DEFINE_string("workdir", None, "Training run directory.")
_OUT = cli.define_output("out", "Forecast zarr store to write (or to continue: the same "
                         "command continues a forecast cut short).", outputs.FORECAST)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the newest).")
_INIT_TIMES = flags.DEFINE_list("init_times", None, "Initial times, e.g. 2020-11-01T00,...")
_INIT_START = flags.DEFINE_string("init_start", None,
                                  "First initial time (default: the run's eval range).")
_INIT_END = flags.DEFINE_string("init_end", None, "Last initial time (a date: its whole day).")
_INIT_EVERY = flags.DEFINE_string("init_every", "12h", "Interval between initial times.")
_LEAD = flags.DEFINE_string("lead", "10d", "Longest lead time, a multiple of the model step.")
_DATA_PATH = flags.DEFINE_string("data.path", None,
                                 "Initial conditions from this store (same variables).")
_RESOLUTION = flags.DEFINE_float("data.resolution", None,
                                  "Their grid spacing in degrees (default: the run's "
                                  "data.resolution; an imported run's grid is not in its "
                                  "checkpoint).")
_MESH_DATA = flags.DEFINE_integer("mesh.data", None, "Devices along the batch axis (-1: rest).")
_MESH_GRAPH = flags.DEFINE_integer("mesh.graph", None, "Devices along the space axis.")
_MESH_EXCHANGE = flags.DEFINE_enum("mesh.exchange", None, list(EXCHANGE_MODES),
                                   "How graph shards exchange rows.")
_MEMBERS = flags.DEFINE_integer(
    "members", None, "An ensemble run's size (an FGN, or GenCast's denoiser): members "
    "0..N-1 along a `number` dim, member k's noise fixed by (the run's seed, initial time, k).")
_PARAMS = cli.define_params()


def main(argv):
  del argv
  process.start()
  mesh = {key: flag.value for key, flag in [("data", _MESH_DATA), ("graph", _MESH_GRAPH),
                                            ("exchange", _MESH_EXCHANGE)]
          if flag.value is not None}
  try:
    summary = run_forecast(_WORKDIR.value, _OUT.value, lead=_LEAD.value,
                           init_times=_INIT_TIMES.value, init_start=_INIT_START.value,
                           init_end=_INIT_END.value, init_every=_INIT_EVERY.value,
                           step=_STEP.value, data_path=_DATA_PATH.value,
                           resolution=_RESOLUTION.value,
                           mesh_overrides=mesh, members=_MEMBERS.value,
                           params=_PARAMS.value)
  except StoreLacks as error:  # the store's advice (data.variables) is the training run's
    which = ("--data.path" if _DATA_PATH.value else f"the store the run {_WORKDIR.value} "
             "trained on")
    raise UserError(f"The store {error.path} ({which}) lacks {error.what} that the run "
                    f"{_WORKDIR.value} reads; it has {error.have}. Give --data.path a store "
                    "with the run's variables and levels (data.variables and "
                    "data.pressure_levels of its config.json)" + (
                        ", or leave --data.path out to read the run's own store."
                        if _DATA_PATH.value else ".")) from error
  except SpacingError as error:  # an imported run's config holds the default resolution
    raise UserError(f"{error}: give the store's spacing, --data.resolution="
                    f"{error.spacing[0]:g} (an imported run's config does not know its "
                    "grid).") from error
  except NanError as error:  # the store's advice (data.fill_nan) is the training run's
    raise UserError(f"{error.problem}. A forecast does not fill NaN: choose initial times "
                    "whose states are whole (--init_times, --init_start/--init_end), "
                    "initial conditions from another store (--data.path), or repair the "
                    "store.") from error
  print(json.dumps(summary))
  process.stop()


if __name__ == "__main__":
  cli.run(main, required=("workdir", "out"), writes_workdir=False)
