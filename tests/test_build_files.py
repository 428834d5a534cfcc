"""setup.py and BUILD describe the same kernel sources."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _setup_list(name: str) -> list[str]:
  tree = ast.parse((ROOT / "setup.py").read_text())
  for node in tree.body:
    if isinstance(node, ast.Assign) and node.targets[0].id == name:
      return ast.literal_eval(node.value)
  raise AssertionError(f"{name} not found in setup.py")


def test_build_and_setup_list_the_same_sources():
  build = (ROOT / "BUILD").read_text()
  srcs = re.search(r"srcs\s*=\s*\[(.*?)\]", build, re.S).group(1)
  bazel = sorted(re.findall(r'"([^"]+)"', srcs))
  setup = sorted(_setup_list("KERNEL_SOURCES") + _setup_list("KERNEL_HEADERS"))
  assert bazel == setup


def test_every_cc_file_is_listed():
  on_disk = sorted(str(p.relative_to(ROOT))
                   for directory in ("intune_tf/cc", "rewrites")
                   for p in (ROOT / directory).rglob("*")
                   if p.suffix in (".cc", ".h"))
  assert on_disk == sorted(_setup_list("KERNEL_SOURCES") +
                           _setup_list("KERNEL_HEADERS"))
