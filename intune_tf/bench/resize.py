"""Changing the CPUs a process may use while it runs (resize events)."""

from __future__ import annotations

import os
import threading
import time
from typing import Sequence

import psutil


def set_process_cpus(cpus: Sequence[int]) -> None:
  """Sets the CPU affinity of every thread of this process.

  Threads created afterwards inherit it from their creator.
  """
  wanted = set(cpus)
  for thread in psutil.Process().threads():
    try:
      os.sched_setaffinity(thread.id, wanted)
    except (ProcessLookupError, PermissionError, OSError):
      pass  # the thread ended meanwhile


def machine_cpu_ids() -> list[int]:
  return sorted(os.sched_getaffinity(0))


class Schedule:
  """Applies `[(seconds after start, number of CPUs), ...]` on a thread."""

  def __init__(self, events: Sequence[tuple[float, int]],
               cpu_ids: Sequence[int] | None = None):
    for t, n in events:
      if t < 0 or n < 1:
        raise ValueError(f"Bad resize event ({t}, {n}): times must be >= 0 "
                         "and CPU counts >= 1.")
    self.events = sorted(events)
    self.cpu_ids = list(cpu_ids or machine_cpu_ids())
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self.applied: list[tuple[float, int]] = []

  def start(self) -> None:
    self._start = time.monotonic()
    self._thread = threading.Thread(target=self._run, daemon=True,
                                    name="intune_resize")
    self._thread.start()

  def _run(self) -> None:
    for at, n in self.events:
      if self._stop.wait(max(0.0, self._start + at - time.monotonic())):
        return
      set_process_cpus(self.cpu_ids[:min(n, len(self.cpu_ids))])
      self.applied.append((time.monotonic() - self._start, n))

  def stop(self) -> None:
    """Stops the schedule and gives the process all its CPUs back."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    set_process_cpus(self.cpu_ids)
