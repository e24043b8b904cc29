"""Experiment trackers: a run's metrics, config and tags beside `metrics.jsonl`.

`train.trackers` names the trackers of a run (`registry.TRACKERS`: TensorBoard,
MLflow, Weights & Biases), each a module of its own behind one interface
(`base.Tracker`); `run.TrackedRun` drives them for a training run (process 0's):
where each keeps the run, what it logs, resuming the same tracked run, and a
tracker that fails.
"""
