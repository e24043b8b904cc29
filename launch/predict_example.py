"""Predicts for a GraphCast example file, writing predictions in GraphCast's format.

  python -m launch.predict_example --workdir=WORKDIR --example=EXAMPLE.nc --out=PREDICTIONS.nc
  python -m launch.predict_example ... --steps=4   # 4 lead times (the example must cover them)
  python -m launch.predict_example ... --members=2 --noise=7   # an FGN's ensemble (WeatherNext 2)
  # GenCast's denoiser: 8 members, member k as launch.forecast --members samples it
  python -m launch.predict_example --workdir=RUN --example=EXAMPLE.nc --out=P.nc --members=8

`WORKDIR` is a run directory (`launch.import_graphcast`'s, or a trained run's). An
existing PREDICTIONS.nc is replaced only with --overwrite (`wnscale.outputs`).
"""

from absl import flags

from launch import cli  # before JAX's backend starts: it quiets libtpu
from wnscale import outputs

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory.")
_EXAMPLE = flags.DEFINE_string("example", None, "GraphCast example file (.nc).")
_OUT = cli.define_output("out", "Predictions file (.nc) to write.", outputs.NETCDF)
_STEPS = flags.DEFINE_integer("steps", None,
                              "Lead times to predict (default: the example's targets).")
_MEMBERS = flags.DEFINE_integer(
    "members", None, "An ensemble run's size (an FGN, or GenCast's denoiser): members "
    "0..N-1 along a `sample` dim.")
_PARAMS = cli.define_params()
_NOISE = flags.DEFINE_string("noise", None, "An FGN's noise: a .npz whose 'noise' is "
                             "[members, K] or [members, steps, K], or an integer seed; "
                             "a denoiser's: an integer seed (default: the run's, as "
                             "launch.forecast's).")


def main(argv):
  del argv
  # Imported here: a mistake in the flags is reported before this slow import.
  from wnscale.interop.graphcast_example import predict_example  # noqa: PLC0415
  predict_example(_WORKDIR.value, _EXAMPLE.value, _OUT.value, _STEPS.value,
                  overwrite=cli.overwrite(), members=_MEMBERS.value, noise=_NOISE.value,
                  params=_PARAMS.value)


if __name__ == "__main__":
  cli.run(main, required=("workdir", "example", "out"), writes_workdir=False)
