"""`remat_policy = 'auto'`: the cheapest remat configuration whose compiled step fits.

Candidates are data (below), ranked by the FLOPs they add (`planner.flops`);
each is compiled in that order until one's per-device peak memory fits the
budget. The decision is cached on disk by a hash of everything it depends on:
the specs' model, data and mesh (less the remat keys a candidate sets), the batch and its
micro-batches (`train.accumulation_steps`: the step measured runs one at a time), the
rollout remat, the target, the budget, the jax version and wnscale's sources
(`wnscale.cache.source_digest`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging

import jax

from wnscale import cache, paths
from wnscale import specs as specs_lib
from wnscale.errors import UserError
from wnscale.planner import accumulation
from wnscale.planner import flops as flops_lib
from wnscale.planner.compile import Problem, StepBuilder
from wnscale.planner.topology import GIB, Target

_ALL = dict.fromkeys(specs_lib.RematSpec.STAGES, True)  # every stage checkpointed
# The remat keys a candidate sets (not scan_layers: how the layers loop is the run's own).
_CHOSEN = tuple(key for key in specs_lib.RematSpec.config_keys() if key != "scan_layers")
_NONE = {key: specs_lib.RematSpec.defaults()[key] for key in _CHOSEN}  # nothing checkpointed
CANDIDATES = {
    "none": {},
    "edge_chunks": dict(edge_chunks=4),
    "decoder": dict(remat_mesh_to_grid_gnn=True, edge_chunks=4),
    "encoder_decoder": dict(remat_grid_to_mesh_gnn=True, remat_mesh_to_grid_gnn=True,
                            edge_chunks=4),
    "processor_every_3": dict(remat_mesh_gnn=True, mesh_remat_every=3),
    "all_dots_saveable": dict(_ALL, remat_policy="dots_with_no_batch_dims_saveable",
                              edge_chunks=4),
    "paper": dict(_ALL, mesh_remat_every=3, edge_chunks=4),
    "paper_grid_blocks": dict(_ALL, mesh_remat_every=3, edge_chunks=4, grid_blocks=8),
    # ... keeping the decoder's summed messages (a grid-sized array) for its backward pass.
    "paper_grid_blocks_messages": dict(_ALL, mesh_remat_every=3, edge_chunks=4,
                                       grid_blocks=8, decoder_keeps_messages=True),
    # ... with the processor's last 4 layers outside the checkpoints, not recomputed.
    "paper_grid_blocks_messages_saved_4": dict(_ALL, mesh_remat_every=3, edge_chunks=4,
                                               grid_blocks=8, decoder_keeps_messages=True,
                                               mesh_layers_saved=4),
    "all_every_1": dict(_ALL, edge_chunks=4),
    "all_every_1_grid_blocks": dict(_ALL, edge_chunks=16, grid_blocks=16),
    # The processor's group carries in host memory, where the backend has it.
    "paper_offload": dict(_ALL, mesh_remat_every=3, edge_chunks=4, grid_blocks=8,
                          remat_policy="offload_carries"),
    "all_every_1_offload": dict(_ALL, edge_chunks=16, grid_blocks=16,
                                remat_policy="offload_carries"),
}
# The candidate that keeps the least: if it does not fit, none does.
LEAST_MEMORY = "all_every_1_offload"


def candidate_overrides(name: str) -> dict:
  """Full remat settings of candidate `name` (unset keys: no remat)."""
  return dict(_NONE, **CANDIDATES[name])


def ranked_candidates(specs: specs_lib.Specs, graphs, num_devices, names=None
                      ) -> list[tuple[str, float, float]]:
  """`(name, added FLOPs, offloaded bytes)` per device and step, cheapest first: by added
  FLOPs, then by bytes moved to host memory and back (ties keep the table's order).

  `graphs`: the graphs or their shapes (`flops.step_flops`)."""
  ranked = []
  for name in names or CANDIDATES:
    trial = dataclasses.replace(specs, model=dataclasses.replace(
        specs.model, remat=dataclasses.replace(specs.model.remat, **candidate_overrides(name))))
    cost = flops_lib.step_flops(trial, graphs, num_devices)
    ranked.append((name, cost["recompute"], cost["offloaded_bytes"]))
  return sorted(ranked, key=lambda item: item[1:])


def _cache_path(specs: specs_lib.Specs, target: Target, budget: int) -> str:
  model = {key: value for key, value in specs.model.section_values().items()
           if key not in _CHOSEN}
  # Only what changes the compiled step: a new learning rate reuses the plan.
  train = specs.train
  key = json.dumps([model, dataclasses.asdict(specs.data), dataclasses.asdict(specs.mesh),
                    train.batch_size, train.accumulation_steps, train.remat_rollout, target.name,
                    len(target.devices), budget,
                    jax.__version__, cache.source_digest()],
                   sort_keys=True, default=str)
  return cache.cache_path("remat_plans", hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")


def choose_remat(specs: specs_lib.Specs, target: Target, step_builder: StepBuilder,
                 budget_bytes: int | None = None, names=None,
                 problem: Problem | None = None) -> dict:
  """Picks the remat settings for `specs` on `target`.

  Candidates are compiled cheapest first. When the cheapest does not fit, the
  one that keeps the least memory is compiled next: if it does not fit either,
  no candidate will, and the search stops there instead of compiling them all.

  Args:
    step_builder: lowers the step to measure (`wnscale.planner.compile.StepBuilder`).
    budget_bytes: per-device memory allowed; default the target's device memory.
    names: candidate names to consider (default: all of `CANDIDATES`).
    problem: a `Problem` of these specs and target to reuse (and its compiles).

  Returns:
    `{"name", "overrides", "peak_bytes", "recompute_flops", "reason"}`.

  Raises:
    ValueError: when no candidate fits, naming the smallest peak found, and whether that
      candidate fits in more micro-batches (`train.accumulation_steps`; compiled to say).
  """
  budget = budget_bytes or target.device_memory_bytes
  if not budget:
    raise UserError("remat_policy='auto' needs a memory budget: set train.memory_budget_gib.")
  path = _cache_path(specs, target, budget)
  if paths.exists(path):
    choice = json.loads(paths.read_text(path))
    logging.info("Remat plan read from the cache: %s", path)
    return choice
  problem = problem or Problem(specs, target, step_builder)
  ranked = ranked_candidates(specs, problem.graph_shapes, len(target.devices), names)
  peaks = {}  # candidate name -> compiled peak bytes (None: the compiler failed), in order

  def fits(name):
    report = problem.compile(candidate_overrides(name), name=name)
    if report.get("compiled", True):
      peaks[name] = report["peak_bytes"]
    else:  # a compiler failure: logged, and the search goes on
      logging.warning("Remat candidate '%s' could not be compiled: %s", name, report["error"])
      peaks[name] = None
    return report["fits"] and report["peak_bytes"] <= budget

  for index, (name, extra, offloaded) in enumerate(ranked):
    if (index == 1 and LEAST_MEMORY in [n for n, *_ in ranked] and not fits(LEAST_MEMORY)
        and peaks[LEAST_MEMORY] is not None):  # compiled, and too big: so is every other
      break
    if fits(name):
      cheaper = ", ".join(f"{n} {_peak(peaks[n])}" for n, *_ in ranked[:index])
      choice = {
          "name": name, "overrides": candidate_overrides(name),
          "peak_bytes": peaks[name], "recompute_flops": extra, "offloaded_bytes": offloaded,
          "reason": (f"'{name}' is the cheapest remat configuration that fits: peak "
                     f"{peaks[name] / GIB:.2f} GiB of {budget / GIB:.2f} GiB per device, "
                     f"+{extra:.3g} recompute FLOPs"
                     + (f" and {offloaded / GIB:.2f} GiB to host memory and back" if offloaded
                        else "") + " per device per step; cheaper ones did not "
                     f"fit: {cheaper or '-'}."),
      }
      cache.write_bytes(path, json.dumps(choice).encode())  # the trainer logs its reason
      return choice
  compiled = {n: peak for n, peak in peaks.items() if peak is not None}
  if not compiled:
    raise UserError(f"No remat configuration could be compiled for {target.name}: "
                    f"{', '.join(peaks)} failed in the compiler (see the warnings above).")
  smallest = min(compiled, key=compiled.get)
  raise UserError(
      f"No remat configuration fits {budget / GIB:.2f} GiB per device on {target.name}: the "
      f"smallest peak is {compiled[smallest] / GIB:.2f} GiB ('{smallest}'). "
      + _with_micro_batches(problem, smallest, budget))


def _with_micro_batches(problem: Problem, name: str, budget: int) -> str:
  """What to do when no candidate fits: the fewest micro-batches with which candidate `name`
  fits (`planner.accumulation`), if any do; the other ways out."""
  others = "more graph shards (mesh.graph), bfloat16, or a smaller model"
  report = accumulation.fewest_that_fit(problem, candidate_overrides(name), budget)
  if report is None:
    return f"Use {others}, or a smaller batch per data shard."
  steps = report["accumulation_steps"]
  return (f"'{name}' fits with train.accumulation_steps={steps} ({_peak(report['peak_bytes'])}"
          f"; micro-batches of {problem.examples_per_data_shard // steps} example(s) per data "
          "shard, the same gradient): set it, and remat_policy='auto' picks the cheapest "
          f"setting that fits then; or use {others}.")


def _peak(peak: int | None) -> str:
  return "(the compiler failed)" if peak is None else f"{peak / GIB:.2f} GiB"
