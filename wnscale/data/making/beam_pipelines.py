"""Work items run as an Apache Beam pipeline: here on the DirectRunner, or on Dataflow,
Flink or Spark.

  options = beam_pipelines.options("DataflowRunner", ["--project=P", "--region=R",
                                                      "--temp_location=gs://B/tmp"])
  beam_pipelines.for_each(options, "write times")(function, items)

`options` checks the runner's name and Beam's own pipeline options (`--project`,
`--temp_location`, `--setup_file`, ...; an unknown one is an error, with the nearest
known one) and returns them. `for_each` returns `(function, items) -> None`, which
calls `function(item)` for every item on the runner's workers, in any order, and
returns when every call has (the first error of one is raised here; it waits for a
pipeline on a cluster too, so `--no_wait_until_finish` is refused). `function`
and the items are pickled to the workers: a module-level function, or a
`functools.partial` of one, whose arguments pickle.

Apache Beam is an optional dependency (`pip install 'wnscale[beam]'`; on Dataflow,
`apache-beam[gcp]`), imported only here, when a pipeline is asked for.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import io
import logging
import re
from collections.abc import Callable, Iterable, Sequence

from wnscale.errors import ArgumentError, UserError


def _beam():
  # Beam's import notes the Google Cloud clients it lacks (BigQuery's), which no pipeline
  # here uses.
  logging.disable(logging.WARNING)
  try:
    import apache_beam  # noqa: PLC0415 (optional: only Beam runs need it)
  except ImportError as error:
    raise UserError(f"A Beam pipeline (`runner`) needs Apache Beam, which is not installed "
                    f"({error}); pip install 'wnscale[beam]'.") from error
  finally:
    logging.disable(logging.NOTSET)
  return apache_beam


def options(runner: str, args: Sequence[str]):
  """Beam's `PipelineOptions` for `runner` (e.g. "DirectRunner", "DataflowRunner") and
  Beam's own options `args` (e.g. `["--project=P", "--region=R"]`), checked as Beam
  checks them when a pipeline starts (e.g. Dataflow's `--temp_location` in a bucket).

  Raises:
    ArgumentError: of `runner`: it is unknown or cannot be used here (e.g. Dataflow
      without `apache-beam[gcp]`), or Beam's validation of it with `args` fails.
    UserError: an option is unknown or has a bad value, or `args` names the runner
      again.
  """
  _beam()
  from apache_beam.options.pipeline_options import (  # noqa: PLC0415
      PipelineOptions, StandardOptions)
  from apache_beam.options.pipeline_options_validator import (  # noqa: PLC0415
      PipelineOptionsValidator)
  from apache_beam.runners.runner import create_runner  # noqa: PLC0415
  args = list(args)
  if any(re.match(r"--?runner(=|$)", arg) for arg in args):
    raise UserError(f"Beam's options {' '.join(args)} name the runner again; give it once, "
                    "as `runner` alone.")
  try:
    runner_object = create_runner(runner)
  except (ValueError, ImportError) as error:
    raise ArgumentError("runner", runner, " ".join(str(error).split())) from error
  if "dataflow" in type(runner_object).__name__.lower() and importlib.util.find_spec(
      "google.cloud.dataflow") is None:  # Beam says so only once the job is submitted
    raise ArgumentError("runner", runner, "needs Beam's Google Cloud clients: pip install "
                        "'apache-beam[gcp]'.")
  pipeline_options = PipelineOptions(args, runner=runner)
  parsers = []
  beam_log = logging.getLogger("apache_beam.options.pipeline_options")
  level = beam_log.level
  beam_log.setLevel(logging.ERROR)  # its warning of unknown options: an error below
  try:
    with contextlib.redirect_stderr(io.StringIO()) as said:
      # Every option Beam knows, in the parser it reads them with.
      pipeline_options.get_all_options(add_extra_args_fn=parsers.append)
      _, unknown = parsers[0].parse_known_args(args)
  except SystemExit:  # argparse's way of saying a value is bad, after its usage text
    raise UserError(f"Beam's options {' '.join(args)}: "
                    f"{said.getvalue().strip().splitlines()[-1].split(': error: ', 1)[-1]}"
                    ) from None
  finally:
    beam_log.setLevel(level)
  if unknown:
    known = [name for action in parsers[0]._actions for name in action.option_strings]
    nearest = difflib.get_close_matches(unknown[0].split("=", 1)[0], known, n=1)
    raise UserError(f"{unknown[0]} is not one of Beam's pipeline options"
                    + (f"; did you mean {nearest[0]}?" if nearest else "")
                    + " (Beam's options go after --; this command's own flags before it).")
  if pipeline_options.view_as(StandardOptions).no_wait_until_finish:
    raise UserError("Beam's option no_wait_until_finish: the command marks its output "
                    "complete when the pipeline has finished, so it waits for it; leave the "
                    "option out.")
  errors = PipelineOptionsValidator(pipeline_options, runner_object).validate()
  if errors:
    raise ArgumentError("runner", runner, f"with Beam's options {args}: "
                        + "; ".join(" ".join(error.split()) for error in errors))
  return pipeline_options


def for_each(pipeline_options, label: str) -> Callable[[Callable, Iterable], None]:
  """`(function, items) -> None`: `function(item)` for every item, as one Beam pipeline
  named `label`, on the runner of `pipeline_options` (see the module docstring)."""
  beam = _beam()
  from apache_beam.options.pipeline_options import StandardOptions  # noqa: PLC0415
  from apache_beam.runners.runner import PipelineState  # noqa: PLC0415

  def run(function: Callable, items: Iterable):
    items = list(items)
    runner = pipeline_options.view_as(StandardOptions).runner
    logging.info("%s: %d work items, as a Beam pipeline on %s.", label, len(items), runner)
    # Beam logs a failed call's traceback, then raises its error here: once is enough.
    logging.getLogger("apache_beam.runners.common").setLevel(logging.CRITICAL)
    pipeline = beam.Pipeline(options=pipeline_options)
    _ = (pipeline | f"{label}: items" >> beam.Create(items)
         | f"{label}: spread" >> beam.Reshuffle()  # over the workers, not fused to one
         | label >> beam.Map(function))
    state = pipeline.run().wait_until_finish()  # a failed call's error is raised here
    if state != PipelineState.DONE:  # e.g. cancelled
      raise UserError(f"The Beam pipeline {label!r} on {runner} ended {state}; what it "
                      "writes is left marked incomplete. Run the command again.")

  return run
