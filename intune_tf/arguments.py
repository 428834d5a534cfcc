"""Argument types of the `intune` commands (argparse `type=` callables).

A leaf: the modules that add commands (`intune_tf.cli`'s `_COMMANDS` and
`_GROUPS`) take their types from here, below the command line that imports
them.
"""

from __future__ import annotations

import argparse
from typing import Callable


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
