"""Readings of the host that budgets and policies depend on.

Every function re-reads what can change from one tuning step to the next (CPU
affinity, free memory, the cgroup's memory in use), so a resize by affinity
is seen at the next call. The cgroup's limits (CPU quota, memory limit) are
re-read at most every `CGROUP_LIMITS_REFRESH_S` seconds, and which cgroup
files exist (the cgroup layout, fixed for the life of a process) is
remembered.
"""

from __future__ import annotations

import functools
import math
import os
import re
import threading
import time
from typing import Any, Callable, Sequence, TypeVar

from absl import logging
import psutil

# The cgroup file system, and where the process's own cgroups are listed.
_CGROUP_FS = "/sys/fs/cgroup"
_PROC_SELF_CGROUP = "/proc/self/cgroup"
_MEMINFO = "/proc/meminfo"
_MEMINFO_TOTAL = re.compile(rb"^MemTotal:\s+(\d+) kB$", re.M)
_MEMINFO_AVAILABLE = re.compile(rb"^MemAvailable:\s+(\d+) kB$", re.M)
_meminfo_fd: int | None = None
_meminfo_lock = threading.Lock()

# The cgroup's CPU quota and memory limit are re-read at most this often:
# they change only when the job is resized, and re-reading them at every
# tuning step costs it several file reads. A resize by CPU affinity is still
# seen at the next call (`usable_cpus` reads the affinity every time).
CGROUP_LIMITS_REFRESH_S = 1.0
_limits_cache: dict[str, tuple[float, Any]] = {}
_T = TypeVar("_T")
# The largest process id Linux can give (PID_MAX_LIMIT, the ceiling of
# /proc/sys/kernel/pid_max on 64-bit kernels).
PID_MAX = 1 << 22


def is_pid(value: Any) -> bool:
  """Whether `value` (read from a shared file) may name a process: an int
  (not a bool) from 1 to `PID_MAX`. Checked before the OS is asked about it:
  `os.kill(0, 0)` signals the caller's process group, `psutil.Process(-1)`
  raises ValueError and `os.kill(2**31, 0)` OverflowError.

  Examples: is_pid(4242) is True; is_pid(-1), is_pid(0), is_pid(2**70),
  is_pid(True) and is_pid("7") are False.
  """
  return (isinstance(value, int) and not isinstance(value, bool) and
          1 <= value <= PID_MAX)


@functools.cache
def _exists(path: str) -> bool:
  return os.path.exists(path)


def _read(path: str) -> str | None:
  if not _exists(path):
    return None
  try:
    with open(path) as f:
      return f.read().strip()
  except OSError:
    return None


def _cached_limit(name: str, read: Callable[[], _T]) -> _T:
  """`read()`, called again at most every `CGROUP_LIMITS_REFRESH_S` seconds
  (the result is kept under `name`)."""
  now = time.monotonic()
  cached = _limits_cache.get(name)
  if cached is None or now - cached[0] >= CGROUP_LIMITS_REFRESH_S:
    cached = (now, read())
    _limits_cache[name] = cached
  return cached[1]


def cgroup_dirs(controller: str) -> list[str]:
  """The directories of this process's cgroup for `controller` ("memory",
  "cpu"), its own first, then each parent up to the hierarchy's root (those
  that exist: in a container without a cgroup namespace the host's path is
  not mounted, and only the root is).

  cgroup v2 (a unified hierarchy at `_CGROUP_FS` whose cgroup.controllers
  lists the controller) is read from the "0::<path>" line of
  /proc/self/cgroup; v1 from the line that names the controller, under
  `_CGROUP_FS/<controller>`.
  """
  text = _read(_PROC_SELF_CGROUP) or ""
  unified = (_read(os.path.join(_CGROUP_FS, "cgroup.controllers")) or
             "").split()
  for line in text.splitlines():
    parts = line.split(":", 2)
    if len(parts) != 3:
      continue
    hierarchy, controllers, path = parts
    if hierarchy == "0" and not controllers:
      if controller not in unified:
        continue
      base = _CGROUP_FS
    elif controller in controllers.split(","):
      base = os.path.join(_CGROUP_FS, controller)
    else:
      continue
    steps = [step for step in path.split("/") if step]
    return [d for d in (os.path.join(base, *steps[:n])
                        for n in range(len(steps), -1, -1))
            if os.path.isdir(d)]
  return []


def _read_int(path: str) -> int | None:
  text = _read(path)
  if not text or text == "max":
    return None
  try:
    return int(text)
  except ValueError:
    return None


def cpu_max_quota(text: str) -> float | None:
  """CPUs allowed by the text of a cgroup v2 `cpu.max` file, "<quota>
  <period>" in microseconds (quota "max": no limit; the period may be left
  out, the kernel's default is 100000).

  Examples: "150000 100000" -> 1.5; "max 100000" -> None; "50000" -> 0.5.

  Raises:
    ValueError: the text is not that (a quota or period that is not a
      positive integer, such as a zero period).
  """
  fields = text.split()
  if not 1 <= len(fields) <= 2:
    raise ValueError(f"expected '<quota> <period>', got {text!r}")
  if fields[0] == "max":
    return None
  quota, period = fields[0], fields[1] if len(fields) == 2 else "100000"
  if not (quota.isdigit() and period.isdigit() and int(quota) > 0 and
          int(period) > 0):
    raise ValueError(f"expected a positive quota and period in "
                     f"microseconds, got {text!r}")
  return int(quota) / int(period)


# cpu.max files found unreadable, each warned about once.
_bad_cpu_max: set[str] = set()


def cgroup_cpu_quota() -> float | None:
  """CPUs allowed by the tightest CPU quota (cpu.max, v1 cfs quota) of this
  process's cgroup and its parents, or None.

  A `cpu.max` that cannot be read as a quota (`cpu_max_quota`, e.g. a zero
  period) is left out, with one warning naming it: the other cgroups'
  quotas and the CPU affinity still bound the CPUs.
  """
  quotas = []
  for d in cgroup_dirs("cpu"):
    path = os.path.join(d, "cpu.max")
    text = _read(path)
    if text:
      try:
        quota = cpu_max_quota(text)
      except ValueError as e:
        if path not in _bad_cpu_max:
          _bad_cpu_max.add(path)
          logging.warning(
              "InTune: cannot read the CPU quota in %s (%s); it is left out, "
              "the other CPU limits (parent cgroups, CPU affinity) apply. "
              "Fix the cgroup's cpu.max, e.g. 'max 100000' for no limit.",
              path, e)
        continue
      if quota is not None:
        quotas.append(quota)
      continue
    quota = _read_int(os.path.join(d, "cpu.cfs_quota_us"))
    period = _read_int(os.path.join(d, "cpu.cfs_period_us"))
    if quota and period and quota > 0 and period > 0:
      quotas.append(quota / period)
  return min(quotas) if quotas else None


# Most passes `set_process_cpus` makes over the threads.
_AFFINITY_PASSES = 5


def _thread_ids() -> list[int]:
  try:
    return [int(tid) for tid in os.listdir("/proc/self/task")]
  except OSError:
    return [t.id for t in psutil.Process().threads()]


def _python_thread_ids() -> set[int]:
  return {t.native_id for t in threading.enumerate()
          if t.native_id is not None}


def set_process_cpus(cpus: Sequence[int], python_threads: bool = True) -> bool:
  """Sets the CPU affinity of every thread of this process (threads created
  afterwards inherit it from their creator).

  Args:
    cpus: the CPUs.
    python_threads: whether Python's threads move too. Default True. Left
      on every CPU given to the process (False), the threads that build
      datasets and their iterators see TensorFlow's `MaxParallelism` that
      plain TensorFlow sees, and so resolve AUTOTUNE values (an
      interleave's `cycle_length`, hence its order) as it does.

  Returns:
    Whether any thread was moved.
  """
  wanted = set(cpus)
  moved_any = False
  # A thread that was not yet moved can start another one while the threads
  # are walked, and that one inherits the old affinity: walk again until a
  # pass finds every thread already moved.
  for _ in range(_AFFINITY_PASSES):
    moved = False
    keep = set() if python_threads else _python_thread_ids()
    for tid in _thread_ids():
      if tid in keep:
        continue
      try:
        if os.sched_getaffinity(tid) != wanted:
          os.sched_setaffinity(tid, wanted)
          moved = True
      except OSError:
        pass  # the thread ended meanwhile
    moved_any |= moved
    if not moved:
      break
  return moved_any


# The CPUs `place_process` confined this process's threads to (None: not
# confined).
_placement: list[frozenset[int] | None] = [None]
_placement_lock = threading.Lock()


def cpu_ids() -> list[int]:
  """The CPUs given to this process: the affinity of the calling thread
  (`place_process` leaves Python's threads on all of them), sorted."""
  try:
    return sorted(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return list(range(os.cpu_count() or 1))


def place_process(cpus: Sequence[int] | None) -> bool:
  """Confines this process's threads to `cpus` (only those of the CPUs given
  to it, `cpu_ids`), or with None gives them back all the CPUs given to it.

  Python's threads stay on every CPU given (`set_process_cpus`): TensorFlow
  reads their affinity where they build datasets. While confined, every call
  moves the threads started since (those a Python thread started inherit
  its affinity).

  Returns:
    Whether any thread was moved.
  """
  if not hasattr(os, "sched_setaffinity"):
    return False
  given = frozenset(cpu_ids())
  target = given if cpus is None else frozenset(cpus) & given
  if not target:
    return False
  with _placement_lock:
    if target == given and _placement[0] is None:
      return False
    moved = set_process_cpus(sorted(target), python_threads=False)
    _placement[0] = None if target == given else target
  return moved


def usable_cpus() -> int:
  """CPUs this process may use now: its affinity (before any confinement of
  its own, `cpu_ids`), capped by the cgroup quota.

  The affinity is read at every call; the quota at most every
  `CGROUP_LIMITS_REFRESH_S` seconds.

  Returns:
    At least 1.
  """
  cpus = len(cpu_ids())
  quota = _cached_limit("cpu_quota", cgroup_cpu_quota)
  if quota is not None:
    cpus = min(cpus, max(1, math.floor(quota)))
  return max(1, cpus)


def machine_cpus() -> int:
  """All logical CPUs of the machine (the most a job could be given)."""
  return os.cpu_count() or 1


def _cgroup_memory_limit() -> tuple[int, str] | None:
  """(limit bytes, path of the usage file) of the tightest memory limit of
  this process's cgroup and its parents, or None if none is limited."""
  best = None
  for d in cgroup_dirs("memory"):
    for limit_name, usage_name in (("memory.max", "memory.current"),
                                   ("memory.limit_in_bytes",
                                    "memory.usage_in_bytes")):
      limit = _read_int(os.path.join(d, limit_name))
      usage_path = os.path.join(d, usage_name)
      # v1 reports "no limit" as a huge number.
      if limit is not None and limit < (1 << 60) and _exists(usage_path):
        if best is None or limit < best[0]:
          best = (limit, usage_path)
  return best


def cgroup_memory() -> tuple[int, int] | None:
  """(limit, usage) bytes of the process's memory cgroup, or None if unlimited.

  The usage is read at every call; the limit at most every
  `CGROUP_LIMITS_REFRESH_S` seconds.
  """
  limit = _cached_limit("memory_limit", _cgroup_memory_limit)
  if limit is None:
    return None
  usage = _read(limit[1])
  return (limit[0], int(usage)) if usage else None


def _meminfo_text() -> bytes:
  """The text of /proc/meminfo (b"" when it cannot be read).

  The file stays open and is re-read from its start (one system call), as
  procps does; the kernel regenerates it at every read from offset 0.
  """
  global _meminfo_fd
  with _meminfo_lock:
    try:
      if _meminfo_fd is None:
        _meminfo_fd = os.open(_MEMINFO, os.O_RDONLY)
      return os.pread(_meminfo_fd, 1 << 16, 0)
    except (OSError, AttributeError):  # no such file; no pread (not Unix)
      if _meminfo_fd is not None:
        try:
          os.close(_meminfo_fd)
        except OSError:
          pass
        _meminfo_fd = None
      return b""


def _meminfo() -> tuple[int, int]:
  """(MemTotal, MemAvailable) bytes from one read of /proc/meminfo, as psutil
  reports them (its own reading where /proc/meminfo lacks or misstates
  MemAvailable, or does not exist)."""
  text = _meminfo_text()
  total = _MEMINFO_TOTAL.search(text)
  available = _MEMINFO_AVAILABLE.search(text)
  if total and available:
    total_bytes = int(total.group(1)) * 1024
    available_bytes = int(available.group(1)) * 1024
    if 0 < available_bytes <= total_bytes:
      return total_bytes, available_bytes
  vm = psutil.virtual_memory()
  return vm.total, vm.available


def memory() -> tuple[int, int]:
  """(total, available) bytes from one reading of RAM and the cgroup.

  total: what this process may use in all (RAM, capped by the cgroup limit);
  available: free RAM now, capped by the cgroup headroom.
  """
  total, available = _meminfo()
  cg = cgroup_memory()
  if cg:
    total = min(total, cg[0])
    available = min(available, max(0, cg[0] - cg[1]))
  return total, available


def total_memory() -> int:
  """Bytes of memory this process may use in all: RAM, capped by the cgroup."""
  return memory()[0]


def available_memory() -> int:
  """Bytes of memory available now: free RAM, capped by the cgroup headroom."""
  return memory()[1]
