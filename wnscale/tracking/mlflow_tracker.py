"""MLflow: one MLflow run per workdir (`pip install 'wnscale[mlflow]'`).

Where, by MLflow's conventions: the tracking store `MLFLOW_TRACKING_URI` (a server, a
database); unset, an embedded store in the workdir that needs no server, MLflow's own
default backend (SQLite, since MLflow 3.7 refuses a new file store):
`sqlite:///<workdir>/mlflow/mlflow.db`, artifacts under `<workdir>/mlflow/artifacts/`
(`mlflow ui --backend-store-uri sqlite:///<workdir>/mlflow/mlflow.db` shows it). A
workdir in a bucket needs `MLFLOW_TRACKING_URI`. The experiment is
`MLFLOW_EXPERIMENT_NAME`, else the workdir's name; the run is named after the workdir.

The config is logged as parameters `section.key` (MLflow keeps a parameter's first value:
one a resumed run changed is in its config.json artifact), metrics with their
`metrics.jsonl` names and steps, files as artifacts, the tags as run tags. The run is
RUNNING while training, then FINISHED, KILLED (stopped, e.g. preempted) or FAILED.
Reaching the store at the start tries once, for at most `PROBE_TIMEOUT_S` (unless
`MLFLOW_HTTP_REQUEST_MAX_RETRIES` / `MLFLOW_HTTP_REQUEST_TIMEOUT` say otherwise); later
calls use MLflow's own retries.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import time

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

from wnscale import paths
from wnscale.errors import UserError
from wnscale.tracking import base

DIRECTORY = "mlflow"
PROBE_TIMEOUT_S = 10
_STATUS = {base.FINISHED: "FINISHED", base.STOPPED: "KILLED", base.FAILED: "FAILED"}
_BATCH = 100  # parameters per call (MLflow's limit)
_PARAM_LENGTH = 6000  # MLflow's longest parameter value


class Tracker(base.Tracker):
  """The MLflow run of a workdir (see the module docstring)."""

  def open(self) -> dict:
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    artifacts = None
    if not uri:  # the embedded store in the workdir
      if paths.is_url(self.where.workdir):
        raise UserError(f"train.trackers: mlflow keeps its embedded store in the workdir, "
                        f"and {self.where.workdir} is in a bucket: set MLFLOW_TRACKING_URI "
                        "(an MLflow server, or sqlite:////local/path/mlflow.db).")
      store = pathlib.Path(self.where.workdir, DIRECTORY).absolute()
      store.mkdir(parents=True, exist_ok=True)
      uri, artifacts = f"sqlite:///{store / 'mlflow.db'}", (store / "artifacts").as_uri()
    record = self.where.record or {}
    with _probing():
      try:
        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or self.where.name
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = (experiment.experiment_id if experiment is not None else
                         self.client.create_experiment(name, artifact_location=artifacts))
        self.run_id = self._reopen(record, uri, experiment_id)
      except Exception as error:  # noqa: BLE001 (MLflow's many errors: one line)
        raise UserError(f"train.trackers: mlflow cannot reach its tracking store {uri} "
                        f"({type(error).__name__}: {str(error).splitlines()[0][:300]}); start "
                        "the server or fix MLFLOW_TRACKING_URI, or leave 'mlflow' out of "
                        "train.trackers.") from error
    self.uri, self.experiment_id = uri, experiment_id
    # The embedded store is recorded as such: a workdir moved elsewhere keeps its run.
    return {"tracking_uri": os.environ.get("MLFLOW_TRACKING_URI", ""),
            "experiment_id": experiment_id, "run_id": self.run_id}

  def _reopen(self, record: dict, uri: str, experiment_id: str) -> str:
    """The recorded run; a new run when there is none (or it is gone)."""
    if record.get("run_id") and record.get("tracking_uri") == os.environ.get(
        "MLFLOW_TRACKING_URI", ""):
      try:
        return self.client.get_run(record["run_id"]).info.run_id
      except Exception as error:  # noqa: BLE001 (deleted, or another store's)
        logging.warning("MLflow: the run %s recorded in the workdir is not in %s (%s); "
                        "starting a new one.", record["run_id"], uri, error)
    run = self.client.create_run(experiment_id, run_name=self.where.name,
                                 tags=self.where.tags)
    return run.info.run_id

  def describe(self) -> str:
    if self.uri.startswith(("http://", "https://")):
      return (f"MLflow run {self.run_id}: {self.uri.rstrip('/')}/#/experiments/"
              f"{self.experiment_id}/runs/{self.run_id}")
    return f"MLflow run {self.run_id} in {self.uri} (mlflow ui --backend-store-uri {self.uri})"

  def logged_through(self, resume_step: int) -> dict[str, int]:
    del resume_step
    return {key: max(metric.step for metric in self.client.get_metric_history(self.run_id, key))
            for key in self.client.get_run(self.run_id).data.metrics}

  def begin(self, resume_step: int):
    del resume_step
    self.client.update_run(self.run_id, status="RUNNING")

  def params(self, config: dict):
    flat = {key: str(value)[:_PARAM_LENGTH] for key, value in base.flatten(config).items()}
    held = self.client.get_run(self.run_id).data.params
    new = [Param(key, value) for key, value in flat.items() if key not in held]
    changed = sorted(key for key, value in flat.items() if key in held and held[key] != value)
    if changed:
      logging.info("MLflow keeps a parameter's first value: %s changed in this start (the "
                   "run's config.json artifact has the new values).", ", ".join(changed))
    for start in range(0, len(new), _BATCH):
      self.client.log_batch(self.run_id, params=new[start:start + _BATCH])
    self.client.log_batch(self.run_id, tags=[RunTag(key, value)  # this start's (commit)
                                             for key, value in self.where.tags.items()])

  def log(self, step: int, values: dict):
    now = int(time.time() * 1000)
    self.client.log_batch(self.run_id, metrics=[Metric(name, value, now, step)
                                                for name, value in values.items()])

  def artifact(self, path: str, folder: str, step: int | None = None):
    del step
    self.client.log_artifact(self.run_id, path, folder or None)

  def close(self, status: str | None):
    if status is not None:
      self.client.set_terminated(self.run_id, _STATUS[status])


@contextlib.contextmanager
def _probing():
  """One try, `PROBE_TIMEOUT_S` long, for each request to a tracking server in the block
  (unless the user's environment says otherwise)."""
  settings = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
              "MLFLOW_HTTP_REQUEST_TIMEOUT": str(PROBE_TIMEOUT_S)}
  added = [name for name in settings if name not in os.environ]
  os.environ.update({name: settings[name] for name in added})
  try:
    yield
  finally:
    for name in added:
      os.environ.pop(name, None)
