"""What a command writes: checked before any work, never replacing data unasked, a full disk
said in one line.

Every output (a path, local or `gs://`: `wnscale.paths`) is of one `Kind`: a
dataset store (`make_dataset`: synthetic or converted), a climatology store, an
observation store, a forecast store, evaluation results, a file (and a run directory:
`wnscale.train.run_directory.KIND`; GraphCast's statistics files:
`wnscale.interop.graphcast_export.STATS`). What is at a path is told by its files
(`identify`): a zarr store by its coordinates (a forecast's `prediction_timedelta`, a
climatology's `dayofyear` and `hour`, an observation store's `station_id`; any other zarr
store is a dataset), evaluation results by `metrics.json`, a run by `config.json`, a
file by its first bytes (a netCDF file, an .npz file).
`check` runs before any work (the launchers call it while parsing their flags,
before JAX starts; the library calls it again for its own callers) and stops
with an `ArgumentError` of the argument that gave the output:

  - when the output exists and `overwrite` is not given (an empty directory
    holds nothing and does not count); when it is not of the kind the command
    writes, the message says what it is and that `overwrite` will not replace it. A forecast store is the exception: it
    is continued, not replaced (`Kind.continues`; `forecast_store` checks that
    it is the same forecast);
  - when `overwrite` is given but what is there is not of the kind the command
    writes: `overwrite` replaces a dataset with a dataset, a climatology with a
    climatology, never a forecast with a dataset nor someone's other directory;
  - when the location cannot be written (`check_writable`, shared with the
    run directory, `wnscale.train.workdir`): a probe file is written and removed
    where the output goes, so a read-only file system, a missing permission or a
    file in the way is said before anything is computed.

Missing parent directories are made when the output is written, as for a
run directory (and as in a bucket, where a path needs no parents).

An output is replaced by writing the new one under a temporary name and
swapping it in when it is whole (`paths.building`): the old one stays intact
and readable until then, so a replacement cut short (a full disk, Ctrl-C, a
mistake found late) loses nothing, at the price of room for both while it is
written.

A full disk (or quota) while writing (`writing`) becomes `errors.NoSpaceLeft`,
which names the path and what was kept; the launchers print it as one line,
exit status 1. A SIGTERM or Ctrl-C while building (`building`) leaves what a full disk
would, and says so (`errors.Interrupted.kept`).

One writer at a time: a launcher holds `<out>.lock` (`lock`, an advisory `flock`, which
the system releases when the process ends however it ends) from its flags' check to its
exit; a second command writing the same output stops at once, naming the first.
What a writer killed outright (SIGKILL, a power cut) left beside its output, a
`<out>.partial-<pid>` being built or a `<out>.replaced-<pid>` being swapped out, is
found by the next writer of that output (`remove_leftovers`): when that process is gone
(its pid is not running on this host) and the leftover is of the output's kind (or
holds nothing recognisable yet), it is removed (a `.replaced-` one put back where the
output is missing), with one warning line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import glob
import json
import logging
import os
import re
import shutil
import uuid

from wnscale import paths
from wnscale.errors import ArgumentError, NoSpaceLeft, no_space


@dataclasses.dataclass(frozen=True)
class Kind:
  """What an output is.

  Attributes:
    noun: what it is called in messages, e.g. "a dataset store".
    markers: names inside it that one of this kind holds (any of them); none
      for a file.
    excludes: names one of this kind never holds: another kind's markers where two kinds
      share one (a run directory's `config.json` and a WeatherNext 2 export's), so that
      `overwrite` of one never replaces the other.
    continues: an existing one is continued rather than replaced.
    store: for a zarr store, which kind of store (`store_kind`): "dataset",
      "climatology", "observations" or "forecast"; None: any directory with a marker.
    signatures: for a file, how one of this kind begins (any of them); none: any file.
  """

  noun: str
  markers: tuple[str, ...] = ()
  excludes: tuple[str, ...] = ()
  continues: bool = False
  store: str | None = None
  signatures: tuple[bytes, ...] = ()

  def __post_init__(self):
    _KINDS.append(self)

  @property
  def is_file(self) -> bool:
    return not self.markers


_KINDS: list[Kind] = []  # every kind defined, for `identify`
_ZARR = (".zgroup", "zarr.json")
DATASET = Kind("a dataset store", _ZARR, store="dataset")
CLIMATOLOGY = Kind("a climatology store", _ZARR, store="climatology")
OBSERVATIONS = Kind("an observation store", _ZARR, store="observations")
FORECAST = Kind("a forecast store", (".zgroup",), continues=True, store="forecast")
RESULTS = Kind("evaluation results", ("metrics.json",))
FILE = Kind("a file")
# Files told apart by their first bytes: predictions (netCDF 3, or 4 on HDF5) and a
# checkpoint (.npz, a zip archive), so that `overwrite` of one never replaces the other.
NETCDF = Kind("a netCDF file", signatures=(b"CDF\x01", b"CDF\x02", b"\x89HDF\r\n\x1a\n"))
NPZ = Kind("an .npz file", signatures=(b"PK\x03\x04", b"PK\x05\x06"))
STORE = DATASET  # the name before the kinds of store were told apart

_PROBE = ".wnscale-write-test-"
_SHOWN_NAMES = 4  # names listed of a directory `overwrite` will not replace


def check(path: str, kind: Kind, *, argument: str, overwrite: bool = False,
          reads: tuple[str, ...] = ()):
  """An `ArgumentError` of `argument` unless `path` can be written as `kind` without
  losing data.

  Args:
    path: the output (local or URL).
    argument: the caller's name for `path` (e.g. "out"), which the error names.
    overwrite: an existing output of this kind may be replaced.
    reads: what the command reads: the output may be none of them, nor hold or lie
      inside one (`overwrite` would replace the input it is computed from).
  """
  path = paths.normalize(path)
  for source in map(paths.normalize, reads):
    relation = ("is also" if path == source else f"is inside {source}," if
                path.startswith(source + "/") else f"holds {source}," if
                source.startswith(path + "/") else None)
    if relation:
      raise ArgumentError(argument, path, f"the output {relation} what this command reads; "
                          "write the output to another path.")
  exists = _holds_data(path, kind, argument)
  if exists and not kind.continues:
    if not _is_kind(path, kind):  # with or without `overwrite`: never replaced
      raise ArgumentError(argument, path, f"exists and is not {kind.noun} "
                          f"({_describe(path, kind)}); `overwrite` replaces only {kind.noun}: "
                          f"choose another `{argument}`, or remove it yourself.")
    if not overwrite:
      raise ArgumentError(argument, path, f"exists ({_describe(path, kind)}); pass "
                          f"`overwrite=True` to replace it, or choose another `{argument}`.")
  # Writes go into a continued store; anything else is built beside its path.
  check_writable(path, argument, inside=exists and kind.continues)


def check_writable(path: str, argument: str, *, inside: bool = False, make: bool = False):
  """An `ArgumentError` of `argument` (the caller's name for `path`, e.g. "workdir")
  saying why, unless `path` can be written.

  A probe file is written and removed (permission bits alone do not tell:
  ACLs, read-only mounts, buckets).

  Args:
    path: the output (local or URL).
    inside: the writes go inside `path` (an existing directory), not beside it.
    make: `path` is a directory to make now if missing (with its parents).
  """
  path = paths.normalize(path)
  if paths.is_url(path):
    # Inside, or beside `path` (an object there would make `path` exist).
    probe = (paths.join(path, _PROBE) if inside or make else path + _PROBE) + uuid.uuid4().hex
    try:
      paths.write_bytes(probe, b"")
      paths.as_epath(probe).unlink()
    except Exception as error:  # noqa: BLE001 (the client's errors have many types)
      # An object needs no parents: not found means no bucket.
      reason = ("no such bucket" if isinstance(error, FileNotFoundError) else
                "permission denied" if isinstance(error, PermissionError) else
                f"{type(error).__name__}: {' '.join(str(error).split())[:300]}")
      raise ArgumentError(argument, path, f"cannot write there ({reason}); give a location "
                          "this account can write to.") from error
    return
  if make or inside:
    directory = path
  else:  # built beside `path`, in the nearest directory that exists; the rest is made
    directory = os.path.dirname(path)
    while not os.path.lexists(directory):
      directory = os.path.dirname(directory)
  if os.path.lexists(directory) and not os.path.isdir(directory):
    what = "is" if directory == path else f"lies under {directory}, which is"
    raise ArgumentError(argument, path, f"{what} a file, not a directory; give a directory "
                        "(missing ones are made).")
  try:
    if make:
      os.makedirs(path, exist_ok=True)
    probe = os.path.join(directory, _PROBE + uuid.uuid4().hex)
    with open(probe, "wb"):
      pass
    os.remove(probe)
  except OSError as error:
    where = "" if directory == path else f" in {directory}"
    raise ArgumentError(argument, path, f"cannot write there ({error.strerror}{where}); give "
                        "a location this user can write to.") from error


def holds_data(path: str) -> bool:
  """Whether something is at `path` (an empty local directory holds nothing)."""
  path = paths.normalize(path)
  if paths.is_url(path):
    return paths.exists(path) or paths.exists(path + ".complete")
  return os.path.lexists(path) and not (os.path.isdir(path) and not os.listdir(path))


def _holds_data(path: str, kind: Kind, argument: str) -> bool:
  """`holds_data`; an `ArgumentError` of `argument` if a file is where a directory goes, or
  the other way."""
  if not paths.is_url(path) and os.path.lexists(path):
    if kind.is_file and os.path.isdir(path):
      raise ArgumentError(argument, path, "is a directory; give the path of a file to write.")
    if not kind.is_file and not os.path.isdir(path):
      raise ArgumentError(argument, path, f"is a file, not {kind.noun}; choose another path.")
  return holds_data(path)


def store_kind(path: str, names=None) -> str:
  """Which kind of zarr store is at `path` (its top-level `names`, listed if None), by its
  coordinates: "forecast" (`prediction_timedelta`), "climatology" (`dayofyear` and
  `hour`), "observations" (`station_id`), else "dataset" (WeatherBench2's layout, a
  conversion's, a synthetic one, an anemoi-datasets store)."""
  names = set(_names(path) if names is None else names)
  if "prediction_timedelta" in names:
    return "forecast"
  if {"dayofyear", "hour"} <= names:
    return "climatology"
  if "station_id" in names:
    return "observations"
  return "dataset"


def _names(path: str) -> list[str]:
  """The names directly inside the directory `path` (none if it is not one)."""
  try:
    return sorted(entry.name for entry in paths.as_epath(path).iterdir())
  except (OSError, ValueError):
    return []


def identify(path: str) -> Kind | None:
  """The kind of output at `path` (the first defined that matches), or None: nothing
  wnscale writes, or nothing there."""
  path = paths.normalize(path)
  if not paths.is_url(path) and os.path.isfile(path):
    head = _head(path)
    return next((kind for kind in _KINDS if kind.signatures and head.startswith(
        kind.signatures)), None)
  if not paths.is_url(path) and not os.path.isdir(path):
    return None
  names = _names(path)
  for kind in _KINDS:
    if not kind.is_file and _matches(path, kind, names):
      return kind
  return None


def _matches(path: str, kind: Kind, names) -> bool:
  if not any(marker in names for marker in kind.markers):
    return False
  if any(name in names for name in kind.excludes):
    return False
  return kind.store is None or store_kind(path, names) == kind.store


def _head(path: str) -> bytes:
  """The first bytes of the file `path` (enough for any `Kind.signatures`)."""
  with paths.as_epath(path).open("rb") as f:
    return f.read(8)


def _is_kind(path: str, kind: Kind) -> bool:
  if kind.is_file:  # an empty file holds nothing to lose
    return not kind.signatures or not (head := _head(path)) or head.startswith(
        kind.signatures)
  names = _names(path)
  if paths.is_url(path) and paths.exists(path + ".complete") and not names:
    return True  # paths.building's marker, the store itself not listed
  return _matches(path, kind, names)


def _describe(path: str, kind: Kind) -> str:
  """What is at `path`, for a message: its kind, or some of the names it holds."""
  if _is_kind(path, kind):
    if not kind.is_file and not paths.is_complete(path):
      return f"{kind.noun} whose writing was cut short"
    return kind.noun
  other = identify(path)
  if other is not None:
    return f"it is {other.noun}"
  if kind.is_file:
    return "it is another kind of file"
  names = sorted(entry.name for entry in paths.as_epath(path).iterdir())
  shown = ", ".join(names[:_SHOWN_NAMES]) + (", ..." if len(names) > _SHOWN_NAMES else "")
  return f"it holds {shown}"


@contextlib.contextmanager
def building(path: str, overwrite: bool = False, resumable: bool = False):
  """`paths.building(path, overwrite, resumable)`, a full disk a `NoSpaceLeft` saying what
  is left.

  Yields where to build the output (see `paths.building`).
  """
  if resumable:
    kept_in = path if paths.is_url(path) else paths.partial_path(path)
    left = (f"what was written is kept in {kept_in}; free some space and run the same "
            "command to continue")
    stopped = f"what was written is kept in {kept_in}; run the same command to continue"
  elif paths.is_url(path):
    left = ("what was written there is incomplete (no .complete marker); free some space "
            "and write it again, overwriting")
    stopped = (f"what was written at {path} is incomplete (no .complete marker); write it "
               "again, overwriting")
  elif overwrite:
    left = ("nothing was written and the existing one is unchanged (replacing it needs room "
            "for both); free some space or remove it, then run again")
    stopped = f"nothing was written; {paths.normalize(path)} is unchanged"
  else:
    left = "nothing was left there; free some space and run again"
    stopped = f"nothing was left at {paths.normalize(path)}"
  try:
    with writing(path, left), paths.building(path, overwrite, resumable) as where:
      yield where
  except KeyboardInterrupt as error:  # Ctrl-C or SIGTERM (`errors.Interrupted`)
    if getattr(error, "kept", None) is None:
      error.kept = stopped
    raise


@contextlib.contextmanager
def writing(path: str, kept):
  """Turns a full disk while the block writes `path` into `NoSpaceLeft` naming it.

  Args:
    path: the output being written.
    kept: what is left, e.g. "nothing was written"; a callable is called
      when the disk is full (e.g. to count what was finished).
  """
  try:
    yield
  except NoSpaceLeft:
    raise
  except Exception as error:  # noqa: BLE001 (re-raised unless the disk is full)
    if no_space(error) is None:
      raise
    said = kept() if callable(kept) else kept
    raise NoSpaceLeft(f"No space left on device writing {paths.normalize(path)}; {said}"
                      ) from error


# --- One writer at a time, and what a killed writer left ------------------------------------

_LOCK_SUFFIX = ".lock"
_HELD: dict[str, int] = {}  # output path -> the open file descriptor holding its lock


def lock(path: str, argument: str):
  """Takes `<path>.lock` for this process until `unlock` (or its end), or raises an
  `ArgumentError` of `argument` naming the process that holds it. Local paths only (a
  bucket has no locks: nothing is done)."""
  import fcntl  # noqa: PLC0415 (POSIX only)
  path = paths.normalize(path)
  if paths.is_url(path) or path in _HELD:
    return
  os.makedirs(os.path.dirname(path), exist_ok=True)
  name = path + _LOCK_SUFFIX
  for _ in range(5):  # the holder may remove the file between our open and our lock
    descriptor = os.open(name, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = _read_holder(descriptor)
      os.close(descriptor)
      raise ArgumentError(argument, path, f"is being written by another command ({holder}); "
                          f"wait for it to end, or choose another `{argument}`.") from None
    try:
      same = os.fstat(descriptor).st_ino == os.stat(name).st_ino
    except FileNotFoundError:
      same = False
    if not same:  # we locked a file its holder has just removed: again, on the new one
      os.close(descriptor)
      continue
    record = json.dumps({"pid": os.getpid(), "since": datetime.datetime.now(
        datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")}).encode()
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, record, 0)
    _HELD[path] = descriptor
    return
  raise ArgumentError(argument, path, f"its lock {name} keeps being replaced by another "
                      f"command; wait for it to end, or choose another `{argument}`.")


def _read_holder(descriptor: int) -> str:
  """"pid P, since T" of the lock file open at `descriptor` (as far as it says)."""
  try:
    record = json.loads(os.pread(descriptor, 4096, 0) or b"{}")
    return f"pid {record['pid']}, since {record['since']}"
  except (OSError, ValueError, KeyError, TypeError):
    return "its pid not yet recorded"


def unlock(path: str):
  """Gives back `lock(path)`'s lock (removing the lock file)."""
  path = paths.normalize(path)
  descriptor = _HELD.pop(path, None)
  if descriptor is None:
    return
  try:
    os.remove(path + _LOCK_SUFFIX)  # while still held: no other process holds this file
  except OSError:
    pass
  os.close(descriptor)


_LEFTOVER = re.compile(r"\.(partial|replaced|tmp)-(\d+)$")


def _running(pid: int) -> bool:
  """Whether process `pid` runs on this host."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's: running
    return True
  return True


def remove_leftovers(path: str, kind: Kind) -> list[str]:
  """Removes what writers of `path` that were killed outright left beside it (module
  docstring); returns the leftovers handled, each said in one warning line.

  Only `<path>.partial-<pid>`, `<path>.replaced-<pid>` and (for a file)
  `<path>.tmp-<pid>` of a pid that is not running here, holding `kind` or nothing
  recognisable; a `.partial` without a pid (a conversion to continue) is left to its
  command.
  """
  path = paths.normalize(path)
  if paths.is_url(path):
    return []
  handled = []
  for leftover in sorted(glob.glob(glob.escape(path) + ".*-*")):
    match = _LEFTOVER.search(leftover[len(path):])
    if not match or leftover[len(path):] != match.group(0):
      continue
    what, pid = match.group(1), int(match.group(2))
    if pid == os.getpid() or _running(pid):
      continue
    found = identify(leftover) if os.path.isdir(leftover) else None
    if found is not None and found is not kind:
      logging.warning("Left %s alone: it was left by process %d, which is no longer "
                      "running, but it is %s, not %s.", leftover, pid, found.noun, kind.noun)
      continue
    if what == "replaced" and not os.path.lexists(path):
      os.replace(leftover, path)
      logging.warning("Put back %s from %s: process %d, which is no longer running, had moved "
                      "it aside to replace it and was stopped before it could.", path,
                      leftover, pid)
    else:
      if os.path.isdir(leftover) and not os.path.islink(leftover):
        shutil.rmtree(leftover, ignore_errors=True)
      else:
        os.remove(leftover)
      said = {"partial": "being built", "replaced": "being replaced",
              "tmp": "being written"}[what]
      logging.warning("Removed %s: what process %d, which is no longer running (killed?), "
                      "left of %s %s.", leftover, pid, path, said)
    handled.append(leftover)
  return handled
