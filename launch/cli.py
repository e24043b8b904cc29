"""What every launcher shares: a quiet libtpu, the common flags, and user errors as one line.

A launcher imports this module before anything starts JAX's backend, defines
its flags, and ends with `cli.run(main, required=...)`:

  from launch import cli
  _CONFIG = cli.define_config()
  ...
  if __name__ == "__main__":
    cli.run(main, required=("config", "workdir"))

Before `main` runs (and before JAX's backend starts) the flags are checked:
required flags, that the config file exists, that every `--config.<key>`
override names a key (else the nearest is suggested), the config's values
(`wnscale.config.validate`) and that the workdir can be written.

A `wnscale.errors.UserError` (a mistake in the config, the flags, the data, the
workdir or the topology), raised while parsing the flags or by the library,
prints `error: <what and what to do>` as one line on stderr and exits with
status 2; `--traceback` (or WNSCALE_TRACEBACK=1) prints its traceback as well.
Any other exception is a bug and keeps its traceback. `--help` exits 0.
A full disk (`wnscale.errors.NoSpaceError`) is one `error:` line too, exit
status 1. A Ctrl-C that the launcher's own loop does not catch (e.g. during
its set-up) ends it with `Interrupted (Ctrl-C).`, exit status 130.

A launcher that runs in a workdir (`lock_workdir`) takes the workdir's lock
(`wnscale.train.workdir.lock`) as soon as its flags are read, before JAX
starts and before anything is written there, and holds it until it exits.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import sys
import traceback

from absl import app, flags
from ml_collections import config_flags

from wnscale import config as config_lib
from wnscale.errors import NoSpaceError, UserError
from wnscale.train import workdir as workdir_lib


def _quiet_libtpu():
  """Without a TPU on this machine, keeps an installed libtpu from printing errors.

  libtpu reads these when JAX's backend starts (not when jax is imported), and
  without them prints start-up errors while looking for TPU hosts, then falls
  back to the CPU. ALLOW_MULTIPLE_LIBTPU_LOAD lets several such processes run.
  """
  try:  # JAX's own test for TPU chips on the PCI bus (a private module; jax is pinned)
    from jax._src import hardware_utils
    if hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0:
      return
  except (ImportError, AttributeError):  # cannot tell: leave a possible TPU alone
    return
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  # Nor JAX's "Unable to initialize backend 'tpu'" note, when there is none to find.
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)


# At import: a launcher imports this module before its main starts JAX's backend.
_quiet_libtpu()

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_HELP_FLAGS = ("--help", "-help", "-h", "-?", "--helpshort", "--helpfull")

_TRACEBACK = flags.DEFINE_bool(
    "traceback", False,
    "On a mistake in the input (exit status 2), print the Python traceback too; "
    "the environment variable WNSCALE_TRACEBACK=1 does the same.")

CONFIG_HELP = (
    "Experiment config file, e.g. configs/tiny.py. Every config key can be overridden as "
    "--config.section.key=value (e.g. --config.train.steps=500 "
    "--config.data.path=/data/era5.zarr); wnscale/config.py lists every key with its "
    "default and meaning.")


def define_config():
  """The `--config` flag (required: pass `"config"` to `run`)."""
  return config_flags.DEFINE_config_file("config", None, CONFIG_HELP)


def define_workdir():
  """The `--workdir` flag (required: pass `"workdir"` to `run`)."""
  return flags.DEFINE_string(
      "workdir", None,
      "Run directory, one per experiment: config.json, metrics.jsonl, tensorboard/, "
      "checkpoints/. Re-running with the same directory resumes.")


def run(main, required: tuple[str, ...] = (), writes_workdir: bool = True,
        lock_workdir=None):
  """`absl.app.run(main)`, with user errors as one line and exit status 2 (module docstring).

  Args:
    main: `main(argv)` of the launcher.
    required: names of flags that must be given (no default).
    writes_workdir: the launcher writes into `--workdir` (made and checked first);
      False for one that only reads a run directory (e.g. `launch.forecast`).
    lock_workdir: `() -> bool`, called once the flags are parsed: whether this
      process holds `--workdir`'s lock while it runs (e.g. process 0 of several);
      None: no lock.
  """
  # --help lists the flags of the launcher's own module: these are the launcher's too.
  for flag in flags.FLAGS.get_flags_for_module(sys.modules[__name__]):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  held = []  # the workdir whose lock this process took
  try:
    app.run(main, flags_parser=lambda argv: _parse_flags(argv, required, writes_workdir,
                                                         lock_workdir, held))
  except KeyboardInterrupt as error:
    _exit_with_line(error, "Interrupted (Ctrl-C).", 130)
  except Exception as error:  # noqa: BLE001 (re-raised unless it is a known kind)
    known = _known_error(error)
    if known is None:
      raise
    _exit_with_line(error, f"error: {' '.join(str(known).split())}",
                    2 if isinstance(known, UserError) else 1)
  finally:
    for workdir in held:
      workdir_lib.unlock(workdir)


def _exit_with_line(error: BaseException, line: str, status: int):
  """Prints `line` (after the traceback, if asked for) and exits with `status`."""
  if _traceback_wanted():
    traceback.print_exception(error)
  sys.stderr.write(line + "\n")
  sys.stderr.flush()
  sys.exit(status)


def _parse_flags(argv: list[str], required, writes_workdir: bool, lock_workdir,
                 held: list) -> list[str]:
  """Parses the flags; a mistake in them is a `UserError`, found before JAX starts."""
  # Arguments after "--" are not this program's (launch.local_cluster passes them on).
  own = argv[1:argv.index("--")] if "--" in argv else argv[1:]
  if any(arg in _HELP_FLAGS for arg in own):
    app.usage(shorthelp="--helpfull" not in own, writeto_stdout=True, exitcode=0)
  for name in required:
    if not any(re.match(rf"--?{name}(=.|$)", arg) for arg in own):
      raise UserError(f"--{name} is required: {flags.FLAGS[name].help} (--help lists "
                      "every flag)")
  if "config" in flags.FLAGS:
    _check_config_args(own)
  try:
    remaining = flags.FLAGS(argv)
  except flags.Error as error:
    raise UserError(f"{error} (--help lists every flag)") from error
  if "config" in flags.FLAGS and flags.FLAGS.config is not None:
    config_lib.validate(flags.FLAGS.config)
  if writes_workdir and "workdir" in flags.FLAGS and flags.FLAGS.workdir:
    workdir_lib.prepare(flags.FLAGS.workdir)
    if lock_workdir is not None and lock_workdir():
      workdir_lib.lock(flags.FLAGS.workdir)
      held.append(flags.FLAGS.workdir)
  return remaining


def _check_config_args(args):
  """The config file exists and every `--config.<key>` override names a key."""
  for index, arg in enumerate(args):
    match = re.match(r"--?config(=(.*))?$", arg)
    if match:
      path = match.group(2) if match.group(1) else (args[index + 1] if index + 1 < len(args)
                                                     else "")
      path = path.split(":", 1)[0]  # "file.py:argument" passes an argument to get_config
      if not os.path.isfile(path):
        configs = sorted(os.path.relpath(p) for p in glob.glob(os.path.join(_REPO, "configs",
                                                                            "*.py")))
        raise UserError(f"Config file {path!r} not found (relative paths start at "
                        f"{os.getcwd()}); the experiments here: {', '.join(configs)}.")
    override = re.match(r"--?(?:no)?config\.([^=]+)", arg)
    if override:
      config_lib.check_key(override.group(1))


def _known_error(error: BaseException) -> UserError | NoSpaceError | None:
  """`error`, or the exception it was raised from, when that is a `UserError` or a
  `NoSpaceError`."""
  while error is not None:
    if isinstance(error, (UserError, NoSpaceError)):
      return error
    error = error.__cause__
  return None


def _traceback_wanted() -> bool:
  if os.environ.get("WNSCALE_TRACEBACK", "").lower() in ("1", "true", "yes"):
    return True
  if flags.FLAGS.is_parsed():
    return _TRACEBACK.value
  return any(arg in ("--traceback", "-traceback") for arg in sys.argv[1:])
