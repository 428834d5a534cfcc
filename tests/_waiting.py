"""Awaiting a condition in tests (a loaded machine starts threads late)."""

import time


def wait_for(predicate, timeout: float = 10.0) -> bool:
  """Polls `predicate` every 10 ms; True once it holds, False at `timeout`."""
  end = time.monotonic() + timeout
  while time.monotonic() < end:
    if predicate():
      return True
    time.sleep(0.01)
  return False
