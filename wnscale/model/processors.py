"""The mesh processors' registry (`model.processor` names one entry), Flax-free.

An entry holds what a config needs without building a model: the processor's
settings (its spec class: the config keys, their defaults and meanings,
`ModelSpec.processor`) and the settings it cannot run with. Its implementation (its
Flax module, the edge sets and masks it reads, its FLOP count) is loaded from its
own module when a model, graphs or a cost estimate is made, so that loading and
validating a config imports neither Flax nor the model. A new processor is one
module (its spec, module and `processor_interface.ProcessorImplementation`) and one more
entry of `PROCESSORS` (tests/test_processor_registry.py adds one).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar, NamedTuple

from wnscale.model.processor_interface import AGGREGATIONS, ProcessorImplementation
from wnscale.specs import ModelSpec, ProcessorSpec, Specs, setting

# `model.transformer_attention`'s values (`wnscale.model.mesh_transformer.attention_kind`).
ATTENTIONS = ("auto", "edges", "splash")


@dataclasses.dataclass(frozen=True)
class GNNSpec(ProcessorSpec):
  """The interaction-network processor's settings (`model.processor='interaction_network'`,
  `wnscale.model.mesh_gnn`)."""

  name: ClassVar[str] = "interaction_network"
  message_passing_steps: int = setting(4, "interaction_network: processor (mesh GNN) layers",
                                       minimum=1)
  aggregation: str = setting(
      "auto", "interaction_network: how the processor's mesh edges reach their receivers "
      "(each edge's receiver row, each receiver's sum), and the grid's encoder and decoder "
      "edges': \"segment_sum\" (by index: a gather and a scatter), \"matmul\" (products "
      "with each block of edges' 0/1 receiver matrix; no scatter: wnscale.model.aggregation; "
      "the encoder's and decoder's where edge_chunks is 1), \"fused\" (blocks, and a "
      "layer's whole edge step one Pallas kernel per block: wnscale.model.fused_edges; the "
      "encoder's and decoder's edge steps too, embedding MLP included, whatever edge_chunks "
      "says: wnscale.model.fused_encoder_decoder; a TPU's, interpreted elsewhere), \"auto\": "
      "fused on a TPU, matmul on another accelerator, segment_sum on a CPU. The same "
      "function each way (to rounding)", choices=AGGREGATIONS, how_only=True)
  edge_block_slots: int = setting(
      768, "interaction_network, aggregation matmul or fused: mesh edges per receiver block "
      "(wnscale.graphs.receiver_blocks), a multiple of 128. Smaller blocks span fewer "
      "receivers and senders (narrower 0/1 matrices, more of the senders in each block's "
      "far list)", minimum=128, how_only=True)
  sender_window_margin: int = setting(
      64, "interaction_network, aggregation matmul or fused: rows each block's sender "
      "window reaches beyond its receivers, on either side, a multiple of 8; the senders "
      "outside are read from the block's far list", minimum=0, how_only=True)


@dataclasses.dataclass(frozen=True)
class TransformerSpec(ProcessorSpec):
  """The mesh transformer's settings (`model.processor='transformer'`,
  `wnscale.model.mesh_transformer`), the `model` keys `transformer_<field>`."""

  name: ClassVar[str] = "transformer"
  KEY_PREFIX: ClassVar[str] = "transformer_"
  layers: int = setting(4, "transformer: blocks (attention + feed-forward)", minimum=1)
  heads: int = setting(4, "transformer: attention heads; must divide latent_size", minimum=1)
  ffw_size: int = setting(128, "transformer: hidden width of the feed-forward layers",
                          minimum=1)
  k_hop: int = setting(
      2, "transformer: a mesh node attends to the nodes at most this many edges away on the "
      "finest mesh (itself included); WeatherNext 2: 32 at mesh_levels 6", minimum=0)
  edges_per_block: int = setting(
      0, "transformer, attention from the edges: edges per block on a device, each block "
      "under its own checkpoint (bounds the [edges, latent] gathers); 0: all at once",
      minimum=0, how_only=True)
  attention: str = setting(
      "auto", "transformer: how attention is computed: \"edges\" (gathers and segment sums "
      "over the neighbour lists: any backend, any graph sharding), \"splash\" (Pallas' "
      "block-sparse flash attention kernel, as WeatherNext 2 on TPUs: the graph on one "
      "device; off a TPU in Pallas' interpret mode, slow) or \"auto\": splash on a TPU with "
      "mesh.graph 1, edges otherwise. The same numbers either way "
      "(wnscale.model.splash_attention)", choices=ATTENTIONS, how_only=True)


class Processor(NamedTuple):
  """A registry entry.

  Attributes:
    spec: its settings, a frozen `ProcessorSpec` dataclass (`ModelSpec.processor`);
      `spec.name` is the entry's key.
    check: `specs -> None`, or what is wrong with them for this processor (beyond
      its settings' own bounds and choices, which `wnscale.config.validate` checks).
    implementation: `() -> ProcessorImplementation`; imports its module (Flax) when
      first called.
  """

  spec: type[ProcessorSpec]
  check: Callable[[Specs], str | None]
  implementation: Callable[[], ProcessorImplementation]


def _transformer_check(specs: Specs) -> str | None:
  m = specs.model
  if m.latent_size % m.processor.heads:
    return (f"model.transformer_heads={m.processor.heads} must divide "
            f"model.latent_size={m.latent_size}")
  if m.regional_mesh_levels:
    return (f"model.regional_mesh_levels={m.regional_mesh_levels} works with the "
            "interaction_network processor, not model.processor='transformer' (its "
            "neighbourhoods are of the uniform mesh)")
  if m.processor.attention == "splash" and specs.mesh.graph not in (1, -1):
    return (f"model.transformer_attention='splash' runs with the graph on one device, not "
            f"mesh.graph={specs.mesh.graph} (\"auto\" computes it from the edges there)")
  return None


def _mesh_gnn() -> ProcessorImplementation:
  from wnscale.model import mesh_gnn  # noqa: PLC0415 (Flax: only once a model is made)
  return mesh_gnn.IMPLEMENTATION


def _mesh_transformer() -> ProcessorImplementation:
  from wnscale.model import mesh_transformer  # noqa: PLC0415 (Flax: as _mesh_gnn)
  return mesh_transformer.IMPLEMENTATION


def _gnn_check(specs: Specs) -> str | None:
  p = specs.model.processor
  if p.edge_block_slots % 128 or p.sender_window_margin % 8:
    return (f"model.edge_block_slots={p.edge_block_slots} must be a multiple of 128 and "
            f"model.sender_window_margin={p.sender_window_margin} one of 8 (the chip's tiles)")
  return None


PROCESSORS = {entry.spec.name: entry for entry in (
    Processor(GNNSpec, check=_gnn_check, implementation=_mesh_gnn),
    Processor(TransformerSpec, check=_transformer_check, implementation=_mesh_transformer),
)}


def implementation(m: ModelSpec) -> ProcessorImplementation:
  """The implementation of the processor `m` has."""
  return PROCESSORS[m.processor.name].implementation()


def keys_not_exported(name: str) -> tuple[str, ...]:
  """The processor keys that a model of processor `name` exported to another framework may
  set as it likes: the other processors' (not read), and its own that change how it
  computes, not what."""
  own = PROCESSORS[name].spec
  return tuple(key for entry in PROCESSORS.values() for key in entry.spec.config_keys()
               if entry.spec is not own or key in own.how_only_keys())
