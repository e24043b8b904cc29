"""Evaluation on the held-out time range: per-channel RMSE in physical units."""

from __future__ import annotations

import jax
import ml_collections
import numpy as np

from wnscale.data import pipeline
from wnscale.model import setup
from wnscale.sharding.layout import ShardedLayout
from wnscale.train import step as step_lib


class Evaluator:
  """Runs the model over `train.eval_batches` batches of the eval range, in order."""

  def __init__(self, config: ml_collections.ConfigDict, layout: ShardedLayout, graphdef,
               constants, halo_indices, stats: dict, channel_names, group: int,
               num_groups: int, source=None):
    self.config = config
    self.layout = layout
    self.constants = constants
    self.halo_indices = halo_indices
    self.std = jax.device_put(np.asarray(stats["std"], np.float32),
                              layout.sharding(jax.sharding.PartitionSpec()))
    self.channel_names = list(channel_names)
    self.group, self.num_groups = group, num_groups
    self.eval_step = step_lib.make_eval_step(layout, graphdef, constants, halo_indices)
    # The eval range's source in the layout's grid order; None: opened at the first evaluation.
    self.source = source

  def evaluate(self, params) -> dict[str, float]:
    """`{channel name: RMSE}` over the first `eval_batches` batches of the eval range."""
    batch_size = self.config.train.batch_size
    if self.source is None:
      self.source = pipeline.source_from_config(self.config, "eval", self.layout.grid_slots)
    data = pipeline.from_config(self.config, "eval", process_index=self.group,
                                process_count=self.num_groups, source=self.source)
    sums, examples = 0.0, 0
    try:
      for _, local in zip(range(self.config.train.eval_batches), data.iterator):
        batch = self.layout.global_batch(local, batch_size, setup.batch_dtype(self.config))
        sums = sums + self.eval_step(params, self.constants, self.halo_indices, batch,
                                     self.std)
        examples += batch_size
    finally:
      data.close()
    count = examples * self.config.data.target_steps * self.layout.num_grid_nodes
    rmse = np.sqrt(np.asarray(sums) / count)
    return dict(zip(self.channel_names, rmse.tolist()))
