"""The on-disk cache: where derived files live and how their keys see code changes.

Graphs, synthetic stores and remat plans are expensive to make and cheap to
keep. Each cached file is named by a hash of everything it depends on,
including the source code that made it (`source_digest`), so a change to that
code never reads back a stale file and nobody has to remember to bump a version.
Compiled programs are kept here too, under JAX's own keys (`wnscale.compilation_cache`).

The cache only saves time: a cache directory that cannot be written (read-only, no
permission, a full disk) is said once, in one warning, and every derived file is then
made again by each run that needs it (`write_bytes`). A synthetic store, which a run
cannot make without a place to keep it, is the exception (`wnscale.data.run_data`).
"""

from __future__ import annotations

import errno
import functools
import hashlib
import logging
import os
import pathlib

from wnscale import paths

_PACKAGE = pathlib.Path(__file__).resolve().parent
# The cache directory when `$WNSCALE_CACHE_DIR` does not name one.
LOCAL_CACHE_DIR = os.path.join(os.path.expanduser("~"), ".cache", "wnscale")


def cache_dir() -> str:
  """`$WNSCALE_CACHE_DIR` (a local path or a URL such as `gs://bucket/cache`), or
  `LOCAL_CACHE_DIR` (`~/.cache/wnscale`)."""
  return paths.normalize(os.environ.get("WNSCALE_CACHE_DIR", LOCAL_CACHE_DIR))


def cache_path(kind: str, name: str) -> str:
  """`cache_dir()/kind/name`: one folder per kind of cached file."""
  return paths.join(cache_dir(), kind, name)


@functools.cache
def source_digest(*parts: str) -> str:
  """A hash of wnscale's Python sources under `parts` (all of wnscale if none).

  Args:
    parts: paths relative to the package, subpackages (`"graphs"`) or modules
      (`"data/making/synthetic.py"`).
  """
  digest = hashlib.sha256()
  for root in [_PACKAGE / part for part in parts] or [_PACKAGE]:
    files = [root] if root.is_file() else sorted(root.rglob("*.py"))
    for path in files:
      digest.update(str(path.relative_to(_PACKAGE)).encode() + b"\0" + path.read_bytes())
  return digest.hexdigest()[:16]


_WARNED: set[str] = set()  # cache directories said to be unwritable, by this process

# The errors of a location that cannot be written: read-only, no permission, full, quota.
_UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)


def write_bytes(path: str, data: bytes) -> bool:
  """Writes the cached file `path` whole (`paths.write_bytes`); returns False, after one
  warning per cache directory, when the cache cannot be written there (see the module
  docstring). Any other error is raised."""
  try:
    paths.write_bytes(path, data)
    return True
  except OSError as error:
    if error.errno not in _UNWRITABLE:
      raise
    directory = cache_dir()
    if directory not in _WARNED:
      _WARNED.add(directory)
      logging.warning("The cache directory %s cannot be written (%s): statistics, graphs "
                      "and plans are made again by every run. Set WNSCALE_CACHE_DIR to a "
                      "directory you can write to keep them.", directory,
                      error.strerror or error)
    return False
