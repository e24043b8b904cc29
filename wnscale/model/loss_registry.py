"""The training losses' registry (`train.loss` names one entry), Flax-free.

An entry holds what a config needs without building a model: the loss's settings
(its spec class: the `train` keys it reads, their defaults and meanings,
`TrainSpec.loss`; how many members of an FGN it compares per example) and the
settings it cannot run with. What it computes, its sums over the grid's nodes and
over a modality's points, is loaded from `wnscale.model.loss` when a step is
built (`wnscale.sharding.sharded_model` asks the entry). A new loss is its sums and one
more entry of `LOSSES`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Callable, ClassVar, NamedTuple

from wnscale.specs import LossSpec, Specs, setting

if TYPE_CHECKING:
  from wnscale.model.loss import LossImplementation


@dataclasses.dataclass(frozen=True)
class MSESpec(LossSpec):
  """GraphCast's weighted MSE (`train.loss='mse'`): no settings of its own; an FGN trained
  with it runs one member per example."""

  name: ClassVar[str] = "mse"


@dataclasses.dataclass(frozen=True)
class CRPSSpec(LossSpec):
  """WeatherNext 2's fair CRPS over an FGN's members (`train.loss='crps'`)."""

  name: ClassVar[str] = "crps"
  ensemble_members: int = setting(
      2, "loss=\"crps\": members per example (a `sample` dim of the batch)", minimum=2)
  members_on_data: bool = setting(
      False, "loss=\"crps\": False: each device runs all members of its examples (vmapped "
      "with the batch); True: members laid out along the data mesh axis (each data shard "
      "one member; mesh.data a multiple of ensemble_members; one process)")

  @property
  def members(self) -> int:
    return self.ensemble_members

  @property
  def on_data(self) -> bool:
    return self.members_on_data


class Loss(NamedTuple):
  """A registry entry.

  Attributes:
    spec: its settings, a frozen `LossSpec` dataclass (`TrainSpec.loss`); `spec.name` is
      the entry's key.
    check: `specs -> None`, or what is wrong with them for this loss (beyond its
      settings' own bounds, which `wnscale.config.validate` checks).
    implementation: `() -> loss.LossImplementation`; imports `wnscale.model.loss` (Flax)
      when first called.
  """

  spec: type[LossSpec]
  check: Callable[[Specs], str | None]
  implementation: Callable[[], LossImplementation]


def _crps_check(specs: Specs) -> str | None:
  if not specs.model.noise_channels:
    return ("train.loss='crps' needs model.noise_channels > 0 (the members of a "
            "deterministic model are identical)")
  if specs.data.modalities and specs.train.loss.members_on_data:
    return ("train.members_on_data lays an FGN's members along the data axis for the grid "
            "only: with data.modalities, set train.members_on_data=False (each device then "
            "runs every member of its examples)")
  return None


def _mse() -> LossImplementation:
  from wnscale.model import loss  # noqa: PLC0415 (Flax: only once a step is built)
  return loss.MSE


def _crps() -> LossImplementation:
  from wnscale.model import loss  # noqa: PLC0415 (Flax: as _mse)
  return loss.CRPS


LOSSES = {entry.spec.name: entry for entry in (
    Loss(MSESpec, check=lambda specs: None, implementation=_mse),
    Loss(CRPSSpec, check=_crps_check, implementation=_crps),
)}
