"""The user-facing docs: every relative link lands, the README stays short."""

import json
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", ROOT / "criteo" / "README.md",
               *(ROOT / "docs").glob("*.md")])
# [text](target), images included; code blocks are left out.
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$", re.M)


def slug(heading: str) -> str:
  """GitHub's anchor for a heading: lower case, spaces to `-`, and every
  character that is not a letter, digit, `-` or `_` dropped."""
  return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def _anchors(path: pathlib.Path) -> set[str]:
  text = _FENCE.sub("", path.read_text())
  return {slug(h) for h in _HEADING.findall(text)}


def _links(path: pathlib.Path) -> list[str]:
  return _LINK.findall(_FENCE.sub("", path.read_text()))


@pytest.mark.parametrize("heading, expected", [
    ("Criteo L4: the agent against AUTOTUNE and the oracle",
     "criteo-l4-the-agent-against-autotune-and-the-oracle"),
    ("The simulator (`intune_tf/sim/simulator.py`)",
     "the-simulator-intune_tfsimsimulatorpy"),
    ("Throughput: 2 workers against 1", "throughput-2-workers-against-1"),
])
def test_slug(heading, expected):
  assert slug(heading) == expected


def test_the_docs_are_found():
  names = {p.relative_to(ROOT).as_posix() for p in DOCS}
  assert {"README.md", "docs/architecture.md", "docs/agent.md",
          "docs/benchmarks.md", "docs/options.md"} <= names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_lands(doc):
  broken = []
  for link in _links(doc):
    if re.match(r"[a-z]+:", link):  # http:, https:, mailto:
      continue
    target, _, anchor = link.partition("#")
    path = (doc.parent / target).resolve() if target else doc
    if not path.exists():
      broken.append(f"{link}: no file {path.relative_to(ROOT)}")
    elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
      broken.append(f"{link}: no heading #{anchor} in "
                    f"{path.relative_to(ROOT)}")
  assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_readme_stays_short():
  lines = (ROOT / "README.md").read_text().count("\n")
  assert lines <= 200, f"README.md has {lines} lines; details go in docs/"


def test_no_top_level_file_beyond_the_layout():
  # The layout the project keeps: code folders, tests, build files and
  # user docs; everything else lives under docs/ or intune_tf/.
  allowed = {"intune_tf", "rewrites", "criteo", "tests", "setup.py", "BUILD",
             "README.md", "Makefile", "docs", "benchmarks", "examples",
             "requirements", "pyproject.toml", ".ci", ".gitignore",
             "tools", "MANIFEST.in",  # build and wheel tools, sdist list
             "LICENSE", "CHANGELOG.md"}
  listed = subprocess.run(["git", "-C", str(ROOT), "ls-files"],
                          capture_output=True, text=True, check=True).stdout
  top = {line.split("/")[0] for line in listed.splitlines()}
  assert "intune_tf" in top
  assert top <= allowed, sorted(top - allowed)


# A command inside backticks: `intune ...`, `python ...`, `make ...`, maybe
# after `cd DIR && ` or an environment assignment.
_COMMAND = re.compile(
    r"(?:^|`)(?:cd \S+ && )?(?:[A-Z_]+=\S+ )*(?:intune|python3?|make) ", re.M)


def _sections(text: str) -> dict[str, str]:
  """`## ` heading -> its text up to the next `## ` heading."""
  parts = re.split(r"^## (.*)$", text, flags=re.M)
  return dict(zip(parts[1::2], parts[2::2]))


@pytest.mark.parametrize("text, expected", [
    ("## A\nCommand: `intune bench --repeats 5`\n| x |\n", []),
    ("## A\n`cd benchmarks && python x.py 3`\n", []),
    ("## A\n```\nINTUNE_X=5 python -m pytest t.py\n```\n", []),
    ("## A\n| x |\n## B\n`make wheel`\n", ["A"]),
    ("## A\nthe intune policy, no command\n", ["A"]),
])
def test_sections_without_a_command_are_found(text, expected):
  assert [h for h, body in _sections(text).items()
          if not _COMMAND.search(body)] == expected


def test_benchmarks_holds_current_figures_each_with_its_command():
  text = (ROOT / "docs" / "benchmarks.md").read_text()
  lines = text.count("\n")
  assert lines <= 300, f"docs/benchmarks.md has {lines} lines; at most 300"
  sections = _sections(text)
  assert len(sections) >= 5
  missing = [h for h, body in sections.items() if not _COMMAND.search(body)]
  assert not missing, f"sections without a command in backticks: {missing}"


# The `intune` command's tree, dumped by a process that may load TensorFlow
# (this module runs with TensorFlow refused): {"intune bench": [flags]}.
_DUMP_COMMANDS = """
import argparse, json
from intune_tf import cli

def walk(parser, path):
  out = {" ".join(path): sorted(
      f for a in parser._actions for f in a.option_strings)}
  for a in parser._actions:
    if isinstance(a, argparse._SubParsersAction):
      for name, sub in a.choices.items():
        out.update(walk(sub, path + [name]))
  return out

print(json.dumps(walk(cli.parser(), ["intune"])))
"""
# `...` spans (they may wrap lines) and fenced blocks, code blocks of Python
# left out.
_SPAN = re.compile(r"`([^`]+)`")
# Fenced blocks, indented ones (in a list) included.
_ANY_FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.S | re.M)
_PYTHON_FENCE = re.compile(r"^[ \t]*```python.*?^[ \t]*```", re.S | re.M)
_WORDS = ("intune", "make", "python", "python3")
# Folders of the project's own scripts; other scripts are the user's.
_SCRIPT_FOLDERS = ("benchmarks/", "tools/", "examples/", "criteo/")


def commands_in(text: str) -> list[tuple[str, str]]:
  """The shell commands a doc shows, each with the folder it runs in (`.`,
  or DIR after `cd DIR && `): each line of a fenced block (a trailing
  backslash joins the next) and each inline span that starts with one of
  _WORDS, after VAR=value assignments."""
  text = _PYTHON_FENCE.sub("", text)
  found = []
  for block in _ANY_FENCE.findall(text):
    body = re.sub(r"\\\n\s*", " ", block)
    found += body.splitlines()[1:-1]
  found += _SPAN.findall(_ANY_FENCE.sub("", text))
  out = []
  for candidate in found:
    folder = "."
    for part in candidate.split("&&"):
      try:
        words = shlex.split(part, comments=True)
      except ValueError:  # an unclosed quote: not a command
        continue
      while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words = words[1:]
      if words[:1] == ["cd"] and len(words) == 2:
        folder = words[1]
      # `intune bench: error: ...` is a command's output.
      elif (len(words) > 1 and words[0] in _WORDS
            and not words[1].endswith(":")):
        out.append((folder, shlex.join(words)))
  return out


def _makefile_targets() -> set[str]:
  text = (ROOT / "Makefile").read_text()
  return set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M))


def problem(command: str, tree: dict[str, list[str]], targets: set[str],
            cwd: pathlib.Path) -> str | None:
  """Why `command` is not known to the `intune` command, the Makefile or
  the script it runs (None: it is)."""
  words = shlex.split(command)
  if words[0] == "make":
    unknown = [w for w in words[1:] if not w.startswith("-")
               and "=" not in w and w not in targets]
    return f"no Makefile target {unknown}" if unknown else None
  if words[0] in ("python", "python3"):
    if words[1] == "-m" and words[2:3] == ["intune_tf"]:
      words = ["intune", *words[3:]]
    elif words[1].startswith("-"):
      return None  # python -c ..., python -m pytest ...
    else:
      script = cwd / words[1]
      if cwd == ROOT and not words[1].startswith(_SCRIPT_FOLDERS):
        return None  # the user's own script (`python train.py`)
      if not script.is_file():
        return f"no script {words[1]}"
      source = script.read_text()
      unknown = [f for f in _flags(words[2:]) if f'"{f}"' not in source]
      return f"{words[1]} has no flag {unknown}" if unknown else None
  path = "intune"
  for word in words[1:]:
    if word.startswith("-"):
      break
    if f"{path} {word}" in tree:
      path = f"{path} {word}"
    elif path == "intune" and not word.isupper():
      return f"no command intune {word}"
    else:
      break
  unknown = [f for f in _flags(words) if f not in tree[path]]
  return f"{path} has no flag {unknown}" if unknown else None


def _flags(words: list[str]) -> list[str]:
  return [w.split("=")[0] for w in words if w.startswith("--")]


@pytest.mark.parametrize("command, known", [
    ("intune bench --repeats 5", True),
    ("intune bench --no-such-flag", False),
    ("intune service worker --port 5051", True),
    ("intune service worker --port 'x --no-such-flag'", True),
    ("intune nothing", False),
    ("intune COMMAND --help", True),
    ("make test", True),
    ("make -j2 wheel", True),
    ("make nothing", False),
    ("python benchmarks/cache.py --epoch-mb 300", True),
    ("python benchmarks/cache.py --no-such-flag", False),
    ("python benchmarks/missing.py", False),
    ("python train.py --anything", True),
    ("python -m intune_tf bench --repeats 2", True),
])
def test_problem_finds_unknown_commands(command, known):
  tree = {"intune": ["--help"], "intune bench": ["--help", "--repeats"],
          "intune service": ["--help"],
          "intune service worker": ["--help", "--port"]}
  assert (problem(command, tree, _makefile_targets(), ROOT) is None) == known


def test_commands_are_found_in_text():
  text = ("Run `make demo`, then\n```\nintune try a.py:f \\\n  --epochs 2\n"
          "make test  # all\nintune bench: error: no\n```\nor `cd benchmarks"
          " && python x.py\n--y 1` (`intune_tf.tune`).\n- a list:\n"
          "  ```python\n  python = `make x`\n  ```\n"
          "`intune a --c 'k --d={n}'`\n")
  assert commands_in(text) == [
      (".", "intune try a.py:f --epochs 2"), (".", "make test"),
      (".", "make demo"), ("benchmarks", "python x.py --y 1"),
      (".", "intune a --c 'k --d={n}'")]


@pytest.mark.slow
def test_every_command_in_the_docs_is_known():
  dumped = subprocess.run([sys.executable, "-c", _DUMP_COMMANDS],
                          capture_output=True, text=True, timeout=600,
                          check=True, cwd=ROOT)
  tree = json.loads(dumped.stdout.splitlines()[-1])
  targets = _makefile_targets()
  unknown = []
  for doc in DOCS:
    for folder, command in commands_in(doc.read_text()):
      why = problem(command, tree, targets, (ROOT / folder).resolve())
      if why:
        unknown.append(f"{doc.relative_to(ROOT)}: `{command}`: {why}")
  assert not unknown, "\n".join(unknown)
