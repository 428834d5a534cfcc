"""Argument types of the `intune` commands (argparse `type=` callables).

A leaf: the modules that add commands (`intune_tf.cli`'s `_COMMANDS` and
`_GROUPS`) take their types from here, below the command line that imports
them.
"""

from __future__ import annotations

import argparse


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
