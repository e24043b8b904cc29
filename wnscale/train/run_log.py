"""What a training run tells the user: set-up phases with their times, and the summary.

The log says what the run does: each set-up phase and its time, a fresh start
or the checkpoint it resumes from, each checkpoint save and how long it held
the loop, and a summary at the end (steps, times, final loss and evaluation,
where every output is). Process 0 speaks for the run.
"""

from __future__ import annotations

import contextlib
import logging
import time

import jax
import numpy as np

from wnscale import paths
from wnscale.errors import raise_if_interrupted
from wnscale.train import workdir as workdir_lib
from wnscale.train.optimizer import TRAINED
from wnscale.train.run_directory import RunDirectory


@contextlib.contextmanager
def phase(what: str):
  """Logs `what`, the block's seconds, and the `"text"` it puts in the yielded dict."""
  start = time.perf_counter()
  details = {}
  yield details
  raise_if_interrupted()  # a Ctrl-C that C code cleared meanwhile: the run stops here
  if jax.process_index() == 0:
    logging.info("%s in %.1f s%s", what, time.perf_counter() - start,
                 f": {details['text']}" if "text" in details else ".")


def describe_data(source, eval_source) -> str:
  """The store, its times and grid, the examples of the train and eval ranges, and each
  modality's stations and store."""
  store = source.store
  ranges = f"train {source.start} .. {source.end} ({len(source):,} examples)"
  if eval_source is not None:
    ranges += f", eval {eval_source.start} .. {eval_source.end} ({len(eval_source):,} examples)"
  first, last = np.datetime_as_string(store.times[[0, -1]], unit="m")
  modalities = "".join(f"; {reader.name}: {reader.points.name} from {reader.path}"
                       for reader in source.modalities)
  return (f"{store.path}, {len(store.times):,} times {first} .. {last} every "
          f"{store.time_step_hours} h, grid {store.points.name}, "
          f"{store.num_channels} channels; {ranges}{modalities}")


def format_rmse(rmse: dict) -> str:
  return ", ".join(f"{name} {value:.4g}" for name, value in rmse.items())


def describe_frozen(counts: dict) -> str:
  """`optimizer.frozen_counts` as "grid_to_mesh (1,234 parameters), processor (...)"."""
  return ", ".join(f"{prefix} ({count:,} parameters)" for prefix, count in counts.items()
                   if prefix != TRAINED)


def summary(start_step, done, wall_seconds, times, last_logged, last_eval, train, workdir,
            checkpoint_steps, store, frozen=None, regional_store: str = "", trackers=()):
  """The end of the run in a few lines: steps, times, final figures, the store, outputs.

  `last_logged`: `(step, metrics)` of the last progress line (step None: there was none);
  `last_eval`: `(step, {channel: RMSE})` of the last evaluation, or None; `frozen`:
  `optimizer.frozen_counts` of `train.freeze`; `trackers`: where each tracker shows the run
  (`TrackedRun.descriptions`).
  """
  logging.info("Run ended at step %d of %d (%d trained now) in %.1f s: set-up %.1f s, compile "
               "%.1f s, training %.1f s, evaluation %.1f s, checkpoint saves blocking %.1f s.",
               done, train.steps, done - start_step, wall_seconds, times["set-up"],
               times["compile"], times["training"], times["evaluation"], times["checkpoint"])
  if last_logged[0] is not None:
    logging.info("Final loss %.5f at step %d.", last_logged[1]["loss"], last_logged[0])
  if last_eval is not None:
    logging.info("Final evaluation (step %d, the first %d batch(es) of the eval range: "
                 "train.eval_batches), RMSE: %s", last_eval[0], train.eval_batches,
                 format_rmse(last_eval[1]))
  elif train.eval_every:
    logging.info("No evaluation in this run (every %d steps).", train.eval_every)
  if train.freeze:
    logging.info("Frozen: %s; %s parameters trained.", describe_frozen(frozen),
                 f"{frozen[TRAINED]:,}")
  if regional_store:  # a cut-out's forecasts are on its points: the region is scored alone
    logging.info("Data: the store %s with the cut-out %s (the truth of the region: "
                 "launch.evaluate --truth=%s --region=cutout).", store, regional_store,
                 regional_store)
  else:
    logging.info("Data: the store %s (the truth for launch.evaluate --truth=...).", store)
  logging.info("Outputs: %s.", _describe_outputs(workdir, checkpoint_steps, trackers))


def _describe_outputs(workdir: str, checkpoint_steps, trackers) -> str:
  """Where every output of a run is."""
  run = RunDirectory(workdir)
  steps = ", ".join(str(step) for step in sorted(checkpoint_steps)) or "none"
  return "; ".join([f"config {run.config_path}",
                    f"metrics {paths.join(workdir, workdir_lib.METRICS)}", *trackers,
                    f"checkpoints {run.checkpoints}/ (steps {steps})"])
