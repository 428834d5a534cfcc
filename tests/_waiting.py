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


def wait_until(predicate, timeout: float = 10.0, what: str = "condition",
               period_s: float = 0.1):
  """Polls `predicate` every `period_s` and returns its first truthy value;
  raises AssertionError naming `what` at `timeout`."""
  end = time.monotonic() + timeout
  while time.monotonic() < end:
    value = predicate()
    if value:
      return value
    time.sleep(period_s)
  raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def poll_for(predicate, seconds: float, period_s: float = 0.05):
  """Calls `predicate` every `period_s` for `seconds`, at least once, and
  returns its last value."""
  end = time.monotonic() + seconds
  while True:
    value = predicate()
    if time.monotonic() >= end:
      return value
    time.sleep(period_s)
