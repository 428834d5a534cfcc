"""Host readings."""

import ctypes
import os
import pathlib
import sys
import threading

import _cgroups
import psutil
import pytest

from intune_tf import host

_LIBC = ctypes.CDLL(None, use_errno=True)


def test_memory_readings_are_consistent():
  total, available = host.total_memory(), host.available_memory()
  assert 0 < available <= total <= psutil.virtual_memory().total
  both_total, both_available = host.memory()
  assert both_total == total  # the total does not move between readings
  assert 0 < both_available <= both_total


_meminfo = host._meminfo  # noqa: SLF001


def _close_meminfo() -> None:
  """Closes the /proc/meminfo stand-in a test made `host` keep open."""
  if host._meminfo_fd is not None:  # noqa: SLF001
    os.close(host._meminfo_fd)  # noqa: SLF001


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
  assert host.usable_cpus() == len(host.cpu_ids())


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


def _thread_affinities(python: bool = False) -> set[frozenset[int]]:
  """The affinities of this process's threads: Python's (`python`), else
  the others."""
  ours = {t.native_id for t in threading.enumerate()}
  return {frozenset(os.sched_getaffinity(t.id))
          for t in psutil.Process().threads() if (t.id in ours) == python}


@pytest.fixture
def given_cpus(monkeypatch):
  """The CPUs given to this process (at least 2), restored afterwards."""
  cpus = sorted(os.sched_getaffinity(0))
  if len(cpus) < 2:
    pytest.skip("needs 2 CPUs to confine a process to one")
  monkeypatch.setattr(host, "cgroup_cpu_quota", lambda: None)
  monkeypatch.setattr(host, "_placement", [None])
  yield cpus
  host.set_process_cpus(cpus)


def _c_thread() -> ctypes.c_ulong:
  """Starts a thread that is not Python's (as TensorFlow's are): libc's
  `sleep` as its start routine, for an hour or until pthread_cancel."""
  handle = ctypes.c_ulong()
  assert _LIBC.pthread_create(ctypes.byref(handle), None,
                              ctypes.cast(_LIBC.sleep, ctypes.c_void_p),
                              ctypes.c_void_p(3600)) == 0
  return handle


@pytest.fixture
def c_threads():
  """Starts C threads (`start()`); cancels and joins them afterwards."""
  handles = []
  yield lambda: handles.append(_c_thread())
  for handle in handles:
    _LIBC.pthread_cancel(handle)
    _LIBC.pthread_join(handle, None)


def test_a_placed_process_runs_on_its_cpus_and_still_counts_all(given_cpus,
                                                               c_threads):
  idle = threading.Event()
  threading.Thread(target=idle.wait, daemon=True).start()
  c_threads()
  assert host.place_process([given_cpus[1]])
  assert _thread_affinities() == {frozenset([given_cpus[1]])}
  # A thread started since by a Python thread has its creator's CPUs until
  # the next placement moves it.
  threading.Thread(target=idle.wait, daemon=True).start()
  c_threads()
  assert host.place_process([given_cpus[1]])
  # Every thread but Python's runs on that CPU; Python's stay on all of
  # them, and they are still all given.
  assert _thread_affinities() == {frozenset([given_cpus[1]])}
  assert _thread_affinities(python=True) == {frozenset(given_cpus)}
  assert host.cpu_ids() == given_cpus
  assert host.usable_cpus() == len(given_cpus)
  assert not host.place_process([given_cpus[1]])  # no change, nothing done
  # A CPU not given to the process is never taken.
  assert host.place_process([given_cpus[0], 10**4])
  assert _thread_affinities() == {frozenset([given_cpus[0]])}
  assert host.place_process(None)
  assert _thread_affinities() == {frozenset(given_cpus)}
  assert not host.place_process(None)
  idle.set()


def test_an_affinity_set_from_outside_replaces_a_placement(given_cpus,
                                                          c_threads):
  c_threads()
  assert host.place_process([given_cpus[0]])
  # An orchestrator gives the process CPUs 1.. (a resize): they are now the
  # ones given to it, and going back gives those, not the former ones.
  host.set_process_cpus(given_cpus[1:])
  assert host.cpu_ids() == given_cpus[1:]
  assert not host.place_process(None)
  assert _thread_affinities() == {frozenset(given_cpus[1:])}


def _fake_cgroups(monkeypatch, tmp_path, proc_lines: str,
                  unified: str = "") -> pathlib.Path:
  """A cgroup file system in tmp_path and a /proc/self/cgroup listing."""
  fs = tmp_path / "cgroup"
  fs.mkdir()
  if unified:
    (fs / "cgroup.controllers").write_text(unified + "\n")
  proc = tmp_path / "proc-self-cgroup"
  proc.write_text(proc_lines)
  monkeypatch.setattr(host, "_CGROUP_FS", str(fs))
  monkeypatch.setattr(host, "_PROC_SELF_CGROUP", str(proc))
  # Limits cached before the paths moved are dropped: a tuner thread left by
  # an earlier test of this process (`make coverage` runs every test in one
  # session) can cache the real cgroup's limit in between, at the fake
  # clock's time.
  monkeypatch.setattr(host, "_limits_cache", {})
  return fs


def _write(path: pathlib.Path, text: str) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text + "\n")


# (listing, controllers of the unified hierarchy, the job's memory dir,
#  limit file, usage file, the job's CPU dir)
_LAYOUTS = {
    "v2": ("0::/slurm/job7\n", "cpu memory", "slurm/job7", "memory.max",
           "memory.current", "slurm/job7"),
    "v1": ("5:memory:/slurm/job7\n3:cpu,cpuacct:/slurm/job7\n0::/\n", "",
           "memory/slurm/job7", "memory.limit_in_bytes",
           "memory.usage_in_bytes", "cpu/slurm/job7"),
}


@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
def test_limits_of_the_process_own_nested_cgroup_count(clock, monkeypatch,
                                                       tmp_path, layout):
  listing, unified, mem_dir, limit_name, usage_name, cpu_dir = (
      _LAYOUTS[layout])
  fs = _fake_cgroups(monkeypatch, tmp_path, listing, unified)
  job = fs / mem_dir
  parent = job.parent
  # Root unlimited, the parent allows 8 MiB, the job 3 MiB: the job's binds.
  _write(parent / limit_name, str(8 << 20))
  _write(parent / usage_name, "100")
  _write(job / limit_name, str(3 << 20))
  _write(job / usage_name, "1000")
  assert host.cgroup_dirs("memory") == [str(job), str(parent),
                                        str(job.parent.parent)]
  # The process's tuner thread (of an earlier test's iterator) may have
  # read the limit at this same fake time, before the files above were
  # written: the read below comes after the cache's refresh interval.
  clock.now += host.CGROUP_LIMITS_REFRESH_S
  assert host.cgroup_memory() == (3 << 20, 1000)
  cpu = fs / cpu_dir
  if layout == "v2":
    _write(cpu / "cpu.max", "150000 100000")
    _write(cpu.parent / "cpu.max", "max 100000")
  else:
    _write(cpu / "cpu.cfs_quota_us", "150000")
    _write(cpu / "cpu.cfs_period_us", "100000")
    _write(cpu.parent / "cpu.cfs_quota_us", "-1")
    _write(cpu.parent / "cpu.cfs_period_us", "100000")
  assert host.cgroup_cpu_quota() == 1.5  # 150000 / 100000


def test_a_cgroup_path_not_mounted_here_falls_back_to_the_root(
    clock, monkeypatch, tmp_path):
  # A container without a cgroup namespace lists the host's path.
  fs = _fake_cgroups(monkeypatch, tmp_path, "0::/docker/abc\n", "memory")
  _write(fs / "memory.max", str(5 << 20))
  _write(fs / "memory.current", "7")
  assert host.cgroup_dirs("memory") == [str(fs)]
  assert host.cgroup_memory() == (5 << 20, 7)


def test_cgroup_memory_usage_is_read_every_time_the_limit_at_intervals(
    clock, monkeypatch, tmp_path):
  fs = _fake_cgroups(monkeypatch, tmp_path, "0::/\n", "memory")
  limit, usage = fs / "memory.max", fs / "memory.current"
  limit.write_text(f"{1 << 20}\n")
  usage.write_text("1000\n")
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


_CHILD_PROBE = """
from intune_tf import host
limit, usage = host.cgroup_memory()
print(limit, host.total_memory())
"""


def test_a_job_in_a_real_child_cgroup_is_budgeted_from_its_own_limit(
    tmp_path):
  """A real memory cgroup under this process's own (as Slurm or
  `systemd-run -p MemoryMax=` make): a process moved into it reads the
  child's limit, not the host's RAM."""
  limit = _cgroups.TF_IMPORT_BYTES
  with _cgroups.memory_cgroup(limit) as cgroup:
    run = cgroup.run([sys.executable, "-c", _CHILD_PROBE], cwd=tmp_path,
                     timeout=120)
  assert run.returncode == 0, run.stderr[-2000:]
  assert [int(v) for v in run.stdout.split()[-2:]] == [limit, limit]


@pytest.mark.parametrize("text,expected", [
    ("150000 100000", 1.5),   # 150000 / 100000
    ("50000", 0.5),           # 50000 / the kernel's default period 100000
    ("max 100000", None),     # no limit
    ("max", None),
])
def test_cpu_max_quota(text, expected):
  assert host.cpu_max_quota(text) == expected


@pytest.mark.parametrize("text", ["100000 0", "0 100000", "-5 100000",
                                  "abc 100000", "1 2 3", "100000 1.5"])
def test_cpu_max_quota_refuses_what_is_not_a_quota(text):
  with pytest.raises(ValueError, match="expected"):
    host.cpu_max_quota(text)


def test_a_cpu_max_with_a_zero_period_is_left_out_with_one_warning_naming_it(
    clock, monkeypatch, tmp_path, caplog):
  # Used to leave the session untuned with a ZeroDivisionError naming no
  # file.
  fs = _fake_cgroups(monkeypatch, tmp_path, "0::/job\n", "cpu")
  _write(fs / "job" / "cpu.max", "100000 0")
  _write(fs / "cpu.max", "300000 100000")
  # The parent's 3 CPUs are the limit left, read twice, told once.
  assert host.cgroup_cpu_quota() == 3.0
  assert host.cgroup_cpu_quota() == 3.0
  told = [r.getMessage() for r in caplog.records if "CPU quota" in
          r.getMessage()]
  assert told == [
      f"InTune: cannot read the CPU quota in {fs / 'job' / 'cpu.max'} "
      "(expected a positive quota and period in microseconds, got "
      "'100000 0'); it is left out, the other CPU limits (parent cgroups, "
      "CPU affinity) apply. Fix the cgroup's cpu.max, e.g. 'max 100000' "
      "for no limit."]
  assert 1 <= host.usable_cpus() <= len(host.cpu_ids())


@pytest.mark.parametrize("value,expected", [
    (1, True), (4242, True), (host.PID_MAX, True),
    (0, False),  # os.kill(0, 0) signals the caller's process group
    (-1, False),  # psutil.Process(-1) raises ValueError
    (host.PID_MAX + 1, False), (2**31, False),  # os.kill: OverflowError
    (2**70, False), (True, False), ("7", False), (7.0, False), (None, False),
])
def test_is_pid_takes_only_what_may_name_a_process(value, expected):
  assert host.is_pid(value) is expected
