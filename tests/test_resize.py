"""Resize events: the affinity of every thread changes on schedule."""

import os
import threading

from _waiting import wait_for
import psutil
import pytest

from intune_tf import host
from intune_tf.bench import resize


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_schedule_changes_every_thread_and_restores():
  idle = threading.Event()
  worker = threading.Thread(target=idle.wait, daemon=True)
  worker.start()
  all_cpus = resize.machine_cpu_ids()
  # Conditions are awaited, not slept for: a loaded CI machine may start the
  # schedule's thread late. The second event leaves 2 s to see the first.
  schedule = resize.Schedule([(0.0, 1), (2.0, 2)])
  schedule.start()

  def counts():
    return {len(os.sched_getaffinity(t.id))
            for t in psutil.Process().threads()}
  assert wait_for(lambda: counts() == {1} and host.usable_cpus() == 1)
  assert wait_for(lambda: host.usable_cpus() == 2)
  schedule.stop()
  assert [n for _, n in schedule.applied] == [1, 2]
  assert sorted(os.sched_getaffinity(0)) == all_cpus
  idle.set()


@pytest.mark.parametrize("events", [[(-1.0, 1)], [(0.0, 0)]])
def test_bad_events_are_rejected(events):
  with pytest.raises(ValueError, match="Bad resize event"):
    resize.Schedule(events)


def test_cotenant_burns_cpu_in_its_window_and_ends_its_processes():
  # A window from 0.5 s to 3 s with 2 processes; conditions are awaited
  # (a loaded machine may start them late).
  cotenant = resize.CoTenant([(0.5, 3.0, 2)])
  cotenant.start()
  assert wait_for(lambda: len(cotenant.processes) == 2)
  burners = [psutil.Process(p.pid) for p in cotenant.processes]
  # Each burns CPU: its CPU time grows while the window is open.
  assert wait_for(lambda: all(b.cpu_times().user > 0.05 for b in burners))
  assert wait_for(lambda: not cotenant.processes)
  assert [n for _, n in cotenant.applied] == [2, 0]
  assert not any(b.is_running() and b.status() != psutil.STATUS_ZOMBIE
                 for b in burners)
  cotenant.stop()


def test_stop_ends_a_cotenant_before_its_window_closes():
  cotenant = resize.CoTenant([(0.0, 600.0, 1)])
  cotenant.start()
  assert wait_for(lambda: len(cotenant.processes) == 1)
  pid = cotenant.processes[0].pid
  cotenant.stop()
  assert not cotenant.processes and not psutil.pid_exists(pid)


@pytest.mark.parametrize("windows", [[(-1.0, 2.0, 1)], [(2.0, 2.0, 1)],
                                     [(0.0, 1.0, 0)]])
def test_bad_cotenant_windows_are_rejected(windows):
  with pytest.raises(ValueError, match="Bad co-tenant window"):
    resize.CoTenant(windows)
