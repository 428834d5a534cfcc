"""tools/kernel_build.py (used by setup.py) and BUILD describe the same
kernel sources."""

import ast
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _setup_list(name: str) -> list[str]:
  tree = ast.parse((ROOT / "tools" / "kernel_build.py").read_text())
  for node in tree.body:
    if isinstance(node, ast.Assign) and node.targets[0].id == name:
      return ast.literal_eval(node.value)
  raise AssertionError(f"{name} not found in tools/kernel_build.py")


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


def _includes(directory: str) -> dict[str, list[str]]:
  """{file: the project headers it includes} of the C++ under `directory`."""
  files = [p for p in (ROOT / directory).rglob("*")
           if p.suffix in (".cc", ".h")]
  return {str(p.relative_to(ROOT)): re.findall(
      r'^#include "((?:intune_tf|rewrites)/[^"]+)"', p.read_text(), re.M)
          for p in files}


def test_the_rewrites_and_the_kernels_do_not_include_each_other():
  # The names both use are in intune_tf/cc/op_names.h, the graph walk in
  # intune_tf/cc/graph_walk.h; the kernels reach the rewrites only through
  # rewrites/rewrite.h (the root runs the passes).
  rewrites = _includes("rewrites")
  kernels = _includes("intune_tf/cc/kernels")
  assert {f: [h for h in hs if h.startswith("intune_tf/cc/kernels/")]
          for f, hs in rewrites.items()} == {f: [] for f in rewrites}
  assert {h for hs in kernels.values() for h in hs
          if h.startswith("rewrites/")} == {"rewrites/rewrite.h"}
  assert set(rewrites["rewrites/rewrite.h"]) <= {
      "intune_tf/cc/op_names.h", "intune_tf/cc/settings_fields.h",
      "intune_tf/cc/cache_decision.h"}


def test_a_source_build_without_tensorflow_stops_at_once_saying_why():
  # As under pip's build isolation: TensorFlow cannot be imported.
  code = ("import runpy, sys; sys.modules['tensorflow'] = None; "
          "sys.argv = ['setup.py', 'bdist_wheel']; "
          "runpy.run_path('setup.py', run_name='__main__')")
  result = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          check=False)
  assert result.returncode == 1
  lines = result.stderr.strip().splitlines()
  assert lines[0] == ("error: building intune_tf from source needs "
                      "TensorFlow, and `import tensorflow`")
  assert len(lines) == 9, result.stderr
  assert "      pip install --no-build-isolation .            (in an " \
         "intune_tf checkout)" in lines
  assert result.stdout == ""  # nothing built or copied first


def _init_version() -> str:
  init = (ROOT / "intune_tf" / "__init__.py").read_text()
  return re.search(r'^__version__ = "([^"]+)"$', init, re.M).group(1)


def test_the_version_has_one_home():
  # setup.py reads it from intune_tf/__init__.py; no other file states it.
  setup = (ROOT / "setup.py").read_text()
  assert "version=_version()" in setup
  assert not re.search(r'version\s*=\s*"', setup)
  changelog = (ROOT / "CHANGELOG.md").read_text()
  assert f"## {_init_version()}" in changelog


def test_the_installed_metadata_names_the_license_and_version():
  # What `pip show intune_tf` prints, from the install the tests run on.
  from importlib import metadata  # noqa: PLC0415  only this test reads it
  meta = metadata.metadata("intune_tf")
  assert meta["Version"] == _init_version()
  license_ = meta.get("License-Expression") or meta.get("License")
  assert license_ == "Apache-2.0", dict(meta)
  files = [str(f) for f in metadata.files("intune_tf") or []]
  assert any(f.endswith("LICENSE") for f in files), files
  assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
