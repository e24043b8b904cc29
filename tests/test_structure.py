"""The architecture holds: imports point down the layers, no package has import cycles,
reading stores never imports the code that makes them, and the library's messages name no
launcher's flag.

The contracts are in pyproject.toml (`[tool.importlinter]`); the layers are the
layout table of docs/design.md, top to bottom.
"""

import ast
import os
import pathlib
import re
import subprocess
import sys

REPO = os.path.join(os.path.dirname(__file__), "..")


def test_import_contracts_hold():
  # `python -c` from the repository: the checked code is this checkout's.
  command = "from importlinter.cli import lint_imports_command; lint_imports_command()"
  result = subprocess.run([sys.executable, "-c", command], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
  assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
  assert "3 kept, 0 broken" in result.stdout


# A token such as `--out` or `--config.data.path=...` (not a bare `--`, nor `--?runner`).
_FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w.-]*")


def _message_parts(tree: ast.AST) -> list[ast.AST]:
  """What makes an error's message in a module: each `raise` statement, each function of
  the module that one calls (e.g. a helper giving advice), each exception class."""
  raises = [node.exc for node in ast.walk(tree) if isinstance(node, ast.Raise) and node.exc]
  called = {call.func.id if isinstance(call.func, ast.Name) else call.func.attr
            for exc in raises for call in ast.walk(exc) if isinstance(call, ast.Call)
            and isinstance(call.func, (ast.Name, ast.Attribute))}
  helpers = [node for node in ast.walk(tree)
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in called]
  errors = [node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and any(
      (base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")).endswith("Error")
      for base in node.bases)]
  return raises + helpers + errors


def _literals(part: ast.AST) -> list[ast.Constant]:
  """The string constants of `part` (f-strings' parts included), docstrings left out."""
  docstrings = {id(node.body[0].value) for node in ast.walk(part)
                if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and isinstance(node.body[0], ast.Expr)}
  return [node for node in ast.walk(part) if isinstance(node, ast.Constant)
          and isinstance(node.value, str) and id(node) not in docstrings]


def _flags_in_messages(source: str, name: str) -> list[str]:
  return [f"{name}:{node.lineno}: {node.value!r}"
          for part in _message_parts(ast.parse(source, name)) for node in _literals(part)
          if _FLAG.search(node.value)]


def test_library_messages_name_no_flag():
  """No error message of `wnscale/` names a `--flag`: it names the library's argument
  (`errors.ArgumentError`, or `overwrite=True` between backquotes), and each launcher shows
  its own flag for it (`launch/cli.py`)."""
  found = []
  for path in sorted(pathlib.Path(REPO, "wnscale").rglob("*.py")):
    found += _flags_in_messages(path.read_text(), str(path.relative_to(REPO)))
  assert not found, "A library message names a launcher's flag:\n" + "\n".join(found)


def test_the_flag_scan_finds_what_it_looks_for():
  """The scan above can fail: it finds a flag in a raised f-string, in an advice helper a
  raise calls, in an exception class; not a bare `--`, a log line, or a docstring."""
  source = '''
def _advice(n):
  """Docstring naming --num_cpu_devices is fine."""
  return f" On CPU, --num_cpu_devices={n} gives {n} devices."
def check(path, n):
  logging.info("tensorboard --logdir %s", path)
  if n:
    raise UserError(f"{path} exists; pass --overwrite to replace it.")
  raise UserError(f"{path}: Beam's options go after --." + _advice(n))
class MismatchError(UserError):
  def __init__(self, run):
    super().__init__(f"give this run a new --workdir than {run}")
'''
  found = _flags_in_messages(source, "example.py")
  assert sorted(int(line.split(":")[1]) for line in found) == [4, 8, 12], found
