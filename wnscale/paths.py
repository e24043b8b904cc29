"""Paths that are a local path or a URL (`gs://bucket/dir`), treated alike.

Every path wnscale takes (stores, statistics, the run directory, the cache)
may live in Cloud Storage. Files go through `etils.epath` (fsspec/gcsfs for
`gs://`, as Orbax does); arrays through tensorstore, whose kvstore spec
`kvstore_spec` builds. Nothing here speaks HTTP itself.

In tests, a Cloud Storage emulator stands in for `gs://`: tensorstore finds it
through `TENSORSTORE_GCS_HTTP_URL`, gcsfs through `STORAGE_EMULATOR_HOST`.

gcsfs keeps each directory listing it has made and updates it for this process's own
writes only: where another process may have changed a directory since (after a barrier),
`forget_listings` makes the next look ask the storage.

Before the first access to a URL's service, this process checks once that the service
can be reached (`check_reachable`: a TCP connection within `REACH_TIMEOUT_S`): without a
network the clients retry for about a minute and then raise their own tracebacks; here
it is one `UserError` naming the service and the reason, in seconds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
import urllib.parse

from etils import epath
from etils.epath import backend as epath_backend

from wnscale.errors import UserError, raise_if_interrupted

# URL schemes with a tensorstore kvstore driver of their own.
_KVSTORE_DRIVERS = {"gs": "gcs", "s3": "s3"}


def is_url(path: str) -> bool:
  """True for `scheme://...` (two letters or more: a Windows drive is not a scheme)."""
  scheme = urllib.parse.urlsplit(str(path)).scheme
  return len(scheme) > 1 and "://" in str(path)


def normalize(path: str) -> str:
  """A local path made absolute (tensorstore refuses ".."), a URL without a trailing "/"."""
  path = os.fspath(path)
  if is_url(path):
    return path.rstrip("/")
  return os.path.abspath(os.path.expanduser(path))


def join(base: str, *parts: str) -> str:
  """`base/part/...` for a local path or a URL."""
  if is_url(base):
    return "/".join([base.rstrip("/"), *(part.strip("/") for part in parts)])
  return os.path.join(base, *parts)


def as_epath(path: str) -> epath.Path:
  """An `etils.epath.Path` (local or `gs://`) for file operations."""
  path = normalize(path)
  if is_url(path):
    check_reachable(path)
  return epath.Path(path)


REACH_TIMEOUT_S = 10.0
# Each scheme's service, and the environment variables that name an emulator instead.
_SERVICES = {"gs": ("Cloud Storage", "storage.googleapis.com",
                    ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL")),
             "s3": ("S3", "s3.amazonaws.com", ("AWS_ENDPOINT_URL",))}
_REACHED: dict[tuple[str, int], str | None] = {}  # (host, port) -> None, or why not
_PROXIES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def check_reachable(path: str):
  """A `UserError` unless the service of the URL `path` answers a TCP connection within
  `REACH_TIMEOUT_S` (checked once per service and process)."""
  scheme = urllib.parse.urlsplit(path).scheme
  if scheme not in _SERVICES or any(os.environ.get(name) for name in _PROXIES):
    return  # through a proxy: the client's own connection is the test
  name, host, variables = _SERVICES[scheme]
  port = 443
  for variable in variables:
    if os.environ.get(variable):
      endpoint = os.environ[variable]
      parts = urllib.parse.urlsplit(endpoint if "://" in endpoint else "http://" + endpoint)
      host, port = parts.hostname or host, parts.port or (443 if parts.scheme == "https"
                                                          else 80)
      break
  if (host, port) not in _REACHED:
    try:
      socket.create_connection((host, port), timeout=REACH_TIMEOUT_S).close()
      _REACHED[host, port] = None
    except socket.timeout:
      _REACHED[host, port] = f"no answer within {REACH_TIMEOUT_S:g} s"
    except OSError as error:
      _REACHED[host, port] = (error.strerror or str(error)).split(" [")[0]
  why = _REACHED[host, port]
  if why is not None:
    raise UserError(f"Cannot reach {name} for {path}: {host}:{port}: {why}. Check this "
                    "machine's network (and proxy), or use a local copy of the data.")


def _filesystem(url: str):
  """The fsspec filesystem (gcsfs for `gs://`) that etils.epath, and so Orbax, use for
  `url`: one instance per scheme, made once."""
  return epath_backend.fsspec_backend.fs(url)


def forget_listings(path: str):
  """Drops this process's cached listings of the URL `path`, of its parents and of what is
  under it: the next look at them asks the storage. A no-op for a local path."""
  if not is_url(path):
    return
  path = normalize(path)
  filesystem = _filesystem(path)
  under = path.split("://", 1)[1] + "/"  # gcsfs's keys: `bucket/dir`, no scheme
  for listed in [key for key in filesystem.dircache if key.startswith(under)]:
    filesystem.dircache.pop(listed, None)
  filesystem.invalidate_cache(path)  # `path` and its parents


def move(path: str, target: str):
  """Moves the file or directory `path` to `target` (not there yet), never losing it.

  Locally one rename. A bucket has no renames of many objects at once, and gcsfs's move
  of a directory moves object by object: stopped midway, it leaves the directory split
  between both names (and where the server refuses its moveTo request, as the emulator
  of the tests does, gcsfs logs a traceback per object before it copies instead). So
  there every object is copied first, and `path` removed once the copy is whole: a crash
  leaves `path` whole, or the whole copy.
  """
  if not is_url(path):
    as_epath(path).rename(target)
    return
  check_reachable(path)
  filesystem = _filesystem(path)
  filesystem.copy(path, target, recursive=True)
  filesystem.rm(path, recursive=True)


def exists(path: str) -> bool:
  return as_epath(path).exists()


def makedirs(path: str):
  """Creates a directory and its parents (for a bucket: a no-op, prefixes need none)."""
  as_epath(path).mkdir(parents=True, exist_ok=True)


def read_text(path: str) -> str:
  return as_epath(path).read_text()


def read_bytes(path: str) -> bytes:
  return as_epath(path).read_bytes()


def write_text(path: str, text: str):
  """Writes `text` whole or not at all (see `write_bytes`)."""
  write_bytes(path, text.encode())


def write_bytes(path: str, data: bytes):
  """Writes `data` whole or not at all: readers never see a half-written file.

  Locally: a temporary file renamed into place. In a bucket one upload is one
  object, which appears complete or not at all.
  """
  if is_url(path):
    as_epath(path).write_bytes(data)
    return
  path = normalize(path)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  temporary = f"{path}.tmp-{os.getpid()}"
  try:
    with open(temporary, "wb") as f:
      f.write(data)
    os.replace(temporary, path)
  finally:  # e.g. a full disk: no half-written temporary left behind
    if os.path.lexists(temporary):
      os.remove(temporary)


def kvstore_spec(path: str) -> dict:
  """The tensorstore kvstore spec of a directory: `file` locally, `gcs` for `gs://`.

  E.g. `kvstore_spec("gs://bkt/era5.zarr/temperature")` ->
  `{"driver": "gcs", "bucket": "bkt", "path": "era5.zarr/temperature/"}`.
  """
  path = normalize(path)
  if not is_url(path):
    return {"driver": "file", "path": path + "/"}
  check_reachable(path)
  parts = urllib.parse.urlsplit(path)
  if parts.scheme not in _KVSTORE_DRIVERS:
    raise ValueError(f"Unsupported URL scheme {parts.scheme!r} in {path}; use a local path "
                     f"or one of {sorted(f'{s}://' for s in _KVSTORE_DRIVERS)}")
  return {"driver": _KVSTORE_DRIVERS[parts.scheme], "bucket": parts.netloc,
          "path": parts.path.strip("/") + "/"}


@contextlib.contextmanager
def local_copy(path: str):
  """Yields a local path holding the file at `path` (downloaded first if a URL)."""
  if not is_url(path):
    yield normalize(path)
    return
  with tempfile.TemporaryDirectory(prefix="wnscale-") as directory:
    local = os.path.join(directory, os.path.basename(path))
    with as_epath(path).open("rb") as source, open(local, "wb") as target:
      shutil.copyfileobj(source, target)
    yield local


def upload(local_path: str, path: str):
  """Copies the local file `local_path` to `path` (local or URL), replacing it whole."""
  with open(local_path, "rb") as f:
    write_bytes(path, f.read())


def free_bytes(path: str) -> int | None:
  """Free bytes on the disk that would hold `path`; None for a URL (no fixed size)."""
  if is_url(path):
    return None
  directory = normalize(path)
  while not os.path.exists(directory):
    directory = os.path.dirname(directory)
  return shutil.disk_usage(directory).free


def partial_path(path: str) -> str:
  """Where a resumable build of `path` lives until it is whole (`building(resumable=True)`)."""
  return f"{normalize(path)}.partial"


@contextlib.contextmanager
def building(path: str, replace: bool = False, resumable: bool = False):
  """Yields where to build a new directory-like output (a zarr store) meant for `path`.

  Locally it is built under a temporary name beside `path` (parents made) and
  renamed to `path` when the block ends without error (removed otherwise): it
  appears whole or not at all. With `replace`, what is at `path` is moved
  aside just before that rename and removed after it, so it stays intact
  until its replacement is whole. A bucket has no renames of many objects at
  once, so there it is built at `path` itself and a `<path>.complete` marker
  is written last (with `replace`, the old output is removed first, its
  marker before it); `is_complete` tells the two apart in either case.
  `resumable`: locally, the build lives at `partial_path(path)` and is kept
  after an error, for a later run to continue (the caller tells whether what
  is there may be continued).
  """
  path = normalize(path)
  if is_url(path):
    if replace:
      for old in (as_epath(path + ".complete"), as_epath(path)):
        if old.is_dir():
          old.rmtree()
        elif old.exists():
          old.unlink()
    yield path
    write_text(path + ".complete", "")
    return
  os.makedirs(os.path.dirname(path), exist_ok=True)
  partial = partial_path(path) if resumable else f"{path}.partial-{os.getpid()}"
  try:
    yield partial
    raise_if_interrupted()  # never renamed into place after a SIGTERM
    # A directory can be renamed onto an empty one only: a full one is moved aside first.
    if replace and os.path.isdir(path) and os.listdir(path):
      replaced = f"{path}.replaced-{os.getpid()}"
      os.replace(path, replaced)
      try:
        os.replace(partial, path)
      except OSError:
        os.replace(replaced, path)
        raise
      shutil.rmtree(replaced)
    else:
      os.replace(partial, path)
  finally:
    if os.path.lexists(partial) and not resumable:
      _remove_for_good(partial)


def _remove_for_good(path: str, seconds: float = 10.0):
  """Removes a local file or directory, and again until it stays removed (bounded).

  A failed tensorstore write of many chunks reports its first error while its
  other chunks are still being written: they can make the directory again.
  """
  deadline = time.monotonic() + seconds
  while os.path.lexists(path) and time.monotonic() < deadline:
    if os.path.isdir(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      os.remove(path)
    time.sleep(0.2)  # writes still in flight land within this


def is_complete(path: str) -> bool:
  """Whether an output built with `building` is all there."""
  path = normalize(path)
  return exists(path + ".complete") if is_url(path) else exists(path)
