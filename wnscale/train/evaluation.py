"""Evaluation on the held-out time range: per-channel RMSE in physical units.

Each target modality of the source (`WeatherExampleSource.with_modalities`) adds the
RMSE of each of its variables over the values present (`<modality>/<variable>`).
An FGN (`model.noise_channels > 0`) is scored by its zero-noise member.
"""

from __future__ import annotations

import jax
import numpy as np

from wnscale import coordination
from wnscale.data import pipeline
from wnscale.model import setup
from wnscale.sharding.layout import BATCH_SPECS, ShardedLayout
from wnscale.specs import Specs
from wnscale.train import step as step_lib


def metric_name(channel: str) -> str:
  """`eval/rmse/temperature_500` for channel `temperature@500`, `eval/rmse/stations/
  2m_temperature` for a modality's: a TensorBoard tag as well."""
  return "eval/rmse/" + channel.replace("@", "_")


class Evaluator:
  """Runs the model over `train.eval_batches` batches of the eval range, in order.

  `source`: the eval range's source, already open (any grid order); default:
  opened at the first evaluation. `rows_per_example`: batch rows per example
  (an FGN's members laid out on `data`: each example repeated on the rows its
  members train on, every row scored, so the batch splits as in training).
  """

  def __init__(self, specs: Specs, layout: ShardedLayout, graphdef, constants, halo_indices,
               stats: dict, channel_names, group: int, num_groups: int, source=None,
               rows_per_example: int = 1):
    self.specs = specs
    self.rows_per_example = rows_per_example
    self.batch_rows = specs.train.batch_size * rows_per_example
    self.layout = layout
    self.constants = constants
    self.halo_indices = halo_indices
    self.std = jax.device_put(np.asarray(stats["std"], np.float32),
                              layout.sharding(jax.sharding.PartitionSpec()))
    self.channel_names = list(channel_names)
    self.group, self.num_groups = group, num_groups
    self.eval_step = step_lib.make_eval_step(layout, graphdef, constants, halo_indices)
    # An FGN is scored by its zero-noise member: the forecast its norms give
    # with a noise embedding of zero (`[B, T, K]` zeros).
    self.noise = None
    if specs.model.noise_channels:
      self.noise = jax.device_put(
          np.zeros((self.batch_rows, specs.data.target_steps,
                    specs.model.noise_channels), np.float32),
          layout.sharding(BATCH_SPECS["noise"]))
    # Read in the layout's grid (and points) order.
    self.source = (None if source is None
                   else source.in_layout(layout.grid_slots, layout.point_slots))

  def evaluate(self, params) -> dict[str, float]:
    """`{channel name: RMSE}` over the first `eval_batches` batches of the eval range, and
    `{"<modality>/<variable>": RMSE}` of each target modality (NaN: no value present)."""
    if self.source is None:
      self.source = pipeline.make_source(self.specs.data, "eval").in_layout(
          self.layout.grid_slots)
    data = pipeline.make_pipeline(self.specs.data, "eval", batch_size=self.specs.train.batch_size,
                                  seed=self.specs.seed, process_index=self.group,
                                  process_count=self.num_groups, source=self.source)
    sums, point_sums, examples = 0.0, {}, 0
    try:
      for _, local in zip(range(self.specs.train.eval_batches), data.iterator):
        if self.rows_per_example > 1:
          local = {key: np.concatenate([value] * self.rows_per_example)
                   for key, value in local.items()}
        batch = self.layout.global_batch(local, self.batch_rows,
                                         setup.batch_dtype(self.specs.model))
        if self.noise is not None:
          batch["noise"] = self.noise
        arguments = (params, self.constants, self.halo_indices, batch, self.std)
        if not isinstance(self.eval_step, jax.stages.Compiled):  # the first evaluation
          self.eval_step = self.eval_step.lower(*arguments).compile()
          coordination.all_reach("eval step compiled")  # as the train step's
        grid, points = self.eval_step(*arguments)
        sums = sums + grid
        point_sums = {name: (point_sums[name][0] + squared, point_sums[name][1] + count)
                      if name in point_sums else (squared, count)
                      for name, (squared, count) in points.items()}
        examples += self.batch_rows
    finally:
      data.close()
    count = examples * self.specs.data.target_steps * self.layout.num_grid_nodes
    rmse = np.sqrt(np.asarray(sums) / count)
    scores = dict(zip(self.channel_names, rmse.tolist()))
    for reader in self.source.modalities:
      if reader.name in point_sums:
        squared, present = (np.asarray(x, np.float64) for x in point_sums[reader.name])
        with np.errstate(invalid="ignore", divide="ignore"):
          point_rmse = np.sqrt(squared / present) * reader.stats["targets"]["std"]
        scores |= {f"{reader.name}/{name}": float(value)
                   for name, value in zip(reader.targets, point_rmse)}
    return scores
