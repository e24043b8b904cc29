"""Compiles a config's real training step for a TPU topology (or local CPUs) and reports
per-device memory against the chip's, FLOPs and compile time; nothing is allocated.

  python -m launch.compile --config=configs/graphcast_0p25.py --topology=v5e:4x4
  python -m launch.compile --config=configs/tiny.py --topology=cpu:8 --json
  python -m launch.compile --config=configs/graphcast_0p25.py --topology=v4:2x2x2 --sweep \
      --graph_shards=1,4,8 --batch_per_data_shard=1

TPU topologies need the libtpu wheel (`pip install -e '.[tpu]'`).
"""

import json
import os

# A planning tool for CPU hosts: keep libtpu from claiming (absent) TPUs.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")  # quiets libtpu's start-up
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from wnscale import config as config_lib  # noqa: E402
from wnscale.planner import auto_remat, topology  # noqa: E402
from wnscale.planner.compile import Problem  # noqa: E402
from wnscale.train.step import lower_train_step  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.py"),
    "Experiment config file.")
_TOPOLOGY = flags.DEFINE_string("topology", "cpu:8", "v4:2x2x1, v5e:4x4, ..., or cpu:N.")
_JSON = flags.DEFINE_bool("json", False, "Print JSON (one object, or a list with --sweep).")
_SWEEP = flags.DEFINE_bool("sweep", False, "Compile every remat candidate at each shard count.")
_GRAPH_SHARDS = flags.DEFINE_list("graph_shards", None,
                                  "With --sweep: graph shard counts (default 1, 2, 4, ...).")
_BATCH = flags.DEFINE_integer("batch_per_data_shard", 0,
                              "Examples per data shard (0: the config's train.batch_size).")
_BREAKDOWN = flags.DEFINE_bool(
    "breakdown", False, "Also list the largest buffers live at the peak of each compiled step "
    "(from XLA's buffer assignment) and the bytes at the peak per part of the model.")

GIB = 2**30


def _row(report) -> str:
  remat = report["remat"]
  stages = "".join(flag for key, flag in (("remat_grid_to_mesh_gnn", "E"), ("remat_mesh_gnn", "P"),
                                          ("remat_mesh_to_grid_gnn", "D")) if remat[key]) or "-"
  memory = report["device_memory_bytes"]
  return (f"{report.get('candidate', ''):<22}{report['mesh']['graph']:>6}{stages:>5}"
          f"{remat['mesh_remat_every']:>4}{remat['edge_chunks']:>5}  {remat['remat_policy']:<34}"
          f"{report['argument_bytes'] / GIB:>8.2f}{report['temp_bytes'] / GIB:>8.2f}"
          f"{report['peak_bytes'] / GIB:>8.2f}{(memory or 0) / GIB:>8.2f}"
          f"{'yes' if report['fits'] else 'NO':>6}{report['flops']:>11.3g}"
          f"{report['compile_seconds']:>8.1f}")


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
    jax.config.update("jax_num_cpu_devices", int(name.split(":")[1]))

  target = topology.resolve(name)
  config = config_lib.validate(_CONFIG.value)
  shard_counts = ([int(g) for g in _GRAPH_SHARDS.value] if _GRAPH_SHARDS.value
                  else [config.mesh.graph] if not _SWEEP.value
                  else [2**k for k in range(len(target.devices).bit_length())
                        if len(target.devices) % 2**k == 0])
  reports = []
  for graph in shard_counts:
    config.mesh.update(graph=graph, data=-1)
    if _BATCH.value:
      config.train.batch_size = _BATCH.value * (len(target.devices) // graph)
    problem = Problem(config, target, lower_train_step)
    names = list(auto_remat.CANDIDATES) if _SWEEP.value else [None]
    if config.model.remat_policy == "auto" and not _SWEEP.value:
      names = [auto_remat.choose_remat(config, target, lower_train_step,
                                       int(config.train.memory_budget_gib * GIB) or None,
                                       problem=problem)["name"]]
    for candidate in names:
      overrides = auto_remat.candidate_overrides(candidate) if candidate else {}
      report = problem.compile(overrides, breakdown=_BREAKDOWN.value)
      if candidate:
        report["candidate"] = candidate
      reports.append(report)
      if not _JSON.value:
        if len(reports) == 1:
          print(f"{target.name}: {len(target.devices)} devices, {problem.counts}")
          print(f"{'candidate':<22}{'graph':>6}{'EPD':>5}{'K':>4}{'chnk':>5}  {'policy':<34}"
                f"{'arg GiB':>8}{'tmp GiB':>8}{'peak':>8}{'HBM':>8}{'fits':>6}{'FLOPs':>11}"
                f"{'comp s':>8}")
        print(_row(report), flush=True)
        if _BREAKDOWN.value and "peak_buffers" in report:
          print(_breakdown(report), flush=True)
  if _JSON.value:
    print(json.dumps(reports if _SWEEP.value else reports[0]))
  elif not all(r["fits"] for r in reports):
    print("Some configurations do NOT fit in device memory (fits = NO).")


if __name__ == "__main__":
  app.run(main)
