"""The fewest micro-batches (`train.accumulation_steps`) with which a step fits.

With accumulation each data shard runs its examples in micro-batches, one after
another inside the step (`wnscale.model.accumulation`): the same gradient, the
activations of one micro-batch. A step that does not fit may fit in more
micro-batches; the counts tried divide a data shard's examples, fewest first
(each more is one more pass of the loop over smaller arrays).
"""

from __future__ import annotations

from wnscale.planner.compile import Problem


def more_micro_batches(examples_per_data_shard: int, accumulation_steps: int) -> list[int]:
  """The micro-batch counts above `accumulation_steps` that split a data shard's examples
  evenly, ascending (the last: micro-batches of one example)."""
  return [count for count in range(accumulation_steps + 1, examples_per_data_shard + 1)
          if examples_per_data_shard % count == 0]


def fewest_that_fit(problem: Problem, remat_overrides: dict | None,
                    budget_bytes: int) -> dict | None:
  """The report (`Problem.compile`) of `remat_overrides` compiled with the fewest more
  micro-batches than the specs' whose step fits `budget_bytes` per device; None when
  even micro-batches of one example do not fit (compiled first: then nothing is searched),
  or when a data shard's examples allow no more micro-batches."""
  counts = more_micro_batches(problem.examples_per_data_shard,
                              problem.specs.train.accumulation_steps)

  def fits(count):
    report = problem.compile(remat_overrides, accumulation_steps=count)
    return report if report["fits"] and report["peak_bytes"] <= budget_bytes else None

  if not counts or not fits(counts[-1]):
    return None
  return next(report for report in map(fits, counts) if report)
