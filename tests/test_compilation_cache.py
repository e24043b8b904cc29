"""JAX's persistent compilation cache in the launchers (`wnscale/compilation_cache.py`): a
second process of the same run loads its train step instead of compiling it; a bucket
keeps the programs, one that cannot be written gives way to the local cache; a cache
directory that is read-only or full never stops a run (one warning).

The runs are real processes of the tiny config, without the test session's own
compilation cache settings (`tiny_runs.fast_compile_env`): the launcher's own apply.
"""

import os
import re
import subprocess
import sys

import gcs
import pytest

from wnscale import config as config_lib
from wnscale.data.making import synthetic
from test_existing_data import tmpfs
from test_interrupts import run_late_peers
from tiny_runs import REPO, losses, process_env

VARIABLES = tuple(config_lib.default_config().data.variables)
FLAGS = ["--config=configs/tiny.py", "--config.train.steps=3", "--config.train.warmup_steps=1",
         "--config.train.log_every=1", "--config.train.eval_every=0",
         "--config.data.train_start=2020-01-01", "--config.data.train_end=2020-01-07",
         "--config.data.eval_start=2020-01-08", "--config.data.eval_end=2020-01-10"]
COMPILED = r"Compiled the train step in [\d.]+ s"
LOADED = COMPILED + ": loaded from the persistent compilation cache"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
  return synthetic.write_synthetic_store(
      str(tmp_path_factory.mktemp("compilation_cache") / "tiny.zarr"), start="2020-01-01",
      end="2020-01-10", levels=(500, 850), variables=VARIABLES)


def environment(cache_dir) -> dict:
  """The session's process environment with `cache_dir` as the cache directory, and the
  compilation cache left to the launcher."""
  env = dict(process_env(), WNSCALE_CACHE_DIR=str(cache_dir))
  for name in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
    env.pop(name, None)
  return env


def train(workdir, cache_dir, store, *extra) -> str:
  """A tiny run to its end in a process of its own; its stderr."""
  result = subprocess.run(
      [sys.executable, "-m", "launch.train", "--platform=cpu", f"--workdir={workdir}",
       *FLAGS, f"--config.data.path={store}", *extra],
      cwd=REPO, env=environment(cache_dir), capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  return result.stderr


def kept(directory, program: str) -> list[str]:
  """The cache entries of `program` (e.g. "jit_train_step") in `directory`."""
  return sorted(name for name in os.listdir(directory)
                if name.startswith(program + "-") and name.endswith("-cache"))


@pytest.mark.slow
def test_a_second_process_loads_the_train_step_from_the_cache(tmp_path, store):
  cache = tmp_path / "cache"
  first = train(tmp_path / "first", cache, store)
  assert f"Persistent compilation cache: {cache / 'jax'}" in first
  assert re.search(COMPILED + r"\.", first) and not re.search(LOADED, first)
  step = kept(cache / "jax", "jit_train_step")
  assert len(step) == 1 and kept(cache / "jax", "jit_init")
  second = train(tmp_path / "second", cache, store)
  assert re.search(LOADED, second), second[-3000:]
  assert kept(cache / "jax", "jit_train_step") == step  # found, not compiled and kept again
  assert losses(tmp_path / "second") == losses(tmp_path / "first")
  off = train(tmp_path / "off", cache, store, "--nocompilation_cache")
  assert "Persistent compilation cache" not in off and not re.search(LOADED, off)


@pytest.mark.slow
def test_a_read_only_or_full_cache_never_stops_a_run(tmp_path, store):
  cache = tmp_path / "cache"
  with tmpfs(cache / "jax", "1m", read_only=True):
    read_only = train(tmp_path / "read_only", cache, store)
  warnings = [line for line in read_only.splitlines() if "Compilation cache" in line]
  assert len(warnings) == 1, read_only[-3000:]
  assert (f"Compilation cache {cache / 'jax'}: cannot write there (Read-only file system); "
          "every program is compiled, none kept." in warnings[0])
  with tmpfs(cache / "jax", "64k"):  # room for the probe, not for a program
    full = train(tmp_path / "full", cache, store)
    cut_short = kept(cache / "jax", "jit_init")
    assert len(cut_short) == 1 and not kept(cache / "jax", "jit_train_step")  # no more writes
  failed = [line for line in full.splitlines() if "persistent compilation cache entry" in line]
  assert len(failed) == 1, full[-3000:]
  assert "No space left on device" in failed[0] and "said once" in failed[0]
  assert losses(tmp_path / "full") == losses(tmp_path / "read_only")


ENABLE = """
import jax, jax.numpy as jnp
from wnscale import compilation_cache
print(compilation_cache.enable())
jax.jit(lambda x: jnp.sin(x) * 2)(jnp.ones(3)).block_until_ready()
print(compilation_cache.hits())
"""


def test_a_bucket_keeps_the_programs_and_one_that_cannot_be_written_gives_way(tmp_path):
  """JAX writes to and reads from a bucket through etils.epath: a second process loads what
  the first compiled. A bucket the account cannot write to: the local cache, said once."""
  def enable(cache_dir) -> tuple[list[str], str]:
    env = dict(environment(cache_dir), HOME=str(tmp_path / "home"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")  # every program kept
    result = subprocess.run([sys.executable, "-c", ENABLE], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.split(), result.stderr

  with gcs.emulator() as bucket:
    (directory, hits), _ = enable(f"{bucket}/cache")
    assert directory == f"{bucket}/cache/jax" and hits == "0"
    (directory, hits), _ = enable(f"{bucket}/cache")
    assert int(hits) >= 1
    (directory, hits), stderr = enable("gs://no-such-bucket/cache")
  local = str(tmp_path / "home" / ".cache" / "wnscale" / "jax")
  assert directory == local and hits == "0"
  assert (f"Compilation cache gs://no-such-bucket/cache/jax: cannot write there (no such "
          f"bucket); it is kept in {local} instead." in stderr)


def test_every_process_of_a_cpu_run_started_again_loads_its_programs(tmp_path):
  """The soak's restarts (`bench/soak.py`): process 1 compiled its train step anew at every
  start (15-20 s), as JAX writes entries from process 0 only while on CPU each process's
  key is its own. Two processes (`launch.local_cluster`, `tests/late_peer.py`: a sum over
  every device of both), started twice with one cache directory: each writes its own
  entry, and at the second start each loads it."""
  cache_dir = str(tmp_path / "xla")
  first, code = run_late_peers(55, LATE_S="0", JAX_COMPILATION_CACHE_DIR=cache_dir)
  assert code == 0, first.stderr[-3000:]
  assert sorted(line for line in first.stdout if "loaded" in line) == [
      "[p0] loaded 0\n", "[p1] loaded 0\n"], first.stderr[-3000:]
  written = [name for name in os.listdir(cache_dir) if name.startswith("jit_sum-")]
  assert len(written) == 2, written  # one per process: their keys differ
  again, code = run_late_peers(55, LATE_S="0", JAX_COMPILATION_CACHE_DIR=cache_dir)
  assert code == 0, again.stderr[-3000:]
  assert sorted(line for line in again.stdout if "loaded" in line) == [
      "[p0] loaded 1\n", "[p1] loaded 1\n"], again.stderr[-3000:]
