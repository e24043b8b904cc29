"""The rollout curriculum (`train.rollout_schedule`): a run's phases at work.

A phase (`specs.Phase`, made by `TrainSpec.phases`) trains on rollouts of
`target_steps` autoregressive steps, from its `first_step` to the next phase's
(the last one to `train.steps`). Without a schedule a run is one phase of
`data.target_steps`. Every phase reads the same
stream of examples (the source indexes them by the longest phase's window,
`WeatherExampleSource(indexed_target_steps=...)`), so a phase change, or a
resume, continues the data iterator at the same position.
"""

from __future__ import annotations

import dataclasses

from wnscale import specs as specs_lib


def phase_at(all_phases: tuple[specs_lib.Phase, ...], step: int) -> specs_lib.Phase:
  """The phase that trains step `step` (0-based; the last phase for `step >= train.steps`)."""
  return [phase for phase in all_phases if phase.first_step <= step][-1]


def longest(all_phases: tuple[specs_lib.Phase, ...]) -> int:
  """The most target steps of any phase: what the data indexing and the memory plan size."""
  return max(phase.target_steps for phase in all_phases)


def longest_phase_specs(specs: specs_lib.Specs) -> specs_lib.Specs:
  """`specs` with its longest phase's examples (`data.target_steps`): what
  `remat_policy="auto"` and the memory planner (`launch.compile`) size, as the longest
  rollout needs the most memory."""
  return dataclasses.replace(specs, data=dataclasses.replace(
      specs.data, target_steps=longest(specs.phases)))
