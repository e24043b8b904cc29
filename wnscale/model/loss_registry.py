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


@dataclasses.dataclass(frozen=True)
class DiffusionSpec(LossSpec):
  """GenCast's denoising loss of a denoiser (`train.loss='diffusion'`,
  `wnscale.model.diffusion`): its noise levels drawn from the rho distribution on
  [training_min_noise_level, training_max_noise_level] (GenCast's `NoiseConfig`)."""

  name: ClassVar[str] = "diffusion"
  training_noise_level_rho: float = setting(
      7.0, "loss=\"diffusion\": the training noise levels' rho (GenCast: 7; higher: more "
      "levels near the minimum)", minimum=1e-6)
  training_min_noise_level: float = setting(
      0.02, "loss=\"diffusion\": the least training noise level (GenCast: 0.02)",
      minimum=1e-6)
  training_max_noise_level: float = setting(
      88.0, "loss=\"diffusion\": the greatest training noise level (GenCast: 88)",
      minimum=1e-6)


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


def _diffusion_check(specs: Specs) -> str | None:
  t = specs.train
  if not specs.model.denoiser.noise_frequencies:
    return ("train.loss='diffusion' trains a denoiser: set model.denoiser_noise_frequencies "
            "> 0 (GenCast: 32)")
  if t.loss.training_min_noise_level >= t.loss.training_max_noise_level:
    return (f"train.training_min_noise_level={t.loss.training_min_noise_level} must be below "
            f"train.training_max_noise_level={t.loss.training_max_noise_level}")
  if specs.data.target_steps != 1 or any(steps != 1 for _, steps in t.rollout_schedule):
    return ("train.loss='diffusion' trains one step (GenCast's 12 h step, no rollout): set "
            "data.target_steps=1 and no train.rollout_schedule phase of more steps")
  if t.remat_rollout:
    return "train.loss='diffusion' has no rollout to remat: set train.remat_rollout=False"
  if t.eval_every:
    return ("train.loss='diffusion': a denoiser's evaluation (of its sampled forecasts) is "
            "not built yet: set train.eval_every=0")
  return None


def _mse() -> LossImplementation:
  from wnscale.model import loss  # noqa: PLC0415 (Flax: only once a step is built)
  return loss.MSE


def _crps() -> LossImplementation:
  from wnscale.model import loss  # noqa: PLC0415 (Flax: as _mse)
  return loss.CRPS


def _diffusion() -> LossImplementation:
  from wnscale.model import diffusion  # noqa: PLC0415 (Flax: as _mse)
  return diffusion.IMPLEMENTATION


def _forecaster_check(specs: Specs) -> str | None:
  """A forecaster's loss (of its rollout's predictions): not a denoiser's."""
  if specs.model.denoiser.noise_frequencies:
    return (f"train.loss={specs.train.loss.name!r} scores a forecaster's predictions; a "
            "denoiser (model.denoiser_noise_frequencies > 0) trains with "
            "train.loss='diffusion'")
  return None


LOSSES = {entry.spec.name: entry for entry in (
    Loss(MSESpec, check=_forecaster_check, implementation=_mse),
    Loss(CRPSSpec, check=_crps_check, implementation=_crps),
    Loss(DiffusionSpec, check=_diffusion_check, implementation=_diffusion),
)}
