"""Forecast speed and memory at the mid config: 4 lead times against 40, same command;
then the short lead on 1 device, on 4 (the graph split 4 ways) and on 2 processes x 2.

  python bench/forecast.py [--inits=1 --long=10d --short=1d] [--no-layouts]

Sets up a run directory for `configs/mid_1p0.py` (1 deg, mesh levels 0..5,
latent 128, 8 steps) on a small synthetic 1 deg store of its variables, with a
checkpoint of freshly initialized parameters (speed and memory do not depend
on training), then runs `python -m launch.forecast` once per lead, each in its
own process. Printed per lead: model steps per second (after compiling), the
compiled step's per-device memory (arguments, outputs, temporaries), the peak
of live device arrays during the rollout, and the process's peak RSS (on CPU
the devices are the host). The rollout streams lead times to the host, so
device memory should not grow with the lead: target ratio 40 / 4 leads = 1.00.

The layout rows run the short lead with the graph split over 4 fake CPU devices, in one
process and in 2 processes of 2 devices (`launch.local_cluster --module=launch.forecast`,
gloo on loopback): per-device step memory should fall about 4x; the speed on CPU is
that of the same cores shared (a TPU's 4 chips each run their own quarter). The live
device arrays are those of the process's devices (process 0's of 2); no RSS there.
`write wait s` is the time process 0 waited for its writes to the store beyond the
rollout they overlap (on several processes each writes a share of the chunks).
"""

import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402

import grain  # noqa: E402

from wnscale import config as config_lib  # noqa: E402
from wnscale import host_memory  # noqa: E402
from wnscale import specs as specs_lib
from wnscale.data import run_data  # noqa: E402
from wnscale.data.making import synthetic  # noqa: E402
from wnscale.model import setup  # noqa: E402
from wnscale.train import checkpoint, optimizer, state as state_lib  # noqa: E402

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MIB = 2**20


def make_run(directory: str) -> str:
  """A run directory of the mid config with a step-0 checkpoint; returns it."""
  config = config_lib.load(os.path.join(REPO, "configs", "mid_1p0.py"))
  store = synthetic.write_synthetic_store(
      os.path.join(directory, "mid.zarr"), resolution=1.0, start="2020-01-01",
      end="2020-01-03", levels=config.data.pressure_levels, variables=config.data.variables)
  # The store's three days: a range reaching outside it would be an error.
  config.data.update(path=store, train_start="2020-01-01", train_end="2020-01-02",
                     eval_start="2020-01-03", eval_end="2020-01-03")
  run_data.resolve_stats(specs_lib.from_config(config).data)  # cached now: not in the runs
  workdir = os.path.join(directory, "run")
  os.makedirs(workdir)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2))
  specs = specs_lib.from_config(config)
  _, params = setup.init_model(specs)
  state = state_lib.initial_state(params, optimizer.make_optimizer(specs.train))
  saver = checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=1)
  saver.save(0, state, iter(grain.MapDataset.range(1).to_iter_dataset()), {"step": 0})
  saver.close()
  return workdir


# Runs the forecast launcher in this process's child and reports the child's own peak RSS.
_MEASURED = """
import json, resource, runpy, sys
sys.argv = ["launch.forecast"] + sys.argv[1:]
try:
  runpy.run_module("launch.forecast", run_name="__main__", alter_sys=True)
except SystemExit:
  pass
print(json.dumps({"max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def forecast(workdir: str, out: str, lead: str, inits: int, processes: int = 1,
             devices: int = 1, platform: str = "cpu") -> dict:
  """Runs the forecast command on `processes` x `devices` (the graph split over them all);
  its JSON summary (process 0's) plus, in one process, the process's peak RSS. `platform`:
  JAX's, for one process (an accelerator's devices are its own, not fake CPU ones)."""
  times = ",".join(f"2020-01-0{1 + i // 4}T{6 * (i % 4 + 1) % 24:02d}" for i in range(inits))
  flags = [f"--workdir={workdir}", f"--out={out}", f"--init_times={times}", f"--lead={lead}",
           "--mesh.data=1", f"--mesh.graph={processes * devices}"]
  if processes == 1:
    devices_flags = [f"--num_cpu_devices={devices}"] if platform == "cpu" else []
    command = [sys.executable, "-c", _MEASURED, f"--platform={platform}", *devices_flags,
               *flags]
  else:
    command = [sys.executable, "-m", "launch.local_cluster", f"--num_processes={processes}",
               # local_cluster's device count is of all its processes together.
               f"--num_cpu_devices={processes * devices}", "--module=launch.forecast",
               "--timeout=3000",
               "--", *flags]
  result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
  lines = [line.removeprefix("[p0] ") for line in result.stdout.strip().splitlines()
           if processes == 1 or line.startswith("[p0] ")]
  summaries = [json.loads(line) for line in lines if line.startswith("{")]
  if result.returncode or not summaries:
    raise RuntimeError(result.stderr[-3000:])
  return {k: v for summary in summaries for k, v in summary.items()}


def _memory_row(label: str, row: dict) -> str:
  memory = row["step_memory"]
  rss = f"{row['max_rss_bytes'] / MIB:>12.1f}" if "max_rss_bytes" in row else f"{'-':>12}"
  return (f"{label:>34} {row['model_steps']:>6} {row['steps_per_sec']:>8.3f} "
          f"{memory['argument_bytes'] / MIB:>14.1f} {memory['temp_bytes'] / MIB:>14.1f} "
          f"{row['peak_live_device_bytes'] / MIB:>16.1f} {rss} "
          f"{row.get('write_wait_seconds', float('nan')):>12.3f}")


LAYOUTS = {"1 process x 1 device": (1, 1), "1 process x 4 devices": (1, 4),
           "2 processes x 2 devices": (2, 2)}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--inits", type=int, default=1, help="initial times per forecast")
  parser.add_argument("--short", default="1d", help="the short lead (4 steps)")
  parser.add_argument("--long", default="10d", help="the long lead (40 steps)")
  parser.add_argument("--layouts", action=argparse.BooleanOptionalAction, default=True,
                      help="also the short lead on 4 devices and on 2 processes x 2")
  args = parser.parse_args()
  # Every forecast process with huge pages for its host buffers, as a launcher gives itself
  # (the 1-process rows run the launcher through runpy, which does not).
  host_memory.set_for_new_processes()
  header = (f"{'':>34} {'steps':>6} {'steps/s':>8} {'step args MiB':>14} "
            f"{'step temp MiB':>14} {'live device MiB':>16} {'max RSS MiB':>12} {'write wait s':>12}")
  with tempfile.TemporaryDirectory() as directory:
    workdir = make_run(directory)
    rows = {}
    for lead in (args.short, args.long):
      rows[lead] = forecast(workdir, os.path.join(directory, f"{lead}.zarr"), lead, args.inits)
    layouts = {}
    for label, (processes, devices) in (LAYOUTS.items() if args.layouts else ()):
      layouts[label] = rows[args.short] if (processes, devices) == (1, 1) else forecast(
          workdir, os.path.join(directory, f"{processes}x{devices}.zarr"), args.short,
          args.inits, processes, devices)
  print(f"mid config (configs/mid_1p0.py), {args.inits} initial time(s), 1 CPU device")
  print(header)
  for lead, row in rows.items():
    print(_memory_row(f"lead {lead}", row))
  short, long = rows[args.short], rows[args.long]
  print(f"ratio {args.long} / {args.short}: live device memory "
        f"{long['peak_live_device_bytes'] / short['peak_live_device_bytes']:.3f}, max RSS "
        f"{long['max_rss_bytes'] / short['max_rss_bytes']:.3f}, steps/s "
        f"{long['steps_per_sec'] / short['steps_per_sec']:.3f}")
  if not layouts:
    return
  print(f"lead {args.short}, the graph split over every device (per-device memory):")
  print(header)
  for label, row in layouts.items():
    print(_memory_row(label, row))
  one, four, two_by_two = (layouts[label] for label in LAYOUTS)
  temp = lambda row: row["step_memory"]["temp_bytes"]  # noqa: E731
  speed = lambda row: row["steps_per_sec"]  # noqa: E731
  print(f"ratio 4 devices / 1: step temp memory {temp(four) / temp(one):.3f}, steps/s "
        f"{speed(four) / speed(one):.3f}; 2 processes x 2 / 1 x 4: step temp memory "
        f"{temp(two_by_two) / temp(four):.3f}, steps/s {speed(two_by_two) / speed(four):.3f}")


if __name__ == "__main__":
  main()
