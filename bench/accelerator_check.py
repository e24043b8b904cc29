r"""The chip's speed table in one command: every problem, its figures kept with the commit.

  bash bench/accelerator_check.sh --prepare [--python=3.11]  # here: wheels and the reference
  bash bench/accelerator_check.sh OUT [--only=STEPS]         # on the accelerator's machine
  bash bench/accelerator_check.sh OUT --cpu                  # the same steps, tiny, on CPU

(`accelerator_check.sh` installs the carried wheels, then runs this file.) The steps, each
in a process of its own, so that one that fails (or aborts on the device) leaves the others
their figures, and only one process at a time holds the accelerator:

  devices         JAX's version and backend, the devices and their memory
  tests           the aggregation, remat and kernel tests on the accelerator
                  (`WNSCALE_TEST_PLATFORM`; `--tests_k`: those a pytest -k expression
                  selects, here and below)
  parity_tests    the one-device sharding test and the parity tests (GraphCast's, WeatherNext
                  2's, splash attention's) there
  setup           the paper model's set-up at 1 and 0.25 deg as a first start has it (nothing
                  cached): `assemble`'s seconds by part (graphs and constants, partition,
                  parameters)
  mid_step        the mid problem (1 deg, mesh levels 0..5, latent 128, 8 steps, float32,
                  batch 1): wnscale's loss + gradient step against the reference
                  GraphCast's, side by side in this process (`reference_speed.compare`;
                  wnscale alone where the reference is not importable)
  latent256_step  the same at latent 256, 16 steps
  paper_1deg      GraphCast's paper model at 1 deg, bfloat16, one example: the train step
                  with the remat setting `--paper_1deg_remat` (the planner's choice for
                  the chip, `all_dots_saveable`; `auto`: plan it here, compiling candidates)
  paper_0p25      the same at 0.25 deg with remat `--paper_0p25_remat` (`paper`)
  forecast        a 10-day forecast at 1 deg (`bench/forecast.py`'s mid run,
                  `python -m launch.forecast`): lead steps per second
  train_loop      `python -m launch.train` on a small synthetic store: the mid config at batch 4
                  and the 1 deg paper model (remat `--paper_1deg_remat`) at batch 1, 40 steps
                  each (with --cpu the tiny config): steps per second and where the loop's
                  time went, the share waiting on input and on the host (`metrics.jsonl`)
  wn2_mini_step   WeatherNext 2's 1 deg Mini (`configs/weathernext2_1p0.py`), one example:
                  its train step with remat `--wn2_mini_remat` (`processor_every_3`) and
                  `model.transformer_attention='auto'` (on a TPU the splash kernel), and on a
                  TPU with edges (in blocks of 2^17); with --cpu a tiny transformer, 'auto'
                  (edges there) and splash (interpreted); the splash kernel's share of
                  tiles with an edge
  gencast_1deg_step  GenCast's 1 deg denoiser (`configs/gencast_1p0.py`), one example: its
                  train step (the diffusion loss, noise drawn in the step) with remat
                  `--gencast_1deg_remat` (`none`: the planner's choice for the chip,
                  compiled peak 15.11 GiB; docs/benchmarks.md) and the config's attention;
                  with --cpu a tiny denoiser on the tiny config's grid
  far_rows        the fused edge step's far rows' gradient (the paper model's mesh edges,
                  latent 512) in seven forms, the code's first, timed
  encoder_blocks  the fused encoder edge step, forward and backward (the paper model's grid
                  to mesh edges at 0.25 deg, latent 512, bfloat16; with --cpu the tiny
                  config's, latent 8), its `SenderBlocks` of 512 sender rows a block (the
                  code's), 256 and 128, timed

Each model step records its step time, compile time, compiled and measured peak memory,
utilization by GraphCast's FLOP count next to the hardware rate (`step_figures`), and
where the time goes by kind of op (`op_profile`, a `jax.profiler` trace). `--cpu` runs
every step on the CPU with tiny problems (the suite runs it: tests/test_accelerator_check.py),
so the script cannot rot between accelerators. A device command may be limited in time:
`--only` runs some of the steps; results accumulate.

Each figure is one JSON line in OUT/results.jsonl (`{"step": ..., "commit": ..., "date":
..., ...}`; a failed step has an `error`); each step's output goes to OUT/log.txt. The
commit is `git describe --always --dirty` of the checkout as `--prepare` wrote it to
`.accelerator/commit.txt` (refresh it before each run on a copied tree: `git describe
--always --dirty > .accelerator/commit.txt`), else the checkout's own. Keep a run's
results.jsonl under bench/results/ (`accelerator_<date>_<commit>.jsonl`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
# pytest selections, two steps so that each fits a limited device command: on an
# accelerator, the aggregation, remat and kernel tests (`tests`), then the one-device sharding and
# parity tests (`parity_tests`); with --cpu, one case of each (the suite runs the rest).
ONE_DEVICE_SHARDING = "tests/test_sharding.py::test_sharded_matches_single_device[1x1-all_gather]"
TESTS = {
    "tests": {"accelerator": ["tests/test_aggregation.py", "tests/test_remat.py",
                              "tests/test_fused_encoder_decoder.py"],
              "cpu": ["tests/test_remat.py::test_remat_matches_plain_model[processor_matmul]"]},
    "parity_tests": {
        "accelerator": [ONE_DEVICE_SHARDING,
                        "tests/test_graphcast_import.py::test_predictions_match_the_reference",
                        "tests/test_weathernext2.py::test_lead_one_equals_weathernext2_at_every_"
                        "node_with_one_triangle", "tests/test_splash_attention.py"],
        "cpu": [ONE_DEVICE_SHARDING]},
}
# The reference comparisons' problems (`mid_problem.parse` flags): the table's, or tiny.
SIDE_BY_SIDE = {
    "mid_step": {"accelerator": [], "cpu": ["--resolution=5.625", "--mesh_levels=2",
                                            "--latent=16", "--steps=2"]},
    "latent256_step": {"accelerator": ["--latent=256", "--steps=16"],
                       "cpu": ["--resolution=5.625", "--mesh_levels=2", "--latent=32",
                               "--steps=3"]},
}
# GraphCast's paper model: its resolution and remat setting per step (the tiny config's
# grid with --cpu).
PAPER = {"paper_1deg": 1.0, "paper_0p25": 0.25}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("out", help="the folder for results.jsonl and log.txt")
  parser.add_argument("--cpu", action="store_true", help="tiny problems on the CPU")
  parser.add_argument("--only", default=",".join(STEP_FUNCTIONS), help="comma-separated steps")
  parser.add_argument("--paper_1deg_remat", default="all_dots_saveable",
                      help="paper_1deg's remat: a planner candidate's name, or auto")
  parser.add_argument("--paper_0p25_remat", default="paper",
                      help="paper_0p25's remat: a planner candidate's name, or auto")
  parser.add_argument("--wn2_mini_remat", default="processor_every_3",
                      help="wn2_mini_step's remat: a planner candidate's name, or auto")
  parser.add_argument("--gencast_1deg_remat", default="none",
                      help="gencast_1deg_step's remat: a planner candidate's name, or auto")
  parser.add_argument("--aggregations", default="auto",
                      help="variants to measure, comma-separated, each a model.aggregation "
                           "value maybe followed by /key=value of other model keys that change "
                           "how the step computes (fused/scan_layers=false): each model step "
                           "runs each (side by side where there is a reference)")
  parser.add_argument("--tests_k", default="",
                      help="tests and parity_tests: only the tests this pytest -k expression "
                           "selects (e.g. 'loop or fused')")
  parser.add_argument("--timed_steps", type=int, default=5, help="timed runs of each step")
  parser.add_argument("--step_timeout", type=float, default=1800,
                      help="seconds each step may take")
  parser.add_argument("--step", help=argparse.SUPPRESS)  # run one step in this process
  parser.add_argument("--platform", help=argparse.SUPPRESS)  # the step's JAX platform
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  if args.step:
    _run_step_here(args)
    return 0
  names = args.only.split(",")
  for name in names:
    if name not in STEP_FUNCTIONS:
      sys.exit(f"--only={args.only}: no step {name!r}; the steps are "
               f"{', '.join(STEP_FUNCTIONS)}")
  args.platform = "cpu" if args.cpu else _platform()
  failed = sum(not _run_step_in_a_process(name, args) for name in names)
  print(f"{len(names) - failed} steps ran, {failed} failed: "
        f"{os.path.join(args.out, 'results.jsonl')}")
  return 1 if failed else 0


def _run_step_in_a_process(name: str, args) -> bool:
  """Runs step `name` in a child process, its output appended to the log; True if it ended
  well. A child that fails without a word of its own (an abort, a timeout) gets its error
  line written here."""
  command = [sys.executable, os.path.abspath(__file__), args.out, f"--step={name}",
             f"--platform={args.platform}", f"--paper_1deg_remat={args.paper_1deg_remat}",
             f"--paper_0p25_remat={args.paper_0p25_remat}",
             f"--wn2_mini_remat={args.wn2_mini_remat}",
             f"--gencast_1deg_remat={args.gencast_1deg_remat}",
             f"--aggregations={args.aggregations}", f"--tests_k={args.tests_k}",
             f"--timed_steps={args.timed_steps}"] + (["--cpu"] if args.cpu else [])
  start = time.perf_counter()
  with open(os.path.join(args.out, "log.txt"), "a") as log:
    log.write(f"=== {name}\n")
    log.flush()
    # A session of its own: a step out of time is ended with every process it started (a
    # test run left behind would hold the accelerator).
    process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
      code = process.wait(timeout=args.step_timeout)
      error = f"exit status {code}" if code else None
    except subprocess.TimeoutExpired:
      os.killpg(process.pid, signal.SIGKILL)
      process.wait()
      error = f"not finished in {args.step_timeout:.0f} s"
  seconds = time.perf_counter() - start
  if error and not _recorded_error(args.out, name):
    _append(args.out, {"step": name, "error": error, "seconds": round(seconds, 1)})
  print(f"{name}: {'failed (' + error + ')' if error else 'done'} in {seconds:.0f} s",
        flush=True)
  return error is None


def _platform() -> str:
  """The accelerator's JAX platform name (`tpu`, `gpu`), read in a short child process so
  that this one never holds the device; then a pause, as a TPU can refuse a program started
  just after another ended."""
  platform = subprocess.run([sys.executable, "-c", "import jax; print(jax.default_backend())"],
                            capture_output=True, text=True, check=True).stdout.split()[-1]
  time.sleep(5)
  return platform


def _recorded_error(out: str, name: str) -> bool:
  path = os.path.join(out, "results.jsonl")
  if not os.path.exists(path):
    return False
  with open(path) as f:
    return any(r["step"] == name and "error" in r for r in map(json.loads, f))


def _append(out: str, record: dict):
  with open(os.path.join(out, "results.jsonl"), "a") as f:
    f.write(json.dumps(record) + "\n")


def commit() -> str:
  """What `--prepare` wrote of the checkout's `git describe --always --dirty` where it did
  (a copied tree's own git, if any, may describe another commit), else the checkout's."""
  written = os.path.join(REPO, ".accelerator", "commit.txt")
  if os.path.exists(written):
    with open(written) as f:
      return f.read().strip()
  try:
    described = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO,
                               capture_output=True, text=True)
    if described.returncode == 0:
      return described.stdout.strip()
  except OSError:  # no git
    pass
  return "unknown"


def _run_step_here(args):
  """Runs `args.step` in this process; its figures (or its error) go to results.jsonl."""
  mode = "cpu" if args.cpu else "accelerator"
  # A CPU run keeps to the CPU (with libtpu installed JAX would look for a TPU first); on
  # the accelerator's machine JAX picks the accelerator, with the host's CPU beside it.
  os.environ["JAX_PLATFORMS"] = "cpu" if args.cpu else f"{args.platform},cpu"
  stamp = {"commit": commit(), "date": time.strftime("%Y-%m-%d")}
  record = lambda **figures: _append(args.out, {"step": args.step, "mode": mode, **stamp,
                                                **figures})
  try:
    STEP_FUNCTIONS[args.step](args, mode, record)
  except Exception as error:  # noqa: BLE001: recorded, and this step fails
    traceback.print_exc()
    record(error=f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
    sys.exit(1)


def devices(args, mode, record):
  import jax  # noqa: PLC0415: in the step's own process, after its platform is set
  device = jax.devices()[0]
  memory = device.memory_stats() or {}
  record(jax=jax.__version__, backend=jax.default_backend(), device_kind=device.device_kind,
         count=jax.device_count(), devices=[str(d) for d in jax.devices()],
         memory_bytes=memory.get("bytes_limit"))


def tests(args, mode, record):
  start = time.perf_counter()
  # Test by test into OUT/<step>.txt, which keeps what ran if the step runs out of time.
  report = os.path.join(args.out, f"{args.step}.txt")
  with open(report, "w") as output:
    code = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-o", "addopts=-ra",
         *(["-k", args.tests_k] if args.tests_k else []), *TESTS[args.step][mode]],
        cwd=REPO, stdout=output, stderr=subprocess.STDOUT,
        env=dict(os.environ, WNSCALE_TEST_PLATFORM=args.platform)).returncode
  with open(report) as output:
    summary = output.read().strip().splitlines()[-1]
  counts = {kind: int(count) for count, kind in
            re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", summary)}
  record(platform=args.platform, exit_status=code, seconds=round(time.perf_counter() - start, 1),
         **counts)
  if code:
    sys.exit(1)


def _bench_imports():
  """`bench/` on the path (and with it tests/, for the problems), in the step's process."""
  sys.path.insert(0, os.path.join(REPO, "bench"))


def side_by_side(args, mode, record):
  """`reference_speed.compare` on the step's problem: wnscale's figures and the reference's."""
  _bench_imports()
  sys.argv = [sys.argv[0]] + SIDE_BY_SIDE[args.step][mode]
  import mid_problem  # noqa: PLC0415
  import reference_speed  # noqa: PLC0415
  _, config, points = mid_problem.parse("", repeats=args.timed_steps)
  m = config.model
  problem = dict(resolution=config.data.resolution, mesh_levels=m.mesh_levels,
                 latent=m.latent_size, steps=m.message_passing_steps, dtype=m.dtype,
                 aggregation=m.aggregation, batch=1)
  result = reference_speed.compare(config, points, args.timed_steps, profile=True,
                                   with_reference=not reference_speed.REFERENCE_MISSING,
                                   aggregations=tuple(args.aggregations.split(",")))
  if reference_speed.REFERENCE_MISSING:
    result["reference"] = "not importable"
  print(json.dumps(result, indent=1))
  record(problem=problem, **result)


def paper_step(args, mode, record):
  """GraphCast's paper model, one example on one device: its train step with the step's
  remat setting, once per `--aggregations` entry."""
  _bench_imports()
  import reference_speed  # noqa: PLC0415
  from wnscale import config as config_lib  # noqa: PLC0415
  if args.cpu:
    config = config_lib.load(os.path.join(REPO, "configs", "tiny.py"))
  else:
    config = config_lib.graphcast_paper_config(PAPER[args.step])
  _train_steps(args, config, getattr(args, f"{args.step}_remat"), record,
               [reference_speed.variant_overrides(name, config.model)
                for name in args.aggregations.split(",")])


def _train_steps(args, config, remat: str, record, variants, details=lambda step: {}):
  """`config`'s train step, one example on one device (the 1-step phase), with remat
  setting `remat` (`auto`: the planner's choice for the device's memory, planned here), once
  per `variants` entry (model overrides): its figures (`step_figures.measure`), the set-up
  and compile time, and `details(TrainStep)`; a step that does not fit is recorded so."""
  import jax  # noqa: PLC0415
  _bench_imports()
  import mid_problem  # noqa: PLC0415: also puts tests/ on the path (problems.py)
  import step_figures  # noqa: PLC0415
  from wnscale import config as config_lib  # noqa: PLC0415
  from wnscale import specs as specs_lib  # noqa: PLC0415
  from wnscale.graphs import points as points_lib  # noqa: PLC0415
  from wnscale.model import setup  # noqa: PLC0415
  from wnscale.planner import auto_remat, topology  # noqa: PLC0415
  from wnscale.planner.compile import Problem  # noqa: PLC0415
  from wnscale.train import step as step_lib  # noqa: PLC0415

  config = config.copy_and_resolve_references()
  # One example, the 1-step phase (the schedule's longer ones size auto remat otherwise).
  config.train.update(batch_size=1, rollout_schedule=(), phase_learning_rates=())
  config.mesh.update(data=1, graph=1)
  config = config_lib.validate(config)
  points = points_lib.standard(config.data.grid, config.data.resolution)
  if remat == "auto":
    device = jax.devices()[0]
    memory = (device.memory_stats() or {}).get("bytes_limit") or topology.host_memory_bytes()
    target = topology.Target(f"{device.platform}:1", (device,), memory)
    start = time.perf_counter()
    specs = specs_lib.from_config(config)
    choice = auto_remat.choose_remat(specs, target, step_lib.lower_train_step,
                                     problem=Problem(specs, target, step_lib.lower_train_step))
    record(setting="planner's choice", choice=choice["name"], reason=choice["reason"],
           planning_seconds=round(time.perf_counter() - start, 1))
    remat = choice["name"]
  config.model.update(auto_remat.candidate_overrides(remat))
  graphs = setup.graphs_for_grid(specs_lib.from_config(config).model, points)
  for overrides in variants:
    variant = config.copy_and_resolve_references()
    variant.model.update(overrides)
    variant = config_lib.validate(variant)
    labels = dict(remat=remat, resolution=variant.data.resolution, dtype=variant.model.dtype,
                  loss=variant.train.loss, **overrides)
    start = time.perf_counter()
    try:
      step = mid_problem.TrainStep(variant, points)
    except jax.errors.JaxRuntimeError as error:
      if "RESOURCE_EXHAUSTED" not in str(error):
        raise
      record(**labels, fits=False, error=str(error).splitlines()[0][:500])
      continue
    setup_seconds = time.perf_counter() - start - step.compile_seconds
    graphcast = (step_figures.graphcast_flops(variant, graphs.counts())
                 if variant.model.processor == "interaction_network" else None)
    figures = step_figures.measure(
        step.step, functools.partial(step.run, timed=False), timed=args.timed_steps,
        graphcast=graphcast, hardware=step_figures.hardware_flops(variant, graphs))
    print(step_figures.describe(f"{args.step} ({', '.join(map(str, labels.values()))})",
                                figures))
    record(**labels, fits=True, setup_seconds=round(setup_seconds, 1),
           setup_parts=step.setup_parts,
           compile_seconds=round(step.compile_seconds, 1), **figures, **details(step))
    del step  # its device arrays, before the next one's are made


def forecast(args, mode, record):
  sys.path.insert(0, os.path.join(REPO, "bench"))
  os.environ["JAX_PLATFORMS"] = "cpu"  # this process only writes the run; the launch computes
  import forecast as forecast_bench  # noqa: PLC0415
  lead = "6h" if args.cpu else "10d"
  with tempfile.TemporaryDirectory() as directory:
    workdir = forecast_bench.make_run(directory)
    summary = forecast_bench.forecast(workdir, os.path.join(directory, "forecast.zarr"), lead,
                                      inits=1, platform=args.platform)
  record(platform=args.platform, config="configs/mid_1p0.py", lead=lead,
         lead_steps=summary["model_steps"], steps_per_second=summary["steps_per_sec"],
         peak_live_device_gib=summary["peak_live_device_bytes"] / 2**30)


def setup(args, mode, record):
  """The set-up of the paper model at 1 and 0.25 deg (with --cpu the tiny config) as a first
  start has it, nothing cached: `assemble`'s seconds by part (graphs and constants, their
  partition, the parameters)."""
  from wnscale import config as config_lib  # noqa: PLC0415
  from wnscale import specs as specs_lib  # noqa: PLC0415
  from wnscale.assembly import assemble  # noqa: PLC0415
  from wnscale.graphs import points as points_lib  # noqa: PLC0415
  from wnscale.sharding import mesh as mesh_lib  # noqa: PLC0415

  configs = ({"tiny": config_lib.load(os.path.join(REPO, "configs", "tiny.py"))} if args.cpu
             else {f"paper {resolution} deg": config_lib.graphcast_paper_config(resolution)
                   for resolution in PAPER.values()})
  for name, config in configs.items():
    config.mesh.update(data=1, graph=1)
    specs = specs_lib.from_config(config_lib.validate(config))
    points = points_lib.standard(specs.data.grid, specs.data.resolution)
    parts = {}

    @contextlib.contextmanager
    def timed(what: str):
      start = time.perf_counter()
      yield {}
      parts[what.split(" ")[0].lower()] = round(time.perf_counter() - start, 2)

    with tempfile.TemporaryDirectory(prefix="wnscale-setup-") as cache:
      os.environ["WNSCALE_CACHE_DIR"] = cache  # a first start: no graphs cached
      start = time.perf_counter()
      assemble(specs, points, None, mesh_lib.single_device_mesh(), params="init", phase=timed)
      total = time.perf_counter() - start
    record(problem=name, seconds=round(total, 2), partitioned_seconds=parts["partitioned"],
           parameters_seconds=parts["initialized"],
           graphs_and_constants_seconds=round(total - sum(parts.values()), 2))


def far_rows(args, mode, record):
  """The far rows' gradient of the fused edge step (`fused_edges`: the rows of each block's
  far list summed onto their senders) of the paper model's mesh edges (with --cpu the mid
  config's, mesh levels 0..5), latent 512 (8), in seven forms, timed on the device: the
  code's (`aggregation.sum_far_rows`: the rows read permuted into sender order and summed
  by blocks, products with 0/1 matrices), a segment sum of the far lists as they are
  (their padding rows add zeros to sender 0), one with the padding rows dropped, one of the
  rows read alone (gathered first), one in sender order after a permutation, a sum of
  gathers (one per far list a sender is in) and a bfloat16 segment sum."""
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415
  from wnscale import config as config_lib  # noqa: PLC0415
  from wnscale import specs as specs_lib  # noqa: PLC0415
  from wnscale.assembly import assemble  # noqa: PLC0415
  from wnscale.graphs import points as points_lib  # noqa: PLC0415
  from wnscale.model import aggregation  # noqa: PLC0415
  from wnscale.sharding import mesh as mesh_lib  # noqa: PLC0415

  config = (config_lib.load(os.path.join(REPO, "configs", "mid_1p0.py")) if args.cpu
            else config_lib.graphcast_paper_config(1.0))
  config.mesh.update(data=1, graph=1)
  config.model.aggregation = "fused"
  specs = specs_lib.from_config(config_lib.validate(config))
  assembly = assemble(specs, points_lib.standard(specs.data.grid, specs.data.resolution), None,
                      mesh_lib.single_device_mesh(), params=None)
  windows = jax.tree.map(lambda x: np.asarray(x)[0],  # the one shard's
                         assembly.layout.partitioned.graphs.edges["mesh"].sender_windows)
  num_senders, latent = assembly.graphs.num_nodes("mesh"), 8 if args.cpu else 512
  far = windows.far_senders
  read = np.zeros(far.shape, bool)  # the far rows a slot reads; the rest pad the lists
  for block, local in enumerate(windows.far_local):
    read[block, local[local < far.shape[1]]] = True
  as_listed = far.reshape(-1)  # as listed: padding rows send zeros to sender 0
  senders = np.where(read, far, num_senders).reshape(-1)  # padding: dropped by the sums
  order = np.argsort(senders, kind="stable")
  rows_read = np.flatnonzero(read.reshape(-1))
  counts = np.bincount(senders, minlength=num_senders + 1)[:num_senders]
  positions = np.full((max(int(counts.max()), 1), num_senders), senders.size, np.int32)
  seen = np.zeros(num_senders, np.int64)
  for position in np.flatnonzero(senders < num_senders):
    sender = senders[position]
    positions[seen[sender], sender] = position
    seen[sender] += 1
  grad = jnp.where(jnp.asarray(read)[..., None], jax.random.normal(
      jax.random.key(0), far.shape + (latent,), jnp.float32), 0)
  as_listed, senders, order, positions, rows_read = map(
      jnp.asarray, (as_listed, senders, order, positions, rows_read))
  rows = lambda g: g.reshape(-1, latent)
  forms = {
      "by blocks in sender order (the code's)": lambda g: aggregation.sum_far_rows(
          g, windows, num_senders),
      "segment sum (far lists' order)": lambda g: jax.ops.segment_sum(
          rows(g), as_listed, num_segments=num_senders),
      "segment sum, padding dropped": lambda g: jax.ops.segment_sum(
          rows(g), senders, num_segments=num_senders),
      "segment sum of the rows read (gathered first)": lambda g: jax.ops.segment_sum(
          rows(g)[rows_read], senders[rows_read], num_segments=num_senders),
      "segment sum (sender order)": lambda g: jax.ops.segment_sum(
          rows(g)[order], senders[order], num_segments=num_senders, indices_are_sorted=True),
      "sum of gathers": lambda g: sum(rows(g).at[p].get(mode="fill", fill_value=0)
                                      for p in positions),
      "segment sum, bfloat16": lambda g: jax.ops.segment_sum(
          rows(g).astype(jnp.bfloat16), senders, num_segments=num_senders),
  }
  # Differences from an exact sum (on a TPU the code's products are one bfloat16 pass).
  exact = jax.jit(forms["segment sum, padding dropped"])(grad)
  for name, form in forms.items():
    compiled = jax.jit(form)
    out = jax.block_until_ready(compiled(grad))
    times = []
    for _ in range(args.timed_steps * 4):
      start = time.perf_counter()
      jax.block_until_ready(compiled(grad))
      times.append(time.perf_counter() - start)
    record(form=name, far_lists=list(far.shape), far_rows_read=int(read.sum()),
           most_lists_of_a_sender=int(counts.max()), latent=latent,
           milliseconds=round(1e3 * sorted(times)[len(times) // 2], 3),
           max_difference=float(jnp.max(jnp.abs(out.astype(jnp.float32) - exact))))


def encoder_blocks(args, mode, record):
  """The fused encoder edge step (`fused_encoder_decoder.encoder_edge_sums`, forward and
  backward) of the paper model's grid-to-mesh edges at 0.25 deg (with --cpu the tiny
  config's grid and mesh), latent 512 (8), bfloat16, random parameters and tables, by
  `SenderBlocks` of 512 (the code's, `receiver_blocks.ENCODER_KERNEL_ROWS`), 256 and 128
  sender rows a block: the median of the timed runs, and the largest difference from the
  code's (relative to its largest value)."""
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415
  from wnscale import config as config_lib  # noqa: PLC0415
  from wnscale import specs as specs_lib  # noqa: PLC0415
  from wnscale.graphs import points as points_lib  # noqa: PLC0415
  from wnscale.graphs import receiver_blocks  # noqa: PLC0415
  from wnscale.model import fused_encoder_decoder, setup as setup_lib  # noqa: PLC0415
  from wnscale.sharding import partition  # noqa: PLC0415

  config = (config_lib.load(os.path.join(REPO, "configs", "tiny.py")) if args.cpu
            else config_lib.graphcast_paper_config(0.25))
  model = specs_lib.from_config(config_lib.validate(config)).model
  points = points_lib.standard(config.data.grid, config.data.resolution)
  graphs = setup_lib.graphs_for_grid(model, points)
  part = partition.partition_graphs(graphs, setup_lib.node_positions(model, points), 1,
                                    "all_gather")
  edges = jax.tree.map(lambda x: np.asarray(x)[0], part.graphs.edges["grid_to_mesh"])
  num_senders, num_receivers = part.nodes["grid"].per_shard, part.nodes["mesh"].per_shard
  latent = 8 if args.cpu else model.latent_size
  keys = iter(jax.random.split(jax.random.key(0), 16))
  normal = lambda *shape, scale=1.0: (scale * jax.random.normal(next(keys), shape)).astype(
      jnp.bfloat16)
  mlp = lambda inputs, size: (normal(inputs, size, scale=inputs ** -0.5), normal(size),
                              normal(size, size, scale=size ** -0.5), normal(size),
                              1 + normal(size), normal(size))
  params = (mlp(edges.features.shape[-1], latent), mlp(latent, latent))
  tables = (normal(num_senders, latent), normal(num_receivers, latent))
  weights = jax.random.normal(next(keys), (num_receivers, latent))

  def loss(params, tables, blocks):
    sums = fused_encoder_decoder.encoder_edge_sums(*params, *tables, blocks, 1e-5)
    return jnp.sum(sums * weights)

  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
  first = None
  for rows in (receiver_blocks.ENCODER_KERNEL_ROWS, 256, 128):
    blocks = receiver_blocks.sender_blocks(edges.senders, edges.receivers, edges.features,
                                           num_senders, num_receivers, block_rows=rows)
    out = jax.block_until_ready(step(params, tables, blocks))
    times = []
    for _ in range(args.timed_steps * 2):
      start = time.perf_counter()
      jax.block_until_ready(step(params, tables, blocks))
      times.append(time.perf_counter() - start)
    leaves = [np.asarray(x, np.float32) for x in jax.tree.leaves(out)]
    first = first or leaves
    difference = max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
                     for a, b in zip(leaves, first))
    record(block_rows=rows, slots=blocks.slots, kernel_blocks=int(blocks.window.shape[0]),
           receiver_list=int(blocks.receiver_rows.shape[1]),
           edges=int(np.count_nonzero(edges.receivers < num_receivers)), latent=latent,
           milliseconds=round(1e3 * sorted(times)[len(times) // 2], 3),
           max_relative_difference=difference)


def _transformer_details(step) -> dict:
  """A transformer step's mesh nodes and attention edges, and the share of the splash
  kernel's tiles that hold an edge (None on another attention)."""
  import numpy as np  # noqa: PLC0415
  mask = step.constants.graphs.masks.get("mesh_neighbours")
  return dict(mesh_nodes=step.counts["mesh_nodes"],
              attention_edges=step.counts["mesh_neighbour_edges"],
              tiles_with_an_edge=None if mask is None else float(np.mean(
                  np.asarray(mask.backward.block_mask) > 0)))


def wn2_mini_step(args, mode, record):
  """WeatherNext 2's Mini (a tiny transformer with --cpu), with each attention
  (`_train_steps`), and the share of the splash kernel's tiles that hold an edge."""
  import jax  # noqa: PLC0415
  from wnscale import config as config_lib  # noqa: PLC0415

  if args.cpu:
    config = config_lib.load(os.path.join(REPO, "configs", "tiny.py"))
    config.model.processor = "transformer"
  else:
    config = config_lib.load(os.path.join(REPO, "configs", "weathernext2_1p0.py"))
  on_tpu = jax.devices()[0].platform == "tpu"
  # Edges in blocks of 2^17 (the 0.25 deg model's 8.2M edges x 512 gathers otherwise).
  variants = [dict(transformer_attention="auto")] + (
      [dict(transformer_attention="edges", transformer_edges_per_block=2**17)] if on_tpu
      else [dict(transformer_attention="splash")] if args.cpu else [])
  _train_steps(args, config, args.wn2_mini_remat, record, variants, _transformer_details)


def gencast_1deg_step(args, mode, record):
  """GenCast's 1 deg denoiser (with --cpu a tiny one on the tiny config's grid): its
  diffusion train step (`_train_steps`) with the config's attention."""
  from wnscale import config as config_lib  # noqa: PLC0415

  if args.cpu:
    config = config_lib.load(os.path.join(REPO, "configs", "tiny.py"))
    config.model.update(processor="transformer", transformer_layers=2,
                        denoiser_noise_frequencies=4, denoiser_noise_hidden_size=8,
                        denoiser_noise_encoding_size=8)
    config.train.update(loss="diffusion", eval_every=0)
  else:
    config = config_lib.load(os.path.join(REPO, "configs", "gencast_1p0.py"))
  _train_steps(args, config, args.gencast_1deg_remat, record, [{}], _transformer_details)


def train_loop(args, mode, record):
  """`launch.train` for 40 steps on a synthetic store of a few days, per run in its own
  process: the logged intervals' steps/s and input wait and host shares (the first
  interval, with the warm-up, left out), the run's set-up and compile seconds; then the
  same run again in a new workdir: its set-up and compile seconds and whether its train
  step came from the persistent compilation cache (where the first run wrote it)."""
  from wnscale import config as config_lib  # noqa: PLC0415
  from wnscale.data.making import synthetic  # noqa: PLC0415
  from wnscale.planner import auto_remat  # noqa: PLC0415
  runs = ({"tiny, batch 2": ("configs/tiny.py", {"train.batch_size": 2})} if args.cpu
          else {"mid, batch 4": ("configs/mid_1p0.py", {"train.batch_size": 4}),
                "paper 1 deg, batch 1": ("configs/graphcast_1p0.py", {
                    "train.batch_size": 1, "train.rollout_schedule": "()",
                    "train.phase_learning_rates": "()", **{
                        f"model.{key}": value for key, value in
                        auto_remat.candidate_overrides(args.paper_1deg_remat).items()}})})
  steps, log_every = 40, 10
  for name, (config_file, overrides) in runs.items():
    config = config_lib.load(os.path.join(REPO, config_file))
    with tempfile.TemporaryDirectory(prefix="wnscale-loop-") as directory:
      store = synthetic.write_synthetic_store(
          os.path.join(directory, "store.zarr"), resolution=config.data.resolution,
          start="2020-01-01", end="2020-01-06", levels=config.data.pressure_levels,
          variables=config.data.variables + config.data.target_only_variables)
      flags = {"data.path": store, "data.train_start": "2020-01-01",
               "data.train_end": "2020-01-05", "data.eval_start": "2020-01-06",
               "data.eval_end": "2020-01-06", "train.steps": steps,
               "train.log_every": log_every, "train.eval_every": 0,
               "train.checkpoint_every": 10 * steps, **overrides}
      # The compiled programs of this run alone: the first start compiles, the second loads.
      cache = os.path.join(directory, "cache")

      def train(workdir: str) -> dict:
        start = time.perf_counter()
        log = subprocess.run(
            [sys.executable, "-m", "launch.train", f"--config={config_file}",
             f"--workdir={workdir}", f"--platform={args.platform}",
             *(f"--config.{key}={value}" for key, value in flags.items())],
            cwd=REPO, check=True, env={**os.environ, "WNSCALE_CACHE_DIR": cache},
            stderr=subprocess.PIPE, text=True).stderr
        sys.stderr.write(log)
        ended = re.search(r"set-up ([0-9.]+) s, compile ([0-9.]+) s", log)
        return dict(seconds=round(time.perf_counter() - start),
                    setup_seconds=float(ended[1]), compile_seconds=float(ended[2]),
                    compiled_from_cache="loaded from the persistent compilation cache" in log)

      first = train(os.path.join(directory, "run"))
      with open(os.path.join(directory, "run", "metrics.jsonl")) as f:
        intervals = [m for m in map(json.loads, f) if "input_wait_fraction" in m][1:]
      again = train(os.path.join(directory, "again"))
    median = lambda key: sorted(m[key] for m in intervals)[len(intervals) // 2]
    record(run=name, config=config_file, steps=steps, **first,
           steps_per_second=median("steps_per_sec"),
           input_wait_fraction=median("input_wait_fraction"),
           host_fraction=median("host_fraction"), intervals=intervals,
           second_start=again)


STEP_FUNCTIONS = {"devices": devices, "tests": tests, "parity_tests": tests, "setup": setup,
                  "mid_step": side_by_side,
                  "latent256_step": side_by_side, "paper_1deg": paper_step,
                  "paper_0p25": paper_step, "forecast": forecast, "train_loop": train_loop,
                  "wn2_mini_step": wn2_mini_step, "gencast_1deg_step": gencast_1deg_step,
                  "far_rows": far_rows, "encoder_blocks": encoder_blocks}


if __name__ == "__main__":
  sys.exit(main())
