"""Checks that the `python -m launch.<name> ...` commands of the documentation parse.

  python -m tools.doc_commands            # README.md and docs/*.md; exit 1 on a problem

Every command in a fenced code block or an inline code span of README.md and
docs/*.md is read as a shell would read it (continuation lines joined, the block's
variables such as `F="--lead=5d"` expanded, `[optional]` brackets and `...` dropped) and
its arguments are parsed by the launcher's own absl flags, in a process per launcher
(a launcher's flags are defined when it is imported), without running it: an unknown
flag, a value of the wrong type, a config file that is not there, an unknown
`--config.a.b` key and a config the overrides make invalid (`wnscale.config.validate`)
are problems; so is a required flag left out of a command that elides nothing (`...`).
Values in capitals (`--steps=N`, `--process_id=I`) stand for a number where the flag
takes one. A command of `launch.local_cluster` is checked for its own flags, and what
follows its `--` as a command of its `--module`. A command shown failing (its block
prints an `error: ...` line) must fail. Nothing is written, read or compiled.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import glob
import json
import os
import re
import shlex
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = re.compile(r"python3? -m (launch\.\w+)")
_PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")
_ASSIGNMENT = re.compile(r"^([A-Za-z_]\w*)=(.*)$")
_FENCE = re.compile(r"^\s*(```|~~~)")


@dataclasses.dataclass
class Command:
  """One launcher command of a document: where it is, and its arguments as a shell
  splits them."""
  source: str  # "README.md:12"
  module: str  # "launch.train"
  args: list[str]
  text: str  # as written (joined into one line)
  elided: bool = False  # holds "..." or [optional] parts: required flags are not checked
  expect_error: bool = False  # shown failing (its block prints `error: ...`): must fail


def documents(repo: str = REPO) -> list[str]:
  """README.md and docs/*.md."""
  return [os.path.join(repo, "README.md")] + sorted(glob.glob(os.path.join(repo, "docs",
                                                                           "*.md")))


def code(path: str) -> list[tuple[int, str, bool]]:
  """The code of a markdown file: `(line, text, fenced)` for each fenced block (its lines
  joined) and each inline code span outside them."""
  with open(path) as f:
    lines = f.read().splitlines()
  found, prose, fence, block, start = [], [], None, [], 0
  for number, line in enumerate(lines, 1):
    match = _FENCE.match(line)
    if fence is None and match:
      fence, block, start = match.group(1), [], number + 1
      prose.append((number, ""))
    elif fence is not None and line.strip().startswith(fence):
      found.append((start, "\n".join(block), True))
      fence = None
      prose.append((number, ""))
    elif fence is not None:
      block.append(line)
      prose.append((number, ""))
    else:
      prose.append((number, line))
  # Inline spans may run over line ends within a paragraph: search paragraph by paragraph.
  paragraph, first = [], 0
  for number, line in prose + [(len(lines) + 1, "")]:
    if line.strip():
      if not paragraph:
        first = number
      paragraph.append(line)
      continue
    text = "\n".join(paragraph)
    for match in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", text, re.DOTALL):
      line_of_span = first + text.count("\n", 0, match.start())
      found.append((line_of_span, " ".join(match.group(2).split()), False))
    paragraph = []
  return found


def _variables(block: str) -> dict[str, str]:
  """The shell variables a block sets (`F="--lead=5d"`, `A=1 B=2`)."""
  variables = {}
  for line in block.splitlines():
    try:
      words = shlex.split(line)
    except ValueError:
      continue
    if words and all(_ASSIGNMENT.match(word) for word in words):
      variables.update(_ASSIGNMENT.match(word).groups() for word in words)
  return variables


def _cut(text: str) -> str:
  """`text` up to the end of its command: an unquoted `&&`, `;`, `|`, ` #` (a comment),
  or a double quote that closes an enclosing string (`--command="... python -m ..."`)."""
  quote = None
  index = 0
  while index < len(text):
    char = text[index]
    if quote:
      if char == quote:
        quote = None
    elif char in "'\"":
      if text.find(char, index + 1) < 0:
        return text[:index]  # closes a string opened before the command
      quote = char
    elif char in ";|" or text.startswith("&&", index) or (char == "#" and index and
                                                           text[index - 1].isspace()):
      return text[:index]
    index += 1
  return text


def _logical_lines(text: str) -> list[tuple[int, str]]:
  """`(line offset, text)` of each shell line of `text`, continuation lines joined."""
  lines, current, start = [], [], None
  for offset, raw in enumerate(text.split("\n")):
    start = offset if start is None else start
    if raw.rstrip().endswith("\\"):
      current.append(raw.rstrip()[:-1])
      continue
    lines.append((start, " ".join(current + [raw])))
    current, start = [], None
  if current:
    lines.append((start, " ".join(current)))
  return lines


def commands_in(path: str, repo: str = REPO) -> list[Command]:
  """The launcher commands of the markdown file at `path`, and what follows the `--` of a
  `launch.local_cluster` command as a command of its `--module`."""
  found = []
  name = os.path.relpath(path, repo)
  for line, text, fenced in code(path):
    variables = _variables(text) if fenced else {}
    expect_error = fenced and re.search(r"^error: ", text, re.MULTILINE) is not None
    for offset, logical in _logical_lines(text):
      for match in LAUNCH.finditer(logical):
        source = f"{name}:{line + offset}"
        command = _cut(logical[match.end():]).strip()
        for variable, value in variables.items():
          command = re.sub(rf"\${{?{variable}\b}}?", lambda _, v=value: v, command)
        written = f"{match.group(0)} {command}".strip()
        try:
          words = shlex.split(command)
        except ValueError as error:
          found.append(Command(source, match.group(1), [f"<unparsable: {error}>"], written))
          continue
        if not words:
          continue  # the launcher named in prose, not a command
        args, elided = [], False
        for word in words:
          stripped = word.strip("[]")
          elided |= stripped != word or "..." in word
          if stripped and "..." not in stripped:
            args.append(stripped)
        found.append(Command(source, match.group(1), args, written, elided, expect_error))
        if match.group(1) == "launch.local_cluster" and "--" in args:
          split = args.index("--")
          module = next((arg.split("=", 1)[1] for arg in args[:split]
                         if arg.startswith("--module=")), "launch.train")
          # The cluster adds each process's flags: its required ones are not checked.
          found.append(Command(source, module, args[split + 1:], written, True, expect_error))
  return found


def all_commands(repo: str = REPO) -> list[Command]:
  """Every launcher command of README.md and docs/*.md."""
  return [command for path in documents(repo) for command in commands_in(path, repo)]


def check(commands: list[Command], repo: str = REPO, workers: int | None = None
          ) -> list[str]:
  """Problems with `commands` (`"source: command: problem"`), each launcher's commands
  checked in a process of its own, `workers` at a time."""
  by_module = {}
  for command in commands:
    by_module.setdefault(command.module, []).append(command)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [repo] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
  env.pop("XLA_FLAGS", None)  # a test session's: nothing here compiles
  env["JAX_PLATFORMS"] = "cpu"  # nothing starts a backend; nor may libtpu try

  def run(module: str) -> list[str]:
    batch = by_module[module]
    result = subprocess.run(
        [sys.executable, "-m", "tools.doc_commands", f"--check_module={module}"],
        input=json.dumps([dataclasses.asdict(c) for c in batch]), capture_output=True,
        text=True, cwd=repo, env=env, timeout=300)
    if result.returncode != 0:
      return [f"{module}: the check itself failed: {result.stderr[-3000:]}"]
    return json.loads(result.stdout.splitlines()[-1])

  workers = workers or max(1, min(len(by_module), os.cpu_count() or 1))
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    return [problem for problems in pool.map(run, sorted(by_module)) for problem in problems]


def _check_module(module_name: str, commands: list[dict]) -> list[str]:
  """In a process of its own: `commands` of the launcher `module_name` parsed by its flags."""
  import importlib  # noqa: PLC0415
  import importlib.util  # noqa: PLC0415

  from absl import flags  # noqa: PLC0415

  try:
    importlib.import_module(module_name)
  except ModuleNotFoundError:
    return [f"{c['source']}: {c['text']}: no launcher {module_name}" for c in commands]
  from launch import cli  # noqa: PLC0415
  from wnscale import config as config_lib  # noqa: PLC0415
  from wnscale.errors import UserError  # noqa: PLC0415

  required = _required(importlib.util.find_spec(module_name).origin)

  FLAGS = flags.FLAGS
  defined = set(FLAGS)
  problems = []
  tiny = os.path.join(config_lib.CONFIGS_DIR, "tiny.py")
  for command in commands:
    args = list(command["args"])
    own = args[:args.index("--")] if "--" in args else args
    own = [_sample(arg, FLAGS) for arg in own]
    try:
      if cli._has_config():
        own = cli._resolve_config_args(own)
        own = [_without_run_argument(arg, tiny) for arg in own]
        cli._check_config_args(own)
      sys.argv = [module_name, *own]
      FLAGS(sys.argv)
      if cli._has_config() and FLAGS["config"].value is not None:
        config_lib.validate(FLAGS["config"].value)
      if not command["elided"]:
        missing = [name for name in required
                   if not any(re.match(rf"--?{name}(=.|$)", arg) for arg in own)]
        if missing:
          raise UserError(f"required --{', --'.join(missing)} left out")
      if command["expect_error"]:
        problems.append(f"{command['source']}: {command['text']}: shown failing, but its "
                        "arguments parse")
    except (Exception, SystemExit) as error:  # noqa: BLE001 (each is a problem to report)
      if not command["expect_error"]:
        message = " ".join(str(error).split()) or type(error).__name__
        problems.append(f"{command['source']}: {command['text']}: {message}")
    finally:
      FLAGS.unparse_flags()
      for name in set(FLAGS) - defined:  # the config's overrides, defined as it is parsed
        delattr(FLAGS, name)
  return problems


def _required(source: str) -> tuple[str, ...]:
  """The flags a launcher requires: the `required=` of its `cli.run(...)` call."""
  import ast  # noqa: PLC0415
  with open(source) as f:
    tree = ast.parse(f.read())
  for node in ast.walk(tree):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr == "run" and getattr(node.func.value, "id", "") == "cli"):
      for keyword in node.keywords:
        if keyword.arg == "required":
          return tuple(ast.literal_eval(keyword.value))
  return ()


def _sample(arg: str, flag_values) -> str:
  """`--name=N` with a number for N where the flag (or the config key) takes one."""
  match = re.match(r"(--?)([\w.]+)=(.*)$", arg)
  if not match or not _PLACEHOLDER.match(match.group(3)):
    return arg
  dashes, name, _ = match.groups()
  if name in flag_values:
    kind = flag_values[name].flag_type()
    if kind in ("int", "float"):
      return f"{dashes}{name}=1"
    return arg
  if name.startswith("config."):
    from wnscale import config as config_lib  # noqa: PLC0415
    value = config_lib.default_config()
    try:
      for key in name.split(".")[1:]:
        value = value[key]
    except (KeyError, AttributeError):
      return arg
    if isinstance(value, (int, float)) and not isinstance(value, bool):
      return f"{dashes}{name}=1"
  return arg


def _without_run_argument(arg: str, stand_in: str) -> str:
  """`--config=.../imported.py:RUN` of a run directory that is a placeholder: the tiny
  config stands in for the run's (the same keys: its overrides are checked the same)."""
  match = re.match(r"(--?config=)([^:]+):(.*)$", arg)
  if match and not os.path.isdir(match.group(3)):
    return match.group(1) + stand_in
  return arg


def main(argv: list[str]) -> int:
  for arg in argv:
    if arg.startswith("--check_module="):
      commands = json.loads(sys.stdin.read())
      problems = _check_module(arg.split("=", 1)[1], commands)
      sys.stdout.write("\n" + json.dumps(problems) + "\n")
      return 0
  commands = all_commands()
  problems = check(commands)
  for problem in problems:
    print(problem)
  print(f"{len(commands)} commands in {len(documents())} documents; {len(problems)} "
        "problem(s).")
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
