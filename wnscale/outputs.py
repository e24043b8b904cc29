"""What a command writes: checked before any work, never replacing data unasked, a full disk
said in one line.

Every output (a path, local or `gs://`: `wnscale.paths`) is of one `Kind`: a
zarr store, evaluation results, a file, a forecast store (and a run directory:
`wnscale.train.run_directory.KIND`).
`check` runs before any work (the launchers call it while parsing their flags,
before JAX starts; the library calls it again for its own callers) and stops
with an `ArgumentError` of the argument that gave the output:

  - when the output exists and `overwrite` is not given (an empty directory
    holds nothing and does not count). A forecast store is the exception: it
    is continued, not replaced (`Kind.continues`; `forecast_store` checks that
    it is the same forecast);
  - when `overwrite` is given but what is there is not of the kind the command
    writes: `overwrite` replaces a store with a store, never someone's other
    directory;
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
exit status 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import uuid

from wnscale import paths
from wnscale.errors import ArgumentError, NoSpaceLeft, no_space


@dataclasses.dataclass(frozen=True)
class Kind:
  """What an output is.

  Attributes:
    noun: what it is called in messages, e.g. "a zarr store".
    markers: names inside it that one of this kind holds (any of them); none
      for a file.
    continues: an existing one is continued rather than replaced.
  """

  noun: str
  markers: tuple[str, ...] = ()
  continues: bool = False

  @property
  def is_file(self) -> bool:
    return not self.markers


STORE = Kind("a zarr store", (".zgroup", "zarr.json"))
RESULTS = Kind("evaluation results", ("metrics.json",))
FILE = Kind("a file")
FORECAST = Kind("a forecast store", (".zgroup",), continues=True)

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
    if not overwrite:
      raise ArgumentError(argument, path, f"exists ({_describe(path, kind)}); pass "
                          f"`overwrite=True` to replace it, or choose another `{argument}`.")
    if not _is_kind(path, kind):
      raise ArgumentError(argument, path, f"exists and is not {kind.noun} "
                          f"({_describe(path, kind)}); `overwrite` replaces only {kind.noun}: "
                          f"choose another `{argument}`, or remove it yourself.")
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


def _is_kind(path: str, kind: Kind) -> bool:
  if kind.is_file:
    return True
  if paths.is_url(path) and paths.exists(path + ".complete"):  # paths.building's marker
    return True
  return any(paths.exists(paths.join(path, marker)) for marker in kind.markers)


def _describe(path: str, kind: Kind) -> str:
  """What is at `path`, for a message: its kind, or some of the names it holds."""
  if _is_kind(path, kind):
    if not kind.is_file and not paths.is_complete(path):
      return f"{kind.noun} whose writing was cut short"
    return kind.noun
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
  elif paths.is_url(path):
    left = ("what was written there is incomplete (no .complete marker); free some space "
            "and write it again, overwriting")
  elif overwrite:
    left = ("nothing was written and the existing one is unchanged (replacing it needs room "
            "for both); free some space or remove it, then run again")
  else:
    left = "nothing was left there; free some space and run again"
  with writing(path, left), paths.building(path, overwrite, resumable) as where:
    yield where


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
