"""Installs the wheel on every TensorFlow minor and Python, with no compiler.

For each (Python, TensorFlow minor): a fresh venv, `CC`/`CXX` unset and a
PATH that holds no compiler, `uv pip install --only-binary :all:` of the
wheel and that minor's tensorflow-cpu, then the tests (the smoke subset, or
with `--write-docs` also the conformance suite and the kernel tests) run
against the installed package. Prints one row per pair; `--write-docs`
writes the table into docs/compatibility.md and a summary into the README.

    python tools/matrix.py --wheel dist/intune_tf-*.whl --minors 16 21 \\
        --pythons 3.11=/usr/bin/python3 [--smoke | --write-docs]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(ROOT, "build", "matrix")
SMOKE_TESTS = ["tests/test_install.py"]
FULL_TESTS = SMOKE_TESTS + ["tests/test_kernels.py",
                            "tests/test_tf_versions.py",
                            "tests/test_conformance.py"]
# Executables that compile C or C++; kept off the venvs' PATH.
_COMPILER = re.compile(
    r"(.*-)?(gcc|g\+\+|cc|c\+\+|cpp|c89|c99|clang|clang\+\+|icc|icpx)"
    r"(-[\d.]+)?")
_DOCS = os.path.join(ROOT, "docs", "compatibility.md")
_README = os.path.join(ROOT, "README.md")
_BEGIN, _END = "<!-- matrix:begin -->", "<!-- matrix:end -->"


@dataclasses.dataclass
class Row:
  python: str
  minor: str
  tf_version: str = "?"
  result: str = "not run"
  ok: bool = False
  install_s: float = 0.0
  tests_s: float = 0.0


def no_compiler_path() -> str:
  """A folder of links to every program on PATH except compilers."""
  folder = os.path.join(WORK, "bin-without-compilers")
  shutil.rmtree(folder, ignore_errors=True)
  os.makedirs(folder)
  for directory in os.environ["PATH"].split(os.pathsep):
    if not os.path.isdir(directory) or "shims" in directory:
      continue
    for name in os.listdir(directory):
      path = os.path.join(directory, name)
      target = os.path.join(folder, name)
      if (_COMPILER.fullmatch(name) or os.path.lexists(target) or
          not os.access(path, os.X_OK) or os.path.isdir(path)):
        continue
      os.symlink(os.path.realpath(path), target)
  return folder


def _env(path: str, venv: str | None = None) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items()
         if k not in ("CC", "CXX", "VIRTUAL_ENV", "PYTHONPATH")}
  env["PATH"] = path
  env["TF_CPP_MIN_LOG_LEVEL"] = "2"
  if venv:
    env["VIRTUAL_ENV"] = venv
  return env


def _summary(output: str) -> str:
  """pytest's last line: '12 passed, 1 failed in 80.1s' -> '12 passed, 1
  failed'."""
  lines = [l for l in output.strip().splitlines() if " in " in l and
           re.search(r"\d+ (passed|failed|error)", l)]
  if not lines:
    return "no result"
  return re.sub(r"\s+in [\d.]+s.*$", "", lines[-1].strip("= "))


def run_one(uv: str, wheel: str, python: str, interpreter: str, minor: str,
            tests: list[str], path: str) -> Row:
  row = Row(python, f"2.{minor}")
  venv = os.path.join(WORK, f"py{python}-tf2_{minor}")
  shutil.rmtree(venv, ignore_errors=True)
  start = time.monotonic()
  steps = [
      [uv, "venv", "-q", "-p", interpreter, venv],
      [uv, "pip", "install", "-q", "--only-binary", ":all:",
       f"{wheel}[tensorflow-cpu]", f"tensorflow-cpu==2.{minor}.*",
       "pytest>=8,<10", "pytest-timeout>=2.3,<3"],
  ]
  for step in steps:
    result = subprocess.run(step, env=_env(path, venv), capture_output=True,
                            text=True, check=False)
    if result.returncode != 0:
      row.result = "install failed: " + result.stderr.strip()[-300:]
      return row
  row.install_s = time.monotonic() - start
  python_exe = os.path.join(venv, "bin", "python")
  check = subprocess.run(
      [python_exe, "-c",
       "import shutil, tensorflow as tf, intune_tf, sys; "
       "c = [n for n in ('gcc', 'g++', 'cc', 'c++', 'clang') "
       "if shutil.which(n)]; "
       "print(tf.__version__, intune_tf.__file__, c)"],
      env=_env(path, venv), capture_output=True, text=True, check=False,
      cwd=WORK)
  if check.returncode != 0:
    row.result = "import failed: " + check.stderr.strip()[-300:]
    return row
  version, location, compilers = check.stdout.split(maxsplit=2)
  row.tf_version = version
  if not location.startswith(venv) or compilers.strip() != "[]":
    row.result = f"bad setup: {location} {compilers.strip()}"
    return row
  start = time.monotonic()
  result = subprocess.run(
      [os.path.join(venv, "bin", "pytest"), "-q", "-p", "no:cacheprovider",
       "-c", os.path.join(ROOT, "pyproject.toml"), *tests],
      env=_env(path, venv), capture_output=True, text=True, check=False,
      cwd=ROOT)
  row.tests_s = time.monotonic() - start
  row.result = _summary(result.stdout)
  row.ok = result.returncode == 0
  with open(venv + ".log", "w") as f:
    f.write(result.stdout + result.stderr)
  return row


def _uv() -> str:
  """uv's executable itself (a pyenv shim needs pyenv on PATH)."""
  uv = shutil.which("uv")
  if uv is None:
    raise SystemExit("uv not found on PATH")
  if os.sep + "shims" + os.sep in uv:
    uv = subprocess.run(["pyenv", "which", "uv"], capture_output=True,
                        text=True, check=True).stdout.strip()
  return os.path.realpath(uv)


def table(rows: list[Row]) -> str:
  lines = ["| TensorFlow | Python | result | tests | install + tests |",
           "|---|---|---|---|---|"]
  for r in rows:
    status = "passed" if r.ok else "FAILED"
    lines.append(f"| {r.minor} ({r.tf_version}) | {r.python} | {status} | "
                 f"{r.result} | {r.install_s:.0f} s + {r.tests_s:.0f} s |")
  return "\n".join(lines)


def readme_table(rows: list[Row], minors: list[str]) -> str:
  """One row per Python, one column per TensorFlow minor."""
  columns = [f"2.{m}" for m in minors]
  lines = ["| Python | " + " | ".join(columns) + " |",
           "|---" * (len(columns) + 1) + "|"]
  for python in dict.fromkeys(r.python for r in rows):
    cells = {r.minor: "passed" if r.ok else "FAILED"
             for r in rows if r.python == python}
    lines.append(f"| {python} | " + " | ".join(
        cells.get(c, "not run") for c in columns) + " |")
  return "\n".join(lines)


def _replace_readme_table(text: str) -> None:
  """Replaces the README's table that starts with `| Python |`."""
  with open(_README) as f:
    lines = f.read().split("\n")
  start = next((i for i, l in enumerate(lines)
                if l.startswith("| Python | 2.")), None)
  if start is None:
    raise SystemExit(f"{_README} has no table starting with '| Python | 2.'")
  end = start
  while end < len(lines) and lines[end].startswith("|"):
    end += 1
  lines[start:end] = text.split("\n")
  with open(_README, "w") as f:
    f.write("\n".join(lines))


def _replace_between(path: str, text: str) -> None:
  with open(path) as f:
    content = f.read()
  if _BEGIN not in content or _END not in content:
    raise SystemExit(f"{path} has no {_BEGIN} ... {_END} markers")
  head, rest = content.split(_BEGIN, 1)
  tail = rest.split(_END, 1)[1]
  with open(path, "w") as f:
    f.write(f"{head}{_BEGIN}\n{text}\n{_END}{tail}")


def write_docs(rows: list[Row], wheel: str, tests: list[str],
               minors: list[str]) -> None:
  day = datetime.date.today().isoformat()
  command = " ".join(["python3 tools/matrix.py"] + [
      os.path.relpath(a, ROOT) if a.startswith(ROOT) else a
      for a in sys.argv[1:]])
  text = (f"{table(rows)}\n\n`{command}` on {day}: "
          f"`{os.path.basename(wheel)}` installed with "
          "`--only-binary :all:` into a fresh venv per row, no compiler on "
          f"PATH, then `pytest {' '.join(tests)}`.")
  _replace_between(_DOCS, text)
  _replace_readme_table(readme_table(rows, minors))


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--wheel", required=True)
  parser.add_argument("--minors", nargs="+", required=True,
                      help="TensorFlow 2.x minors, e.g. 16 21")
  parser.add_argument("--pythons", nargs="+", required=True,
                      help="version=interpreter, e.g. 3.11=/usr/bin/python3")
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument("--smoke", action="store_true",
                    help=f"run only {' '.join(SMOKE_TESTS)}")
  mode.add_argument("--write-docs", action="store_true",
                    help="write the table into docs and README")
  parser.add_argument("--jobs", type=int, default=1,
                      help="rows run at once (default 1)")
  parser.add_argument("--tests", nargs="+", default=None,
                      help="test files to run instead (default: the smoke "
                      "subset with --smoke, else the full list)")
  args = parser.parse_args(argv)
  uv = _uv()
  os.makedirs(WORK, exist_ok=True)
  path = no_compiler_path()
  tests = args.tests or (SMOKE_TESTS if args.smoke else FULL_TESTS)
  wheel = os.path.abspath(args.wheel)
  pairs = []
  for spec in args.pythons:
    python, _, interpreter = spec.partition("=")
    # A bare name (`python3`, as `make smoke` passes PYTHON_MAIN) is looked
    # up on PATH.
    interpreter = shutil.which(interpreter) or interpreter
    if not os.access(interpreter, os.X_OK):
      print(f"Python {python}: no interpreter at {interpreter}, skipped",
            flush=True)
      continue
    pairs += [(python, interpreter, minor) for minor in args.minors]

  def run(pair: tuple[str, str, str]) -> Row:
    python, interpreter, minor = pair
    row = run_one(uv, wheel, python, interpreter, minor, tests, path)
    print(f"TF {row.minor} ({row.tf_version}) Python {python}: "
          f"{'passed' if row.ok else 'FAILED'} ({row.result}), install "
          f"{row.install_s:.0f} s, tests {row.tests_s:.0f} s", flush=True)
    return row

  with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
    rows = list(pool.map(run, pairs))  # in the order of the table
  print(table(rows))
  if args.write_docs:
    write_docs(rows, wheel, tests, args.minors)
  return 0 if rows and all(r.ok for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
