"""Rows per second over a measured window: the one "iterate for N seconds".

    meter = meter_lib.pull(iter(ds), seconds=10, warmup=2)
    meter.rows_per_s

or, around a loop that does more per element:

    meter = meter_lib.Meter(seconds=10, warmup=2, window_s=1)
    while meter.running():
      next(it)
      window = meter.count(rows)  # (time, rows/s) when a window closes

Standard library only: the harness, the demo, the TFX executor and the
benchmarks share it.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterator


class Meter:
  """Counts rows after a warm-up, for a measured window of `seconds`.

  The window opens at the first count after the warm-up; rows counted after
  that, up to the last count, make the rate (rows finished before the window
  opened are not in it). Optional fixed windows of `window_s` give a rate
  over time.

  Args:
    seconds: Length of the measured window, after the warm-up.
    warmup: Seconds counted but not measured. Default 0.
    window_s: Length of the rate-over-time windows; None (default): none.
    clock: Monotonic clock in seconds. Default `time.monotonic`.
    cpu_clock: The process's CPU time in seconds, all threads. Default
      `time.process_time`.
  """

  def __init__(self, seconds: float, warmup: float = 0.0,
               window_s: float | None = None,
               clock: Callable[[], float] = time.monotonic,
               cpu_clock: Callable[[], float] = time.process_time):
    self.seconds, self.warmup, self.window_s = seconds, warmup, window_s
    self._clock, self._cpu_clock = clock, cpu_clock
    self._cpu_from: float | None = None
    self.cpu_seconds = 0.0  # process CPU time over the measured window
    self.start = clock()
    self.counts = 0  # calls of `count`, warm-up included
    self.rows = 0  # rows in the measured window
    self.total_rows = 0  # rows of every count, warm-up included
    self.measured_from: float | None = None
    self.last: float | None = None
    self.last_count: float | None = None
    self._window_start, self._window_rows = self.start, 0

  def running(self) -> bool:
    """Whether the warm-up and the measured window have not both passed."""
    return self._clock() - self.start < self.warmup + self.seconds

  def elapsed(self) -> float:
    """Seconds since the meter started."""
    return self._clock() - self.start

  def count(self, rows: int = 1) -> tuple[float, float] | None:
    """Counts `rows` finished now.

    Returns:
      (seconds since the start, rows/s over the window) when a rate-over-time
      window closes with this count, else None.
    """
    now = self._clock()
    self.counts += 1
    self.total_rows += rows
    self.last_count = now
    if now - self.start >= self.warmup:
      if self.measured_from is None:
        self.measured_from = now
        self._cpu_from = self._cpu_clock()
      else:
        self.rows += rows
        self.last = now
        self.cpu_seconds = self._cpu_clock() - self._cpu_from
    if self.window_s is None:
      return None
    self._window_rows += rows
    if now - self._window_start < self.window_s:
      return None
    window = (now - self.start,
              self._window_rows / (now - self._window_start))
    self._window_start, self._window_rows = now, 0
    return window

  @property
  def measured_s(self) -> float:
    """Length of the measured window so far (0 before two counts in it)."""
    if self.measured_from is None or self.last is None:
      return 0.0
    return self.last - self.measured_from

  @property
  def rows_per_s(self) -> float:
    """Rows per second over the measured window (0.0 before it has any)."""
    return self.rows / self.measured_s if self.measured_s > 0 else 0.0


  @property
  def cpu_seconds_per_row(self) -> float:
    """The process's CPU time per row over the measured window, every
    thread counted (0.0 before the window has rows)."""
    return self.cpu_seconds / self.rows if self.rows else 0.0

  @property
  def whole_run_rows_per_s(self) -> float:
    """Rows per second from the start to the last count, warm-up included:
    what a job that ran this long got (0.0 before any count)."""
    if self.last_count is None or self.last_count <= self.start:
      return 0.0
    return self.total_rows / (self.last_count - self.start)


def pull(iterator: Iterator[Any], seconds: float, warmup: float = 0.0,
         rows_of: Callable[[Any], int] | None = None,
         clock: Callable[[], float] = time.monotonic) -> Meter:
  """Pulls elements from `iterator` for `warmup` then `seconds`, or until it
  ends.

  Args:
    iterator: Any iterator (a tf.data iterator).
    seconds: Length of the measured window.
    warmup: Unmeasured seconds first. Default 0.
    rows_of: Rows in an element; None (default): 1 per element.
    clock: As for `Meter`.

  Returns:
    The `Meter`, for `rows_per_s`, `rows` and `counts`.
  """
  meter = Meter(seconds, warmup, clock=clock)
  while meter.running():
    try:
      element = next(iterator)
    except StopIteration:
      break
    meter.count(rows_of(element) if rows_of is not None else 1)
  return meter


class PeakSampler:
  """The peak of a reading (buffered bytes, RSS) sampled on a thread.

      with PeakSampler(lambda: process.memory_info().rss) as rss:
        ...
      rss.peak - rss.start

  A reading that raises is skipped (the session or model it reads may not
  exist yet, or any more).

  Args:
    read: Returns the current value.
    period_s: Seconds between readings. Default 0.01.
  """

  def __init__(self, read: Callable[[], int], period_s: float = 0.01):
    self.read, self.period_s = read, period_s
    self.start: int | None = None  # the first reading
    self.peak = 0
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def _sample(self) -> None:
    try:
      value = int(self.read())
    except Exception:  # noqa: BLE001  see the class docstring
      return
    if self.start is None:
      self.start = value
    self.peak = max(self.peak, value)

  def _run(self) -> None:
    while not self._stop.is_set():
      self._sample()
      self._stop.wait(self.period_s)

  def __enter__(self) -> "PeakSampler":
    self._sample()
    self._thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self._stop.set()
    self._thread.join()
    self._sample()
