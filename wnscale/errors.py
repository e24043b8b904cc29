"""The one exception type for mistakes in what the user gave: config, flags, data, directories.

A `UserError` is raised where the mistake is found, with a message that names
the problem and says what to do. The launchers print that message as one line
and exit with status 2 (`launch/cli.py`); any other exception is a bug and
keeps its traceback. It subclasses `ValueError`, so code that catches bad
input as `ValueError` keeps working.

A full disk is neither the user's mistake nor a bug: `NoSpaceError`, one line
too, exit status 1.
"""

import errno


class UserError(ValueError):
  """A mistake in the user's input; the message says what it is and how to fix it."""


class NoSpaceError(RuntimeError):
  """An output could not be written: the disk (or the quota) is full.

  Not a mistake in the input, and not a bug: the launchers print its message
  as one line and exit with status 1 (`launch/cli.py`).
  """


def is_no_space(error: BaseException) -> bool:
  """Whether `error`, or an exception it came from, is a full disk.

  An `OSError` with `errno.ENOSPC`, or the message of one passed on as text
  (tensorstore, through Orbax: `... No space left on device [os_error_code='28']`).
  """
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
      return True
    if "No space left on device" in str(error):
      return True
    error = error.__cause__ or error.__context__
  return False
