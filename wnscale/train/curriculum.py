"""The rollout curriculum (`train.rollout_schedule`): the phases of a run, one place.

A phase trains on rollouts of `target_steps` autoregressive steps, from its
`first_step` to the next phase's (the last one to `train.steps`). Without a
schedule a run is one phase of `data.target_steps`. Every phase reads the same
stream of examples (the source indexes them by the longest phase's window,
`WeatherExampleSource(indexed_target_steps=...)`), so a phase change, or a
resume, continues the data iterator at the same position.
"""

from __future__ import annotations

import copy
import dataclasses

import ml_collections

from wnscale import specs as specs_lib


@dataclasses.dataclass(frozen=True)
class Phase:
  """Steps `[first_step, end_step)` of a run, trained on `target_steps` rollout steps."""

  index: int
  first_step: int
  end_step: int
  target_steps: int


def phases(train: specs_lib.TrainSpec, target_steps: int) -> tuple[Phase, ...]:
  """The phases of a run of `train`, in order, covering steps `[0, train.steps)`;
  `target_steps` (`data.target_steps`) is the one phase's without a schedule."""
  schedule = train.rollout_schedule or ((0, target_steps),)
  ends = [first for first, _ in schedule[1:]] + [train.steps]
  return tuple(Phase(index, first, end, steps)
               for index, ((first, steps), end) in enumerate(zip(schedule, ends)))


def phase_at(all_phases: tuple[Phase, ...], step: int) -> Phase:
  """The phase that trains step `step` (0-based; the last phase for `step >= train.steps`)."""
  return [phase for phase in all_phases if phase.first_step <= step][-1]


def longest(all_phases: tuple[Phase, ...]) -> int:
  """The most target steps of any phase: what the data indexing and the memory plan size."""
  return max(phase.target_steps for phase in all_phases)


def with_target_steps(config: ml_collections.ConfigDict, target_steps: int
                      ) -> ml_collections.ConfigDict:
  """A copy of `config` whose examples have `target_steps` targets (a phase's step, or the
  longest phase for the memory planner)."""
  config = copy.deepcopy(config)  # ConfigDict(config) would share its sections
  config.data.target_steps = target_steps
  return config


def longest_phase_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` with its longest phase's examples: what `remat_policy="auto"` and the memory
  planner (`launch.compile`) size, as the longest rollout needs the most memory."""
  specs = specs_lib.from_config(config)
  return with_target_steps(config, longest(phases(specs.train, specs.data.target_steps)))
