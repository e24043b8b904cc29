"""Writes docs/config_reference.md: every config key, its default and its meaning.

  python -m tools.config_reference > docs/config_reference.md

The keys and defaults are `wnscale.config.default_config()`'s; the meaning of a key
is the comment beside it in wnscale/config.py (the comment on its line, or on the
lines of a statement that spans several, and the comment lines that follow it up to
the next blank or code line), or, for a key a component owns (a processor's, the
remat's, a loss's: `wnscale.config.owned_settings`), the meaning its settings declare.
tests/test_docs.py fails when the file is out of date, and when a key has no meaning.
"""

from __future__ import annotations

import ast
import io
import os
import sys
import tokenize

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import ml_collections  # noqa: E402

from wnscale import config as config_lib  # noqa: E402

SOURCE = os.path.join(os.path.dirname(os.path.abspath(config_lib.__file__)), "config.py")
COMMAND = "python -m tools.config_reference > docs/config_reference.md"
# What each section is for (a section without an entry gets no sentence).
SECTIONS = {
    "model": "The network: its sizes, its processor, rematerialization and numerics "
             "(`wnscale.specs.ModelSpec`).",
    "mesh": "How the devices are laid out: the batch axis and the graph (space) axis "
            "(`wnscale.specs.MeshSpec`).",
    "data": "What the model reads and predicts, from which store, over which times "
            "(`wnscale.specs.DataSpec`).",
    "train": "The optimizer, the schedule, the loss, checkpoints and evaluation "
             "(`wnscale.specs.TrainSpec`).",
}


def key_comments(source: str, owned: dict[str, str]) -> dict[str, str]:
  """`{"section.key": comment}` for every key `default_config` assigns in `source`, in
  the order of the source (top-level keys: `{"seed": ...}`); where it updates a section
  (`m.update(...)`: the keys components own), `owned`'s keys of that section."""
  tree = ast.parse(source)
  function = next(node for node in tree.body
                  if isinstance(node, ast.FunctionDef) and node.name == "default_config")
  comments, code_lines = _comments_and_code_lines(source)
  aliases = {}  # variable name -> section path ("" for the root config)
  keys = {}
  for statement in function.body:
    if (isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Call)
        and _is_config_dict(statement.value)):
      section = None
      for target in statement.targets:
        if isinstance(target, ast.Name) and section is None:
          aliases[target.id] = ""  # the root: c = ml_collections.ConfigDict()
        elif isinstance(target, ast.Attribute):
          section = _path(target, aliases)
      for target in statement.targets:
        if isinstance(target, ast.Name) and section is not None:
          aliases[target.id] = section
      continue
    if _is_section_update(statement):
      section = aliases[statement.value.func.value.id]
      keys |= {path: meaning for path, meaning in owned.items()
               if path.rpartition(".")[0] == section}
      continue
    if not isinstance(statement, ast.Assign):
      continue
    text = _comment(statement, comments, code_lines)
    for target in statement.targets:
      for element in (target.elts if isinstance(target, ast.Tuple) else [target]):
        if isinstance(element, ast.Attribute):
          keys[_path(element, aliases)] = text
  return keys


def _is_section_update(statement: ast.stmt) -> bool:
  """Whether `statement` is `<section>.update(...)`."""
  call = getattr(statement, "value", None)
  return (isinstance(statement, ast.Expr) and isinstance(call, ast.Call)
          and isinstance(call.func, ast.Attribute) and call.func.attr == "update"
          and isinstance(call.func.value, ast.Name))


def _is_config_dict(call: ast.Call) -> bool:
  function = call.func
  name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
  return name == "ConfigDict"


def _path(target: ast.Attribute, aliases: dict[str, str]) -> str:
  """`m.latent_size` -> "model.latent_size", `c.mesh.data` -> "mesh.data"."""
  names = []
  node = target
  while isinstance(node, ast.Attribute):
    names.append(node.attr)
    node = node.value
  if not isinstance(node, ast.Name) or node.id not in aliases:
    raise ValueError(f"line {target.lineno}: cannot tell which config this assigns to")
  prefix = aliases[node.id]
  return ".".join(([prefix] if prefix else []) + names[::-1])


def _comments_and_code_lines(source: str) -> tuple[dict[int, str], set[int]]:
  """The comment on each line (without `#`), and the lines that hold code."""
  comments, code_lines = {}, set()
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type == tokenize.COMMENT:
      comments[token.start[0]] = token.string.lstrip("#").strip()
    elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                            tokenize.ENDMARKER):
      code_lines.update(range(token.start[0], token.end[0] + 1))
  return comments, code_lines


def _comment(statement: ast.stmt, comments: dict[int, str], code_lines: set[int]) -> str:
  """The comments on the statement's lines, then the comment lines that follow it."""
  parts = [comments[line] for line in range(statement.lineno, statement.end_lineno + 1)
           if line in comments]
  line = statement.end_lineno + 1
  while line in comments and line not in code_lines:
    parts.append(comments[line])
    line += 1
  return " ".join(part for part in parts if part)


def _leaf_paths(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  paths = []
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      paths.extend(_leaf_paths(value, prefix + key + "."))
    else:
      paths.append(prefix + key)
  return paths


def owned_meanings() -> dict[str, str]:
  """`{"section.key": meaning}` of the keys components own (`config.owned_settings`)."""
  return {f"{settings.SECTION}.{key}": meaning for settings in config_lib.owned_settings()
          for key, meaning in settings.meanings().items()}


def reference() -> dict[str, list[tuple[str, object, str]]]:
  """`{section: [(key, default, meaning), ...]}` in the source's order (section "" holds
  the top-level keys).

  Raises:
    ValueError: the source's keys (the owned keys included) are not `default_config()`'s.
  """
  with open(SOURCE) as f:
    meanings = key_comments(f.read(), owned_meanings())
  config = config_lib.default_config()
  leaves = _leaf_paths(config)
  if sorted(leaves) != sorted(meanings):
    raise ValueError(f"{SOURCE}: keys read from default_config's source "
                     f"{sorted(set(meanings) - set(leaves))} and keys of default_config() "
                     f"{sorted(set(leaves) - set(meanings))} differ")
  sections = {}
  for path, meaning in meanings.items():
    section, _, key = path.rpartition(".")
    value = config
    for name in path.split("."):
      value = value[name]
    sections.setdefault(section, []).append((key, value, meaning))
  return sections


def undocumented() -> list[str]:
  """The keys without a meaning (a comment in wnscale/config.py, or their settings')."""
  return [f"{section}.{key}".lstrip(".") for section, rows in reference().items()
          for key, _, meaning in rows if not meaning]


def _cell(text: str) -> str:
  """`text` for a markdown table cell: pipes escaped, and outside code spans, `<`
  escaped (so `<cache dir>` is not read as an HTML tag)."""
  parts = text.replace("|", "\\|").split("`")
  for index in range(0, len(parts), 2):
    parts[index] = parts[index].replace("<", "&lt;").replace(">", "&gt;")
  return "`".join(parts)


def _default(value) -> str:
  text = repr(value)
  return f"`{_cell(text)}`" if "`" not in text else _cell(text)


def markdown() -> str:
  lines = [
      "# Config reference",
      "",
      "<!-- Generated from wnscale/config.py by `" + COMMAND + "`; do not edit. -->",
      "",
      "Every key of a wnscale config, its default (`wnscale.config.default_config()`) and "
      "its meaning (the comment beside it in `wnscale/config.py`). A config file in "
      "`configs/` starts from these defaults and changes some (`configs/tiny.py` changes "
      "one: `data.synthetic=True`); any key can be overridden on the command line as "
      "`--config.section.key=value`, e.g. `--config.train.steps=500`, "
      "`--config.data.pressure_levels='(500, 850)'`. An unknown key is an error that names "
      "the nearest one; `wnscale.config.validate` checks values and combinations before "
      "anything is built.",
      "",
  ]
  for section, rows in reference().items():
    lines.append(f"## `{section}`" if section else "## Top level")
    lines.append("")
    if SECTIONS.get(section):
      lines += [SECTIONS[section], ""]
    lines += ["| key | default | meaning |", "|---|---|---|"]
    for key, value, meaning in rows:
      name = f"{section}.{key}" if section else key
      lines.append(f"| `{name}` | {_default(value)} | {_cell(meaning)} |")
    lines.append("")
  return "\n".join(lines)


if __name__ == "__main__":
  sys.stdout.write(markdown())
