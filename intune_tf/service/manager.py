"""`PoolManager`: a controller (`controllers`) driving a scaler (`scalers`),
its decisions recorded (`history`) and logged, and reported in the
dispatcher's status file (`report`)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from absl import logging

from intune_tf.service import controllers
from intune_tf.service.scalers import Scaler
from intune_tf.service.scalers import ScalerError

# The last decisions `PoolManager.report` includes.
REPORTED_DECISIONS = 10


@dataclasses.dataclass(frozen=True)
class PoolEvent:
  """One decision of a `PoolManager`: when, the size before and wanted,
  why, and the error when the resize failed."""
  time_s: float
  before: int
  size: int
  reason: str
  error: str | None = None


def describe_reading(reading: controllers.PoolReading) -> str:
  """What a decision was made on, for the logs: for example "wait 40%,
  pace 177 rows/s, 2 serving at 104 rows/s, 1 starting" (the mean rows/s
  when reported, those starting when any)."""
  parts = [f"wait {reading.wait_share:.0%}",
           f"pace {reading.consumer_rate:.0f} rows/s",
           f"{reading.workers} serving"]
  if reading.worker_rates:
    mean = sum(reading.worker_rates) / len(reading.worker_rates)
    parts[-1] += f" at {mean:.0f} rows/s"
  if reading.starting:
    parts.append(f"{reading.starting} starting")
  return ", ".join(parts)


def hold_wording(reason: str) -> str:
  """`reason` with its numbers masked: holds that differ only in figures
  ("trainer waits 2%" and "trainer waits 1%") are logged once at INFO."""
  return re.sub(r"[-+]?\d+(?:\.\d+)?", "#", reason)


class PoolManager:
  """A controller driving a scaler: each `step(reading)` decides, resizes on
  a change and records it; a change is logged with its reason and what it
  was decided on, a hold when its wording (`hold_wording`) is new.

  Args:
    controller: decides the size.
    scaler: carries it out.
  """

  def __init__(self, controller: controllers.PoolController, scaler: Scaler):
    self.controller = controller
    self.scaler = scaler
    self.history: list[PoolEvent] = []
    self.failures = 0
    self.reason: str | None = None  # of the last decision, or of no decision
    self._logged_hold: str | None = None  # the last hold's `hold_wording`

  def report(self) -> dict[str, Any]:
    """The pool now, as the dispatcher's status file carries it (`pool`),
    with the last `REPORTED_DECISIONS` entries of `history`."""
    scaler = self.scaler
    return {
        "kind": scaler.kind, "min": scaler.min_workers,
        "max": scaler.max_workers, "size": scaler.size(),
        "serving": scaler.serving(), "standby": scaler.standby_count(),
        "lost": scaler.lost,
        "failures": self.failures, "reason": self.reason,
        "decisions": [dataclasses.asdict(e)
                      for e in self.history[-REPORTED_DECISIONS:]]}

  def hold(self, reason: str) -> None:
    """Records that nothing could be decided this period, and why (no
    reading: for example no consumer report)."""
    self.reason = reason
    self._log_hold(reason)

  def _log_hold(self, reason: str) -> None:
    wording = hold_wording(reason)
    if wording != self._logged_hold:
      self._logged_hold = wording
      logging.info("Worker pool holds at %d: %s", self.scaler.size(), reason)

  def give_up_unstarted(self, now_s: float) -> int:
    """`Scaler.give_up_unstarted`, counted, recorded at `now_s` and logged
    as a failed change."""
    before = self.scaler.size()
    missing = self.scaler.give_up_unstarted()
    if missing:
      size = self.scaler.size()
      error = (f"{missing} of the {before} worker(s) asked for did not start "
               f"serving in time; the pool counts the {size} serving")
      self.failures += 1
      self.controller.rejected(
          controllers.Decision(before, "workers did not start"))
      self.history.append(PoolEvent(now_s, before, size,
                                    "workers did not start", error))
      logging.error("Worker pool %d -> %d: %s.", before, size, error)
    return missing

  def step(self, reading: controllers.PoolReading) -> controllers.Decision:
    """Decides on `reading` and resizes on a change. A failed resize is
    logged once as an error and recorded; the pool stays as it was."""
    decision = self.controller.decide(reading)
    self.reason = decision.reason
    before = self.scaler.size()
    measured = describe_reading(reading)
    if decision.size == before:
      self._log_hold(f"{decision.reason} ({measured})")
      return decision
    self._logged_hold = None
    error = None
    try:
      self.scaler.resize(decision.size)
      logging.info("Worker pool %d -> %d: %s (%s)", before, decision.size,
                   decision.reason, measured)
    except (ScalerError, ValueError) as e:
      error = str(e)
      self.failures += 1
      self.controller.rejected(decision)
      logging.error("Worker pool %d -> %d failed: %s", before, decision.size,
                    error)
    self.history.append(PoolEvent(reading.time_s, before, decision.size,
                                  decision.reason, error))
    return decision
