"""What every launcher shares: a quiet libtpu, the common flags, and user errors as one line.

A launcher imports this module before anything starts JAX's backend, defines
its flags, and ends with `cli.run(main, required=...)`:

  from launch import cli
  _CONFIG = cli.define_config()
  ...
  if __name__ == "__main__":
    cli.run(main, required=("config", "workdir"))

Before `main` runs (and before JAX's backend starts) the flags are checked:
required flags, that the config file exists (a path, or the name of an experiment of
configs/ from any directory: `wnscale.config.config_file`), that every `--config.<key>`
override names a key (else the nearest is suggested), the config's values
(`wnscale.config.validate`), that the workdir can be written, and that every
output (`define_output`, e.g. `--out`) can be written without replacing data
unasked (`wnscale.outputs.check`; `--overwrite` replaces).

A `wnscale.errors.UserError` (a mistake in the config, the flags, the data, the
workdir, the outputs or the topology), raised while parsing the flags or by the
library, prints `error: <what and what to do>` as one line on stderr and exits
with status 2; a full disk (`wnscale.errors.NoSpaceLeft`, or any error that
`errors.no_space` finds a full disk behind) prints one line too and exits with
status 1. A SIGTERM is handled as a Ctrl-C is: a loop that catches both
(`wnscale.interrupts`: training, a forecast) stops where nothing is lost; anywhere
else it ends the launcher with `Interrupted (SIGTERM): <what the output was left
as>.`, exit status 143 (as a shell shows a process ended by SIGTERM; a second SIGTERM
ends it at once). `--traceback` (or WNSCALE_TRACEBACK=1) prints the traceback as well.
So does a mistake inside the config file (it does not compile, `get_config`
fails or is missing: the line names the file and line). An
`errors.ArgumentError` about a library argument is shown as the launcher's flag
of that name (`--init_every=24: ...`), of that config key
(`--config.train.init_from=...`), or of `_FLAG_NAMES`; so is each argument a
library message names between backquotes (`overwrite=True` as `--overwrite`).
Any other exception is a bug and keeps its
traceback; in one process of several (`jax.distributed` started) it is followed by one
line, `error: process i of n stopped on an unexpected error, ...`, and the process exits
1 at once, as it does after a user error, a full disk or an interrupt: not held at JAX's
shutdown barrier, which waits for every peer (minutes), while its exit is what tells a
launcher or a scheduler to stop the others. A collective that a peer left (killed) or
did not come to (JAX's Gloo rendezvous gives up after 30 s), or a wait on the
coordination service that process 0 took with it, is that line alone: the peer's log
says why; so is a checkpoint's save that another process failed (`errors.PeerFailed`).
`--help` exits 0. A Ctrl-C that the launcher's own loop does not
catch (e.g. during its set-up, or while its modules are imported) ends it with
`Interrupted (Ctrl-C).`, exit status 130, even where its handler ran inside a callback
that Python cannot raise from (`_raise_swallowed_interrupt`). An interrupted launcher
leaves as soon as its line is said and its locks given back. Orbax's INFO lines stay
out of the log unless `--verbosity=1` (or more) asks for them.

A launcher that runs in a workdir (`lock_workdir`) takes the workdir's lock
(`wnscale.train.workdir.lock`) as soon as its flags are read, before JAX
starts and before anything is written there, and holds it until it exits. So
does a launcher of each output it replaces rather than continues (`outputs.lock`:
a second command writing the same `--out` stops at once), which then removes what a
killed writer of that output left beside it (`outputs.remove_leftovers`, one line).
"""

from __future__ import annotations

import functools
import glob
import logging
import os
import re
import signal
import sys
import threading
import traceback

from absl import app, flags
from ml_collections import config_flags

from wnscale import config as config_lib
from wnscale import errors, outputs
from wnscale.errors import ArgumentError, Interrupted, UserError, no_space
from wnscale.train import run_directory
from wnscale.train import workdir as workdir_lib


def _quiet_libtpu():
  """Without a TPU on this machine, keeps an installed libtpu from printing errors.

  libtpu reads these when JAX's backend starts (not when jax is imported), and
  without them prints start-up errors while looking for TPU hosts, then falls
  back to the CPU. ALLOW_MULTIPLE_LIBTPU_LOAD lets several such processes run.
  """
  if _has_google_pci_device():
    return  # a TPU host (or one we cannot tell from one): leave libtpu's settings alone
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  # Nor JAX's "Unable to initialize backend 'tpu'" note, when there is none to find.
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.WARNING)


def _has_google_pci_device() -> bool:
  """Whether a PCI device of Google's vendor id (0x1ae0: TPU chips) is attached, as JAX
  itself finds TPUs; read from sysfs, so that a launcher starts without importing JAX
  (a mistake in its flags is then reported in well under a second)."""
  for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
    try:
      with open(vendor) as f:
        if f.read().strip() == "0x1ae0":
          return True
    except OSError:
      continue
  return False


# At import: a launcher imports this module before its main starts JAX's backend.
_quiet_libtpu()


def _terminated_while_starting(signum, frame):
  """A SIGTERM or a Ctrl-C while the launcher's modules are imported, before `run`:
  nothing is written yet; one line, the exit status of that signal."""
  del frame
  os.write(2, f"Interrupted ({_shown(signal.Signals(signum).name)}): nothing was written "
           "yet.\n".encode())
  os._exit(128 + signum)  # noqa: SLF001 (no clean-up to run: nothing started)


def _shown(signal_name: str | None) -> str:
  """How a launcher's line names the signal that stopped it: "Ctrl-C" for a SIGINT."""
  return "Ctrl-C" if signal_name in (None, "SIGINT") else signal_name


_INTERRUPTS = (signal.SIGINT, signal.SIGTERM)

# The environment variable in which `launch.local_cluster` gives each process it starts
# its own pid, for the process to watch (`launch.process.watch_launcher`).
LAUNCHER_PID = "WNSCALE_LAUNCHER_PID"

# Only in a launcher's process (`python -m launch.<name>`), not in one that imports it.
if (threading.current_thread() is threading.main_thread() and sys.argv and
    os.path.basename(os.path.dirname(os.path.abspath(sys.argv[0]))) == "launch"):
  for _signum in _INTERRUPTS:
    signal.signal(_signum, _terminated_while_starting)

_HELP_FLAGS = ("--help", "-help", "-h", "-?", "--helpshort", "--helpfull")

_TRACEBACK = flags.DEFINE_bool(
    "traceback", False,
    "On a mistake in the input (exit status 2), print the Python traceback too; "
    "the environment variable WNSCALE_TRACEBACK=1 does the same.")

CONFIG_HELP = (
    "Experiment config: a file, or the name of one in configs/ from any directory (e.g. "
    "tiny, or configs/tiny.py). Every config key can be overridden as "
    "--config.section.key=value (e.g. --config.train.steps=500 "
    "--config.data.path=/data/era5.zarr); wnscale/config.py lists every key with its "
    "default and meaning.")


def define_config(what_for: str = ""):
  """The `--config` flag (required: pass `"config"` to `run`); `what_for` opens its help."""
  _CONFIG_FLAG.append(True)
  return config_flags.DEFINE_config_file("config", None, f"{what_for} {CONFIG_HELP}".strip())


_CONFIG_FLAG = []  # not empty once this launcher has a wnscale `--config` (define_config)


def config_name() -> str:
  """The name of the `--config` file, without its folder and `.py` (e.g. "tiny")."""
  filename = config_flags.get_config_filename(flags.FLAGS["config"]).split(":")[0]
  return os.path.splitext(os.path.basename(filename))[0]


def _has_config() -> bool:
  """Whether `--config` is a wnscale config file (another launcher's may be another file)."""
  return bool(_CONFIG_FLAG)


def define_workdir():
  """The `--workdir` flag (required: pass `"workdir"` to `run`)."""
  return flags.DEFINE_string(
      "workdir", None,
      "Run directory, one per experiment: config.json, metrics.jsonl, tensorboard/, "
      "checkpoints/. Re-running with the same directory resumes.")


_OUTPUTS = []  # (flag, outputs.Kind or `() -> Kind`) of each output the launcher defines


def define_params():
  """`--params`: which parameters of a training run a launcher reads (`run_directory.PARAMS`)."""
  return flags.DEFINE_enum("params", None, list(run_directory.PARAMS),
                           "Parameters: the moving average (ema) or the raw ones (default: "
                           "the moving average when the run kept one, train.ema_decay).")


def define_output(name: str, help_text: str, kind):
  """An output flag (e.g. `--out`), checked before JAX starts (`wnscale.outputs.check`).

  An output that is replaced rather than continued comes with `--overwrite`
  (read it with `overwrite()`); without it, an existing output is an error.
  `kind`: an `outputs.Kind`, or `() -> Kind` when the other flags decide it (called
  once they are parsed).
  """
  flag = flags.DEFINE_string(name, None, help_text)
  _OUTPUTS.append((flag, kind))
  if (callable(kind) or not kind.continues) and "overwrite" not in flags.FLAGS:
    flags.DEFINE_bool(
        "overwrite", False,
        "Replace an existing output of the same kind (without it, an existing output is an "
        "error). The new one is written beside it and swapped in when whole: the old one "
        "stays intact until then, and the disk needs room for both.")
  return flag


def overwrite() -> bool:
  """`--overwrite` (see `define_output`)."""
  return "overwrite" in flags.FLAGS and flags.FLAGS.overwrite


def run(main, required: tuple[str, ...] = (), writes_workdir: bool = True,
        unknown_flag_hint: str = "", lock_workdir=None):
  """`absl.app.run(main)`, with user errors as one line and exit status 2 (module docstring).

  Args:
    main: `main(argv)` of the launcher.
    required: names of flags that must be given (no default).
    writes_workdir: the launcher writes into `--workdir` (made and checked first);
      False for one that only reads a run directory (e.g. `launch.forecast`).
    unknown_flag_hint: added to the error for a flag this launcher does not know.
    lock_workdir: `() -> bool`, called once the flags are parsed: whether this
      process holds `--workdir`'s lock while it runs (e.g. process 0 of several);
      None: no lock.
  """
  # --help lists the flags of the launcher's own module: these are the launcher's too.
  for flag in flags.FLAGS.get_flags_for_module(sys.modules[__name__]):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  held = []  # the workdir whose lock this process took, and `("out", path)` of outputs
  previous_handlers = _handle_interrupts()
  previous_unraisable = sys.unraisablehook
  sys.unraisablehook = ours = functools.partial(_raise_swallowed_interrupt,
                                                previous_unraisable)
  leave_with = None  # the exit status to leave with at once, once its line is said
  try:
    app.run(main, flags_parser=lambda argv: _parse_flags(argv, required, writes_workdir,
                                                         unknown_flag_hint, lock_workdir, held))
  except KeyboardInterrupt as error:
    _restore_handlers(previous_handlers)  # the interrupt is here: none to pass on
    name = error.signal_name if isinstance(error, Interrupted) else None
    kept = getattr(error, "kept", None)
    written = [path for path in held if isinstance(path, tuple)]
    if kept is None and written:  # outside `outputs.building`: nothing written yet
      kept = "nothing was written to " + ", ".join(path for _, path in written)
    line = f"Interrupted ({_shown(name)})" + (f": {kept}." if kept else ".")
    # An interrupted zarr or tensorstore call leaves its asyncio task pending: not news.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    _say(error, line)
    leave_with = 128 + (signal.Signals[name].value if name else signal.SIGINT.value)
  except Exception as error:  # noqa: BLE001 (re-raised unless the user's mistake or a full disk)
    user_error = _user_error(error)
    full_disk = None if user_error else no_space(error)
    if user_error is None and full_disk is None and not _in_a_cluster():
      raise  # a bug: its traceback, as Python shows it
    if user_error is None and full_disk is None:
      line, status = _unexpected_in_a_cluster(error), 1
    else:
      message = _message(user_error) if user_error else str(full_disk)
      line, status = f"error: {' '.join(message.split())}", 2 if user_error else 1
    _say(error, line)
    if not _in_a_cluster():
      sys.exit(status)
    leave_with = status
  finally:
    for workdir in held:
      if isinstance(workdir, tuple):
        outputs.unlock(workdir[1])
      else:
        workdir_lib.unlock(workdir)
    _restore_handlers(previous_handlers)  # ours in sys.unraisablehook passes all on now
    if sys.unraisablehook is ours:  # not wrapped since (`_quiet_libraries`)
      sys.unraisablehook = previous_unraisable
  if leave_with is not None:
    # Nothing more to keep (the lock is given back above): gone now, not after the
    # threads' queued work (a store's pending writes to a bucket: seconds), JAX's
    # shutdown barrier (minutes: it waits for every peer, while they work on or wait for
    # this one; this exit is what tells a launcher or a scheduler to stop them), nor by
    # SIGINT instead of 130 (Python's way after a KeyboardInterrupt that went through an
    # `exec`, as in dataclasses).
    _leave_at_once(leave_with)


def _restore_handlers(previous_handlers: dict):
  """Sets the handlers `_handle_interrupts` replaced (Python's own for those set while
  the launcher's modules were imported)."""
  for signum, previous in previous_handlers.items():
    if previous is _terminated_while_starting:
      previous = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
    signal.signal(signum, previous)


def _interrupted(signum, frame):
  """The handler of SIGINT and SIGTERM while a launcher runs (`_handle_interrupts`)."""
  if _SWALLOWED:  # passed on by `_raise_swallowed_interrupt`
    if _inside_unraisable_hook(frame):  # raised here, it would be dropped again
      _pass_on_later()
      return
    raise _SWALLOWED.pop().with_traceback(None)
  name = signal.Signals(signum).name
  errors.note_interrupt(name)  # raised again where work stops cleanly, if C code clears it
  if signum == signal.SIGINT:
    raise KeyboardInterrupt  # as Python's own handler: each Ctrl-C raises it
  signal.signal(signum, signal.SIG_DFL)  # a second SIGTERM ends the process at once
  raise Interrupted(name)


_SWALLOWED: list[KeyboardInterrupt] = []  # an interrupt to raise again (one at most)


def _handle_interrupts() -> dict:
  """Makes a Ctrl-C raise KeyboardInterrupt and a SIGTERM `errors.Interrupted` (a loop's
  own handler, `wnscale.interrupts`, takes over while it runs), each recorded
  (`errors.note_interrupt`); a second SIGTERM ends the process at once. Returns the
  handlers replaced ({}: not the main thread, nothing done)."""
  if threading.current_thread() is not threading.main_thread():
    return {}
  return {signum: signal.signal(signum, _interrupted) for signum in _INTERRUPTS}


def _raise_swallowed_interrupt(previous, report):
  """`sys.unraisablehook` while a launcher runs: an interrupt that Python could only print.

  A signal's handler runs at the first check of the main thread's Python code after the
  signal came; when that code is a callback whose exceptions Python prints and drops (a
  garbage-collection callback, as JAX's `_xla_gc_callback` that runs at each collection;
  a weakref callback; a `__del__`), the Ctrl-C's KeyboardInterrupt (a SIGTERM's
  `Interrupted`) was lost there and the run went on. It is passed on to the main thread
  instead, as a signal is, and `_interrupted` raises it at the first check outside this
  hook; nothing printed. Any other report goes to `previous`.
  """
  if (not isinstance(report.exc_value, KeyboardInterrupt)
      or signal.getsignal(signal.SIGINT) is not _interrupted):  # a loop's handler: its own
    previous(report)
  elif not _SWALLOWED:  # else one is on its way already: one raised, not two
    _SWALLOWED.append(report.exc_value)
    _pass_on_later()


def _pass_on_later():
  """A SIGINT to the main thread, from another thread: sent from the main thread, its
  handler would run before the hook returns. A signal, not `_thread.interrupt_main`: it
  also ends a wait the main thread is in (a sleep, a lock)."""
  timer = threading.Timer(0.001, signal.pthread_kill,
                          (threading.main_thread().ident, signal.SIGINT))
  timer.daemon = True
  timer.start()


def _inside_unraisable_hook(frame) -> bool:
  """Whether `frame` runs inside `sys.unraisablehook` (`_quiet_libraries` wraps ours)."""
  hooks = {_raise_swallowed_interrupt.__code__, getattr(sys.unraisablehook, "__code__", None)}
  while frame is not None:
    if frame.f_code in hooks:
      return True
    frame = frame.f_back
  return False


def _in_a_cluster() -> bool:
  """Whether this process is one of a multi-process job (`jax.distributed` started)."""
  jax = sys.modules.get("jax")
  return jax is not None and jax.distributed.is_initialized()


# What JAX raises in a process whose peer left a collective or did not come to it, or
# to the coordination service (the peer failed, was stopped, or is far behind), or whose
# coordination service is gone with process 0, or took a peer for dead (its heartbeats
# stopped): a barrier or a key's wait then fails, unless JAX's own watch of the service
# ends the process first, with its log.
_PEER_MISSING = re.compile(r"Gloo [\w -]+ failed|DEADLINE_EXCEEDED|Connection (closed|reset) "
                           r"by peer|another task died|distributed service detected fatal|"
                           r"Failed to send RPC to coordination service|heartbeat timeout")


def _unexpected_in_a_cluster(error: BaseException) -> str:
  """The line of an unexpected error in one process of several: its traceback is kept
  (printed above the line) unless a peer's absence caused it, which only its log tells."""
  import jax  # noqa: PLC0415 (in a cluster, imported already)
  who = f"process {jax.process_index()} of {jax.process_count()}"
  first = (str(error).strip().splitlines() or [""])[0]
  first = re.sub(r"\s*\[type\.googleapis\.com[^\]]*\]", "", first)  # gRPC's payload names
  if isinstance(error, errors.PeerFailed):
    return (f"error: {who} stopped: {first[:300]}. The run stops; run the same command again "
            "to resume from its last checkpoint.")
  if isinstance(error, jax.errors.JaxRuntimeError) and _PEER_MISSING.search(str(error)):
    return (f"error: {who} stopped: another process left a collective or did not come to "
            f"it in time ({first[:160]}); its log says why (a failure, a signal, or far "
            "behind). "
            "The run stops; run the same command again to resume from its last checkpoint.")
  if not _traceback_wanted():  # a bug: where it happened, always
    traceback.print_exception(error)
  return (f"error: {who} stopped on an unexpected error, {type(error).__name__}: "
          f"{first[:200]} (the traceback above); the other processes stop with it.")


def _say(error: BaseException, line: str):
  """Prints `line` on stderr, after `error`'s traceback if asked for."""
  if _traceback_wanted():
    traceback.print_exception(error)
  sys.stderr.write(line + "\n")
  sys.stderr.flush()


def _leave_at_once(status: int):
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)  # noqa: SLF001 (see `_exit_with_line`)


def _parse_flags(argv: list[str], required, writes_workdir: bool, unknown_flag_hint: str,
                 lock_workdir, held: list) -> list[str]:
  """Parses the flags; a mistake in them is a `UserError`, found before JAX starts."""
  # Arguments after "--" are not this program's (launch.local_cluster passes them on).
  own = argv[1:argv.index("--")] if "--" in argv else argv[1:]
  if any(arg in _HELP_FLAGS for arg in own):
    app.usage(shorthelp="--helpfull" not in own, writeto_stdout=True, exitcode=0)
  for name in required:
    if not any(re.match(rf"--?{name}(=.|$)", arg) for arg in own):
      raise UserError(f"--{name} is required: {flags.FLAGS[name].help} (--help lists "
                      "every flag)")
  if _has_config():
    own = _resolve_config_args(own)
    argv = [argv[0], *own, *argv[1 + len(own):]]
  config_path = _check_config_args(own) if _has_config() else None
  try:
    remaining = flags.FLAGS(argv)
  except Exception as error:  # noqa: BLE001 (re-raised unless it is the user's mistake)
    mistake = _config_file_error(error, config_path) if config_path else None
    if mistake is not None:
      cause = None if mistake is _original(error) else error  # not the library's own error
      raise mistake from cause
    if isinstance(error, flags.UnrecognizedFlagError) and unknown_flag_hint:
      raise UserError(f"{error}: {unknown_flag_hint}") from error
    if isinstance(error, flags.Error):
      raise UserError(f"{error} (--help lists every flag)") from error
    raise
  if _has_config() and flags.FLAGS.config is not None:
    config_lib.validate(flags.FLAGS.config)
  if writes_workdir and "workdir" in flags.FLAGS and flags.FLAGS.workdir:
    workdir_lib.prepare(flags.FLAGS.workdir)
    if lock_workdir is not None and lock_workdir():
      workdir_lib.lock(flags.FLAGS.workdir)
      held.append(flags.FLAGS.workdir)
  for flag, kind in _OUTPUTS:
    if flag.value:
      kind = kind() if callable(kind) and not isinstance(kind, outputs.Kind) else kind
      outputs.check(flag.value, kind, overwrite=overwrite(), argument=flag.name)
      if not kind.continues:  # one writer at a time; then what a killed one left
        outputs.lock(flag.value, argument=flag.name)
        held.append(("out", flag.value))
        outputs.remove_leftovers(flag.value, kind)
  _quiet_libraries(verbose=flags.FLAGS.verbosity >= 1)
  return remaining


def _quiet_libraries(verbose: bool):
  """Keeps Orbax's per-save/restore INFO chatter out of a launcher's log (warnings stay;
  `--verbosity=1` shows it), and a full disk's background noise always: Orbax's and
  asyncio's logs of the write that found it full, tensorstore's "Event loop is closed"
  tracebacks, writer threads' tracebacks. The full disk itself is raised where the
  command waits for its writes, and said in one line. Orbax logs through absl's logger,
  so its records are told apart by the file that made them. A save's background thread
  that stopped because another process's part of the save failed (`errors.PeerFailed`)
  is said at the end, in one line, too."""
  def keep(record: logging.LogRecord) -> bool:
    if "/orbax/" not in record.pathname and record.name != "asyncio":
      return True
    if (record.exc_info and (no_space(record.exc_info[1]) is not None or isinstance(
        record.exc_info[1], errors.PeerFailed))) or (
        "No space left on device" in record.getMessage()):
      return False
    if "after interpreter shutdown" in record.getMessage():
      return False  # a write still pending when a failed command exits: said already
    return verbose or record.levelno >= logging.WARNING or record.name == "asyncio"

  for logger in ("absl", "asyncio"):
    logging.getLogger(logger).addFilter(keep)
  previous_unraisable, previous_thread = sys.unraisablehook, threading.excepthook

  def unraisable(report):
    # One failed write of an Orbax save closes its event loop while tensorstore still
    # completes the others: each then finds the loop closed (dozens for one full disk).
    if not (isinstance(report.exc_value, RuntimeError)
            and str(report.exc_value) == "Event loop is closed"):
      previous_unraisable(report)

  def thread(args):
    if no_space(args.exc_value) is None:
      previous_thread(args)

  sys.unraisablehook, threading.excepthook = unraisable, thread


def _resolve_config_args(args: list[str]) -> list[str]:
  """`args` with `--config`'s value as the file it names (`config_lib.config_file`: a
  path, or an experiment of configs/ by name, e.g. `--config=tiny`, from any working
  directory).

  Raises:
    UserError: no such config file.
  """
  resolved = list(args)
  for index, arg in enumerate(args):
    match = re.match(r"(--?config)(=(.*))?$", arg)
    if match and match.group(2):
      resolved[index] = f"{match.group(1)}={config_lib.config_file(match.group(3))}"
    elif match and index + 1 < len(args):
      resolved[index + 1] = config_lib.config_file(args[index + 1])
  return resolved


def _check_config_args(args) -> str | None:
  """The config file exists and every `--config.<key>` override names a key.

  Returns:
    The config file's path (without a `:argument`), if `--config` is given.
  """
  config_path = None
  for index, arg in enumerate(args):
    match = re.match(r"--?config(=(.*))?$", arg)
    if match:
      path = match.group(2) if match.group(1) else (args[index + 1] if index + 1 < len(args)
                                                     else "")
      path = config_lib.config_file(path).split(":", 1)[0]  # ":argument": for get_config
      config_path = path
    override = re.match(r"--?(?:no)?config\.([^=]+)", arg)
    if override:
      config_lib.check_key(override.group(1))
  return config_path


def _original(error: BaseException) -> BaseException:
  """The first exception of `error`'s chain (ml_collections and absl re-raise as others)."""
  seen = [error]
  while (error.__cause__ or error.__context__) not in (None, *seen):
    error = error.__cause__ or error.__context__
    seen.append(error)
  return error


def _config_file_error(error: BaseException, path: str) -> UserError | None:
  """A mistake inside the config file `path` (it does not compile, `get_config` fails or
  is missing) as one line naming the file and line; None for any other error."""
  original = _original(error)
  if isinstance(original, UserError):  # found by the library, called from get_config
    return original
  if isinstance(original, SyntaxError):
    if original.filename and os.path.samefile(original.filename, path):
      return UserError(f"Config file {path}, line {original.lineno}: {original.msg} "
                       f"({type(original).__name__}).")
    return None
  lines = [frame.lineno for frame in traceback.extract_tb(original.__traceback__)
           if os.path.exists(frame.filename) and os.path.samefile(frame.filename, path)]
  if lines:
    return UserError(f"Config file {path}, line {lines[-1]}: {type(original).__name__}: "
                     f"{original}")
  if isinstance(original, AttributeError) and "get_config" in str(original):
    return UserError(f"Config file {path} defines no get_config(); a config file defines "
                     "get_config() returning the experiment's ConfigDict, e.g. configs/tiny.py.")
  return None


def _message(error: UserError) -> str:
  """The error's message, naming this launcher's flags: one about a library argument
  (`ArgumentError`) opens with its flag, and each argument the message names between
  backquotes (`overwrite=True`, `out`) is shown as its flag (`--overwrite`, `--out`)."""
  flag = _flag_of(error.argument) if isinstance(error, ArgumentError) else None
  if flag is None:
    message = str(error)
  elif error.value is None:
    message = f"{flag} {error.problem}"
  else:
    message = f"{flag}={error.value}: {error.problem}"
  return _REFERENCE.sub(_as_flag, message)


# An argument named in a library message, `name` or `name=value` (see wnscale.errors).
_REFERENCE = re.compile(r"`([A-Za-z_][\w.]*)(?:=([^`]*))?`")

# Library arguments (and settings) that a launcher's flag of another name sets.
_FLAG_NAMES = {"jax_num_cpu_devices": "num_cpu_devices"}


def _as_flag(reference: re.Match) -> str:
  """`name` as `--flag`, `name=value` as `--flag=value` (`--flag` for a boolean flag
  set to True); unchanged when this launcher has no flag for `name`."""
  name, value = reference.groups()
  flag = _flag_of(name)
  if flag is None:
    return reference.group(0)
  own = _FLAG_NAMES.get(name, name)  # a config key's override keeps its `=True`
  boolean = own in flags.FLAGS and flags.FLAGS[own].boolean
  return flag if value is None or (value == "True" and boolean) else f"{flag}={value}"


def _flag_of(argument: str) -> str | None:
  """This launcher's flag that sets `argument` (a flag's name, one of `_FLAG_NAMES`, or a
  config key), if any."""
  name = _FLAG_NAMES.get(argument, argument)
  if name in flags.FLAGS:
    return f"--{name}"
  if _has_config() and argument in config_lib.key_paths(config_lib.default_config()):
    return f"--config.{argument}"
  return None


def _user_error(error: BaseException) -> UserError | None:
  """`error`, or the exception it was raised from, when that is a `UserError`."""
  while error is not None:
    if isinstance(error, UserError):
      return error
    error = error.__cause__
  return None


def _traceback_wanted() -> bool:
  if os.environ.get("WNSCALE_TRACEBACK", "").lower() in ("1", "true", "yes"):
    return True
  if flags.FLAGS.is_parsed():
    return _TRACEBACK.value
  return any(arg in ("--traceback", "-traceback") for arg in sys.argv[1:])
