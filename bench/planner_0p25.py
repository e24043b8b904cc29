"""Per-chip memory of GraphCast 0.25 deg on TPU topologies: no remat, the paper's scheme, and
the planner's choice, at several graph shard counts (AOT compiles with libtpu, on this CPU).

  python bench/planner_0p25.py [--topologies=v5e:4x4,v4:2x2x2 --graph_shards=8,16,4,1,2]
  python bench/planner_0p25.py --table   # what is measured so far

Each (topology, graph shards) runs in its own process (a 0.25 deg TPU compile
takes minutes and gigabytes of host memory) and appends one JSON line per
result to `--out`; a rerun skips what is there, so the report can be built up
over several sessions. At the end the table for the README is printed.
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
CONFIG = os.path.join(REPO, "configs", "graphcast_0p25.py")
GIB = 2**30
SCHEMES = ("none", "paper", "best")


def measure(topology: str, graph: int, out: str, done: set):
  """Compiles the schemes of one (topology, graph) not yet in `done`; appends them to `out`."""
  from wnscale import config as config_lib
  from wnscale.planner import auto_remat, topology as topology_lib
  from wnscale.planner.compile import Problem
  from wnscale.train.step import lower_train_step

  target = topology_lib.resolve(topology)
  config = config_lib.load(CONFIG)
  config.mesh.update(graph=graph, data=len(target.devices) // graph)
  config.train.batch_size = config.mesh.data  # one example per data shard
  problem = Problem(config, target, lower_train_step)

  def record(scheme, report):
    with open(out, "a") as f:
      f.write(json.dumps(dict(report, scheme=scheme, code=code_version())) + "\n")
    print(f"{topology} graph={graph} {scheme}: peak {report['peak_bytes'] / GIB:.2f} GiB, "
          f"fits={report['fits']}, {report['compile_seconds']:.0f} s", flush=True)

  for scheme in ("none", "paper"):
    if scheme not in done:
      record(scheme, problem.compile(auto_remat.candidate_overrides(scheme)))
  if "best" not in done:
    try:
      choice = auto_remat.choose_remat(config, target, lower_train_step, problem=problem)
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


def table(results: list[dict]) -> str:
  """Markdown: one row per (topology, graph), peak GiB per device for each scheme, and the
  commit(s) of the code that compiled them."""
  cells = {}
  for r in results:
    key = (r["topology"], r["mesh"]["graph"])
    if r["scheme"] == "best" and r["candidate"] is None:
      text = "nothing fits"
    else:
      peak = f"{r['peak_bytes'] / GIB:.2f}" + ("" if r["fits"] else " (no)")
      text = f"{peak} `{r['candidate']}`" if r["scheme"] == "best" else peak
    cells.setdefault(key, {})[r["scheme"]] = text
    cells[key].setdefault("code", set()).add(r.get("code", "?"))
    cells[key]["devices"] = r.get("num_devices", cells[key].get("devices"))
    cells[key]["hbm"] = f"{r['device_memory_bytes'] / GIB:.0f}" if "device_memory_bytes" in r \
        else cells[key].get("hbm", "")
  lines = ["| topology | graph shards | chips per example | HBM GiB per device | no remat "
           "| paper | planner's choice | code |", "|---|---:|---:|---:|---:|---:|---|---|"]
  for (topology, graph), row in sorted(cells.items()):
    chips = math.prod(int(n) for n in topology.split(":")[1].split("x"))
    per_chip = row["devices"] // chips  # v4 exposes both TensorCores of a chip
    lines.append(f"| {topology} | {graph} | {graph / per_chip:g} | {row.get('hbm', '')} | "
                 + " | ".join(row.get(s, "-") for s in SCHEMES)
                 + f" | {', '.join(sorted(row['code']))} |")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--topologies", default="v5e:4x4,v4:2x2x2")
  parser.add_argument("--graph_shards", default="8,16,4,1,2")
  parser.add_argument("--out", default=os.path.join(REPO, "bench", "results", "planner_0p25.jsonl"))
  parser.add_argument("--table", action="store_true", help="print the table of --out, compile nothing")
  parser.add_argument("--one", default="", help=argparse.SUPPRESS)  # "topology,graph": child
  args = parser.parse_args()
  os.makedirs(os.path.dirname(args.out), exist_ok=True)

  def done(topology, graph):
    return {r["scheme"] for r in load(args.out)
            if r["topology"] == topology and r["mesh"]["graph"] == graph}

  if args.table:
    print(table(load(args.out)))
    return 0
  if args.one:
    topology, graph = args.one.split(",")
    measure(topology, int(graph), args.out, done(topology, int(graph)))
    return 0
  for graph in (int(g) for g in args.graph_shards.split(",")):
    for topology in args.topologies.split(","):
      if done(topology, graph) >= set(SCHEMES):
        continue
      status = subprocess.run([sys.executable, __file__, f"--one={topology},{graph}",
                               f"--out={args.out}"], cwd=REPO).returncode
      if status:
        print(f"{topology} graph={graph}: the compile process failed ({status})", flush=True)
  print(table(load(args.out)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
