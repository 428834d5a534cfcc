"""The C++ unit tests of tests/cc, built with plain g++ and run."""

import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Each test and the project sources it links (free of TF types).
_UNITS = {
    "budget_guard_test.cc": ["intune_tf/cc/kernels/budget_guard.cc"],
    "stage_names_test.cc": ["intune_tf/cc/kernels/stage_names.cc"],
}


@pytest.mark.slow
@pytest.mark.parametrize("test", sorted(_UNITS))
def test_cc_unit_passes(test: str, tmp_path: pathlib.Path):
  compiler = shutil.which("g++")
  assert compiler is not None, "g++ is needed to build the C++ unit tests"
  binary = tmp_path / test.removesuffix(".cc")
  sources = [str(ROOT / "tests" / "cc" / test)]
  sources += [str(ROOT / s) for s in _UNITS[test]]
  subprocess.run(
      [compiler, "-std=c++17", "-Wall", "-Werror", f"-I{ROOT}", *sources,
       "-o", str(binary)],
      check=True, capture_output=True, text=True)
  run = subprocess.run([str(binary)], capture_output=True, text=True,
                       timeout=60)
  assert run.returncode == 0, run.stdout + run.stderr
  counts = re.search(r"(\d+) passed, (\d+) failed", run.stdout)
  assert counts is not None, run.stdout
  assert int(counts.group(1)) > 0 and int(counts.group(2)) == 0, run.stdout


def test_every_cc_unit_test_is_run():
  on_disk = sorted(p.name for p in (ROOT / "tests" / "cc").glob("*_test.cc"))
  assert on_disk == sorted(_UNITS)
