"""Readings of the host that budgets and policies depend on.

Every function re-reads the machine, so a change of CPU affinity, cgroup
quota or free memory is seen at the next call. Only which cgroup files exist
(the cgroup layout, fixed for the life of a process) is remembered.
"""

from __future__ import annotations

import functools
import math
import os

import psutil

_CGROUP_V2_CPU = "/sys/fs/cgroup/cpu.max"
_CGROUP_V1_QUOTA = "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"
_CGROUP_V1_PERIOD = "/sys/fs/cgroup/cpu/cpu.cfs_period_us"
_CGROUP_V2_MEM_MAX = "/sys/fs/cgroup/memory.max"
_CGROUP_V2_MEM_CUR = "/sys/fs/cgroup/memory.current"
_CGROUP_V1_MEM_MAX = "/sys/fs/cgroup/memory/memory.limit_in_bytes"
_CGROUP_V1_MEM_CUR = "/sys/fs/cgroup/memory/memory.usage_in_bytes"


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

  Returns:
    At least 1.
  """
  try:
    cpus = len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    cpus = os.cpu_count() or 1
  quota = cgroup_cpu_quota()
  if quota is not None:
    cpus = min(cpus, max(1, math.floor(quota)))
  return max(1, cpus)


def machine_cpus() -> int:
  """All logical CPUs of the machine (the most a job could be given)."""
  return os.cpu_count() or 1


def cgroup_memory() -> tuple[int, int] | None:
  """(limit, usage) bytes of the process's memory cgroup, or None if unlimited."""
  for max_path, cur_path in ((_CGROUP_V2_MEM_MAX, _CGROUP_V2_MEM_CUR),
                             (_CGROUP_V1_MEM_MAX, _CGROUP_V1_MEM_CUR)):
    limit, usage = _read(max_path), _read(cur_path)
    if limit and limit != "max" and usage:
      limit_bytes = int(limit)
      if limit_bytes < (1 << 60):  # v1 reports "no limit" as a huge number
        return limit_bytes, int(usage)
  return None


def memory() -> tuple[int, int]:
  """(total, available) bytes from one reading of RAM and the cgroup.

  total: what this process may use in all (RAM, capped by the cgroup limit);
  available: free RAM now, capped by the cgroup headroom.
  """
  vm = psutil.virtual_memory()
  total, available = vm.total, vm.available
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
