"""Test setup: 8 fake CPU devices (or one accelerator: `WNSCALE_TEST_PLATFORM`) and a fresh
cache, set before jax is imported anywhere."""

import atexit
import fcntl
import os
import pickle
import shutil
import tempfile

import pytest

import graphcast_runs
import tiny_runs
from wnscale import host_memory

# WNSCALE_TEST_PLATFORM=tpu (or gpu): the tests that need one device run on that accelerator
# (bench/accelerator_check.py runs them there); the default is 8 fake CPU devices.
PLATFORM = os.environ.get("WNSCALE_TEST_PLATFORM", "cpu")
os.environ["JAX_PLATFORMS"] = PLATFORM
if PLATFORM == "cpu":
  # With libtpu installed (TPU AOT tests): quiet its start-up, allow several processes.
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  os.environ["XLA_FLAGS"] = (
      os.environ.get("XLA_FLAGS", "")
      # 8 fake devices for the sharding tests.
      + " --xla_force_host_platform_device_count=8"
      # XLA:CPU's default (concurrency-optimized) scheduler hoists the recomputation
      # that remat adds, so memory_analysis would hardly show remat; the sequential
      # one does not.
      + " --xla_cpu_enable_concurrency_optimized_scheduler=false"
      # Tests compile many small programs: cheap compiles (tiny_runs.py says how much).
      + " " + tiny_runs.FAST_COMPILE_XLA_FLAGS
  )
# Huge pages for the large host buffers of the xdist workers (started after this file is
# read) and of every process a test starts, as the launchers give themselves.
host_memory.set_for_new_processes()
# A cache of this test session's own (graphs, synthetic stores, remat plans), never
# the user's, and never one left by an earlier session: what the tests build, they
# build. Subprocesses inherit it through the environment.
_CACHE = tempfile.mkdtemp(prefix="wnscale-test-cache-")
os.environ["WNSCALE_CACHE_DIR"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

import absl.flags  # noqa: E402
import jax  # noqa: E402

if PLATFORM == "cpu":
  # The CPU backend reads XLA_FLAGS once, when it starts: start it, then take out the flag
  # that libtpu (loaded later by the TPU-topology tests in this process) would abort on.
  jax.devices()
  os.environ["XLA_FLAGS"] = os.environ["XLA_FLAGS"].replace(tiny_runs.CPU_ONLY_XLA_FLAG, "")
else:
  # An accelerator's float32 matmuls default to fewer bits (bfloat16 passes on a TPU): the
  # equality tests compare at float32 precision, as on a CPU.
  jax.config.update("jax_default_matmul_precision", "highest")

# Grain reads absl flags in its workers; outside absl.app.run they must be parsed.
absl.flags.FLAGS.mark_as_parsed()

# The longest files (minutes each on 2 cores) start first, so that none starts last on a
# worker while the others have finished; the order only changes how soon the suite ends.
# Longest first by their seconds at the last timed run; the accelerator check (one test
# of 2 minutes, no shared run) before the files that wait on the trained tiny run.
LONGEST_FIRST = ("test_accelerator_check.py", "test_training.py", "test_interrupts.py",
                 "test_bad_input.py", "test_cli.py", "test_sharding.py", "test_planner.py",
                 "test_modalities.py", "test_existing_data.py", "test_transformer.py",
                 "test_forecast_end_to_end.py", "test_accumulation.py", "test_ensemble.py",
                 "test_remat.py", "test_compilation_cache.py", "test_gencast_training.py",
                 "test_forecast.py", "test_gencast_forecast.py", "test_trackers.py",
                 "test_remote_storage.py", "test_weathernext2_export.py", "test_stations.py")


# tryfirst: before pytest-xdist's own hook, which reads the groups into the test ids.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
  """Groups tests for pytest-xdist (`--dist loadgroup`), one group per file, so that a
  module's fixtures are made once; the longest files go first."""
  for item in items:
    item.add_marker(pytest.mark.xdist_group(item.path.name))

  def rank(item):
    name = item.path.name
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

  items.sort(key=rank)  # stable: tests keep their order within a file


def _made_once(tmp_path_factory, name: str, make):
  """`make(directory)`'s result, made once in the test session whichever pytest-xdist worker
  asks first; the others wait for it and read what it made. (The shared runs are read by
  several files: a group of their own would run those files one after another.)"""
  base = tmp_path_factory.getbasetemp()
  # Under xdist each worker's base is a folder of the session's; without, the session's.
  root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
  result = root / f"{name}.pickle"
  with open(root / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the worker dies
    if not result.exists():
      directory = root / name
      shutil.rmtree(directory, ignore_errors=True)  # a worker that died making it
      directory.mkdir()
      result.write_bytes(pickle.dumps(make(str(directory))))
    return pickle.loads(result.read_bytes())


@pytest.fixture(scope="session")
def trained_tiny_run(tmp_path_factory) -> str:
  """The workdir of one uninterrupted run of `tiny_runs.RUN_FLAGS`: 1 process x 4
  devices, graph sharded 4 ways, 12 steps. Shared: read it, copy it to write."""
  def make(workdir):
    tiny_runs.run(workdir)
    return workdir

  return _made_once(tmp_path_factory, "trained_tiny_run", make)


@pytest.fixture(scope="session")
def trained_station_run(tmp_path_factory) -> tiny_runs.StationRun:
  """configs/tiny_stations.py's run of `tiny_runs.STATION_FLAGS` (2 graph shards, 12 steps),
  killed with SIGKILL after step 8 and resumed to the end. Shared: read it, copy it to
  write."""
  return _made_once(tmp_path_factory, "trained_station_run",
                    tiny_runs.killed_and_resumed_station_run)


@pytest.fixture(scope="session")
def graphcast_import(tmp_path_factory) -> graphcast_runs.Imported:
  """The 5.625 deg GraphCast fixture imported, and a config to fine-tune it
  (`graphcast_runs.import_fixture`). Shared: read it, copy it to write."""
  return _made_once(tmp_path_factory, "graphcast_import", graphcast_runs.import_fixture)


@pytest.fixture(scope="session")
def fine_tuned_import(graphcast_import, tmp_path_factory) -> str:
  """The workdir of a run fine-tuned from `graphcast_import` with its config. Shared:
  read it, copy it to write."""
  return _made_once(tmp_path_factory, "fine_tuned_import",
                    lambda workdir: graphcast_runs.fine_tune(graphcast_import, workdir))
