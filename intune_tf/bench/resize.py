"""Changing the CPUs a process may use while it runs (resize events), and
a co-tenant: processes that burn CPU beside it for a while."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Sequence

from intune_tf import host


def machine_cpu_ids() -> list[int]:
  return sorted(os.sched_getaffinity(0))


class _Timeline:
  """Applies `events`, `[(seconds after start, value), ...]` sorted, on a
  thread of its own from `start()`; subclasses say what a value does
  (`_apply`, returning what `applied` records) and what `stop()` undoes
  (`_finish`)."""

  events: list[tuple[float, int]]
  applied: list[tuple[float, int]]

  def start(self) -> None:
    self._stop = threading.Event()
    self._start = time.monotonic()
    self._thread = threading.Thread(target=self._run, daemon=True,
                                    name=f"intune_{type(self).__name__}")
    self._thread.start()

  def _run(self) -> None:
    for at, value in self.events:
      if self._stop.wait(max(0.0, self._start + at - time.monotonic())):
        return
      self.applied.append((time.monotonic() - self._start,
                           self._apply(value)))

  def _apply(self, value: int) -> int:
    raise NotImplementedError

  def _finish(self) -> None:
    raise NotImplementedError

  def stop(self) -> None:
    """Stops the timeline and undoes it (`_finish`)."""
    if getattr(self, "_thread", None) is not None:
      self._stop.set()
      self._thread.join()
    self._finish()


class Schedule(_Timeline):
  """Applies `[(seconds after start, number of CPUs), ...]` on a thread."""

  def __init__(self, events: Sequence[tuple[float, int]],
               cpu_ids: Sequence[int] | None = None):
    for t, n in events:
      if t < 0 or n < 1:
        raise ValueError(f"Bad resize event ({t}, {n}): times must be >= 0 "
                         "and CPU counts >= 1.")
    self.events = sorted(events)
    self.cpu_ids = list(cpu_ids or machine_cpu_ids())
    self.applied: list[tuple[float, int]] = []

  def _apply(self, n: int) -> int:
    host.set_process_cpus(self.cpu_ids[:min(n, len(self.cpu_ids))])
    return n

  def _finish(self) -> None:
    """Gives the process all its CPUs back."""
    host.set_process_cpus(self.cpu_ids)


# A co-tenant process: one thread that never waits.
_BURN = "while True:\n  pass"


class CoTenant(_Timeline):
  """Starts and stops CPU-burning processes of its own on a schedule:
  `[(seconds after start, seconds after start, processes), ...]`, each a
  window during which that many processes (one busy thread each, on every
  CPU the machine gives this process) run beside the pipeline.

  `applied` lists (seconds after start, processes running) as each window
  opens and closes; `stop()` ends every process it started.
  """

  def __init__(self, windows: Sequence[tuple[float, float, int]]):
    for begin, end, count in windows:
      if not 0 <= begin < end or count < 1:
        raise ValueError(
            f"Bad co-tenant window ({begin}, {end}, {count}): it must start "
            "at 0 s or later, end after it starts, and run 1 or more "
            "processes.")
    events = []
    for begin, end, count in windows:
      events += [(begin, count), (end, -count)]
    self.events = sorted(events)
    self.processes: list[subprocess.Popen] = []
    self.applied: list[tuple[float, int]] = []

  def _apply(self, change: int) -> int:
    if change > 0:
      self.processes += [subprocess.Popen([sys.executable, "-c", _BURN])
                         for _ in range(change)]
    else:
      for process in self.processes[:-change]:
        _end(process)
      self.processes = self.processes[-change:]
    return len(self.processes)

  def _finish(self) -> None:
    """Ends the processes it started."""
    for process in self.processes:
      _end(process)
    self.processes = []


def _end(process: subprocess.Popen) -> None:
  process.kill()
  process.wait()
