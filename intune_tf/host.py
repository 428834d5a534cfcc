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
from typing import Any, Callable, TypeVar

import psutil

_CGROUP_V2_CPU = "/sys/fs/cgroup/cpu.max"
_CGROUP_V1_QUOTA = "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"
_CGROUP_V1_PERIOD = "/sys/fs/cgroup/cpu/cpu.cfs_period_us"
_CGROUP_V2_MEM_MAX = "/sys/fs/cgroup/memory.max"
_CGROUP_V2_MEM_CUR = "/sys/fs/cgroup/memory.current"
_CGROUP_V1_MEM_MAX = "/sys/fs/cgroup/memory/memory.limit_in_bytes"
_CGROUP_V1_MEM_CUR = "/sys/fs/cgroup/memory/memory.usage_in_bytes"
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


def cgroup_cpu_quota() -> float | None:
  """CPUs allowed by the cgroup CPU quota (cpu.max / cfs quota), or None."""
  text = _read(_CGROUP_V2_CPU)
  if text:
    quota, _, period = text.partition(" ")
    if quota != "max" and period:
      return int(quota) / int(period)
    return None
  quota, period = _read(_CGROUP_V1_QUOTA), _read(_CGROUP_V1_PERIOD)
  if quota and period and int(quota) > 0:
    return int(quota) / int(period)
  return None


def usable_cpus() -> int:
  """CPUs this process may use now: its affinity, capped by the cgroup quota.

  The affinity is read at every call; the quota at most every
  `CGROUP_LIMITS_REFRESH_S` seconds.

  Returns:
    At least 1.
  """
  try:
    cpus = len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    cpus = os.cpu_count() or 1
  quota = _cached_limit("cpu_quota", cgroup_cpu_quota)
  if quota is not None:
    cpus = min(cpus, max(1, math.floor(quota)))
  return max(1, cpus)


def machine_cpus() -> int:
  """All logical CPUs of the machine (the most a job could be given)."""
  return os.cpu_count() or 1


def _cgroup_memory_limit() -> tuple[int, str] | None:
  """(limit bytes, path of the usage file) of the memory cgroup, or None if
  unlimited."""
  for max_path, cur_path in ((_CGROUP_V2_MEM_MAX, _CGROUP_V2_MEM_CUR),
                             (_CGROUP_V1_MEM_MAX, _CGROUP_V1_MEM_CUR)):
    limit = _read(max_path)
    if limit and limit != "max" and _exists(cur_path):
      limit_bytes = int(limit)
      if limit_bytes < (1 << 60):  # v1 reports "no limit" as a huge number
        return limit_bytes, cur_path
  return None


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
