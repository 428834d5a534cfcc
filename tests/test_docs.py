"""The user-facing docs: every relative link lands, the README stays short."""

import pathlib
import re
import subprocess

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
