"""Host readings."""

import os
import threading

import psutil

from intune_tf import host


def test_usable_cpus_follows_affinity():
  result = {}

  def probe():
    # Affinity is per thread on Linux: change it on a thread of our own.
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[0]})
    result["one"] = host.usable_cpus()
    os.sched_setaffinity(0, set(cpus))
    result["all"] = host.usable_cpus()

  t = threading.Thread(target=probe)
  t.start()
  t.join()
  assert result["one"] == 1
  assert result["all"] == min(len(os.sched_getaffinity(0)),
                              int(host.cgroup_cpu_quota() or 10**6))


def test_memory_readings_are_consistent():
  total, available = host.total_memory(), host.available_memory()
  assert 0 < available <= total <= psutil.virtual_memory().total
  both_total, both_available = host.memory()
  assert both_total == total  # the total does not move between readings
  assert 0 < both_available <= both_total
