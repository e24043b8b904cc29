"""Per-chip memory of GraphCast 0.25 deg on TPU topologies: no remat, the paper's scheme, and
the planner's choice, at several graph shard counts (AOT compiles with libtpu, on this CPU);
with `--model=weathernext2`, WeatherNext 2's network: no remat and processor remat; with
`--model=graphcast_fgn`, GraphCast as an FGN ensemble (32 noise channels conditioning every
layer norm, the CRPS of 2 members per example, vmapped on each data shard) under the paper's
scheme with grid blocks.

  python bench/planner_0p25.py [--topologies=v5e:4x4,v4:2x2x2 --graph_shards=8,16,4,1,2]
  python bench/planner_0p25.py --model=weathernext2 --graph_shards=16,8,4
  python bench/planner_0p25.py --model=graphcast_fgn --topologies=v5e:4x4 --graph_shards=16,8,4
  python bench/planner_0p25.py [--model=...] --table   # what is measured so far

Each (topology, graph shards) runs in its own process (a 0.25 deg TPU compile
takes minutes and gigabytes of host memory) and appends one JSON line per
result to `--out`; a rerun skips what is there, so the report can be built up
over several sessions. At the end the table for docs/benchmarks.md is printed.
"""

import argparse
import json
import math
import os
import subprocess
import sys

# A CPU host planning for TPUs (as in launch/compile.py).
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
GIB = 2**30
# Per model: its config, its schemes (column labels) and its default results file.
MODELS = {
    "graphcast": ("graphcast_0p25.py", {"none": "no remat", "paper": "paper",
                                        "best": "planner's choice"}, "planner_0p25.jsonl"),
    "weathernext2": ("weathernext2_0p25.py", {"none": "no remat", "processor": "processor remat"},
                     "planner_0p25_weathernext2.jsonl"),
    "graphcast_fgn": ("graphcast_0p25.py", {"paper_grid_blocks": "FGN, 2 members: paper + "
                                            "grid blocks"}, "planner_0p25_fgn.jsonl"),
}
# Config overrides of a model beyond its config file.
OVERRIDES = {"graphcast_fgn": {"model": dict(noise_channels=32),
                               "train": dict(loss="crps", ensemble_members=2)}}


def scheme_overrides(scheme: str) -> dict:
  """Remat settings of a fixed scheme: an auto_remat candidate, or `processor` (the processor
  alone, one checkpoint per layer)."""
  from wnscale.planner import auto_remat
  if scheme == "processor":
    return dict(auto_remat.candidate_overrides("none"), remat_mesh_gnn=True)
  return auto_remat.candidate_overrides(scheme)


def measure(model: str, topology: str, graph: int, out: str, done: set):
  """Compiles the schemes of one (topology, graph) not yet in `done`; appends them to `out`."""
  from wnscale import config as config_lib
  from wnscale import specs as specs_lib
  from wnscale.planner import auto_remat, topology as topology_lib
  from wnscale.planner.compile import Problem
  from wnscale.train.step import lower_train_step

  config_file, schemes, _ = MODELS[model]
  target = topology_lib.resolve(topology)
  config = config_lib.load(os.path.join(REPO, "configs", config_file))
  for section, values in OVERRIDES.get(model, {}).items():
    config[section].update(values)
  config.mesh.update(graph=graph, data=len(target.devices) // graph)
  config.train.batch_size = config.mesh.data  # one example per data shard
  specs = specs_lib.from_config(config)
  problem = Problem(specs, target, lower_train_step)

  def record(scheme, report):
    with open(out, "a") as f:
      f.write(json.dumps(dict(report, scheme=scheme, code=code_version())) + "\n")
    print(f"{topology} graph={graph} {scheme}: peak {report['peak_bytes'] / GIB:.2f} GiB, "
          f"fits={report['fits']}, {report['compile_seconds']:.0f} s", flush=True)

  for scheme in schemes:
    if scheme not in done and scheme != "best":
      record(scheme, problem.compile(scheme_overrides(scheme)))
  if "best" in schemes and "best" not in done:
    try:
      choice = auto_remat.choose_remat(specs, target, lower_train_step, problem=problem)
      record("best", dict(problem.compile(choice["overrides"]), candidate=choice["name"],
                          reason=choice["reason"]))
    except ValueError as error:  # nothing fits
      record("best", {"topology": topology, "mesh": {"graph": graph}, "fits": False,
                      "peak_bytes": 0, "compile_seconds": 0, "candidate": None,
                      "reason": str(error)})


def code_version() -> str:
  """The commit of the code that compiles (`+` if the library has uncommitted changes)."""
  git = lambda *args: subprocess.run(["git", *args], cwd=REPO, capture_output=True,
                                     text=True).stdout.strip()
  return git("rev-parse", "--short", "HEAD") + ("+" if git("status", "--porcelain", "wnscale")
                                                else "")


def load(out: str) -> list[dict]:
  if not os.path.exists(out):
    return []
  with open(out) as f:
    return [json.loads(line) for line in f if line.strip()]


def table(results: list[dict], schemes: dict) -> str:
  """Markdown: one row per (topology, graph), peak GiB per device for each of `schemes`, and
  the commit(s) of the code that compiled them."""
  cells = {}
  for r in results:
    key = (r["topology"], r["mesh"]["graph"])
    if r["scheme"] == "best" and r["candidate"] is None:
      text = "nothing fits"
    else:
      peak = f"{r['peak_bytes'] / GIB:.2f}" + ("" if r["fits"] else " (no)")
      text = peak
      if r["scheme"] == "best":  # the choice, and the work its remat adds to the step
        added = (f" +{r['recompute_flops'] / r['flops']:.0%} FLOPs"
                 if r.get("flops") and "recompute_flops" in r else "")
        text = f"{peak} `{r['candidate']}`{added}"
    cells.setdefault(key, {})[r["scheme"]] = text
    cells[key].setdefault("code", set()).add(r.get("code", "?"))
    cells[key]["devices"] = r.get("num_devices", cells[key].get("devices"))
    cells[key]["hbm"] = f"{r['device_memory_bytes'] / GIB:.0f}" if "device_memory_bytes" in r \
        else cells[key].get("hbm", "")
  labels = list(schemes.values())
  lines = ["| topology | graph shards | chips per example | HBM GiB per device | "
           + " | ".join(labels) + " | code |",
           "|---|---:|---:|---:|" + "---:|" * len(labels) + "---|"]
  for (topology, graph), row in sorted(cells.items()):
    chips = math.prod(int(n) for n in topology.split(":")[1].split("x"))
    per_chip = row["devices"] // chips  # v4 exposes both TensorCores of a chip
    lines.append(f"| {topology} | {graph} | {graph / per_chip:g} | {row.get('hbm', '')} | "
                 + " | ".join(row.get(s, "-") for s in schemes)
                 + f" | {', '.join(sorted(row['code']))} |")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--model", default="graphcast", choices=sorted(MODELS))
  parser.add_argument("--topologies", default="v5e:4x4,v4:2x2x2")
  parser.add_argument("--graph_shards", default="8,16,4,1,2")
  parser.add_argument("--out", default="", help="results file (default: the model's)")
  parser.add_argument("--table", action="store_true", help="print the table of --out, compile nothing")
  parser.add_argument("--one", default="", help=argparse.SUPPRESS)  # "topology,graph": child
  args = parser.parse_args()
  schemes = MODELS[args.model][1]
  args.out = args.out or os.path.join(REPO, "bench", "results", MODELS[args.model][2])
  os.makedirs(os.path.dirname(args.out), exist_ok=True)

  def done(topology, graph):
    return {r["scheme"] for r in load(args.out)
            if r["topology"] == topology and r["mesh"]["graph"] == graph}

  if args.table:
    print(table(load(args.out), schemes))
    return 0
  if args.one:
    topology, graph = args.one.split(",")
    measure(args.model, topology, int(graph), args.out, done(topology, int(graph)))
    return 0
  for graph in (int(g) for g in args.graph_shards.split(",")):
    for topology in args.topologies.split(","):
      if done(topology, graph) >= set(schemes):
        continue
      status = subprocess.run([sys.executable, __file__, f"--one={topology},{graph}",
                               f"--model={args.model}", f"--out={args.out}"],
                              cwd=REPO).returncode
      if status:
        print(f"{topology} graph={graph}: the compile process failed ({status})", flush=True)
  print(table(load(args.out), schemes))
  return 0


if __name__ == "__main__":
  sys.exit(main())
