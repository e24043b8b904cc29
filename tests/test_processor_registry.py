"""A new processor is one module and one registry entry: this file defines one (a small
MLP-mixer over the mesh nodes, `MeshMixer`, with its settings `MixerSpec` and its
`ProcessorImplementation`), registers it, and trains a tiny model with it through the
trainer, changing no library file.

Its config keys (`model.mixer_layers`, ...), their defaults, checks and meanings come from
its settings, as the built-in processors' do (`wnscale.model.processors`).
"""

import dataclasses
import json
import logging
import os
import re
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from wnscale import config as config_lib
from wnscale import progress
from wnscale import specs as specs_lib
from wnscale.errors import UserError
from wnscale.graphs.graph import Graphs
from wnscale.model import processors
from wnscale.model.mlp import mlp_flops
from wnscale.model.processor_interface import ProcessorCost, ProcessorImplementation
from wnscale.specs import ModelSpec, ProcessorSpec, setting
from wnscale.train import trainer


@dataclasses.dataclass(frozen=True)
class MixerSpec(ProcessorSpec):
  """The mixer's settings: the `model` keys `mixer_<field>`."""

  name: ClassVar[str] = "mixer"
  KEY_PREFIX: ClassVar[str] = "mixer_"
  layers: int = setting(2, "mixer: blocks (neighbour mixing, then channel mixing)", minimum=1)
  hidden_size: int = setting(64, "mixer: hidden width of the channel-mixing MLP", minimum=1)


class MixerBlock(nnx.Module):
  """Mixes each mesh node with the mean of its neighbours on the multi-mesh (the token
  mixing), then mixes its channels (an MLP); both residual."""

  def __init__(self, width: int, hidden: int, *, dtype, rngs: nnx.Rngs):
    self.neighbour_norm = nnx.LayerNorm(width, rngs=rngs)
    self.neighbour_mix = nnx.Linear(width, width, dtype=dtype, rngs=rngs)
    self.channel_norm = nnx.LayerNorm(width, rngs=rngs)
    self.channel_up = nnx.Linear(width, hidden, dtype=dtype, rngs=rngs)
    self.channel_down = nnx.Linear(hidden, width, dtype=dtype, rngs=rngs)

  def __call__(self, nodes, edges, exchange):
    """`nodes` `[num_mesh_nodes, width]` after the block; `edges`: the mesh edge set."""
    num_nodes = nodes.shape[0]
    # The senders' rows, remote ones included (`exchange`), then summed per receiver.
    senders = exchange("mesh", self.neighbour_norm(nodes))[edges.senders]
    summed = jax.ops.segment_sum(senders, edges.receivers, num_nodes)
    degree = jax.ops.segment_sum(jnp.ones(edges.receivers.shape, summed.dtype),
                                 edges.receivers, num_nodes)
    nodes = nodes + self.neighbour_mix(summed / jnp.maximum(degree, 1)[:, None])
    hidden = jax.nn.gelu(self.channel_up(self.channel_norm(nodes)))
    return nodes + self.channel_down(hidden)


class MeshMixer(nnx.Module):
  """The processor: `MixerSpec.layers` mixer blocks (no noise conditioning)."""

  def __init__(self, spec: ModelSpec, *, dtype, rngs: nnx.Rngs):
    own = spec.processor
    self.blocks = nnx.List([MixerBlock(spec.latent_size, own.hidden_size, dtype=dtype,
                                       rngs=rngs) for _ in range(own.layers)])

  def __call__(self, graphs: Graphs, mesh, exchange, conditioning=None):
    del conditioning  # a deterministic model's
    for block in self.blocks:
      mesh = block(mesh, graphs.edges["mesh"], exchange)
    return mesh


def _mixer_cost(m: ModelSpec, graphs: Graphs) -> ProcessorCost:
  """Per layer, the neighbour mixing's product and the channel MLP (sums not counted)."""
  d, mesh = m.latent_size, graphs.num_nodes("mesh")
  layer = 2.0 * mesh * d * d + mlp_flops(mesh, d, m.processor.hidden_size, d)
  return ProcessorCost(m.processor.layers * layer, 0.0, m.processor.layers, mesh)


def _mixer_check(specs: specs_lib.Specs) -> str | None:
  if specs.model.noise_channels:
    return "model.processor='mixer' has no noise-conditioned layer norms: set noise_channels=0"
  return None


IMPLEMENTATION = ProcessorImplementation(MeshMixer, edge_sets=lambda m: {}, masks=lambda *_: {},
                                         cost=_mixer_cost)
MIXER = processors.Processor(MixerSpec, check=_mixer_check,
                             implementation=lambda: IMPLEMENTATION)


@pytest.fixture
def mixer(monkeypatch):
  """The mixer registered for one test (the config's keys are the registry's)."""
  monkeypatch.setitem(processors.PROCESSORS, MixerSpec.name, MIXER)


def test_its_keys_defaults_and_checks_come_from_its_settings(mixer):
  config = config_lib.default_config()
  assert (config.model.mixer_layers, config.model.mixer_hidden_size) == (2, 64)
  config.model.update(processor="mixer", mixer_layers=3)
  model = specs_lib.from_config(config_lib.validate(config)).model
  assert model.processor == MixerSpec(layers=3, hidden_size=64)
  assert model.section_values()["mixer_layers"] == 3
  config.model.mixer_layers = 0
  with pytest.raises(UserError, match=r"model.mixer_layers=0 must be >= 1"):
    config_lib.validate(config)
  config.model.update(mixer_layers=2, noise_channels=4)
  with pytest.raises(UserError, match="has no noise-conditioned layer norms"):
    config_lib.validate(config)
  with pytest.raises(UserError, match="did you mean model.mixer_layers"):
    config_lib.check_key("model.mixer_layer")
  # What another framework's export may ignore: the mixer's keys, for another processor.
  assert "mixer_layers" not in processors.keys_not_exported("mixer")
  assert "mixer_layers" in processors.keys_not_exported("interaction_network")


def test_it_trains_a_tiny_model_one_step(mixer, tmp_path, monkeypatch, caplog):
  config = config_lib.load("tiny")
  config.model.update(processor="mixer", mixer_layers=2, mixer_hidden_size=48)
  config.train.update(steps=1, log_every=1, checkpoint_every=1, eval_every=0, trackers=())
  config.mesh.update(data=2, graph=4)  # the graph sharded: its senders come by exchange
  config.data.update(train_start="2020-01-01", train_end="2020-01-10",
                     eval_start="2020-01-11", eval_end="2020-01-20")
  # While the train step compiles, a line says how long it has taken so far (every minute;
  # here every 0.2 s), ended by the compile's own line.
  monkeypatch.setattr(progress, "STILL_SECONDS", 0.2)
  with caplog.at_level(logging.INFO):
    trainer.train_and_evaluate(config_lib.validate(config), str(tmp_path))
  lines = [record.getMessage() for record in caplog.records]
  compiled = next(i for i, line in enumerate(lines) if line.startswith("Compiled the train step"))
  so_far = r"Compiling the train step: \d+:\d\d:\d\d so far\.\.\."
  assert any(re.fullmatch(so_far, line) for line in lines[:compiled])
  with open(tmp_path / "metrics.jsonl") as f:
    losses = [entry["loss"] for entry in map(json.loads, f) if "loss" in entry]
  assert len(losses) == 1 and np.isfinite(losses[0])
  with open(tmp_path / "config.json") as f:
    recorded = json.load(f)["model"]
  assert (recorded["processor"], recorded["mixer_layers"],
          recorded["mixer_hidden_size"]) == ("mixer", 2, 48)
  assert "1" in os.listdir(tmp_path / "checkpoints")
