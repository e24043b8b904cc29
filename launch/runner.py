"""The `--runner` flag: a launcher's work as an Apache Beam pipeline, with Beam's own
options after `--`.

  python -m launch.make_climatology --store=... --out=... --runner=DataflowRunner -- \
      --project=P --region=R --temp_location=gs://B/tmp --setup_file=./pyproject.toml

Without `--runner` the work runs in the launcher's process. `--runner=DirectRunner`
runs the pipeline here; DataflowRunner, FlinkRunner, SparkRunner (or a runner's full
class name) run it there, configured by Beam's pipeline options, which follow `--`
as Beam's own commands take them (`wnscale.data.making.beam_pipelines`).
"""

from absl import flags

from wnscale.data.making import beam_pipelines
from wnscale.errors import UserError

RUNNER = flags.DEFINE_string(
    "runner", None, "Run as an Apache Beam pipeline on this runner: DirectRunner (here), "
    "DataflowRunner, FlinkRunner, SparkRunner; Beam's pipeline options (--project, "
    "--region, --temp_location, --setup_file, ...) follow --. Default: in this process.")
# For cli.run: an unknown flag may be one of Beam's options, given before `--`.
UNKNOWN_FLAG_HINT = ("Beam's pipeline options (--project, --temp_location, ...) go after "
                     "--runner=... and --, e.g. --runner=DataflowRunner -- --project=P")


def for_each(argv: list[str], label: str):
  """`beam_pipelines.for_each` on `--runner` with Beam's options `argv[1:]` (what follows
  `--`), for work items labelled `label`; None without `--runner`.

  Raises:
    UserError: a bad runner or option, or options after `--` without `--runner`.
  """
  beam_args = argv[1:]
  if RUNNER.value is None:
    if beam_args:
      raise UserError(f"{' '.join(beam_args)}: what follows -- is Beam's pipeline options, "
                      "for a run with --runner=...; give --runner, or leave them out.")
    return None
  return beam_pipelines.for_each(beam_pipelines.options(RUNNER.value, beam_args), label)
