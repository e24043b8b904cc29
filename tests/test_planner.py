"""The memory planner: AOT compiles on CPU and TPU topologies, and remat_policy='auto'."""

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys

import jax
import pytest

from wnscale import cache
from wnscale import config as config_lib
from wnscale import specs as specs_lib
from wnscale.planner import accumulation, auto_remat, topology
from wnscale.planner import buffers as buffers_lib
from wnscale.planner import flops as flops_lib
from wnscale.planner.compile import Problem
from wnscale.train.step import lower_train_step

REPO = os.path.join(os.path.dirname(__file__), "..")
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None


def tiny(**model):
  config = config_lib.load(os.path.join(REPO, "configs", "tiny.py"))
  config.model.update(model)
  return config


@pytest.mark.slow
def test_cpu_compile_cli_reports_the_compiled_step():
  """The step of 2 micro-batches (`train.accumulation_steps`): the batch of 2 on 2 data
  shards is rounded up to 2 examples a shard, one per micro-batch."""
  result = subprocess.run(
      [sys.executable, "-m", "launch.compile", "--config=configs/tiny.py", "--topology=cpu:8",
       "--config.mesh.graph=4", "--config.train.accumulation_steps=2", "--json"],
      cwd=REPO, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert ("train.batch_size=2 does not split over 2 data shards of 2 micro-batches: "
          "compiling 2 example(s) per data shard (batch 4)") in result.stderr
  report = json.loads(result.stdout.strip().splitlines()[-1])
  assert report["topology"] == "cpu:8" and report["num_devices"] == 8
  assert report["mesh"] == {"data": 2, "graph": 4}
  assert report["batch_size"] == 4 and report["accumulation_steps"] == 2
  assert report["fits"] is True and report["flops"] > 0
  assert 0 < report["temp_bytes"] < report["device_memory_bytes"]
  assert report["peak_bytes"] >= report["argument_bytes"] > 0


def test_the_planner_compiles_a_step_with_stations():
  """configs/tiny_stations.py: the planner reads no store, so a "synthetic:N" modality is N
  points at random; the step compiles with their batch and edges, and the analytic FLOPs
  add each modality's embedder, edges and node MLPs to the grid model's, unchanged."""
  config = config_lib.load(os.path.join(REPO, "configs", "tiny_stations.py"))
  config.model.message_passing_steps = 2
  config.mesh.update(data=1, graph=1)
  config.train.batch_size = 1
  target = topology.Target("cpu:1", tuple(jax.devices()[:1]), 64 * 2**30)
  specs = specs_lib.from_config(config_lib.validate(config))
  problem = Problem(specs, target, lower_train_step)
  stations = specs.data.modalities[0].synthetic_stations
  assert problem.counts["stations_nodes"] == stations
  assert problem.counts["stations_to_mesh_edges"] > 0
  assert problem.batch["stations/targets"].shape[-1] == problem.counts["stations_nodes"]
  report = problem.compile()
  assert report["fits"] and report["peak_bytes"] > 0
  with_points = flops_lib.forward_flops(specs, problem.graph_shapes)
  grid_only = dataclasses.replace(specs, data=dataclasses.replace(specs.data, modalities=()))
  without = flops_lib.forward_flops(grid_only, problem.graph_shapes)
  assert without["encoder_points"] == without["decoder_points"] == 0
  assert with_points["encoder_points"] > 0 and with_points["decoder_points"] > 0
  assert {k: v for k, v in with_points.items() if not k.endswith("_points")} == {
      k: v for k, v in without.items() if not k.endswith("_points")}
  assert report["flops"] == pytest.approx(flops_lib.step_flops(
      specs, problem.graph_shapes, 1)["model"])


def test_a_live_device_is_planned_with_the_memory_it_offers(monkeypatch):
  """A run's own devices: the memory the first one lets XLA use (`bytes_limit`, e.g. a v5e
  chip's 15.75 GiB); fake CPU devices, which say none, share the host's RAM."""

  class Chip:
    platform = "tpu"

    def memory_stats(self):
      return {"bytes_limit": 16_909_336_064, "bytes_in_use": 0}

  monkeypatch.setattr(jax, "devices", lambda: [Chip(), Chip()])
  target = topology.live_target()
  assert (target.name, len(target.devices)) == ("tpu:2", 2)
  assert target.device_memory_bytes == 16_909_336_064
  monkeypatch.undo()
  cpu = topology.live_target()
  assert cpu.name == f"cpu:{len(jax.devices())}"
  assert cpu.device_memory_bytes == topology.host_memory_bytes() // jax.local_device_count()


def test_bad_topology_is_a_clear_error():
  with pytest.raises(ValueError, match="Unknown topology 'v5e-8'"):
    topology.resolve("v5e-8")
  with pytest.raises(ValueError, match="needs 64 CPU devices"):
    topology.resolve("cpu:64")


@pytest.mark.slow
@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu not installed: pip install -e '.[tpu]'")
def test_tpu_topology_compile():
  target = topology.resolve("v5e:2x2")
  # What a v5e chip lets XLA use (its memory_stats()["bytes_limit"], 15.75 GiB), not 16 GiB.
  assert len(target.devices) == 4 and target.device_memory_bytes == 16_909_336_064

  def report(graph, **model):
    # The tiny model with 2 processor layers: each TPU compile takes ~2/3 of the time.
    config = tiny(message_passing_steps=2, **model)
    config.mesh.update(graph=graph, data=4 // graph)
    config.train.batch_size = 4 // graph  # one example per data shard
    return Problem(specs_lib.from_config(config), target, lower_train_step).compile()

  whole, split = report(1), report(4)
  for r in (whole, split):
    assert 0 < r["peak_bytes"] < r["device_memory_bytes"] and r["fits"]
  # On TPU read the peak: XLA:TPU's temp figure can leave out buffers (a scan's
  # temporaries showed as 0.3 MiB against a 92 MiB peak).
  assert split["peak_bytes"] < 0.6 * whole["peak_bytes"]
  remat = report(1, remat_grid_to_mesh_gnn=True, remat_mesh_gnn=True,
                 remat_mesh_to_grid_gnn=True, edge_chunks=4)
  assert remat["peak_bytes"] < whole["peak_bytes"]


@pytest.mark.slow
@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu not installed: pip install -e '.[tpu]'")
def test_a_checkpointed_rollout_keeps_its_states_in_host_memory_on_tpu():
  """`train.remat_rollout`: the state each step predicts waits for the backward pass in
  host memory, not in HBM (wnscale/model/rollout_loss.py), compiled for v5e:2x2."""
  target = topology.resolve("v5e:2x2")
  host_temp_bytes = {}

  def compiled_host_temps(remat_rollout):
    # Any aggregation will do: `matmul` compiles faster for a TPU than `auto`'s kernels.
    config = tiny(message_passing_steps=2, aggregation="matmul")
    config.mesh.update(graph=2, data=2)
    config.train.update(batch_size=2, remat_rollout=remat_rollout)
    config.data.target_steps = 3

    def step_builder(*args):
      lowered = lower_train_step(*args)

      class Recorded:
        def compile(self):
          compiled = lowered.compile()
          host_temp_bytes[remat_rollout] = compiled.memory_analysis().host_temp_size_in_bytes
          return compiled

      return Recorded()

    problem = Problem(specs_lib.from_config(config), target, step_builder)
    assert problem.compile()["fits"]
    batch, _, channels, grid = problem.batch["inputs"].shape
    return batch // 2 * channels * grid // 2 * 4  # one float32 state per device (2 x 2)

  state_bytes = compiled_host_temps(True)
  compiled_host_temps(False)
  assert host_temp_bytes[False] == 0
  assert host_temp_bytes[True] >= 3 * state_bytes


@pytest.fixture
def plan_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("WNSCALE_CACHE_DIR", str(tmp_path))
  return tmp_path


@pytest.mark.slow
def test_auto_remat_none_when_ample_remat_when_tight_clear_error_when_impossible(
    plan_cache, monkeypatch):
  config = tiny(remat_policy="auto")
  config.mesh.update(data=1, graph=1)
  specs = specs_lib.from_config(config)
  target = topology.Target("cpu:1", tuple(jax.devices()[:1]), 64 * 2**30)
  # One Problem for every search below, what they ask of it and what it compiles recorded:
  # a setting compiled once serves them all.
  problem = Problem(specs, target, lower_train_step)
  asked, compiled = [], []  # (overrides, micro-batches: None for the config's)
  original_compile, original_uncached = problem.compile, problem._compile

  def compile(overrides=None, breakdown=False, accumulation_steps=None, name=None):
    asked.append((overrides, accumulation_steps))
    return original_compile(overrides, breakdown, accumulation_steps, name)

  def uncached(overrides, breakdown, accumulation_steps):
    compiled.append((overrides, accumulation_steps))
    return original_uncached(overrides, breakdown, accumulation_steps)

  monkeypatch.setattr(problem, "compile", compile)
  monkeypatch.setattr(problem, "_compile", uncached)
  names = ["none", "edge_chunks", "all_every_1"]
  ample = auto_remat.choose_remat(specs, target, lower_train_step, names=names,
                                  problem=problem)
  assert ample["name"] == "none" and "cheapest" in ample["reason"]

  tight = auto_remat.choose_remat(specs, target, lower_train_step, ample["peak_bytes"] - 1,
                                  names=names, problem=problem)
  assert tight["name"] != "none" and tight["peak_bytes"] < ample["peak_bytes"]
  assert tight["overrides"]["edge_chunks"] > 1 or tight["overrides"]["remat_mesh_gnn"]

  with pytest.raises(ValueError, match="No remat configuration fits 0.00 GiB per device"):
    auto_remat.choose_remat(specs, target, lower_train_step, 1024, names=["none"],
                            problem=problem)

  # Impossible budgets stop after the cheapest and the least-memory candidate; 'none',
  # compiled above, is not compiled again. Then the smallest is compiled with micro-batches
  # of one example (the batch's 2 examples in 2), to say whether they would make it fit.
  asked_before, compiled_before = len(asked), len(compiled)
  with pytest.raises(ValueError, match=r"smallest peak is .* \('all_every_1_offload'\). Use "
                     r"more graph shards .*, or a smaller batch per data shard"):
    auto_remat.choose_remat(specs, target, lower_train_step, 1024, problem=problem)
  least = auto_remat.candidate_overrides("all_every_1_offload")
  assert asked[asked_before:] == [(auto_remat.candidate_overrides("none"), None),
                                  (least, None), (least, 2)]
  assert compiled[compiled_before:] == [(least, 1), (least, 2)]
  assert len({json.dumps(c, sort_keys=True) for c in compiled}) == len(compiled)  # each once

  monkeypatch.setattr(auto_remat, "Problem", None)  # cache hits compile nothing
  assert auto_remat.choose_remat(specs, target, lower_train_step, names=names) == ample


def test_the_planner_measures_the_micro_batches_and_says_how_many_fit(plan_cache):
  """With `train.accumulation_steps` the step compiled is the one training runs, a
  micro-batch at a time: 4 examples on one device in 4 micro-batches need less than half
  the temporaries of all 4 at once. With a budget the config's 2 micro-batches miss,
  `planner.accumulation` finds the fewest that fit, and remat_policy='auto', when no
  candidate fits, says so in one line."""
  config = tiny(remat_policy="auto")
  config.mesh.update(data=1, graph=1)
  config.train.update(batch_size=4, accumulation_steps=2)
  specs = specs_lib.from_config(config)
  target = topology.Target("cpu:1", tuple(jax.devices()[:1]), 64 * 2**30)
  problem = Problem(specs, target, lower_train_step)
  none = auto_remat.candidate_overrides("none")
  halves = problem.compile(none)  # the config's micro-batches
  whole, singles = (problem.compile(none, accumulation_steps=n) for n in (1, 4))
  assert [r["accumulation_steps"] for r in (whole, halves, singles)] == [1, 2, 4]
  assert singles["temp_bytes"] < halves["temp_bytes"] < whole["temp_bytes"]
  assert singles["temp_bytes"] < 0.5 * whole["temp_bytes"]
  assert whole["flops"] == halves["flops"] == singles["flops"]  # the same work per step

  choice = auto_remat.choose_remat(specs, target, lower_train_step, halves["peak_bytes"],
                                   names=["none"], problem=problem)
  assert choice["name"] == "none" and choice["peak_bytes"] == halves["peak_bytes"]
  tight = halves["peak_bytes"] - 1
  assert accumulation.more_micro_batches(4, 2) == [4]
  assert accumulation.fewest_that_fit(problem, none, tight)["accumulation_steps"] == 4
  assert accumulation.fewest_that_fit(problem, none, singles["peak_bytes"] - 1) is None
  with pytest.raises(ValueError, match=r"^No remat configuration fits .* \('none'\). 'none' "
                     r"fits with train.accumulation_steps=4 \(.* GiB; micro-batches of 1 "
                     r"example\(s\) per data shard") as error:
    auto_remat.choose_remat(specs, target, lower_train_step, tight, names=["none"],
                            problem=problem)
  assert "\n" not in str(error.value)


def test_compile_time_out_of_memory_is_reported_as_not_fitting():
  """The TPU compiler refuses a step whose temporaries exceed HBM: a report, not a trace."""
  message = ("RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the "
             "total memory required for HLO temporaries (21.24G) exceeds available HBM "
             "(15.75G). HLO module: jit_train_step.")

  class Refused:
    def compile(self):
      raise jax.errors.JaxRuntimeError(message)

  config = tiny()
  config.mesh.update(graph=1, data=1)
  target = topology.Target("v5e:1x1", tuple(jax.devices()[:1]), 16 * 2**30)
  report = Problem(specs_lib.from_config(config), target, lambda *args: Refused()).compile()
  assert report["fits"] is False and "CompileTimeHbmOom" in report["error"]
  assert report["temp_bytes"] == int(21.24 * 2**30)


def test_a_candidate_the_compiler_fails_on_is_skipped_not_raised(plan_cache, caplog):
  """XLA can fail on one setting with an internal error (seen: TPU host offload inside a
  12-step rollout, "Bitcast cannot have different memory spaces"): the report says so,
  and the search goes on to the next candidate."""
  internal = ("INTERNAL: during context [post-optimization]: Bitcast cannot have different "
              "memory spaces of output (5) and operand (0)")

  def step_builder(specs, *args):
    lowered = lower_train_step(specs, *args)

    class FailsOnEdgeBlocks:
      def compile(self):
        if specs.model.remat.edge_chunks > 1 and not specs.model.remat.remat_mesh_gnn:
          raise jax.errors.JaxRuntimeError(internal)
        return lowered.compile()

    return FailsOnEdgeBlocks()

  config = tiny(remat_policy="auto")
  config.mesh.update(data=1, graph=1)
  specs = specs_lib.from_config(config)
  target = topology.Target("cpu:1", tuple(jax.devices()[:1]), 64 * 2**30)
  problem = Problem(specs, target, step_builder)
  failed = problem.compile(auto_remat.candidate_overrides("edge_chunks"))
  assert failed["fits"] is False and failed["compiled"] is False
  assert failed["error"] == "the compiler failed: " + internal
  choice = auto_remat.choose_remat(specs, target, step_builder,
                                   names=["edge_chunks", "all_every_1"], problem=problem)
  assert choice["name"] == "all_every_1"
  assert "edge_chunks (the compiler failed)" in choice["reason"]
  assert "'edge_chunks' could not be compiled" in caplog.text


def test_plan_cache_key_follows_what_changes_the_compiled_step(plan_cache, monkeypatch):
  config = tiny()
  target = topology.Target("cpu:1", tuple(jax.devices()[:1]), 64 * 2**30)

  def key(trial):
    return auto_remat._cache_path(specs_lib.from_config(trial), target, 2**30)

  base = key(config)
  retuned = tiny()
  retuned.train.learning_rate *= 10
  assert key(retuned) == base  # a new learning rate reuses the plan
  rollout = tiny()
  rollout.train.remat_rollout = not config.train.remat_rollout
  assert key(rollout) != base
  bigger = tiny(latent_size=64)
  assert key(bigger) != base
  micro = tiny()
  micro.train.accumulation_steps = 2  # the step measured runs a micro-batch at a time
  assert key(micro) != base
  monkeypatch.setattr(cache, "source_digest", lambda *parts: "other code")
  assert key(config) != base  # plans measured on other wnscale code are not reused


def test_breakdown_lists_the_peak_buffers_by_part():
  """XLA's own buffer assignment, read back: the step's arguments and each stage's
  buffers appear under their part, with their shapes, the largest first."""
  config = tiny()
  config.mesh.update(graph=1, data=1)
  config.train.batch_size = 1
  target = topology.Target("cpu:1", tuple(jax.devices()[:1]), 64 * 2**30)
  report = Problem(specs_lib.from_config(config), target, lower_train_step).compile(
      breakdown=True)
  buffers, by_part = report["peak_buffers"], report["peak_by_part"]
  sizes = [b["bytes"] for b in buffers]
  assert sizes == sorted(sizes, reverse=True) and sizes[0] > 0
  assert {"parameters", "optimizer state", "inputs"} <= set(by_part)
  assert {"encoder", "processor", "decoder"} & {part.split(" ")[0] for part in by_part}
  # The batch (an argument, live throughout): inputs, targets, forcings and statics of
  # one example of 12 state channels and 5 forcings on the 32 x 64 grid, float32.
  assert by_part["inputs"] == (2 * 12 + 1 * 12 + 3 * 5 + 2) * 2048 * 4
  # Within 25 % of XLA's own peak (the HLO-level analysis is not the final schedule).
  assert 0.75 < sum(by_part.values()) / report["peak_bytes"] < 1.25


def test_breakdown_counts_device_memory_only(tmp_path):
  """A value in host memory (`@5`: where offload_carries puts the processor's carries)
  is not on the device; values sharing one place count once; the peak is where the
  device-memory buffers add up to the most. Files as XLA's TPU compiler dumps them."""
  module = "module_0000.jit_train_step"
  (tmp_path / f"{module}.after_optimizations.txt").write_text(
      '  %carries = bf16[16,1024]{1,0:S(5)} dynamic-update-slice(%a), '
      'metadata={op_name="jit(train_step)/processor"}\n'
      '  %grads = f32[1024]{0} fusion(%b), metadata={op_name="jit(train_step)/transpose('
      'jvp())/decoder/dot_general"}\n'
      '  %loop = (f32[256]{0}) while(%c), metadata={op_name="jit(train_step)/encoder/while"}\n'
      '  %body_param = (f32[256]{0}) parameter(0)\n'
      '  %early = f32[512]{0} fusion(%d), metadata={op_name="jit(train_step)/encoder/add"}\n')
  (tmp_path / f"{module}.after_optimizations-buffer-assignment.txt").write_text(
      "allocation 0: size 32768, color 5, page 0, preallocated-temp:\n"
      " value: <10 carries @5> (size=32768,offset=0): bf16[16,1024]{1,0:S(5)}\n"
      "allocation 1: size 4096, page 0, preallocated-temp:\n"
      " value: <11 grads @0> (size=4096,offset=0): f32[1024]{0}\n"
      " value: <12 loop{0} @0> (size=1024,offset=4096): f32[256]{0}\n"
      " value: <13 body_param{0} @0> (size=1024,offset=4096): f32[256]{0}\n"
      " value: <14 early @0> (size=2048,offset=0): f32[512]{0}\n")
  (tmp_path / f"{module}.after_optimizations-live-range.txt").write_text(
      "HloLiveRange (max 9):\n  InstructionSequence:\n    0:carries\n  BufferLiveRange:\n"
      "    carries{}:0-9\n    early{}:0-2\n    loop{0}:3-8\n    body_param{0}:4-6\n"
      "    grads{}:5-9\n  Live ranges at 5 (peak):\n    carries{}: 32768 bytes\n")
  buffers = buffers_lib.read_peak_buffers(str(tmp_path))
  assert [(b.bytes, b.shape, b.part) for b in buffers] == [
      (4096, "f32[1024]", "decoder (backward)"), (1024, "f32[256]", "encoder")]
