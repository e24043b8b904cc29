"""The launchers as a newcomer meets them, each case through the real command.

A mistake in the input (config, flags, data, workdir, topology) ends with exit
status 2 and one line on stderr that names it and says what to do, with no
traceback; `--traceback` shows one; a bug keeps its traceback. Most cases stop
before anything is compiled, in a few seconds. The processes run as on a user's
CPU machine: one CPU device and none of the test session's JAX or libtpu settings,
so that they also show that libtpu prints nothing on a machine without a TPU.
"""

import importlib.util
import io
import json
import logging
import os
import re
import shutil
import struct
import subprocess
import sys

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import zarr
from tensorboardX.proto import event_pb2

from launch import cli, local_cluster
from wnscale import config as config_lib
from wnscale import progress
from wnscale import specs as specs_lib
from wnscale.data import run_data
from wnscale.data.making import synthetic
from wnscale.errors import ArgumentError, UserError
from wnscale.model import setup
from wnscale.planner.compile import batch_per_data_shard, best_setting
from wnscale.sharding import mesh as mesh_lib
from wnscale.train import checkpoint, optimizer as optimizer_lib, trainer
from wnscale.train import workdir as workdir_lib
from tiny_runs import read_metrics
from wnscale.train.state import initial_state

from problems import CONFIG_FILES
from tiny_runs import fast_compile_env

REPO = os.path.join(os.path.dirname(__file__), "..")
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
TINY = "--config=configs/tiny.py"
# A short run of the tiny config: the synthetic store spans January 2020 only.
SHORT = ["--config.data.train_start=2020-01-01", "--config.data.train_end=2020-01-20",
         "--config.data.eval_start=2020-01-21", "--config.data.eval_end=2020-01-31"]
# What libtpu prints when it looks for TPUs that are not there.
LIBTPU_NOISE = ("libtpu", "TPU_WORKER_HOSTNAMES", "TPU_ACCELERATOR_TYPE", "host bounds",
                "InitGoogle", "backend 'tpu'", "E0000")


def _env(**extra) -> dict:
  env = dict(os.environ)
  for name in ("JAX_PLATFORMS", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES",
               "ALLOW_MULTIPLE_LIBTPU_LOAD", "XLA_FLAGS", "WNSCALE_TRACEBACK"):
    env.pop(name, None)
  if os.environ.get("WNSCALE_TEST_PLATFORM", "cpu") != "cpu":
    env["JAX_PLATFORMS"] = "cpu"  # this test process holds the accelerator (conftest.py)
  env.update(extra)
  return env


def run(module, *args, timeout=180, env=None, prefix=()):
  return subprocess.run([*prefix, sys.executable, "-m", f"launch.{module}", *args], cwd=REPO,
                        env=env or _env(), capture_output=True, text=True, timeout=timeout)


def assert_no_libtpu_noise(stderr):
  noise = [line for line in stderr.splitlines()
           if any(n in line for n in LIBTPU_NOISE) and not line.startswith("error: ")]
  assert not noise, noise


def assert_user_error(result, *fragments) -> str:
  """Exit 2, no traceback, and the one `error:` line, last on stderr, holds `fragments`."""
  assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-4000:]
  assert "Traceback" not in result.stderr, result.stderr[-4000:]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(errors) == 1 and result.stderr.strip().splitlines()[-1] == errors[0], (
      result.stderr[-4000:])
  for fragment in fragments:
    assert fragment in errors[0], errors[0]
  assert_no_libtpu_noise(result.stderr)
  return errors[0]


def started_jax(result) -> bool:
  return "JAX process 0 of 1" in result.stderr


def train(workdir, *args, **kwargs):
  return run("train", TINY, f"--workdir={workdir}", *args, **kwargs)


# --- Flags and help ----------------------------------------------------------------------

@pytest.mark.parametrize("module", ["train", "compile", "graph_info"])
def test_help_exits_0_and_says_how_to_override_the_config(module):
  result = run(module, "--help")
  assert result.returncode == 0, result.stderr[-2000:]
  assert "--config.section.key=value" in result.stdout
  assert "wnscale/config.py" in result.stdout
  assert "--[no]traceback" in result.stdout and "--config:" in result.stdout


@pytest.mark.parametrize("args, missing", [
    (["--workdir=/nonexistent/run"], "--config is required"),
    ([TINY], "--workdir is required"),
])
def test_config_and_workdir_are_required(args, missing):
  assert_user_error(run("train", *args), missing)


def test_a_directory_that_is_no_run_is_named_by_each_launchers_flag(tmp_path):
  """The library names what is wrong with a run directory (`RunDirectory`); each launcher
  names its own flag for it."""
  missing = tmp_path / "no_run"
  example = os.path.join(REPO, "tests", "fixtures", "graphcast_5p625", "example.nc")
  for module, args in (("forecast", [f"--out={tmp_path / 'f.zarr'}", "--platform=cpu"]),
                       ("predict_example", [f"--example={example}",
                                            f"--out={tmp_path / 'p.nc'}"])):
    assert_user_error(run(module, f"--workdir={missing}", *args),
                      f"error: --workdir={missing}: not a run directory: it holds no "
                      "config.json (launch.train and launch.import_graphcast make one)")


def test_a_misspelled_config_key_suggests_the_nearest(tmp_path):
  result = train(tmp_path, "--config.train.step=3")
  assert_user_error(result, "Unknown config key 'train.step'", "did you mean train.steps?",
                    "wnscale/config.py")
  assert not started_jax(result)


def test_a_missing_config_file_is_said_before_jax_starts(tmp_path):
  result = run("train", "--config=configs/tiny_typo.py", f"--workdir={tmp_path}")
  assert_user_error(result, "error: --config=configs/tiny_typo.py: no such config file",
                    "tiny_stations, ", "(e.g. --config=tiny, or --config=configs/tiny.py)")
  assert not started_jax(result)


@pytest.mark.parametrize("config", [["--config=tiny"], ["--config=configs/tiny.py"],
                                    ["--config", "tiny"]], ids=" ".join)
def test_a_config_by_name_from_another_directory(tmp_path, config):
  """`--config=tiny` (or the repository's relative path) names the experiment of configs/
  wherever the command runs; its overrides apply (here one that stops it, before JAX)."""
  env = _env(PYTHONPATH=os.path.abspath(REPO))
  result = subprocess.run([sys.executable, "-m", "launch.train", *config,
                           "--config.train.steps=0", f"--workdir={tmp_path / 'run'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
  assert_user_error(result, "Invalid config: train.steps=0 must be >= 1")
  assert not started_jax(result)


@pytest.mark.parametrize("value", ["0", "-0.001"])
def test_learning_rate_must_be_positive(tmp_path, value):
  assert_user_error(train(tmp_path, f"--config.train.learning_rate={value}"),
                    "train.learning_rate=", "must be > 0")


def test_zero_steps(tmp_path):
  assert_user_error(train(tmp_path, "--config.train.steps=0"), "train.steps=0 must be >= 1")


def test_unknown_remat_policy(tmp_path):
  assert_user_error(train(tmp_path, "--config.model.remat_policy=save_everything"),
                    "Unknown remat policy 'save_everything'", "nothing_saveable")


def test_zero_edge_chunks(tmp_path):
  assert_user_error(train(tmp_path, "--config.model.edge_chunks=0"),
                    "model.edge_chunks=0 must be >= 1")


def test_micro_batches_that_do_not_split_the_batch(tmp_path):
  result = train(tmp_path, "--config.train.accumulation_steps=3")
  assert_user_error(result, "train.batch_size=2 does not split into "
                    "train.accumulation_steps=3 micro-batches")
  assert not started_jax(result)


def test_a_value_of_the_wrong_type(tmp_path):
  assert_user_error(train(tmp_path, "--config.train.steps=many"),
                    "--config.train.steps=many", "--help")


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_traceback_on_request(tmp_path, how):
  args = ["--config.train.steps=0"] + (["--traceback"] if how == "flag" else [])
  env = _env(WNSCALE_TRACEBACK="1") if how == "environment" else None
  result = train(tmp_path, *args, env=env)
  assert result.returncode == 2
  assert "Traceback" in result.stderr and "UserError" in result.stderr
  assert result.stderr.strip().splitlines()[-1].startswith("error: Invalid config")


def test_a_bug_keeps_its_traceback():
  result = subprocess.run(
      [sys.executable, "-c", "from launch import cli; cli.run(lambda argv: {}['missing'])"],
      cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
  assert result.returncode == 1
  assert "Traceback" in result.stderr and "KeyError: 'missing'" in result.stderr
  assert "error: " not in result.stderr


def test_a_library_message_is_shown_with_this_launchers_flags():
  """The arguments a library message names between backquotes become the flags of the
  launcher (here the flags `launch.local_cluster` defines, in this process), by name or
  through `cli._FLAG_NAMES`; a boolean set to True is the bare flag; one the launcher
  lacks stays as the library wrote it."""
  shown = cli._message(ArgumentError(
      "num_processes", 0, "must be at least 1; on CPU `jax_num_cpu_devices=4` gives 4 "
      "devices, `gloo_messages=True` shows Gloo's lines, `member=N` is another command's."))
  assert shown == ("--num_processes=0: must be at least 1; on CPU --num_cpu_devices=4 gives "
                   "4 devices, --gloo_messages shows Gloo's lines, `member=N` is another "
                   "command's.")
  assert cli._message(UserError("give another `timeout`.")) == "give another --timeout."
  assert cli._message(ArgumentError("member", None, "is required.")) == "member is required."


# --- Devices and directories (JAX starts; nothing compiles) ------------------------------

def test_batch_not_divisible_by_the_data_shards():
  """(The way out of `launch.train` of the mesh case below: checked on the library.)"""
  mesh = specs_lib.MeshSpec(data=4, graph=1, exchange="all_gather")
  with pytest.raises(UserError, match="train.batch_size=3 is not divisible by the 4 data "
                     "shards"):
    mesh_lib.check_batch_size(mesh_lib.make_mesh(mesh, jax.devices()[:4]), 3)


def test_a_mesh_larger_than_the_devices_suggests_num_cpu_devices(tmp_path):
  assert_user_error(train(tmp_path, "--config.mesh.graph=4"),
                    "1 devices cannot be split into groups of 4", "--num_cpu_devices=4")
  mesh = specs_lib.MeshSpec(data=1, graph=4, exchange="all_gather")
  with pytest.raises(UserError, match="`jax_num_cpu_devices=4` gives") as library:
    mesh_lib.mesh_shape(mesh, 1, "cpu")
  assert "--" not in str(library.value)


def test_a_workdir_that_is_a_file(tmp_path):
  path = tmp_path / "run"
  path.write_text("not a directory")
  result = train(path)
  assert_user_error(result, f"--workdir={path}: is a file, not a directory")
  assert not started_jax(result)
  with pytest.raises(ArgumentError, match=f"^workdir={re.escape(str(path))}: is a file") as library:
    workdir_lib.prepare(str(path))  # a library caller is told of its argument, not a flag
  assert "--" not in str(library.value)


def without_root() -> tuple[str, ...]:
  """A command prefix (for `run`) under which permission bits hold even for root."""
  if os.geteuid() != 0:
    return ()
  if not shutil.which("setpriv"):
    pytest.skip("running as root without setpriv: cannot make a directory read-only")
  dropped = "-dac_override,-dac_read_search"
  return ("setpriv", f"--inh-caps={dropped}", f"--bounding-set={dropped}")


def test_a_read_only_workdir(tmp_path):
  path = tmp_path / "run"
  path.mkdir(mode=0o555)
  assert_user_error(train(path, prefix=without_root()),
                    f"--workdir={path}: cannot write there (Permission denied)")


# --- Data (JAX starts; nothing compiles) -------------------------------------------------

@pytest.fixture(scope="module")
def stores(tmp_path_factory):
  """Small stores for the tiny config: good, one lacking a variable, one with a NaN."""
  root = tmp_path_factory.mktemp("stores")
  write = synthetic.write_synthetic_store
  good = write(str(root / "good.zarr"), start="2020-01-01", end="2020-01-20",
               levels=(500, 850, 1000))
  lacking = write(str(root / "lacking.zarr"), start="2020-01-01", end="2020-01-20",
                  levels=(500, 850, 1000),
                  variables=[name for name in config_lib.default_config().data.variables
                             if name != "specific_humidity"])
  nan = write(str(root / "nan.zarr"), start="2020-01-01", end="2020-01-20",
              levels=(500, 850, 1000))
  zarr.open_array(f"{nan}/temperature", mode="r+")[21, 1, 4, 5] = np.nan  # 850 hPa
  return {"good": good, "lacking": lacking, "nan": nan}


def on_store(path):
  return [f"--config.data.path={path}", "--config.data.train_start=2020-01-01",
          "--config.data.train_end=2020-01-15", "--config.data.eval_start=2020-01-16",
          "--config.data.eval_end=2020-01-20"]


def test_a_data_path_that_does_not_exist(tmp_path):
  missing = tmp_path / "era5.zarr"
  assert_user_error(train(tmp_path / "run", *on_store(missing)),
                    f"--config.data.path={missing}: store not found",
                    "python -m launch.make_dataset", "leave data.path empty")
  data = config_lib.default_config().data
  data.path = str(missing)
  with pytest.raises(ArgumentError,
                     match=f"^data.path={re.escape(str(missing))}: store not found") as library:
    run_data.resolve_store(data, seed=0)
  assert "--" not in str(library.value)


def train_here(workdir, path, **data):
  """`trainer.train_and_evaluate` in this process: the tiny config on one device, on the
  store at `path` (`on_store`'s ranges, then `data`), a batch over this process's devices.
  The mistakes below take the way out of `launch.train` that the NaN's launch takes (a
  launch costs seconds)."""
  config = config_lib.load(os.path.join(REPO, "configs", "tiny.py"))
  config.train.batch_size = len(jax.devices())
  config.data.update(dict(path=path, train_start="2020-01-01", train_end="2020-01-15",
                          eval_start="2020-01-16", eval_end="2020-01-20"), **data)
  return trainer.train_and_evaluate(config, str(workdir))


def test_a_store_with_nan_is_found_before_compiling(tmp_path, stores):
  result = train(tmp_path, *on_store(stores["nan"]))
  assert_user_error(result, "NaN in variable 'temperature@850' at time 2020-01-06T06:00",
                    "data.fill_nan=True")
  assert "Compiled" not in result.stderr


def test_a_store_missing_a_variable(tmp_path, stores):
  with pytest.raises(UserError, match=r"lacks variable\(s\) \['specific_humidity'\].*"
                     r"data\.variables"):
    train_here(tmp_path, stores["lacking"])


def test_a_pressure_level_not_in_the_store(tmp_path, stores):
  with pytest.raises(UserError, match=r"Level\(s\) \[700\] hPa not in store.*"
                     r"\[500, 850, 1000\].*data\.pressure_levels"):
    train_here(tmp_path, stores["good"], pressure_levels=(500, 700))


def test_a_time_range_reaching_outside_the_store_is_not_clipped(tmp_path, stores):
  with pytest.raises(UserError, match=r"Time range 2020-01-16 \.\. 2020-01-25 ends after the "
                     r"store \S+, which covers 2020-01-01 00:00:00 \.\. 2020-01-20 18:00:00 every "
                     r"6 h.*set data\.eval_start/eval_end inside it"):
    train_here(tmp_path / "eval", stores["good"], eval_end="2020-01-25")
  # The training range is checked first, by its statistics (the same way out).
  training = config_lib.default_config()
  training.data.update(path=stores["good"], train_start="2019-12-25", train_end="2020-01-15")
  with pytest.raises(UserError, match="Time range 2019-12-25 .. 2020-01-15 starts before "
                     "the store .* set data.train_start/train_end inside it"):
    run_data.resolve_stats(specs_lib.from_config(training).data)


def _checkpoint_of_another_model(workdir):
  """A whole checkpoint of the tiny model at latent 16 (the runs below build latent 32)."""
  config = config_lib.load(os.path.join(REPO, "configs", "tiny.py"))
  config.model.latent_size = 16
  _, shapes = setup.init_model_shapes(specs_lib.from_config(config))
  params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  state = initial_state(params, optimizer_lib.make_optimizer(
      specs_lib.from_config(config).train))
  saver = checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"), max_to_keep=3)
  saver.save(4, state, iter(grain.MapDataset.range(4).to_iter_dataset()),
             {"step": 4, "data_groups": 1, "data_offset": 0})
  saver.close()
  return os.path.join(workdir, "checkpoints", "4")


def test_a_checkpoint_of_another_model(tmp_path, stores):
  step_dir = _checkpoint_of_another_model(tmp_path)
  with pytest.raises(UserError, match=f"^The checkpoint {re.escape(step_dir)} was written by "
                     "another model.*params.*new `workdir`.*left as it is") as error:
    train_here(tmp_path, stores["good"])
  assert len(str(error.value)) < 1200  # a paragraph, not a dump of every array
  assert os.listdir(os.path.join(tmp_path, "checkpoints")) == ["4"]


# --- Topologies ---------------------------------------------------------------------------

def test_an_unknown_topology_names_the_valid_ones():
  result = run("compile", TINY, "--topology=v5e-8")
  assert_user_error(result, "Unknown topology 'v5e-8'", "v5e:2x2", "cpu:N")


@pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu not installed: pip install -e '.[tpu]'")
def test_a_topology_libtpu_refuses_does_not_blame_a_missing_libtpu():
  error = assert_user_error(run("compile", TINY, "--topology=v5e:3x3"),
                            "libtpu has no TPU slice 'v5e:3x3'", "v5e:4x4")
  assert "pip install" not in error


# --- launch.compile -----------------------------------------------------------------------

@pytest.mark.parametrize("path", CONFIG_FILES, ids=os.path.basename)
def test_compile_defaults_split_every_config_over_cpu_8(path):
  """The default --topology=cpu:8 gives every config whole examples on every data shard."""
  config = config_lib.load(path)
  assert 8 % config.mesh.graph == 0
  shards = 8 // config.mesh.graph
  per_shard = batch_per_data_shard(config.train.batch_size, shards)
  assert per_shard * shards >= config.train.batch_size > (per_shard - 1) * shards


def _report(candidate, graph, batch, flops, recompute, peak, fits=True):
  return {"candidate": candidate, "mesh": {"graph": graph, "data": 8 // graph},
          "batch_size": batch, "flops": flops, "recompute_flops": recompute,
          "peak_bytes": peak * 2**30, "device_memory_bytes": 16 * 2**30, "fits": fits}


def test_the_sweep_ends_with_the_best_setting_and_why():
  reports = [_report("none", 1, 8, 100.0, 0.0, 20.0, fits=False),
             _report("paper", 1, 8, 130.0, 30.0, 9.0),
             _report("none", 4, 2, 25.0, 0.0, 12.0),
             _report("none", 8, 1, 12.5, 0.0, 7.0),
             _report("processor_every_3", 8, 1, 14.0, 1.5, 5.0)]
  best = best_setting(reports)
  # 12.5 FLOPs per example at 4 and at 8 shards: the fewer shards win.
  assert best.startswith("Best: 'none' with 4 graph shard(s)"), best
  assert "12.00 of 16.00 GiB" in best and "of the 4 settings that fit" in best
  assert best_setting(reports[:1]).startswith("Nothing fits: the smallest peak is 20.00 GiB")


@pytest.mark.slow
def test_compile_with_its_defaults_rounds_the_batch_and_explains_its_columns():
  env = _env(**fast_compile_env())
  result = run("compile", TINY, env=env, timeout=600)  # cpu:8: 8 data shards for a batch of 2
  assert result.returncode == 0, result.stderr[-3000:]
  assert ("train.batch_size=2 does not split over 8 data shards: compiling 1 example(s) per "
          "data shard (batch 8)") in result.stderr
  # The compile is said before it starts (what, and how long such a compile takes) and
  # after it ends (how long it took): a 0.25 deg compile is silent for minutes otherwise.
  what = "Compiling the train step for cpu:8 (1 graph shard(s), batch 8, remat "
  assert re.search(re.escape(what) + r"[\w_]+\) \(seconds to a minute\)\.\.\.", result.stderr)
  assert re.search(re.escape(what) + r"[\w_]+\): done in \d+:\d\d:\d\d\.", result.stderr)
  header, row = result.stdout.splitlines()[1:3]
  assert header.split()[:3] == ["candidate", "graph", "batch"] and row.split()[:2] == ["1", "8"]
  legend = result.stdout.split("Columns:\n")[1]
  assert all(f"  {column} " in legend for column in header.split()[:6])
  assert_no_libtpu_noise(result.stderr)


def test_a_long_compile_says_how_long_it_has_taken_while_it_lasts(caplog):
  """A real XLA compile (about a second) under `progress.long_step`, with a line every
  0.1 s instead of every minute: the lines come while it compiles (the compiler lets go of
  the GIL), then the one saying it is done."""
  def chain(x):
    for i in range(200):
      x = jnp.sin(x @ x.T + i)
    return x
  lowered = jax.jit(chain).lower(jax.ShapeDtypeStruct((32, 32), jnp.float32))
  with caplog.at_level(logging.INFO), progress.long_step("Compiling chain", "a second",
                                                         every=0.1):
    lowered.compile()
  lines = [record.getMessage() for record in caplog.records]
  assert lines[0] == "Compiling chain (a second)..."
  assert re.fullmatch(r"Compiling chain: done in \d+:\d\d:\d\d\.", lines[-1])
  assert all(re.fullmatch(r"Compiling chain: \d+:\d\d:\d\d so far\.\.\.", line)
             for line in lines[1:-1]) and len(lines) >= 3, lines


# --- A run that says what it does ---------------------------------------------------------

def _tensorboard_tags(workdir) -> set[str]:
  """Scalar tags of the TensorBoard event files (TFRecord framing, read by hand)."""
  tags = set()
  directory = os.path.join(workdir, "tensorboard")
  for name in os.listdir(directory):
    with open(os.path.join(directory, name), "rb") as f:
      data = f.read()
    offset = 0
    while offset < len(data):
      (length,) = struct.unpack("<Q", data[offset:offset + 8])
      event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
      tags.update(value.tag for value in event.summary.value if value.HasField("simple_value"))
      offset += 12 + length + 4
  return tags


@pytest.mark.slow
def test_a_short_run_clips_its_warm_up_and_says_what_it_does(tmp_path):
  env = _env(**fast_compile_env())
  args = [*SHORT, "--config.train.steps=3", "--config.train.eval_every=3",
          "--config.train.eval_batches=1"]
  result = train(tmp_path, *args, env=env, timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  log = result.stderr
  store = json.load(open(tmp_path / "config.json"))["data"]["path"]  # the synthetic store
  assert store.startswith(os.environ["WNSCALE_CACHE_DIR"]) and store.endswith(".zarr")
  warnings = [line for line in log.splitlines() if "warm-up clipped" in line]
  assert len(warnings) == 1 and "train.warmup_steps=20" in warnings[0], warnings
  assert "Built graphs in" in log or "Graphs from the cache" in log
  for phase in ("Store and statistics ready in", "Partitioned the graphs",
                "Initialized the model in", "Starting fresh: no checkpoint in",
                "Compiled the train step in", "Checkpoint of step 3: writing in the background",
                "the loop was blocked", "Run ended at step 3 of 3", "Final loss",
                "Final evaluation (step 3, the first 1 batch(es)",
                f"Data: the store {store} (the truth for launch.evaluate",
                f"Outputs: config {tmp_path}"):
    assert phase in log, phase
  assert_no_libtpu_noise(log)
  assert "Traceback" not in log and "error" not in log.lower()

  # metrics.jsonl keys are the TensorBoard tags.
  keys = {key for entry in read_metrics(str(tmp_path)) for key in entry if key != "step"}
  assert "eval/rmse/temperature_500" in keys and "loss" in keys
  assert keys == _tensorboard_tags(tmp_path)
  assert json.load(open(tmp_path / "config.json"))["train"]["steps"] == 3

  again = train(tmp_path, *args, "--config.train.steps=4", env=env, timeout=600)
  assert again.returncode == 0, again.stderr[-4000:]
  assert f"Resumed from step 3, checkpoint {tmp_path / 'checkpoints' / '3'}" in again.stderr
  assert "Run ended at step 4 of 4 (1 trained now)" in again.stderr


def test_local_cluster_prefixes_each_process_and_passes_on_exit_status_2(tmp_path):
  result = run("local_cluster", "--num_processes=2", "--num_cpu_devices=2", "--timeout=300",
               "--", TINY, "--config.train.learning_rate=0", f"--workdir={tmp_path}")
  assert result.returncode == 2, result.stdout[-3000:] + result.stderr[-3000:]
  lines = result.stderr.strip().splitlines()
  assert lines and all(line.startswith(("[p0] ", "[p1] ")) for line in lines), lines
  # The process that finds it first says it (the other may be stopped before it does).
  assert any(re.match(r"\[p[01]\] error: Invalid config: train\.learning_rate=0", line)
             for line in lines), lines


def test_local_cluster_leaves_out_gloo_messages_unless_asked():
  output = ("[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer "
            "ranks is : 1\nI1130 train.py:58] step 2/4 | loss 15.6\n")
  for shown, wanted in ((False, "[p1] I1130 train.py:58] step 2/4 | loss 15.6\n"),
                        (True, "[p1] [Gloo] Rank 1 is connected to 1 peer ranks. Expected "
                               "number of connected peer ranks is : 1\n[p1] I1130 "
                               "train.py:58] step 2/4 | loss 15.6\n")):
    out = io.StringIO()
    local_cluster._forward(1, io.StringIO(output), out, gloo_messages=shown)
    assert out.getvalue() == wanted
