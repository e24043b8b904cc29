"""The documentation is true as written: its commands parse with the launchers' own flags,
the config reference is generated from wnscale/config.py, its links lead somewhere, and
the README's test command is the one CI runs."""

import importlib.util
import os
import re
import sys

import pytest

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _tool(name):
  """tools/<name>.py as a module (tools/ is outside the installed packages)."""
  spec = importlib.util.spec_from_file_location(f"tools_{name}",
                                                os.path.join(REPO, "tools", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # (dataclasses look their module up)
  spec.loader.exec_module(module)
  return module


config_reference = _tool("config_reference")
doc_commands = _tool("doc_commands")


def _read(path):
  with open(os.path.join(REPO, path)) as f:
    return f.read()


# --- The config reference ------------------------------------------------------------------

def test_the_config_reference_is_up_to_date():
  assert _read("docs/config_reference.md") == config_reference.markdown(), (
      "docs/config_reference.md is out of date with wnscale/config.py: run "
      f"`{config_reference.COMMAND}`")


def test_every_config_key_has_its_meaning_beside_it():
  assert config_reference.undocumented() == [], (
      "config keys without a comment in wnscale/config.py (the comment after a key is its "
      "documentation)")


def test_the_reference_reads_each_keys_own_comment():
  sections = config_reference.reference()
  assert list(sections) == ["", "model", "mesh", "data", "train"]
  rows = {f"{section}.{key}".lstrip("."): (value, meaning)
          for section, entries in sections.items() for key, value, meaning in entries}
  assert rows["seed"] == (0, "seeds parameter init, data shuffling and the synthetic store")
  assert rows["mesh.exchange"][1] == "how shards get remote sender rows: all_gather | halo"
  # A multi-line statement's trailing comment, then the comment lines after it.
  value, meaning = rows["data.variables"]
  assert value[0] == "temperature" and meaning == ("state variables (inputs and targets), "
                                                   "WeatherBench2 names")
  assert rows["model.regional_mesh_levels"][1].endswith("interaction_network processor only")
  table = config_reference.markdown()
  assert "| `mesh.exchange` | `'all_gather'` | how shards get remote sender rows: all_gather \\| " \
         "halo |" in table
  assert "&lt;cache dir&gt;/stats" in table  # not an HTML tag


# --- Commands --------------------------------------------------------------------------------

def test_every_documented_command_parses():
  """Each `python -m launch.<name> ...` of README.md and docs/*.md, parsed by the launcher's
  flags (config file, `--config.a.b` keys and values, required flags): a renamed flag or
  config key fails here."""
  commands = doc_commands.all_commands()
  sources = {command.source.split(":")[0] for command in commands}
  assert "README.md" in sources and len(sources) >= 8, sources
  assert len(commands) >= 60
  problems = doc_commands.check(commands)
  assert not problems, ("Commands in the documentation that do not parse "
                        "(python -m tools.doc_commands lists them):\n" + "\n".join(problems))


def test_the_check_finds_what_is_wrong(tmp_path):
  page = tmp_path / "page.md"
  page.write_text("\n".join([
      "```bash",
      "python -m launch.train --config=configs/tiny.py --config.train.stepz=3 --workdir=W",
      "python -m launch.train --config=tiny --config.train.steps=many --workdir=W",
      "python -m launch.train --config=configs/tiny.py --config.train.steps=0 --workdir=W",
      "python -m launch.train --config=configs/tiny.py --no_such_flag=1 --workdir=W",
      "python -m launch.train --config=configs/tiny.py",
      "python -m launch.train --config=tiny_typo --workdir=W",
      "F='--config.model.bogus=1'",
      "python -m launch.local_cluster --num_processes=2 -- --config=tiny $F \\",
      "    --workdir=W  # each process's flags after --",
      "python -m launch.train --config=imported:RUN --config.train.steps=N --workdir=W && ls",
      "```",
      "",
      "Inline: `python -m launch.train --config=configs/tiny.py [--config.train.steps=N] ...`,",
      "`python -m launch.train --workdir=W --config=configs/tiny.py",
      "--config.data.gird=O32`.",
      "",
      "```",
      "$ python -m launch.train --config=configs/tiny.py --workdir=/tmp/run",
      "error: shown failing",
      "```",
  ]))
  commands = doc_commands.commands_in(str(page), str(tmp_path))
  problems = doc_commands.check(commands)
  expected = [
      ("page.md:2", "Unknown config key 'train.stepz'; did you mean train.steps?"),
      ("page.md:3", "flag --config.train.steps=many"),
      ("page.md:4", "train.steps=0 must be >= 1"),
      ("page.md:5", "Unknown command line flag 'no_such_flag'"),
      ("page.md:6", "required --workdir left out"),
      ("page.md:7", "config=tiny_typo: no such config file"),
      ("page.md:9", "Unknown config key 'model.bogus'"),
      ("page.md:15", "Unknown config key 'data.gird'; did you mean data.grid?"),
      ("page.md:19", "shown failing, but its arguments parse"),
  ]
  assert len(problems) == len(expected), "\n".join(problems)
  for source, fragment in expected:
    assert any(p.startswith(source + ": ") and fragment in p for p in problems), (
        source, fragment, problems)


def test_the_readme_gives_the_two_commands_ci_and_users_run():
  readme = _read("README.md")
  assert len(readme.splitlines()) <= 300
  blocks = [text for _, text, fenced in doc_commands.code(os.path.join(REPO, "README.md"))
            if fenced]
  lines = [line.strip() for block in blocks for line in block.splitlines()]
  assert any(re.fullmatch(r"python -m launch\.train --config=configs/tiny\.py --workdir=\S+",
                          line) for line in lines), lines
  test_command = "pip install -e '.[test,tpu]' && pytest -q"
  assert test_command in lines
  ci = [line.strip() for line in _read(".ci/run").splitlines()
        if line.strip() and not line.startswith("#")]
  assert ci[-1] == test_command, f".ci/run must run the README's test command: {ci[-1]}"


# --- Links and files -------------------------------------------------------------------------

def _slug(heading: str) -> str:
  """GitHub's anchor of a heading."""
  text = heading.strip().lower().replace("`", "")
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def _anchors(path: str) -> set[str]:
  anchors, seen = set(), {}
  in_fence = False
  with open(path) as f:
    for line in f:
      if line.lstrip().startswith(("```", "~~~")):
        in_fence = not in_fence
      match = None if in_fence else re.match(r"#{1,6} (.*)", line)
      if match:
        slug = _slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
  return anchors


@pytest.mark.parametrize("page", [os.path.relpath(p, REPO) for p in doc_commands.documents()])
def test_links_lead_somewhere(page):
  path = os.path.join(REPO, page)
  text = re.sub(r"```.*?```", "", _read(page), flags=re.DOTALL)
  broken = []
  for target in re.findall(r"\]\(([^)\s]+)\)", text):
    if re.match(r"[a-z]+:", target):
      continue  # a URL
    file, _, anchor = target.partition("#")
    linked = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
    if not os.path.exists(linked):
      broken.append(f"{target}: no file {os.path.relpath(linked, REPO)}")
    elif anchor and linked.endswith(".md") and anchor not in _anchors(linked):
      broken.append(f"{target}: no heading #{anchor} in {os.path.relpath(linked, REPO)}")
  assert not broken, f"{page}: " + "; ".join(broken)


def test_the_scripts_the_documentation_names_exist():
  missing = []
  for path in doc_commands.documents():
    text = open(path).read()
    for script in re.findall(r"(?:python3?|bash) ((?:bench|tools)/[\w/]+\.(?:py|sh))", text):
      if not os.path.exists(os.path.join(REPO, script)):
        missing.append(f"{os.path.relpath(path, REPO)}: {script}")
    for module in re.findall(r"python3? -m (tools\.\w+)", text):
      if not os.path.exists(os.path.join(REPO, *module.split(".")) + ".py"):
        missing.append(f"{os.path.relpath(path, REPO)}: {module}")
  assert not missing, missing
