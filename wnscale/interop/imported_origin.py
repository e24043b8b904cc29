"""The import a run is, or started from: where an export finds what the import kept.

An import (`graphcast_import`, `weathernext2_import`) keeps in its run directory what
wnscale's model does not hold (a remainder file). A run trained from it names it in
`train.init_from`, and so on: `find` follows those links back to the first run holding
the file.
"""

from __future__ import annotations

import logging

from wnscale import paths
from wnscale.train.run_directory import RunDirectory

# How many `train.init_from` links are followed back.
MAX_ANCESTORS = 32


def find(run: RunDirectory, init_from: str, kept_file: str) -> RunDirectory | None:
  """The run directory holding `kept_file`: `run` itself or the run it started from
  (`init_from`, its `train.init_from`), followed back; None if there is none (or the run it
  started from is gone)."""
  seen = []
  while len(seen) < MAX_ANCESTORS and run.path not in seen:
    seen.append(run.path)
    if paths.exists(paths.join(run.path, kept_file)):
      return run
    if not init_from:
      return None
    run = RunDirectory(init_from)
    if not run.has_config():
      logging.info("The run started from %s, which is no longer there: the parameters "
                   "wnscale's model does not hold are written as zeros.", init_from)
      return None
    init_from = run.read_config().train.init_from
  return None


def texts(run: RunDirectory, origin: RunDirectory | None, imported, step: int,
          params: str | None) -> tuple[str, str]:
  """`(description, license)` of an export of `run` at `step` (`params`: "ema", "raw" or
  None): the imported file's own when `run` is the import `origin`, else a description of
  the export (and of the import it started from: `imported`, its texts, or None)."""
  if origin is not None and origin.path == run.path:
    return imported.description, imported.license
  description = (f"Exported by wnscale from the run {run.path}, step {step}"
                 f"{f' ({params} parameters)' if params else ''}.")
  if imported is None:
    return description, ""
  return (f"{description} Started from {origin.path}, imported from: "
          f"{imported.description}", imported.license)
