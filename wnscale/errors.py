"""The one exception type for mistakes in what the user gave: config, flags, data, directories.

A `UserError` is raised where the mistake is found, with a message that names
the problem and says what to do. The launchers print that message as one line
and exit with status 2 (`launch/cli.py`); any other exception is a bug and
keeps its traceback. It subclasses `ValueError`, so code that catches bad
input as `ValueError` keeps working. The library names the problem; where the
mistake is one argument of a library function, an `ArgumentError` names it, and
a launcher shows its own flag for it.
"""


class UserError(ValueError):
  """A mistake in the user's input; the message says what it is and how to fix it."""


class ArgumentError(UserError):
  """A `UserError` about one argument of a library function, e.g. `init_every="24"`.

  The message reads `argument=value: problem`; a launcher with a flag of the
  argument's name shows `--argument=value: problem` instead (`launch/cli.py`).
  """

  def __init__(self, argument: str, value, problem: str):
    super().__init__(f"{argument}={value}: {problem}")
    self.argument, self.value, self.problem = argument, value, problem
