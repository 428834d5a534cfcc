"""Host readings."""

import os
import threading

import psutil
import pytest

from intune_tf import host


def test_memory_readings_are_consistent():
  total, available = host.total_memory(), host.available_memory()
  assert 0 < available <= total <= psutil.virtual_memory().total
  both_total, both_available = host.memory()
  assert both_total == total  # the total does not move between readings
  assert 0 < both_available <= both_total


_meminfo = host._meminfo  # pylint: disable=protected-access


def _close_meminfo() -> None:
  """Closes the /proc/meminfo stand-in a test made `host` keep open."""
  if host._meminfo_fd is not None:  # pylint: disable=protected-access
    os.close(host._meminfo_fd)  # pylint: disable=protected-access


class _Clock:
  """A stand-in for the `time` module whose monotonic clock we move."""

  def __init__(self, now: float = 1000.0):
    self.now = now

  def monotonic(self) -> float:
    return self.now


@pytest.fixture
def clock(monkeypatch):
  fake = _Clock()
  monkeypatch.setattr(host, "time", fake)
  monkeypatch.setattr(host, "_limits_cache", {})
  return fake


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_cgroup_cpu_quota_is_reread_after_the_refresh_interval(clock,
                                                               monkeypatch):
  quota = {"cpus": 1.0}
  monkeypatch.setattr(host, "cgroup_cpu_quota", lambda: quota["cpus"])
  assert host.usable_cpus() == 1
  quota["cpus"] = None
  clock.now += host.CGROUP_LIMITS_REFRESH_S / 2
  assert host.usable_cpus() == 1  # the quota read a moment ago
  clock.now += host.CGROUP_LIMITS_REFRESH_S / 2
  assert host.usable_cpus() == len(os.sched_getaffinity(0))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_affinity_change_is_seen_at_the_next_reading(clock, monkeypatch):
  # The clock stands still: only the affinity, read at every call, moves.
  monkeypatch.setattr(host, "cgroup_cpu_quota", lambda: None)
  result = {}

  def probe():
    cpus = sorted(os.sched_getaffinity(0))
    result["before"] = host.usable_cpus()
    os.sched_setaffinity(0, {cpus[0]})
    result["one"] = host.usable_cpus()
    os.sched_setaffinity(0, set(cpus))
    result["after"] = host.usable_cpus()

  t = threading.Thread(target=probe)
  t.start()
  t.join()
  all_cpus = len(os.sched_getaffinity(0))
  assert result == {"before": all_cpus, "one": 1, "after": all_cpus}


def test_cgroup_memory_usage_is_read_every_time_the_limit_at_intervals(
    clock, monkeypatch, tmp_path):
  limit, usage = tmp_path / "memory.max", tmp_path / "memory.current"
  limit.write_text(f"{1 << 20}\n")
  usage.write_text("1000\n")
  monkeypatch.setattr(host, "_CGROUP_V2_MEM_MAX", str(limit))
  monkeypatch.setattr(host, "_CGROUP_V2_MEM_CUR", str(usage))
  ram_total, ram_available = _meminfo()
  assert host.cgroup_memory() == (1 << 20, 1000)
  assert host.memory() == (1 << 20, min(ram_available, (1 << 20) - 1000))
  usage.write_text("2000\n")
  assert host.memory()[1] == min(ram_available, (1 << 20) - 2000)
  limit.write_text(f"{2 << 20}\n")
  clock.now += host.CGROUP_LIMITS_REFRESH_S / 2
  assert host.total_memory() == 1 << 20
  clock.now += host.CGROUP_LIMITS_REFRESH_S / 2
  assert host.total_memory() == 2 << 20
  limit.write_text("max\n")
  clock.now += host.CGROUP_LIMITS_REFRESH_S
  assert host.cgroup_memory() is None
  assert host.total_memory() == ram_total


def test_meminfo_agrees_with_psutil():
  total, available = _meminfo()
  assert total == psutil.virtual_memory().total
  assert 0 < available <= total


def test_meminfo_is_read_afresh_from_its_start(monkeypatch, tmp_path):
  meminfo = tmp_path / "meminfo"
  monkeypatch.setattr(host, "_MEMINFO", str(meminfo))
  monkeypatch.setattr(host, "_meminfo_fd", None)
  meminfo.write_text("MemTotal:       4000 kB\nMemFree: 1 kB\n"
                     "MemAvailable:   3000 kB\n")
  try:
    assert _meminfo() == (4000 * 1024, 3000 * 1024)
    with open(meminfo, "r+") as f:  # the same file, rewritten in place
      f.write("MemTotal:       4000 kB\nMemFree: 1 kB\n"
              "MemAvailable:   2000 kB\n")
    assert _meminfo() == (4000 * 1024, 2000 * 1024)
  finally:
    _close_meminfo()


@pytest.mark.parametrize("text", [
    None,  # no /proc/meminfo
    "MemTotal:       4000 kB\n",  # no MemAvailable (kernels before 3.14)
    "MemTotal:       4000 kB\nMemAvailable:   0 kB\n",
])
def test_meminfo_falls_back_to_psutil(monkeypatch, tmp_path, text):
  meminfo = tmp_path / "meminfo"
  if text is not None:
    meminfo.write_text(text)
  monkeypatch.setattr(host, "_MEMINFO", str(meminfo))
  monkeypatch.setattr(host, "_meminfo_fd", None)
  try:
    total, available = _meminfo()
  finally:
    _close_meminfo()
  assert total == psutil.virtual_memory().total
  assert 0 < available <= total
