"""Finds the run's zarr store, making the synthetic ERA5-like one when none is configured."""

from __future__ import annotations

import logging
import os
import shutil
import time

import jax
import ml_collections
from jax.experimental import multihost_utils

from wnscale import cache
from wnscale.data import synthetic
from wnscale.data import variables as variables_lib


def synthetic_store_path(data: ml_collections.ConfigDict, seed: int) -> str:
  """Where the synthetic store for `data`'s resolution, levels and time ranges lives."""
  start = min(data.train_start, data.eval_start)
  end = max(data.train_end, data.eval_end)
  levels = _store_levels(data.pressure_levels)
  # The code digest: a store written by other synthetic code is not reused.
  code = cache.source_digest("data/synthetic.py", "graphs/grid.py")
  name = (f"synthetic-{data.resolution}deg-{len(levels)}levels-{start}-{end}-seed{seed}-"
          f"{code}.zarr")
  return cache.cache_path("datasets", name)


def _store_levels(levels):
  if set(levels) <= set(variables_lib.WB2_LEVELS_13):
    return variables_lib.WB2_LEVELS_13
  return variables_lib.ERA5_LEVELS_37


def resolve_store(config: ml_collections.ConfigDict) -> str:
  """`config.data.path`, or the synthetic store (written by process 0 if missing).

  The synthetic store is written to a temporary name and renamed when
  complete, so an interrupted write is never mistaken for a store.
  """
  data = config.data
  if data.path:
    return data.path
  path = synthetic_store_path(data, config.seed)
  if jax.process_index() == 0 and not os.path.exists(path):
    logging.info("Writing the synthetic store %s (data.path is empty; kept for later runs).",
                 path)
    start = time.perf_counter()
    partial = f"{path}.partial-{os.getpid()}"
    synthetic.write_synthetic_store(
        partial, resolution=data.resolution, start=min(data.train_start, data.eval_start),
        end=max(data.train_end, data.eval_end), levels=_store_levels(data.pressure_levels),
        seed=config.seed, time_step_hours=data.time_step_hours)
    try:
      os.replace(partial, path)
    except OSError:  # another run finished the same store first
      shutil.rmtree(partial, ignore_errors=True)
    logging.info("Wrote the synthetic store in %.1f s.", time.perf_counter() - start)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("wnscale synthetic store ready")
  return path
