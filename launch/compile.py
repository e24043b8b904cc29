r"""Compiles a config's real training step for a TPU topology (or local CPUs) and reports
per-device memory against the chip's, FLOPs and compile time; nothing is allocated.

  python -m launch.compile --config=configs/graphcast_0p25.py --topology=v5e:4x4
  python -m launch.compile --config=configs/tiny.py --topology=cpu:8 --json
  python -m launch.compile --config=configs/graphcast_0p25.py --topology=v4:2x2x2 --sweep \
      --graph_shards=1,4,8 --batch_per_data_shard=1

The graph is split over the config's mesh.graph devices (--graph_shards to choose),
the rest of the devices split the batch. When the config's train.batch_size does
not divide over those data shards (or a data shard's examples into the config's
train.accumulation_steps micro-batches), each data shard gets the fewest whole examples
that cover it (--batch_per_data_shard to choose). The step compiled is the one training
runs: with train.accumulation_steps, its micro-batches one at a time. A step that does
not fit is compiled again with more micro-batches, and the fewest that fit are named.
Any config key can be overridden as --config.section.key=value (wnscale/config.py lists
them). TPU topologies need the libtpu wheel (`pip install -e '.[tpu]'`).
"""

import dataclasses
import json
import os

# A planning tool for CPU hosts: keep libtpu from claiming TPUs (a training job may
# hold them), and let it load beside that job. XLA:CPU's default scheduler hoists
# the recomputation that remat adds (then remat hardly shows in a cpu:N compile);
# the sequential one does not.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
if "xla_cpu_enable_concurrency_optimized_scheduler" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_cpu_enable_concurrency_optimized_scheduler=false")

from launch import cli  # noqa: E402

import jax  # noqa: E402
from absl import flags, logging  # noqa: E402

from wnscale import config as config_lib  # noqa: E402
from wnscale import specs as specs_lib  # noqa: E402
from wnscale.errors import UserError  # noqa: E402
from wnscale.planner import accumulation, auto_remat, topology  # noqa: E402
from wnscale.train import curriculum  # noqa: E402
from wnscale.planner.compile import (Problem, batch_per_data_shard,  # noqa: E402
                                     best_setting)
from wnscale.train.step import lower_train_step  # noqa: E402

_CONFIG = cli.define_config()
_TOPOLOGY = flags.DEFINE_string("topology", "cpu:8", "v4:2x2x1, v5e:4x4, ..., or cpu:N.")
_JSON = flags.DEFINE_bool("json", False, "Print JSON (one object, or a list with --sweep).")
_SWEEP = flags.DEFINE_bool("sweep", False, "Compile every remat candidate at each shard count.")
_GRAPH_SHARDS = flags.DEFINE_list("graph_shards", None,
                                  "Graph shard counts (default: the config's mesh.graph; with "
                                  "--sweep: 1, 2, 4, ... up to the device count).")
_BATCH = flags.DEFINE_integer("batch_per_data_shard", 0,
                              "Examples per data shard (0: the config's train.batch_size split "
                              "over the data shards, rounded up to whole examples).",
                              lower_bound=0)
_BREAKDOWN = flags.DEFINE_bool(
    "breakdown", False, "Also list the largest buffers live at the peak of each compiled step "
    "(from XLA's buffer assignment) and the bytes at the peak per part of the model.")

GIB = 2**30
COLUMNS = (  # printed under the table
    ("candidate", "the remat setting compiled (with --sweep; see wnscale/planner/auto_remat.py)"),
    ("graph", "graph shards (mesh.graph); the other devices split the batch (mesh.data)"),
    ("batch", "global batch (train.batch_size), whole examples per data shard"),
    ("micro", "micro-batches per step (train.accumulation_steps): each data shard runs its "
              "examples in this many, one at a time"),
    ("EPD", "stages under remat: E encoder, P processor, D decoder (- none)"),
    ("K", "processor layers per checkpoint (model.mesh_remat_every)"),
    ("blocks", "blocks of encoder/decoder edges, mesh edges, grid nodes (model.edge_chunks, "
               "mesh_edge_chunks, grid_blocks)"),
    ("policy", "model.remat_policy"),
    ("arg GiB", "per device: parameters, optimizer state, batch and graph arrays"),
    ("tmp GiB", "per device: XLA's temporaries"),
    ("peak", "per device: peak memory in GiB, as compiled (TPU: XLA's own, checked against HBM)"),
    ("HBM", "memory of one device in GiB: what XLA may use (v5e: 15.75 of its 16; "
            "cpu:N: the host's RAM / N)"),
    ("fits", "peak <= HBM"),
    ("FLOPs", "per device per step: model plus recomputation (analytic)"),
    ("comp s", "compile seconds"),
)


def _row(report) -> str:
  remat = report["remat"]
  stages = "".join(flag for key, flag in (("remat_grid_to_mesh_gnn", "E"), ("remat_mesh_gnn", "P"),
                                          ("remat_mesh_to_grid_gnn", "D")) if remat[key]) or "-"
  memory = report["device_memory_bytes"]
  return (f"{report.get('candidate', ''):<22}{report['mesh']['graph']:>6}"
          f"{report['batch_size']:>6}{report['accumulation_steps']:>6}{stages:>5}"
          f"{remat['mesh_remat_every']:>4}{_blocks(remat):>9}  {remat['remat_policy']:<34}"
          f"{report['argument_bytes'] / GIB:>8.2f}{report['temp_bytes'] / GIB:>8.2f}"
          f"{report['peak_bytes'] / GIB:>8.2f}{(memory or 0) / GIB:>8.2f}"
          f"{'yes' if report['fits'] else 'NO':>6}{report['flops']:>11.3g}"
          f"{report['compile_seconds']:>8.1f}")


def _blocks(remat) -> str:
  return f"{remat['edge_chunks']}/{remat['mesh_edge_chunks']}/{remat['grid_blocks']}"


def _breakdown(report) -> str:
  """The peak per model part, then the largest peak buffers."""
  mib = 2**20
  lines = ["  at the peak, by part (MiB): " + ", ".join(
      f"{part} {size / mib:.1f}" for part, size in report["peak_by_part"].items())]
  lines.append(f"  {'MiB':>9}  {'buffer':<30}{'part':<22}made by (JAX name stack)")
  for buffer in report["peak_buffers"]:
    # Scopes every buffer shares (the jit, shard_map, scans' while bodies) say nothing.
    scopes = [s for s in buffer["op_name"].split("/") if s not in _NOISE_SCOPES]
    lines.append(f"  {buffer['bytes'] / mib:>9.1f}  {buffer['shape']:<30}{buffer['part']:<22}"
                 f"{'/'.join(scopes)[-80:]}")
  return "\n".join(lines)


_NOISE_SCOPES = {"jit(train_step)", "jvp()", "transpose(jvp())", "shard_map", "while", "body",
                 "closed_call"}


def main(argv):
  del argv
  name = _TOPOLOGY.value
  if name.startswith("cpu:"):
    if not name[4:].isdigit() or int(name[4:]) < 1:
      raise UserError(f"--topology={name}: cpu:N needs a device count N >= 1, e.g. cpu:8.")
    jax.config.update("jax_num_cpu_devices", int(name[4:]))

  target = topology.resolve(name)
  num_devices = len(target.devices)
  specs = curriculum.longest_phase_specs(
      specs_lib.from_config(config_lib.validate(_CONFIG.value)))
  config_batch = specs.train.batch_size
  if _GRAPH_SHARDS.value and not all(g.isdigit() for g in _GRAPH_SHARDS.value):
    raise UserError(f"--graph_shards={','.join(_GRAPH_SHARDS.value)}: give shard counts, "
                    "e.g. --graph_shards=1,4,8.")
  shard_counts = ([int(g) for g in _GRAPH_SHARDS.value] if _GRAPH_SHARDS.value
                  else [specs.mesh.graph] if not _SWEEP.value
                  else [2**k for k in range(num_devices.bit_length())
                        if num_devices % 2**k == 0])
  reports = []
  for graph in shard_counts:
    if graph < 1 or num_devices % graph:
      raise UserError(f"{graph} graph shards do not divide the {num_devices} devices of "
                      f"{name}.")
    data_shards = num_devices // graph
    micro_batches = specs.train.accumulation_steps
    per_shard = _BATCH.value or batch_per_data_shard(config_batch, data_shards, micro_batches)
    if not _BATCH.value and per_shard * data_shards != config_batch:
      logging.warning("train.batch_size=%d does not split over %d data shards%s: compiling "
                      "%d example(s) per data shard (batch %d); --batch_per_data_shard "
                      "chooses.", config_batch, data_shards,
                      f" of {micro_batches} micro-batches" if micro_batches > 1 else "",
                      per_shard, per_shard * data_shards)
    specs = dataclasses.replace(
        specs, mesh=dataclasses.replace(specs.mesh, graph=graph, data=-1),
        train=dataclasses.replace(specs.train, batch_size=per_shard * data_shards))
    problem = Problem(specs, target, lower_train_step)
    names = list(auto_remat.CANDIDATES) if _SWEEP.value else [None]
    if specs.model.remat.remat_policy == "auto" and not _SWEEP.value:
      names = [auto_remat.choose_remat(specs, target, lower_train_step,
                                       int(specs.train.memory_budget_gib * GIB) or None,
                                       problem=problem)["name"]]
    for candidate in names:
      overrides = auto_remat.candidate_overrides(candidate) if candidate else {}
      report = problem.compile(overrides, breakdown=_BREAKDOWN.value, name=candidate)
      if candidate:
        report["candidate"] = candidate
      reports.append(report)
      _print(report, problem, len(reports) == 1)
      if not report["fits"] and report.get("compiled", True) and not _SWEEP.value:
        fitting = accumulation.fewest_that_fit(problem, overrides, target.device_memory_bytes)
        report["fits_with_accumulation_steps"] = (fitting or {}).get("accumulation_steps")
        _print(fitting, problem, False)
  if _JSON.value:
    print(json.dumps(reports if _SWEEP.value else reports[0]))
    return
  print("Columns:")
  for column, meaning in COLUMNS:
    print(f"  {column:<10} {meaning}")
  if _SWEEP.value:
    print(best_setting(reports))
  elif not all(r["fits"] for r in reports):
    print("Some configurations do NOT fit in device memory (fits = NO).")
    for report in reports:
      if report.get("fits_with_accumulation_steps"):
        steps = report["fits_with_accumulation_steps"]
        per_shard = report["batch_size"] // report["mesh"]["data"]
        print(f"With {report['mesh']['graph']} graph shard(s) it fits with "
              f"train.accumulation_steps={steps} (micro-batches of {per_shard // steps} "
              f"example(s) per data shard; the same gradient): "
              f"--config.train.accumulation_steps={steps}.")


def _print(report, problem, first: bool):
  """A compiled step's row of the table (after the header, if `first`), and what it adds:
  why the compiler failed, the peak's buffers. Nothing for no report, or with --json."""
  if report is None or _JSON.value:
    return
  if first:
    print(f"{problem.target.name}: {len(problem.target.devices)} devices; graphs "
          f"{problem.counts}")
    print(f"{'candidate':<22}{'graph':>6}{'batch':>6}{'micro':>6}{'EPD':>5}{'K':>4}"
          f"{'blocks':>9}  {'policy':<34}{'arg GiB':>8}{'tmp GiB':>8}{'peak':>8}{'HBM':>8}"
          f"{'fits':>6}{'FLOPs':>11}{'comp s':>8}")
  print(_row(report), flush=True)
  if not report.get("compiled", True):
    print(f"  {report['error']}", flush=True)
  if _BREAKDOWN.value and "peak_buffers" in report:
    print(_breakdown(report), flush=True)


if __name__ == "__main__":
  cli.run(main, required=("config",))
