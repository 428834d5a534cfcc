"""Argument types of the `intune` commands (argparse `type=` callables).

Every flag of every `intune` command takes its type from here, so that each
says exactly what it accepts and refuses the rest the same way: argparse
then exits with status 2, naming the flag ("argument --repeats: '0' is not
a positive integer; pass 1 or more."), before the command does any work.
`nan`, `inf`, negatives and zero are refused wherever they mean nothing.

- `positive_int`: an integer of at least 1 (a count, a size, a pid);
- `non_negative_int`: an integer of at least 0 (a seed; a count where 0
  means none);
- `positive_float`: a finite number above 0;
- `int_in(low, high, what)`: an integer from `low` to `high`; `port`: one
  from 1 to 65535;
- `duration`: finite seconds above 0, at most `MAX_SECONDS`;
- `optional_duration`: the same, or 0 (none);
- `output_file`: a file to write: not a folder, in a folder that exists and
  this user may write;
- `output_folder`: a folder to write in: one this user may write, or one
  that can be made;
- `names_in`: comma-separated names, each among the valid ones (policies,
  scenarios);
- `parsed_by(parse, name)`: a value of a format another module owns and
  parses (a worker pool, `intune_tf.service.scalers.parse_pool_spec`), its
  ValueError the flag's error.

A leaf: the modules that add commands (`intune_tf.cli`'s `_COMMANDS` and
`_GROUPS`) take their types from here, below the command line that imports
them.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")

# The largest TCP port.
MAX_PORT = 65535
# The longest duration (seconds, about 31 years): `time.sleep(1e10)` raises
# OverflowError ("timestamp out of range for platform time_t").
MAX_SECONDS = 1e9


def positive_int(text: str) -> int:
  """An argparse type of every command: an integer of at least 1.

  positive_int("3") = 3; positive_int("0") and positive_int("x") raise
  argparse.ArgumentTypeError("'0' is not a positive integer; pass 1 or more.").
  """
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a positive integer; pass 1 or more.")
  return value


def int_in(low: int, high: int, what: str) -> Callable[[str], int]:
  """An argparse type: an integer from `low` to `high`.

  int_in(1, 512, "pool size")("64") = 64; for "0" it raises
  argparse.ArgumentTypeError("'0' is not a pool size; pass 1 to 512.").
  """
  def check(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      value = low - 1
    if not low <= value <= high:
      raise argparse.ArgumentTypeError(
          f"{text!r} is not a {what}; pass {low} to {high}.")
    return value
  check.__name__ = what.replace(" ", "_")
  return check


def parsed_by(parse: Callable[[str], T], name: str) -> Callable[[str], T]:
  """An argparse type from a parse function of the module that owns the
  format: its ValueError becomes the flag's error (exit status 2, the flag
  named, the function's message).

  parsed_by(scalers.parse_pool_spec, "pool")("local:1-4") =
  ("local", 1, 4); for "local:4-1" it raises argparse.ArgumentTypeError
  with parse_pool_spec's message ("'local:4-1': the pool's MIN (4) is
  above its MAX (1); pass ...").

  Args:
    parse: takes the flag's text; raises ValueError saying what to pass.
    name: the type's name, e.g. "pool".
  """
  def check(text: str) -> T:
    try:
      return parse(text)
    except ValueError as e:
      raise argparse.ArgumentTypeError(str(e)) from None
  check.__name__ = name
  return check


def non_negative_int(text: str) -> int:
  """An argparse type: an integer of at least 0 (a seed; a count where 0
  means none).

  non_negative_int("0") = 0; non_negative_int("-1") raises
  argparse.ArgumentTypeError("'-1' is not an integer of 0 or more; pass 0 or
  more.").
  """
  try:
    value = int(text)
  except ValueError:
    value = -1
  if value < 0:
    raise argparse.ArgumentTypeError(
        f"{text!r} is not an integer of 0 or more; pass 0 or more.")
  return value


def positive_float(text: str) -> float:
  """An argparse type: a finite number above 0.

  positive_float("0.3") = 0.3; positive_float("0"), positive_float("nan"),
  positive_float("inf") and positive_float("-1") raise
  argparse.ArgumentTypeError("'nan' is not a positive number; pass a finite
  number above 0.").
  """
  try:
    value = float(text)
  except ValueError:
    value = math.nan
  if not (math.isfinite(value) and value > 0):
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a positive number; pass a finite number above 0.")
  return value


# An argparse type: a TCP port, 1 to `MAX_PORT`; port("0") raises
# argparse.ArgumentTypeError("'0' is not a port; pass 1 to 65535.").
port = int_in(1, MAX_PORT, "port")


def _seconds(text: str, zero: bool) -> float:
  try:
    value = float(text)
  except ValueError:
    value = math.nan
  if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
    least = "0 or more" if zero else "above 0"
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a duration; pass finite seconds {least}.")
  if value > MAX_SECONDS:
    raise argparse.ArgumentTypeError(
        f"{text!r} is too long a duration; pass at most {MAX_SECONDS:g} "
        "seconds.")
  return value


def duration(text: str) -> float:
  """An argparse type: finite seconds above 0, at most `MAX_SECONDS` (1e9).

  duration("0.5") = 0.5; duration("0"), duration("nan"), duration("inf")
  and duration("-1") raise argparse.ArgumentTypeError("'inf' is not a
  duration; pass finite seconds above 0.").
  """
  return _seconds(text, zero=False)


def optional_duration(text: str) -> float:
  """An argparse type: finite seconds of 0 or more, at most `MAX_SECONDS`
  (1e9), 0 meaning none (no warm-up, no waiting).

  optional_duration("0") = 0.0; optional_duration("nan") raises
  argparse.ArgumentTypeError("'nan' is not a duration; pass finite seconds
  0 or more.").
  """
  return _seconds(text, zero=True)


def _folder_problem(folder: str) -> str | None:
  """Why this user cannot create files in `folder` (None: it can)."""
  if not os.path.isdir(folder):
    return "does not exist" if not os.path.lexists(folder) else (
        "is not a folder")
  if not os.access(folder, os.W_OK | os.X_OK):
    return "is not writable"
  return None


def output_file(path: str) -> str:
  """An argparse type: a file a command writes when it is done, checked
  before it does its work: not a folder, in a folder that exists and this
  user may write, and, when it exists, writable.

  output_file("out.json") = "out.json"; output_file("/nonexistent/x.json")
  raises argparse.ArgumentTypeError("cannot write /nonexistent/x.json: the
  folder /nonexistent does not exist; create it or pass another path.").
  """
  if os.path.isdir(path):
    raise argparse.ArgumentTypeError(
        f"{path} is a folder: pass the path of a file to write.")
  folder = os.path.dirname(os.path.abspath(path))
  problem = _folder_problem(folder)
  if problem is None and os.path.exists(path) and not os.access(
      path, os.W_OK):
    problem = "holds it read-only"
  if problem is not None:
    raise argparse.ArgumentTypeError(
        f"cannot write {path}: the folder {folder} {problem}; create it or "
        "pass another path.")
  return path


def output_folder(path: str) -> str:
  """An argparse type: a folder a command writes files in (made when
  missing), checked before it does its work: an existing folder this user
  may write, or a new one whose nearest existing parent is one.

  output_folder("out/demo") = "out/demo" when "out" (or ".") is writable;
  output_folder("/etc/passwd") raises argparse.ArgumentTypeError("cannot
  write in /etc/passwd: it is not a folder; pass a folder.").
  """
  target = os.path.abspath(path)
  if os.path.lexists(target) and not os.path.isdir(target):
    raise argparse.ArgumentTypeError(
        f"cannot write in {path}: it is not a folder; pass a folder.")
  existing = target
  while not os.path.lexists(existing):
    existing = os.path.dirname(existing)
  problem = _folder_problem(existing)
  if problem is not None:
    raise argparse.ArgumentTypeError(
        f"cannot write in {path}: {existing} {problem}; pass a folder you "
        "can write.")
  return path


def names_in(valid: Callable[[], Iterable[str]], what: str
             ) -> Callable[[str], str]:
  """An argparse type: comma-separated names, each among `valid()` (read
  when the flag is parsed, so that registered names count).

  Args:
    valid: the valid names, e.g. the policy registry's.
    what: what a name is, for the message, e.g. "policy".

  Returns:
    The type: it returns the text unchanged, or raises
    argparse.ArgumentTypeError("unknown policy 'clmb'; valid: climb, even.")
    for a name not among them, or for no name at all.
  """
  def check(text: str) -> str:
    known = list(valid())
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in known]
    if not names or unknown:
      said = ", ".join(repr(n) for n in unknown) or "none given"
      raise argparse.ArgumentTypeError(
          f"unknown {what} {said}; valid: {', '.join(known)}.")
    return text
  check.__name__ = f"{what}_names"
  return check
