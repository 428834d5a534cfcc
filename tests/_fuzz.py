"""Fuzzing the readers of the shared folders (status files, host leases,
warm-start files): bad files of every kind, and a fresh process with a time
limit to read them in.

`bad_contents(valid, rng)` derives the bytes of one file from a valid record:
random JSON shapes, the record with a field (at any depth) given a wrong
type or an extreme number (-1, 0, 2**70, NaN, inf, strings), a field left
out, odd encodings (UTF-16, a BOM, invalid UTF-8, NUL bytes), truncated,
empty, nested too deeply. `odd_kind(path, rng, valid_bytes)` puts something
else than a file there: a folder, a FIFO, links (to nothing, to a loop, to
/dev/zero, to a valid file), a file of another owner or mode, a huge file.
`run_reader(script, seeds)` runs a script that reads them in a fresh Python,
with `SEEDS` and the fuzz helpers importable, and returns its output.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import textwrap
from typing import Any, Callable

# Fixed seeds: a failure names its seed, and reruns the same files.
SEEDS = (49, 4901, 4902)
# Longest a reader's process may take (seconds), TensorFlow's import
# included.
TIME_LIMIT_S = 120.0

EXTREMES = (-1, 0, 1, 2**70, -2**70, 2**31, float("nan"), float("inf"),
            float("-inf"), 1e308, -0.0, True, False, None, "", "7", "x" * 300,
            [], {}, [1, 2], {"a": 1})
# Given to every top-level field of a valid record in turn (`grid`).
GRID = (-1, 0, 2**31, 2**70, -2**70, float("nan"), float("inf"), "7", None,
        True, [])


def random_json(rng: random.Random, depth: int = 0) -> Any:
  """A random JSON value (its containers at most 4 deep)."""
  kinds = ["int", "float", "str", "bool", "null", "extreme"]
  if depth < 4:
    kinds += ["list", "dict"] * 2
  kind = rng.choice(kinds)
  if kind == "int":
    return rng.randint(-2**40, 2**40)
  if kind == "float":
    return rng.uniform(-1e6, 1e6)
  if kind == "str":
    return "".join(rng.choice("ab\u00e9\u4e2d\0\n\"\\/")
                   for _ in range(rng.randint(0, 8)))
  if kind == "bool":
    return rng.random() < 0.5
  if kind == "null":
    return None
  if kind == "extreme":
    return copy.deepcopy(rng.choice(EXTREMES))
  if kind == "list":
    return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
  return {random_key(rng): random_json(rng, depth + 1)
          for _ in range(rng.randint(0, 4))}


def random_key(rng: random.Random) -> str:
  return rng.choice(["pid", "host", "format", "sessions", "stages", "id",
                     "x", "", "\u00e9", "config", "weight"])


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
  """Every path to a value inside nested dicts and lists."""
  found = [prefix] if prefix else []
  if isinstance(value, dict):
    for k, v in value.items():
      found += _paths(v, (*prefix, k))
  elif isinstance(value, list):
    for i, v in enumerate(value):
      found += _paths(v, (*prefix, i))
  return found


def mutate(valid: dict, rng: random.Random) -> Any:
  """`valid` (deep-copied) with one to three fields changed or removed."""
  data = json.loads(json.dumps(valid))
  for _ in range(rng.randint(1, 3)):
    paths = _paths(data)
    if not paths:
      break
    path = rng.choice(paths)
    parent = data
    for step in path[:-1]:
      parent = parent[step]
    if rng.random() < 0.15 and isinstance(parent, dict):
      del parent[path[-1]]
    else:
      # A copy: an extreme container set in two places (or in itself) would
      # make the record a cycle.
      parent[path[-1]] = (copy.deepcopy(rng.choice(EXTREMES))
                          if rng.random() < 0.7 else random_json(rng, 2))
  return data


def grid(valid: dict) -> list[dict]:
  """`valid` with each top-level field given each of `GRID` in turn, and
  with each left out: the cases a random pick may miss."""
  cases = []
  for key in valid:
    cases += [{**valid, key: value} for value in GRID]
    cases.append({k: v for k, v in valid.items() if k != key})
  return cases


def bad_contents(valid: dict, rng: random.Random) -> bytes:
  """The bytes of one bad (or, now and then, valid) file."""
  roll = rng.random()
  if roll < 0.55:
    text = json.dumps(mutate(valid, rng), allow_nan=True)
  elif roll < 0.7:
    text = json.dumps(random_json(rng), allow_nan=True)
  else:
    good = json.dumps(valid)
    return rng.choice([
        lambda: good.encode("utf-16"),
        lambda: b"\xef\xbb\xbf" + good.encode(),
        lambda: good.encode()[:rng.randint(0, len(good))],
        lambda: good.encode().replace(b'"', b"\xff", 1),
        lambda: good.encode() + b"\0",
        lambda: b"",
        lambda: b"[" * 100_000,
        lambda: b'{"pid": ' + b"9" * 5000 + b"}",
        lambda: good.replace(": 1", ": NaN", 1).encode(),
        lambda: good.replace(": 1", ": 1e999", 1).encode(),
        lambda: good.encode("latin-1", "replace") + b"\xe9",
    ])()
  return text.encode("utf-8", "surrogatepass")


def write(path: pathlib.Path, data: bytes, mode: int = 0o600) -> None:
  fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
  with os.fdopen(fd, "wb") as f:
    f.write(data)
  os.chmod(path, mode)


def odd_kind(path: pathlib.Path, rng: random.Random, valid: bytes,
             max_bytes: int) -> None:
  """Puts something at `path` that is not a plain file of this user."""
  choice = rng.randrange(9)
  if choice == 0:
    path.mkdir()
  elif choice == 1:
    os.mkfifo(path, 0o600)  # nothing writes it: a plain open blocks
  elif choice == 2:
    path.symlink_to(path.with_name("nothing-there"))
  elif choice == 3:
    path.symlink_to(path)  # a loop
  elif choice == 4:
    path.symlink_to("/dev/zero")  # endless
  elif choice == 5:
    target = path.with_name(f".target-{path.name}")
    write(target, valid)
    path.symlink_to(target.name)
  elif choice == 6:
    write(path, valid, 0o666)  # others may write it
  elif choice == 7:
    write(path, valid)
    if os.getuid() == 0:
      os.chown(path, 54321, 54321)  # another user's
  else:
    write(path, b" " * (max_bytes + 1) + valid)  # too large


def fill(folder: pathlib.Path, seed: int, count: int,
         valid: Callable[[random.Random], dict],
         name: Callable[[Any, int], str], max_bytes: int
         ) -> list[pathlib.Path]:
  """Writes the `grid` of a valid record, then `count` random bad files
  (about one in six an odd kind), into `folder`.

  Args:
    folder: where (made if missing).
    seed: the random seed.
    count: how many.
    valid: a valid record, made fresh for each file.
    name: the file name for the decoded contents (None when not JSON) and
      the file's index; unique for None.
    max_bytes: the largest file the reader takes (odd kinds pass it).

  Returns:
    The paths written.
  """
  rng = random.Random(seed)
  folder.mkdir(parents=True, exist_ok=True)
  paths = []
  cases = grid(valid(rng)) if count > 1 else []
  for i, case in enumerate(cases):
    path = folder / name(case, count + i)
    if os.path.lexists(path):  # its name taken: one of no record
      path = folder / name(None, count + i)
    write(path, json.dumps(case, allow_nan=True).encode())
    paths.append(path)
  for i in range(count):
    record = valid(rng)
    if rng.random() < 0.17:
      path = folder / name(record, i)
      if not os.path.lexists(path):
        odd_kind(path, rng, json.dumps(record).encode(), max_bytes)
        paths.append(path)
      continue
    data = bad_contents(record, rng)
    try:
      decoded = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
      decoded = None
    path = folder / name(decoded, i)
    if os.path.lexists(path):
      continue
    write(path, data)
    paths.append(path)
  return paths


def finite_or_none(value: Any) -> bool:
  return not isinstance(value, float) or math.isfinite(value)


def warnings_told() -> list[str]:
  """The messages of every WARNING or worse logged from now on, in order."""
  told = []

  class Catch(logging.Handler):
    def emit(self, record):
      if record.levelno >= logging.WARNING:
        told.append(record.getMessage())

  logging.getLogger().addHandler(Catch())
  return told


def run_reader(script: str, seeds=SEEDS) -> str:
  """Runs `script` in a fresh Python with `SEEDS` (`seeds`) and this module
  importable as `_fuzz`, within `TIME_LIMIT_S`; returns its stdout.

  Raises:
    AssertionError: it raised (a traceback, or a logging error), exited
      with a status other than 0, or did not finish in time (naming the
      seeds).
  """
  tests = str(pathlib.Path(__file__).parent)
  code = (f"import sys; sys.path.insert(0, {tests!r}); SEEDS = {seeds!r}\n" +
          textwrap.dedent(script))
  try:
    # Outside the checkout: `-c` puts the working directory first on the
    # path, and on the compat stack the checkout is not what is installed.
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=TIME_LIMIT_S, check=False,
                          cwd=tempfile.gettempdir())
  except subprocess.TimeoutExpired as e:
    raise AssertionError(f"the reader hung past {TIME_LIMIT_S} s on the "
                         f"files of seeds {seeds}: {e.stderr!r:.2000}"
                         ) from None
  problems = [line for line in done.stderr.splitlines()
              if "Traceback" in line or "Logging error" in line]
  assert done.returncode == 0 and not problems, (
      f"seeds {seeds}: exit {done.returncode}\n{done.stderr[-4000:]}")
  return done.stdout
