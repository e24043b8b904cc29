"""Typed, frozen specs of an experiment, made once from its validated config.

The config (`wnscale.config`: ml_collections files, `--config.a.b=v`
overrides, a run's `config.json`) is the user's interface; `validate` is the
one place of its defaults and checks. `from_config` turns a validated config
into `Specs`: one frozen dataclass per section, fields named as the config's
keys, tuples for sequences; the model's processor and remat settings and the training
loss's nested (`ModelSpec.processor`, `ModelSpec.remat`, `TrainSpec.loss`), each a
`Settings` that its component
declares (the keys, their defaults, meanings and bounds: flat keys in the config). An
entry point (`train_and_evaluate`, `run_forecast`, a launcher) calls it once; below
it, code reads specs: the model keeps its `ModelSpec` in
its graphdef (hashable, unlike a `ConfigDict`), and `DataSpec` owns the facts derived
from the data keys (outputs, channels, batch shapes), computed here and nowhere else. A
value resolved on the way (the store's path, remat_policy="auto"'s choice) is a
`dataclasses.replace` of a spec; `recorded_config` writes it back into the config a run
records.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import ClassVar

from wnscale.data import variables as variables_lib
from wnscale.errors import UserError
from wnscale.graphs import region as region_lib


def setting(default, meaning: str, *, minimum: float | None = None, choices: tuple = (),
            how_only: bool = False):
  """A field of a component's `Settings`: one key of its config section.

  Args:
    default: the key's default.
    meaning: its documentation (docs/config_reference.md lists it).
    minimum: the least value allowed, if any.
    choices: the values allowed, if only some are.
    how_only: it changes how the model computes, not what (a run exported to another
      framework may set it as it likes).
  """
  return dataclasses.field(default=default, metadata=dict(
      meaning=meaning, minimum=minimum, choices=choices, how_only=how_only))


class Settings:
  """A component's own settings (a processor's, the remat's, a loss's): a frozen dataclass
  of `setting` fields, each the config key `KEY_PREFIX + field name` of the section
  `SECTION`.

  The component declares them once; the config's keys, defaults and documentation, the
  checks of their values and the interop's key lists are read from here.
  """

  SECTION: ClassVar[str] = "model"
  KEY_PREFIX: ClassVar[str] = ""

  @classmethod
  def config_keys(cls) -> dict[str, dataclasses.Field]:
    """`{config key: field}`, in the fields' order."""
    return {cls.KEY_PREFIX + field.name: field for field in dataclasses.fields(cls)}

  @classmethod
  def defaults(cls) -> dict:
    """`{config key: default}`."""
    return {key: field.default for key, field in cls.config_keys().items()}

  @classmethod
  def meanings(cls) -> dict[str, str]:
    """`{config key: its documentation}`."""
    return {key: field.metadata["meaning"] for key, field in cls.config_keys().items()}

  @classmethod
  def how_only_keys(cls) -> tuple[str, ...]:
    """The config keys that change how the model computes, not what."""
    return tuple(key for key, field in cls.config_keys().items() if field.metadata["how_only"])

  @classmethod
  def named(cls, name: str) -> type[Settings]:
    """The subclass of `cls` called `name` (`ProcessorSpec.named("transformer")`): the
    settings of that registry entry.

    Raises:
      ValueError: none is defined (its registry, which validating a config imports, was
        not: `wnscale.model.processors`, `wnscale.model.loss_registry`).
    """
    # Found among the subclasses, not in the registries: those import this module.
    for kind in cls.__subclasses__():
      if kind.name == name:
        return kind
    raise ValueError(f"No {cls.__name__} is named {name!r}: import its registry first.")

  @classmethod
  def from_section(cls, section) -> Settings:
    """The settings in a config's `SECTION` section (a `ConfigDict` or a dict)."""
    return cls(**{field.name: _frozen(section[key])
                  for key, field in cls.config_keys().items()})

  def section_values(self) -> dict:
    """`{config key: value}`: the settings as their section holds them."""
    return {key: getattr(self, field.name) for key, field in self.config_keys().items()}

  @classmethod
  def problem(cls, section) -> str | None:
    """What is wrong with a value of these settings in their section, if anything."""
    for key, field in cls.config_keys().items():
      value, minimum, choices = section[key], field.metadata["minimum"], field.metadata["choices"]
      if minimum is not None and value < minimum:
        return f"{cls.SECTION}.{key}={value} must be >= {minimum}"
      if choices and value not in choices:
        return f"{cls.SECTION}.{key}={value!r}, expected one of {choices}"
    return None


class ProcessorSpec(Settings):
  """A processor's settings; `name` is its `model.processor`. Each subclass is the `spec` of
  its processor's registry entry (`wnscale.model.processors.PROCESSORS`)."""

  name: ClassVar[str]


class LossSpec(Settings):
  """A loss's settings, keys of the `train` section; `name` is its `train.loss`. Each
  subclass is the `spec` of its loss's registry entry
  (`wnscale.model.loss_registry.LOSSES`)."""

  SECTION: ClassVar[str] = "train"
  name: ClassVar[str]

  @property
  def members(self) -> int:
    """An FGN's members per example that the loss compares (a deterministic model: 1)."""
    return 1

  @property
  def on_data(self) -> bool:
    """Whether the members are laid out along the `data` mesh axis (one per data shard)."""
    return False


@dataclasses.dataclass(frozen=True)
class RematSpec(Settings):
  """What the model recomputes in its backward pass, and in which blocks (the `model` keys
  of these names). What a policy costs in recomputation is its registry entry's
  (`wnscale.model.remat_policies.POLICIES`)."""

  remat_grid_to_mesh_gnn: bool = setting(False, "checkpoint the whole encoder")
  remat_mesh_gnn: bool = setting(
      False, "checkpoint the processor (either kind), one checkpoint per mesh_remat_every "
      "layers")
  remat_mesh_to_grid_gnn: bool = setting(False, "checkpoint the whole decoder")
  remat_policy: str = setting(
      "nothing_saveable", "a name from wnscale.model.remat_policies.POLICY_NAMES, or "
      "\"auto\": before training, the cheapest remat settings whose compiled step fits "
      "train.memory_budget_gib (wnscale.planner.auto_remat; overrides the remat keys)")
  mesh_remat_every: int = setting(1, "layers per processor checkpoint (GraphCast: 3)",
                                  minimum=1)
  mesh_layers_saved: int = setting(
      0, "with remat_mesh_gnn: the processor's last this many layers run outside the "
      "checkpoints, what their backward pass needs kept, not recomputed: the backward pass "
      "reaches them first, so they hold memory the shortest (a faster step where the "
      "memory is left)", minimum=0)
  edge_chunks: int = setting(
      1, "encoder/decoder edges in this many blocks, each under its own checkpoint (not "
      "under model.aggregation fused, whose kernels write no edge-sized intermediates)",
      minimum=1)
  mesh_edge_chunks: int = setting(
      1, "interaction-network processor: each step's mesh edges in this many blocks, each "
      "under its own checkpoint (a step's backward keeps one block's edge work)", minimum=1)
  grid_blocks: int = setting(
      1, "grid-node work (embedder, encoder grid update, the whole decoder) in this many "
      "blocks of grid nodes, each under its own checkpoint (then edge_chunks applies to the "
      "encoder only)", minimum=1)
  decoder_keeps_messages: bool = setting(
      False, "the decoder's summed messages ([grid nodes, latent]) kept for the backward "
      "pass whatever remat_policy says: its edge step is not run again (on a TPU v5e, 33 ms "
      "of the 0.25 deg paper step's 1.16 s) for one more grid-sized array (1 GiB at 0.25 "
      "deg in bfloat16)")
  scan_layers: bool = setting(
      True, "the processor's layers (or remat groups) as one jax.lax.scan, compiled once; "
      "False: a Python loop over them (MaxText's scan_layers): a longer compile, but the "
      "values the backward pass keeps are separate arrays, not slices of stacked ones, which "
      "saves their copies (on a TPU, ~6% of the GraphCast paper model's step)")

  # The switches of the three stages (encoder, processor, decoder), in order.
  STAGES: ClassVar[tuple[str, ...]] = ("remat_grid_to_mesh_gnn", "remat_mesh_gnn",
                                       "remat_mesh_to_grid_gnn")


@dataclasses.dataclass(frozen=True)
class DenoiserSpec(Settings):
  """GenCast's denoiser (`wnscale.model.denoiser`): the network as a diffusion model's
  denoiser, its layer norms conditioned on the noise level (the `model` keys
  `denoiser_<field>`; `noise_frequencies` 0: the network is a forecaster)."""

  KEY_PREFIX: ClassVar[str] = "denoiser_"
  noise_frequencies: int = setting(
      0, "0: the network forecasts; > 0: it is GenCast's denoiser of noisy targets, the noise "
      "level sigma encoded as this many Fourier frequencies of log(sigma) and an MLP, the "
      "encoding conditioning every layer norm (GenCast: 32)", minimum=0)
  noise_base_period: float = setting(
      16.0, "denoiser: the period of the lowest Fourier frequency of log(sigma) (GenCast: 16)",
      minimum=0.0)
  noise_hidden_size: int = setting(
      32, "denoiser: hidden width of the noise-level encoding's MLP (GenCast: 32)", minimum=1)
  noise_encoding_size: int = setting(
      16, "denoiser: width of the noise-level encoding, what the layer norms are conditioned on "
      "(GenCast: 16)", minimum=1)


@dataclasses.dataclass(frozen=True)
class SamplerSpec(Settings):
  """GenCast's sampler of a denoiser (`wnscale.model.sampler`): its noise levels and
  stochastic churn (the `model` keys `sampler_<field>`; read with
  `denoiser_noise_frequencies > 0`)."""

  KEY_PREFIX: ClassVar[str] = "sampler_"
  max_noise_level: float = setting(80.0, "sampler: the first noise level (GenCast: 80)",
                                   minimum=0.0)
  min_noise_level: float = setting(0.03, "sampler: the last noise level before 0 (GenCast: "
                                   "0.03)", minimum=0.0)
  noise_levels: int = setting(20, "sampler: noise levels from max to min (then 0), one "
                              "2nd-order step each (GenCast: 20)", minimum=1)
  rho: float = setting(7.0, "sampler: the levels' spacing, (max^(1/rho) ... min^(1/rho))^rho "
                       "(GenCast: 7)", minimum=0.0)
  churn_rate: float = setting(2.5, "sampler: stochastic churn S_churn, spread over the levels "
                              "(GenCast: 2.5; 0: deterministic)", minimum=0.0)
  churn_min_noise_level: float = setting(0.75, "sampler: churn at levels >= this (GenCast: "
                                         "0.75)", minimum=0.0)
  churn_max_noise_level: float = setting(0.0, "sampler: churn at levels <= this; 0: at any "
                                         "level above churn_min_noise_level (GenCast's inf)",
                                         minimum=0.0)
  noise_level_inflation: float = setting(1.05, "sampler: the churn's noise is this much more "
                                         "than the denoiser is told (GenCast: 1.05)",
                                         minimum=0.0)
  spherical_noise: bool = setting(True, "sampler and loss=\"diffusion\": noise fields as "
                                  "GenCast's spherical white noise (a regular latitude/"
                                  "longitude grid, an even number of longitudes); False: "
                                  "independent per grid node (any grid)")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """The `model` section (its keys are documented in `wnscale.config.default_config`).

  `processor` and `remat` hold the keys their components own (the processor's registry
  entry, `wnscale.model.processors.PROCESSORS`; the remat's `RematSpec`): in the config,
  keys of the section like the others.
  """

  latent_size: int
  mesh_levels: int
  regional_mesh_levels: int
  radius_fraction: float
  mesh_to_grid_edge_normalization: float
  edge_latent_size: int
  processor: ProcessorSpec  # a GNNSpec or TransformerSpec, or another registered processor's
  remat: RematSpec
  denoiser: DenoiserSpec
  sampler: SamplerSpec
  dtype: str
  noise_channels: int
  grid_to_mesh_gather_from_receivers: bool
  grid_to_mesh_aggregate_normalization: float
  output_activations: tuple[tuple[str, str, float], ...]

  # The fields that are a component's `Settings`, the keys it owns.
  COMPONENTS: ClassVar[tuple[str, ...]] = ("processor", "remat", "denoiser", "sampler")

  def __post_init__(self):  # the config's "variable:activation[:offset]" entries, parsed
    object.__setattr__(self, "output_activations", tuple(
        _parse_entry(entry, "model.output_activations", (str, str, float), defaults=(0.0,))
        for entry in self.output_activations))

  @classmethod
  def from_section(cls, section) -> ModelSpec:
    """The spec of a config's `model` section; the processor's settings are those of the
    registry entry `section["processor"]` names."""
    return cls(processor=ProcessorSpec.named(section["processor"]).from_section(section),
               remat=RematSpec.from_section(section),
               denoiser=DenoiserSpec.from_section(section),
               sampler=SamplerSpec.from_section(section), **_own_fields(cls, section))

  def section_values(self) -> dict:
    """`{config key: value}`: the spec as the config's `model` section holds it."""
    return (_own_values(self) | {"processor": self.processor.name}
            | self.processor.section_values() | self.remat.section_values()
            | self.denoiser.section_values() | self.sampler.section_values())

  @property
  def conditioning_size(self) -> int:
    """Width of the vector every layer norm is conditioned on: an FGN's noise embedding
    (`noise_channels`), a denoiser's noise-level encoding, or 0 (plain norms)."""
    if self.denoiser.noise_frequencies:
      return self.denoiser.noise_encoding_size
    return self.noise_channels

  @property
  def edge_size(self) -> int:
    """Width of the encoder's and decoder's edge latents (`edge_latent_size`, 0: latent)."""
    return self.edge_latent_size or self.latent_size


@dataclasses.dataclass(frozen=True)
class MeshSpec:
  """The `mesh` section: devices along the batch and space axes, the exchange mode."""

  data: int
  graph: int
  exchange: str


# Stations of a modality whose source is "synthetic" (without ":N").
SYNTHETIC_STATIONS = 500


@dataclasses.dataclass(frozen=True)
class ModalitySpec:
  """One `data.modalities` entry: a named point set (e.g. stations) beside the grid.

  Attributes:
    name: the node set's name (`<name>_to_mesh`, `mesh_to_<name>` its edge sets).
    source: where its points and values come from: an observation store's path
      (`wnscale.data.reading.observations`), or "synthetic[:N]": a synthetic network of N
      stations (`SYNTHETIC_STATIONS` without ":N") of the grid store.
    inputs: variables it feeds the encoder (WeatherBench2 surface names), may be ().
    targets: variables the model predicts at its points, may be ().
    loss_weight: its point-weighted MSE's weight in the loss.
  """

  name: str
  source: str
  inputs: tuple[str, ...]
  targets: tuple[str, ...]
  loss_weight: float = 1.0

  @classmethod
  def parse(cls, entry) -> ModalitySpec:
    """Of a config entry `(name, source, inputs, targets[, loss_weight])`; the variable
    lists as sequences or comma-separated strings."""
    if isinstance(entry, ModalitySpec):
      return entry
    if isinstance(entry, str) or not 4 <= len(entry) <= 5:
      raise UserError(f"Invalid config: data.modalities entry {entry!r}: expected "
                      "(name, source, inputs, targets[, loss_weight]).")
    names = lambda v: tuple(x for x in (v.split(",") if isinstance(v, str) else v) if x)
    try:
      weight = float(entry[4]) if len(entry) == 5 else 1.0
    except (TypeError, ValueError) as error:
      raise UserError(f"Invalid config: data.modalities entry {entry!r}: loss_weight: "
                      f"{error}.") from error
    return cls(str(entry[0]), str(entry[1]), names(entry[2]), names(entry[3]), weight)

  @property
  def synthetic_stations(self) -> int | None:
    """The station count of a "synthetic[:N]" source; None for a store's path.

    Raises:
      UserError: "synthetic:..." without a count >= 1.
    """
    if self.source == "synthetic":
      return SYNTHETIC_STATIONS
    if not self.source.startswith("synthetic:"):
      return None
    count = self.source.removeprefix("synthetic:")
    if not count.isdigit() or int(count) < 1:
      raise UserError(f"Invalid config: data.modalities entry {self.name!r}: source "
                      f"{self.source!r}: synthetic:N needs a station count N >= 1.")
    return int(count)

  def input_channels(self, input_steps: int) -> int:
    """Channels of the embedder's inputs per point: each input at each input time, and a
    presence mask for each."""
    return 2 * input_steps * len(self.inputs)


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """The `data` section, and what follows from it about the arrays the model reads.

  Channel counts and batch shapes follow the contract in `wnscale.model.forecast`.
  """

  path: str
  member: int
  synthetic: bool
  stats_path: str
  regional_path: str
  region: str
  regional_loss_weight: float
  resolution: float
  grid: str
  variables: tuple[str, ...]
  target_only_variables: tuple[str, ...]
  pressure_levels: tuple[int, ...]
  forcings: tuple[str, ...]
  stored_forcings: tuple[str, ...]
  input_normalization: str
  input_steps: int
  target_steps: int
  time_step_hours: int
  global_forcings: tuple[str, ...]
  train_start: str
  train_end: str
  eval_start: str
  eval_end: str
  worker_count: int
  fill_nan: bool
  nan_fill_values: tuple[tuple[str, float], ...]
  modalities: tuple[ModalitySpec, ...] = ()

  def __post_init__(self):  # the config's "variable:value" entries, parsed
    object.__setattr__(self, "nan_fill_values", tuple(
        _parse_entry(entry, "data.nan_fill_values", (str, float))
        for entry in self.nan_fill_values))
    object.__setattr__(self, "modalities", tuple(ModalitySpec.parse(entry)
                                                 for entry in self.modalities))

  @property
  def region_box(self) -> region_lib.Box | None:
    """`region` parsed (`graphs.region.parse_box`); None: the regional points' hull."""
    return region_lib.parse_box(self.region, "data.region")

  @property
  def outputs(self) -> tuple[str, ...]:
    """The variables the model predicts: the state, then the target-only ones."""
    return self.variables + self.target_only_variables

  @property
  def state_channels(self) -> tuple[str, ...]:
    """Channel names of the state (inputs), `variables` on `pressure_levels`."""
    return tuple(variables_lib.channel_names(self.variables, self.pressure_levels))

  @property
  def output_channels(self) -> tuple[str, ...]:
    """Channel names of the outputs: the state's, then the target-only variables'."""
    return tuple(variables_lib.channel_names(self.outputs, self.pressure_levels))

  @property
  def global_channels(self) -> int:
    """Global input channels of one step: each global forcing at the input and target times."""
    return (self.input_steps + 1) * len(self.global_forcings)

  @property
  def input_channels(self) -> int:
    """Channels of the network's grid input for one step (global inputs included)."""
    return (self.input_steps * len(self.state_channels)
            + (self.input_steps + 1) * len(self.forcings)
            + len(variables_lib.STATIC_VARIABLES) + self.global_channels)

  def batch_shapes(self, num_grid_nodes: int, batch_size: int,
                   num_points: dict[str, int] | None = None) -> dict[str, tuple[int, ...]]:
    """The array shapes of one batch of `batch_size` examples (`globals` only if configured).

    Each modality (`num_points`: its point count by name) adds `<name>/inputs`
    `[B, input_steps, inputs, P]` and `<name>/targets` `[B, target_steps, targets, P]`
    (those it has), NaN where missing; a modality `num_points` lacks adds none.
    """
    steps = self.input_steps + self.target_steps
    shapes = {
        "inputs": (batch_size, self.input_steps, len(self.state_channels), num_grid_nodes),
        "targets": (batch_size, self.target_steps, len(self.output_channels), num_grid_nodes),
        "forcings": (batch_size, steps, len(self.forcings), num_grid_nodes),
        "statics": (batch_size, len(variables_lib.STATIC_VARIABLES), num_grid_nodes),
    }
    if self.global_forcings:
      shapes["globals"] = (batch_size, steps, len(self.global_forcings))
    for modality in self.modalities:
      if modality.name not in (num_points or {}):
        continue
      points = num_points[modality.name]
      if modality.inputs:
        shapes[f"{modality.name}/inputs"] = (batch_size, self.input_steps,
                                             len(modality.inputs), points)
      if modality.targets:
        shapes[f"{modality.name}/targets"] = (batch_size, self.target_steps,
                                              len(modality.targets), points)
    return shapes

  def split_range(self, split: str) -> tuple[str, str]:
    """`(start, end)` of the "train" or "eval" time range."""
    if split not in ("train", "eval"):
      raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    return getattr(self, f"{split}_start"), getattr(self, f"{split}_end")


@dataclasses.dataclass(frozen=True)
class Phase:
  """A rollout phase: steps `[first_step, end_step)` trained on `target_steps` rollout steps."""

  index: int
  first_step: int
  end_step: int
  target_steps: int


@dataclasses.dataclass(frozen=True)
class TrainSpec:
  """The `train` section: optimizer, schedule, loss, logging and checkpoints.

  `loss` holds the keys its registry entry owns (`wnscale.model.loss_registry.LOSSES`): in
  the config, keys of the section like the others.
  """

  steps: int
  batch_size: int
  accumulation_steps: int
  learning_rate: float
  end_learning_rate: float
  warmup_steps: int
  weight_decay: float
  adam_b1: float
  adam_b2: float
  grad_clip_norm: float
  remat_rollout: bool
  loss: LossSpec  # an MSESpec or CRPSSpec, or another registered loss's
  log_every: int
  prefetch_batches: int
  eval_every: int
  eval_batches: int
  checkpoint_every: int
  max_checkpoints: int
  memory_budget_gib: float
  variable_loss_weights: tuple[tuple[str, float], ...]
  init_from: str
  rollout_schedule: tuple[tuple[int, int], ...]
  phase_learning_rates: tuple[tuple[float, int, float], ...]
  ema_decay: float
  freeze: tuple[str, ...]
  trackers: tuple[str, ...]

  # The fields that are a component's `Settings`, the keys it owns.
  COMPONENTS: ClassVar[tuple[str, ...]] = ("loss",)

  def __post_init__(self):  # the config's entries, parsed
    object.__setattr__(self, "variable_loss_weights", tuple(
        _parse_entry(entry, "train.variable_loss_weights", (str, float))
        for entry in self.variable_loss_weights))
    object.__setattr__(self, "rollout_schedule", tuple(
        _parse_entry(entry, "train.rollout_schedule", (int, int))
        for entry in self.rollout_schedule))
    # "peak[:warmup_steps[:end]]": no end given, the phase's rate stays at its peak.
    rates = (_parse_entry(str(entry) if isinstance(entry, (int, float)) else entry,
                          "train.phase_learning_rates", (float, int, float),
                          defaults=(0, math.nan)) for entry in self.phase_learning_rates)
    object.__setattr__(self, "phase_learning_rates", tuple(
        (peak, warmup, peak if math.isnan(end) else end) for peak, warmup, end in rates))

  @classmethod
  def from_section(cls, section) -> TrainSpec:
    """The spec of a config's `train` section; the loss's settings are those of the
    registry entry `section["loss"]` names."""
    return cls(loss=LossSpec.named(section["loss"]).from_section(section),
               **_own_fields(cls, section))

  def section_values(self) -> dict:
    """`{config key: value}`: the spec as the config's `train` section holds it."""
    return _own_values(self) | {"loss": self.loss.name} | self.loss.section_values()

  def phases(self, target_steps: int) -> tuple[Phase, ...]:
    """The rollout phases of the run, in order, covering steps `[0, steps)`; `target_steps`
    (`data.target_steps`) is the one phase's without a `rollout_schedule`."""
    schedule = self.rollout_schedule or ((0, target_steps),)
    ends = [first for first, _ in schedule[1:]] + [self.steps]
    return tuple(Phase(index, first, end, steps)
                 for index, ((first, steps), end) in enumerate(zip(schedule, ends)))


@dataclasses.dataclass(frozen=True)
class Specs:
  """A whole experiment: its seed and one spec per config section."""

  seed: int
  model: ModelSpec
  mesh: MeshSpec
  data: DataSpec
  train: TrainSpec

  @property
  def phases(self) -> tuple[Phase, ...]:
    """The run's rollout phases (`TrainSpec.phases`)."""
    return self.train.phases(self.data.target_steps)


def _parse_entry(entry, key: str, types: tuple, defaults: tuple = ()) -> tuple:
  """A config entry "a:b[:c]" (or an already parsed tuple) as a tuple of `types`."""
  parts = entry.split(":") if isinstance(entry, str) else list(entry)
  missing = len(types) - len(parts)
  if 0 < missing <= len(defaults):  # the last parts may be left out
    parts += defaults[-missing:]
  try:
    if len(parts) != len(types):
      raise ValueError(f"{len(parts)} parts, not {len(types)}")
    return tuple(kind(part) for kind, part in zip(types, parts))
  except ValueError as error:
    raise UserError(f"Invalid config: {key} entry {entry!r}: {error}.") from error


def _frozen(value):
  """A config value as a spec holds it: sequences as tuples."""
  return tuple(value) if isinstance(value, (list, tuple)) else value


def _own_fields(cls, section) -> dict:
  """`{field: value}` of a config section, for the fields of its spec `cls` that hold no
  component's settings (those are `cls.COMPONENTS`)."""
  return {field.name: _frozen(section[field.name]) for field in dataclasses.fields(cls)
          if field.name not in cls.COMPONENTS}


def _own_values(spec) -> dict:
  """`{config key: value}` of the fields of a section's spec that hold no component's."""
  return {field.name: getattr(spec, field.name) for field in dataclasses.fields(spec)
          if field.name not in spec.COMPONENTS}


def _section(cls, section):
  """`cls` of a config section. A key `cls` lacks is a TypeError."""
  if hasattr(cls, "from_section"):  # a section with components' settings
    return cls.from_section(section)
  return cls(**{key: _frozen(value) for key, value in section.items()})


def _section_values(spec) -> dict:
  """`{config key: value}` of a section's spec."""
  if hasattr(spec, "section_values"):
    return spec.section_values()
  return {field.name: getattr(spec, field.name) for field in dataclasses.fields(spec)}


SECTIONS = {"model": ModelSpec, "mesh": MeshSpec, "data": DataSpec, "train": TrainSpec}


def from_config(config) -> Specs:
  """The specs of a validated config (`wnscale.config.validate`'s `ConfigDict`, or its JSON
  as a dict)."""
  return Specs(seed=config["seed"], **{name: _section(cls, config[name])
                                       for name, cls in SECTIONS.items()})


def recorded_config(specs: Specs, given: dict) -> dict:
  """The config a run records (its `config.json`) for `specs`: `given`, the JSON (a dict) of
  the validated config the specs were made from, with each value resolved since (a
  `dataclasses.replace` of a spec: the store's path, remat_policy="auto"'s choice) in its
  place, in the config's form."""
  made = from_config(given)
  recorded = copy.deepcopy(given)
  if specs.seed != made.seed:
    recorded["seed"] = specs.seed
  for name in SECTIONS:
    values, made_values = (_section_values(getattr(s, name)) for s in (specs, made))
    for key, value in values.items():
      if value != made_values.get(key):
        recorded[name][key] = _config_value(value)
  return recorded


def _config_value(value):
  """A spec's field as a config's JSON holds it: tuples as lists, a nested spec (a
  `ModalitySpec`) as its entry's list of fields."""
  if dataclasses.is_dataclass(value):
    value = dataclasses.astuple(value)
  if isinstance(value, tuple):
    return [_config_value(item) for item in value]
  return value
