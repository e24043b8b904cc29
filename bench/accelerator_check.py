r"""A prepared accelerator check: a few minutes on a GPU or TPU, one command, every figure kept.

  bash bench/accelerator_check.sh --prepare [--python=3.12]   # here: wheels and the reference
  bash bench/accelerator_check.sh OUT                         # on the accelerator's machine
  bash bench/accelerator_check.sh OUT --cpu                   # the same steps, tiny, on CPU

(`accelerator_check.sh` installs the carried wheels, then runs this file.) The steps, each
in a process of its own, so that one that fails (or aborts on the device) leaves the others
their figures, and only one process at a time holds the accelerator:

  devices     JAX's version and backend, the devices and their memory
  tests       the remat, one-device sharding and parity tests (GraphCast's, WeatherNext 2's)
              on the accelerator (`WNSCALE_TEST_PLATFORM`, tests/conftest.py)
  mid_step    `bench/reference_speed.py`: wnscale's train step against the reference
              GraphCast's on the mid problem, where the reference is importable
  paper_step  GraphCast's paper model (0.25 deg, `--paper_resolution`), one example: its
              train step plain and with the planner's remat choice (`remat_policy='auto'`
              for this device): compile time, step time, compiled and measured peak memory
  forecast    a 10-day forecast at 1 deg (`bench/forecast.py`'s mid run,
              `python -m launch.forecast`): lead steps per second
  wn2_mini_step  WeatherNext 2's 1 deg Mini (`configs/weathernext2_1p0.py`), one example:
              its train step with `model.transformer_attention='auto'` (on a TPU the splash
              kernel) and, on a TPU, with edges (in blocks of 2^17 edges); with --cpu a
              tiny transformer with 'auto' (edges there) and splash (interpreted): as
              paper_step, the planner's choice, then the step plain and with it; and the
              kernel's tiles with an edge

`--cpu` runs every step on the CPU with the tiny problem (the suite runs it:
tests/test_accelerator_check.py), so the script cannot rot between accelerators.
Each figure is one JSON line in OUT/results.jsonl (`{"step": ..., ...}`; a failed step
has an `error`); each step's output goes to OUT/log.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
# pytest selections: on an accelerator, the remat tests, the one-device sharding case and
# the parity tests; with --cpu, one remat case and the one-device sharding case (the suite
# runs the rest).
ONE_DEVICE_SHARDING = "tests/test_sharding.py::test_sharded_matches_single_device[1x1-all_gather]"
TESTS = {
    "accelerator": ["tests/test_remat.py", ONE_DEVICE_SHARDING,
                    "tests/test_graphcast_import.py::test_predictions_match_the_reference",
                    "tests/test_weathernext2.py::test_lead_one_equals_weathernext2_at_every_node"
                    "_with_one_triangle", "tests/test_splash_attention.py"],
    "cpu": ["tests/test_remat.py::test_remat_matches_plain_model[processor]",
            ONE_DEVICE_SHARDING],
}
# bench/reference_speed.py's problem: the mid problem, or with --cpu a tiny one.
MID_FLAGS = {"accelerator": [], "cpu": ["--resolution=5.625", "--mesh_levels=2", "--latent=16",
                                        "--steps=2", "--repeats=1"]}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("out", help="the folder for results.jsonl and log.txt")
  parser.add_argument("--cpu", action="store_true", help="the tiny problem on the CPU")
  parser.add_argument("--only", default=",".join(STEP_FUNCTIONS), help="comma-separated steps")
  parser.add_argument("--paper_resolution", type=float, default=0.25,
                      help="paper_step's grid (degrees); with --cpu the tiny config's")
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
             f"--platform={args.platform}", f"--paper_resolution={args.paper_resolution}",
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


def _run_step_here(args):
  """Runs `args.step` in this process; its figures (or its error) go to results.jsonl."""
  mode = "cpu" if args.cpu else "accelerator"
  # A CPU run keeps to the CPU (with libtpu installed JAX would look for a TPU first); on
  # the accelerator's machine JAX picks the accelerator.
  if args.cpu:
    os.environ["JAX_PLATFORMS"] = "cpu"
  record = lambda **figures: _append(args.out, {"step": args.step, "mode": mode, **figures})
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
  # Test by test into OUT/pytest.txt, which keeps what ran if the step runs out of time.
  report = os.path.join(args.out, "pytest.txt")
  with open(report, "w") as output:
    code = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-o", "addopts=-ra",
         *TESTS[mode]], cwd=REPO, stdout=output, stderr=subprocess.STDOUT,
        env=dict(os.environ, WNSCALE_TEST_PLATFORM=args.platform)).returncode
  with open(report) as output:
    summary = output.read().strip().splitlines()[-1]
  counts = {kind: int(count) for count, kind in
            re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", summary)}
  record(platform=args.platform, exit_status=code, seconds=round(time.perf_counter() - start, 1),
         **counts)
  if code:
    sys.exit(1)


def mid_step(args, mode, record):
  result = subprocess.run(
      [sys.executable, os.path.join(REPO, "bench", "reference_speed.py"), *MID_FLAGS[mode]],
      cwd=REPO, capture_output=True, text=True,
      env=dict(os.environ, JAX_PLATFORMS=args.platform))
  print(result.stdout + result.stderr[-5000:])
  if "reference GraphCast is not importable" in result.stderr:
    record(reference="not importable", note=result.stderr.strip().splitlines()[-1])
    return
  if result.returncode:
    raise RuntimeError(result.stderr.strip().splitlines()[-1])
  rows = {}
  for line in result.stdout.splitlines():  # "name  temp GiB  median s  all s ...  compile s"
    fields = line.split()
    if fields and fields[0] in ("reference", "wnscale") and fields[1][0].isdigit():
      rows[fields[0]] = {"temp_gib": float(fields[1]), "step_seconds": float(fields[2]),
                         "compile_seconds": float(fields[-1])}
  ratio = re.search(r"time ([\d.]+), memory ([\d.]+)", result.stdout)
  record(**rows, time_ratio=float(ratio.group(1)), memory_ratio=float(ratio.group(2)))


def paper_step(args, mode, record):
  """GraphCast's paper model, one example on one device: plain, then the planner's choice."""
  from wnscale import config as config_lib  # noqa: PLC0415

  if args.cpu:
    config = config_lib.load(os.path.join(REPO, "configs", "tiny.py"))
  else:
    config = config_lib.graphcast_paper_config(args.paper_resolution)
  _planned_steps(args, config, record)


def _planned_steps(args, config, record, details=lambda step: {}, **labels):
  """`config`'s train step, one example on one device (the 1-step phase): the planner's
  remat choice for the device's memory (`remat_policy='auto'`), then the step plain and
  with that choice: compile and step time, compiled and measured peak memory, TFLOP/s by
  the planner's count. Every record holds `labels`, a step's also `details(TrainStep)`."""
  import jax  # noqa: PLC0415
  sys.path.insert(0, os.path.join(REPO, "bench"))
  import mid_problem  # noqa: PLC0415: also puts tests/ on the path (problems.py)
  from wnscale import config as config_lib  # noqa: PLC0415
  from wnscale.graphs import points as points_lib  # noqa: PLC0415
  from wnscale.planner import auto_remat, topology, xla_stats  # noqa: PLC0415
  from wnscale.planner.compile import Problem  # noqa: PLC0415
  from wnscale.train import step as step_lib  # noqa: PLC0415

  config = config.copy_and_resolve_references()
  # One example, the 1-step phase (the schedule's longer ones size auto remat otherwise).
  config.train.update(batch_size=1, rollout_schedule=(), phase_learning_rates=())
  config.mesh.update(data=1, graph=1)
  config = config_lib.validate(config)
  # The planner's compile of its choice, then the step's own (with arrays): one compile
  # where the two programs are the same.
  jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp(prefix="wnscale-check-"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  device = jax.devices()[0]
  memory = (device.memory_stats() or {}).get("bytes_limit") or topology.host_memory_bytes()
  target = topology.Target(f"{device.platform}:1", (device,), memory)
  points = points_lib.standard(config.data.grid, config.data.resolution)
  start = time.perf_counter()
  problem = Problem(config, target, step_lib.lower_train_step)  # its compiles are kept
  choice = auto_remat.choose_remat(config, target, step_lib.lower_train_step, problem=problem)
  record(**labels, setting="planner's choice", choice=choice["name"], reason=choice["reason"],
         planning_seconds=round(time.perf_counter() - start, 1))
  for setting, name in (("plain", "none"), ("planner's choice", choice["name"])):
    if setting == "planner's choice" and name == "none":
      break  # the same step as the plain one
    step_config = config.copy_and_resolve_references()
    step_config.model.update(auto_remat.candidate_overrides(name))
    step_config = config_lib.validate(step_config)
    try:
      step = mid_problem.TrainStep(step_config, points)
    except jax.errors.JaxRuntimeError as error:
      if "RESOURCE_EXHAUSTED" not in str(error):
        raise
      record(**labels, setting=setting, remat=name, fits=False,
             error=str(error).splitlines()[0][:500])
      continue
    step.run(timed=False)
    for _ in range(args.timed_steps):
      step.run()
    stats = xla_stats.compiled_stats(step.step)
    measured = device.memory_stats() or {}
    # The planner's count (recomputation included; XLA's counts a scanned layer once).
    flops = problem.compile(auto_remat.candidate_overrides(name))["flops"]
    seconds = statistics.median(step.times)
    record(**labels, setting=setting, remat=name, fits=True,
           resolution=config.data.resolution, dtype=config.model.dtype,
           compile_seconds=round(step.compile_seconds, 1), step_seconds=seconds,
           compiled_peak_gib=stats["peak_bytes"] / 2**30,
           measured_peak_gib=(measured["peak_bytes_in_use"] / 2**30
                              if "peak_bytes_in_use" in measured else None),
           tflops_per_second=flops / seconds / 1e12, **details(step))
    del step  # its device arrays, before the next setting's are made


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


def wn2_mini_step(args, mode, record):
  """WeatherNext 2's Mini (a tiny transformer with --cpu), with each attention: the steps of
  `_planned_steps`, and the graphs' figures and the splash kernel's tiles with an edge."""
  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415
  from wnscale import config as config_lib  # noqa: PLC0415
  from wnscale import specs as specs_lib  # noqa: PLC0415
  from wnscale.model import mesh_transformer  # noqa: PLC0415

  if args.cpu:
    config = config_lib.load(os.path.join(REPO, "configs", "tiny.py"))
    config.model.processor = "transformer"
  else:
    config = config_lib.load(os.path.join(REPO, "configs", "weathernext2_1p0.py"))
  platform = jax.devices()[0].platform

  def details(step):
    mask = step.constants.graphs.masks.get("mesh_neighbours")
    return dict(mesh_nodes=step.counts["mesh_nodes"],
                attention_edges=step.counts["mesh_neighbour_edges"],
                tiles_with_an_edge=None if mask is None else float(np.mean(
                    np.asarray(mask.backward.block_mask) > 0)))

  others = ("edges",) if platform == "tpu" else ("splash",) if args.cpu else ()
  for attention in ("auto",) + others:
    attention_config = config.copy_and_resolve_references()
    attention_config.model.transformer_attention = attention
    if attention == "edges":  # the gathers of 8.2M edges x 512 in blocks (0.25 deg's size)
      attention_config.model.transformer_edges_per_block = 2**17
    runs = mesh_transformer.attention_kind(
        specs_lib.from_config(config_lib.validate(attention_config)).model, platform, 1)
    _planned_steps(args, attention_config, record, details, attention=attention, runs=runs)


STEP_FUNCTIONS = {"devices": devices, "tests": tests, "mid_step": mid_step,
                  "paper_step": paper_step, "forecast": forecast, "wn2_mini_step": wn2_mini_step}


if __name__ == "__main__":
  sys.exit(main())
