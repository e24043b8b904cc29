"""Which files the config enters on the path of a training run or a forecast (its walk).

  python -m tools.config_walk [--config=configs/tiny.py] [--config.a.b=v ...]
  python -m tools.config_walk --forecast [--config=...] [--config.a.b=v ...]

Trains the config (by default `configs/tiny.py`, with `remat_policy='auto'` so that the
planner's path is walked too) for 2 steps, one evaluation and one checkpoint, in a fresh
workdir and a fresh cache directory, through `launch.train`'s `main`. With --forecast,
that run is trained in a child process and the walk is of `launch.forecast`'s `main`
from it instead (a 12 h lead from one initial time). A file of `wnscale/` or `launch/`
counts when a config (an `ml_collections.ConfigDict`, or a section of it) enters it: one
of its functions is called with one among its arguments, or its code reads one (a key,
an iteration, a copy, a JSON dump). Prints those files, with how many times, then how
many there are. Below the entry point (which makes the specs once: `wnscale.specs`) the
code should see specs, not the config.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import tempfile
import threading

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import ml_collections  # noqa: E402

_READS = ("__getattr__", "__getitem__", "__contains__", "__iter__", "get", "items", "keys",
          "values", "to_dict", "to_json", "to_json_best_effort", "update",
          "copy_and_resolve_references")
_OWN = tuple(os.path.join(REPO, package) + os.sep for package in ("wnscale", "launch"))
TRAINING = ("--config.train.steps=2", "--config.train.eval_every=2",
            "--config.train.eval_batches=1", "--config.train.checkpoint_every=2",
            "--config.train.trackers=()", "--config.model.remat_policy=auto",
            "--config.train.memory_budget_gib=8")
FORECAST = ("--lead=12h", "--init_times=2020-11-02T00")  # inside the default eval range


def _own_file(frame) -> str | None:
  """The repository file of the innermost frame of our code from `frame` outwards."""
  while frame is not None:
    name = frame.f_code.co_filename
    if name.startswith(_OWN):
      return os.path.relpath(name, REPO)
    frame = frame.f_back
  return None


def record(entered: collections.Counter):
  """Counts into `entered`, by file, the calls that receive a config and the config's reads
  (until `stop_recording`)."""
  for method in _READS:
    original = getattr(ml_collections.ConfigDict, method, None)
    if original is None:
      continue

    def patched(self, *args, _original=original, **kwargs):
      file = _own_file(sys._getframe(1))
      if file is not None:
        entered[file] += 1
      return _original(self, *args, **kwargs)

    setattr(ml_collections.ConfigDict, method, patched)

  def profile(frame, event, _):
    if event == "call" and frame.f_code.co_filename.startswith(_OWN):
      arguments = frame.f_code.co_varnames[:frame.f_code.co_argcount
                                           + frame.f_code.co_kwonlyargcount]
      if any(isinstance(frame.f_locals.get(name), ml_collections.ConfigDict)
             for name in arguments):
        entered[os.path.relpath(frame.f_code.co_filename, REPO)] += 1

  sys.setprofile(profile)
  threading.setprofile(profile)


def stop_recording():
  sys.setprofile(None)
  threading.setprofile(None)


def walk(launcher, argv: list[str], **run_options) -> collections.Counter:
  """The files a config enters while `launcher` (a module of `launch/`) runs with `argv`."""
  from launch import cli  # noqa: PLC0415 (after the path is set)
  entered = collections.Counter()
  sys.argv = [launcher.__name__, *argv]
  record(entered)
  try:
    cli.run(launcher.main, **run_options)
  except SystemExit as exit:
    if exit.code not in (0, None):
      raise
  finally:
    stop_recording()
  return entered


def main():
  args = sys.argv[1:]
  forecast = "--forecast" in args
  config = [arg for arg in args if arg.startswith("--config=")] or ["--config=configs/tiny.py"]
  overrides = [arg for arg in args if not arg.startswith("--config=") and arg != "--forecast"]
  with tempfile.TemporaryDirectory() as temporary:
    os.environ["WNSCALE_CACHE_DIR"] = os.path.join(temporary, "cache")
    training = [*config, f"--workdir={temporary}/run", *TRAINING, *overrides]
    if forecast:
      subprocess.run([sys.executable, "-m", "launch.train", *training], cwd=REPO, check=True,
                     capture_output=True)
      from launch import forecast as launcher  # noqa: PLC0415
      entered = walk(launcher, [f"--workdir={temporary}/run", f"--out={temporary}/f.zarr",
                                *FORECAST], required=("workdir", "out"),
                     writes_workdir=False)
    else:
      from launch import train as launcher  # noqa: PLC0415
      entered = walk(launcher, training, required=("config", "workdir"),
                     lock_workdir=lambda: True)
  for file, count in sorted(entered.items()):
    print(f"{count:>7}  {file}")
  print(f"The config enters {len(entered)} files "
        f"({len([f for f in entered if f.startswith('wnscale')])} of them in wnscale/).")


if __name__ == "__main__":
  main()
