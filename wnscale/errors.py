"""The exceptions a launcher prints as one line: a mistake in what the user gave, a full disk.

A `UserError` (a mistake in the config, flags, data or directories) is raised
where the mistake is found, with a message that names the problem and says
what to do. The launchers print that message as one line and exit with status
2 (`launch/cli.py`); any other exception is a bug and keeps its traceback. It
subclasses `ValueError`, so code that catches bad input as `ValueError` keeps
working. The library names the problem, never a launcher's flag; where the
mistake is one argument of a library function, an `ArgumentError` names it, and
a launcher shows its own flag for it. A message names any other argument (or
setting) it refers to between backquotes, e.g. "pass `overwrite=True` to
replace it, or choose another `out`"; a launcher shows its flag for each it has
("pass --overwrite to replace it, or choose another --out").

A full disk is neither the user's mistake nor a bug: a `NoSpaceLeft` (a full
disk or quota while writing an output, `wnscale.outputs.writing`; `no_space`
finds one behind any error) names the path and what was kept; the launchers
print it as one line too, with exit status 1. So is a `PeerFailed` in one process of
several: another process failed where this one waits for it, and its log says why.
"""

import errno


class UserError(ValueError):
  """A mistake in the user's input; the message says what it is and how to fix it."""


class ArgumentError(UserError):
  """A `UserError` about one argument of a library function, e.g. `init_every="24"`.

  The message reads `argument=value: problem` (`value` None: a missing argument,
  `argument problem`, e.g. "members is required: ..."); a launcher with a flag of
  the argument's name shows `--argument=value: problem` (`--argument problem`)
  instead (`launch/cli.py`). `problem` names other arguments between backquotes
  (see the module docstring).
  """

  def __init__(self, argument: str, value, problem: str):
    super().__init__(f"{argument} {problem}" if value is None else
                     f"{argument}={value}: {problem}")
    self.argument, self.value, self.problem = argument, value, problem


class Interrupted(KeyboardInterrupt):
  """A SIGTERM (what batch schedulers and `kill` send) outside a loop that handles it
  itself, raised like a Ctrl-C's KeyboardInterrupt (`launch/cli.py` installs the handler).

  A signal handler raises wherever the main thread is, and C code that clears errors (a
  numpy comparison, for one) can swallow it there; so the signal (a SIGTERM or a Ctrl-C)
  is also recorded (`note_interrupt`), and the places where a command's work stops
  cleanly (a piece of progress done, an output about to be renamed into place, a
  training run's set-up phase done) raise it again (`raise_if_interrupted`), as this.

  Attributes:
    signal_name: e.g. "SIGTERM".
    kept: what the interrupted write left, set on the way out (`outputs.building`),
      e.g. "nothing was left at /data/x.zarr"; None: nothing was being written.
  """

  def __init__(self, signal_name: str):
    super().__init__(signal_name)
    self.signal_name = signal_name
    self.kept = None


_PENDING: list[str] = []  # the signal received, until the process ends


def note_interrupt(signal_name: str):
  """Records that `signal_name` asked this process to stop (see `Interrupted`)."""
  if not _PENDING:
    _PENDING.append(signal_name)


def raise_if_interrupted():
  """Raises `Interrupted` if a signal asked this process to stop (`note_interrupt`)."""
  if _PENDING:
    raise Interrupted(_PENDING[0])


class StoreLacks(UserError):
  """A data store without a variable or level the caller needs (`wnscale.data.reading.store`,
  `wnscale.data.reading.anemoi`); the message says what to choose in a training config, and a
  launcher that reads a store for another purpose says its own (`launch.forecast`).

  Attributes:
    path: the store; what: e.g. "variable(s) ['temperature']"; have: what it has, e.g.
      "['2m_temperature', ...]".
  """

  def __init__(self, path: str, what: str, have: str, message: str):
    self.path, self.what, self.have = path, what, have
    self.arguments = (path, what, have, message)
    super().__init__(message)

  def __reduce__(self):
    return type(self), self.arguments


class PeerFailed(RuntimeError):
  """Another process of a multi-process run failed where this one waits for it (e.g. its
  part of a checkpoint's save); the message says where, the other's log says why."""


class NoSpaceLeft(OSError):
  """No space left on the device (or quota) holding an output; the message names the path
  and what was kept."""

  def __init__(self, message: str):
    super().__init__(errno.ENOSPC, message)

  def __str__(self) -> str:
    return self.strerror


def no_space(error: BaseException) -> NoSpaceLeft | None:
  """The full disk (or quota) behind `error`, or None.

  The `NoSpaceLeft` that `error` is or came from; else, when the disk was full
  (an `OSError` ENOSPC or EDQUOT, or a message saying "No space left on device"
  or "Disk quota exceeded": tensorstore, through Orbax, passes it on as text), a
  `NoSpaceLeft` of that error's message.
  """
  seen, cause = set(), error
  while cause is not None and id(cause) not in seen:
    seen.add(id(cause))
    if isinstance(cause, NoSpaceLeft):
      return cause
    if ((isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT)) or
        any(text in str(cause) for text in ("No space left on device", "Disk quota exceeded"))):
      return NoSpaceLeft(f"No space left on device: {cause}")
    cause = cause.__cause__ or cause.__context__
  return None
