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
             "tools", "MANIFEST.in"}  # build and wheel tools, sdist list
  listed = subprocess.run(["git", "-C", str(ROOT), "ls-files"],
                          capture_output=True, text=True, check=True).stdout
  top = {line.split("/")[0] for line in listed.splitlines()}
  assert "intune_tf" in top
  assert top <= allowed, sorted(top - allowed)
