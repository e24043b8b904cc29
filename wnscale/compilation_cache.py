"""JAX's persistent compilation cache, kept in wnscale's cache directory: a run started
again (resumed, repeated, another of the same model) loads its compiled programs instead
of compiling them anew (minutes for a 0.25 deg step).

`enable()` is called by the launchers before anything compiles (`launch/process.py`;
`--nocompilation_cache` leaves it off). The programs go to `<cache dir>/jax`
(`cache.cache_dir()`: `$WNSCALE_CACHE_DIR`, default `~/.cache/wnscale`), or to the
directory JAX was already given (`JAX_COMPILATION_CACHE_DIR`). A bucket (`gs://...`)
works as JAX reads and writes it through `etils.epath`, as wnscale does (`paths`);
JAX writes from process 0 only, so on several hosts a bucket is what lets all of them
load. The cache's key is the program, the devices, the compile options and the versions
of jax and XLA: another model, topology or release compiles anew. On CPU the key also
differs from process to process (XLA:CPU's topology and compile options name the
process's own devices), so process 0's entries serve no other process: there each
process writes its own (`_write_from_every_process`), and a multi-process run started
again (`launch.local_cluster`) loads its programs in every process.

The cache never stops a run:

- a location that cannot be written (a read-only file system, a missing permission, a
  bucket without access) is found by writing a probe file first; a bucket falls back to
  the local default, a local directory leaves the cache off; one warning says so;
- an entry JAX cannot write or read later (a disk that fills up, a truncated file) is a
  warning of JAX's, shown once per process (`_warn_once`); the program is compiled, and
  after a failed write the process writes no more. The entry whose write the full disk
  cut short stays, truncated: JAX reads it as a miss and never writes it again; remove
  the directory once there is space.

Only programs that take `MIN_COMPILE_SECONDS` to compile are written (the train,
evaluation and initialization steps, not the small programs of eager operations),
whatever their size; `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS` and
`JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES` override. Nothing is evicted: remove the
directory to reclaim its space.
"""

from __future__ import annotations

import logging
import math
import os
import re
import warnings

import jax
# JAX's own cache and its write (`_write_from_every_process`): no public way to let
# every process write.
from jax._src import compilation_cache as jax_cache
from jax._src import compiler, distributed

from wnscale import cache, outputs, paths
from wnscale.errors import ArgumentError

# The cache directory's folder of compiled programs.
KIND = "jax"
# Seconds a program must take to compile to be written: reading it back (a file, or an
# object in a bucket) must cost much less than compiling it again.
MIN_COMPILE_SECONDS = 1.0
# Bytes an entry must have to be written: any (a 0.25 deg step is what is worth keeping).
MIN_ENTRY_BYTES = 0
# What JAX's warnings about an entry it failed to read or write begin with.
_JAX_ENTRY_ERROR = re.compile(r"Error (reading|writing) persistent compilation cache entry")
_HIT_EVENT = "/jax/compilation_cache/cache_hits"

_hits = 0


def enable() -> str | None:
  """Points JAX's persistent compilation cache at `<cache dir>/jax` (or the directory
  JAX was given), once the location is known to be writable; returns it, or None when
  the cache stays off (one warning says why). Call before anything compiles."""
  directory = jax.config.jax_compilation_cache_dir or paths.join(cache.cache_dir(), KIND)
  directory = paths.normalize(directory)
  problem = _unwritable(directory)
  if problem and paths.is_url(directory):
    local = paths.join(cache.LOCAL_CACHE_DIR, KIND)
    logging.warning("Compilation cache %s: %s; it is kept in %s instead.", directory, problem,
                    local)
    directory, problem = local, _unwritable(local)
  if problem:
    logging.warning("Compilation cache %s: %s; every program is compiled, none kept.",
                    directory, problem)
    return None
  jax.config.update("jax_compilation_cache_dir", directory)
  for name, value in (("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS),
                      ("jax_persistent_cache_min_entry_size_bytes", MIN_ENTRY_BYTES)):
    if name.upper() not in os.environ:  # the user's setting stands
      jax.config.update(name, value)
  _warn_once()
  _write_from_every_process()
  jax.monitoring.register_event_listener(_count_hit)
  logging.info("Persistent compilation cache: %s (a program compiled once is loaded from "
               "there).", directory)
  return directory


def hits() -> int:
  """Programs this process has loaded from the persistent cache so far (JAX's events)."""
  return _hits


def _count_hit(event: str, **_):
  global _hits
  if event == _HIT_EVENT:
    _hits += 1


def _write_from_every_process():
  """Lets every process of a CPU run write the entries it compiled (JAX's `_cache_write`
  skips any process but 0, lest several write one entry at once; on CPU no two processes
  share a key, so there is no such race, and without it every process but 0 compiles
  each program anew at every start: 15-20 s for the tiny train step). Other platforms,
  where the processes share their keys, keep JAX's rule. Once per process."""
  if getattr(compiler._cache_write, "every_process", False):  # noqa: SLF001
    return
  jax_write = compiler._cache_write  # noqa: SLF001

  def write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks):
    if distributed.global_state.process_id == 0 or backend.platform != "cpu":
      jax_write(cache_key, compile_time_secs, module_name, backend, executable,
                host_callbacks)
      return
    # JAX's own conditions and error handling (its warning is what `_warn_once` sees).
    minimum = jax.config.jax_persistent_cache_min_compile_time_secs
    if host_callbacks or compile_time_secs < minimum:
      return
    try:
      jax_cache.put_executable_and_time(cache_key, module_name, executable, backend,
                                        int(compile_time_secs))
    except Exception as error:  # noqa: BLE001 (as JAX: a failed write never stops a run)
      if compiler._should_raise_persistent_cache_error(error):  # noqa: SLF001
        raise
      warnings.warn(f"Error writing persistent compilation cache entry for '{module_name}': "
                    f"{type(error).__name__}: {error}")

  write.every_process = True
  compiler._cache_write = write  # noqa: SLF001


def _unwritable(directory: str) -> str | None:
  """Why a probe file cannot be written in `directory` (made if missing), e.g. "cannot
  write there (Read-only file system)", or None."""
  try:
    outputs.check_writable(directory, "compilation cache", make=True)
  except ArgumentError as error:
    return error.problem.split(";")[0]
  return None


def _warn_once():
  """JAX's warnings about cache entries it fails to read or write: the first one shown as
  a warning saying the run goes on, the others not (one failed write per program else).
  After a failed write (a full disk) nothing more is written: one entry cut short at
  most."""
  shown = warnings.showwarning
  said = []

  def show(message, category, filename, lineno, file=None, line=None):
    failed = _JAX_ENTRY_ERROR.search(str(message))
    if not failed:
      shown(message, category, filename, lineno, file, line)
      return
    writing = failed.group(1) == "writing"
    if writing:
      jax.config.update("jax_persistent_cache_min_compile_time_secs", math.inf)
    if not said:
      said.append(True)
      logging.warning("%s. The run goes on, compiling what the compilation cache cannot "
                      "give%s (said once).", message,
                      "; nothing more is written to it" if writing else "")

  warnings.showwarning = show
