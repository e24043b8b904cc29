"""Predicts for a GraphCast example file, writing predictions in GraphCast's format.

  python -m launch.predict_example --workdir=WORKDIR --example=EXAMPLE.nc --out=PREDICTIONS.nc
  python -m launch.predict_example ... --steps=4   # 4 lead times (the example must cover them)

`WORKDIR` is a run directory (`launch.import_graphcast`'s, or a trained run's).
"""

from absl import app, flags

from wnscale.interop.graphcast_example import predict_example

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory.", required=True)
_EXAMPLE = flags.DEFINE_string("example", None, "GraphCast example file (.nc).", required=True)
_OUT = flags.DEFINE_string("out", None, "Predictions file (.nc) to write.", required=True)
_STEPS = flags.DEFINE_integer("steps", None,
                              "Lead times to predict (default: the example's targets).")


def main(argv):
  del argv
  predict_example(_WORKDIR.value, _EXAMPLE.value, _OUT.value, _STEPS.value)


if __name__ == "__main__":
  app.run(main)
