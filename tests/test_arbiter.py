"""The host arbiter: the split rule, the lease folder, hostile entries."""

import json
import logging
import math
import os
import pathlib
import stat
import subprocess
import sys
import threading
import time

import _fuzz
import pytest

from intune_tf import arbiter

INF = math.inf


@pytest.mark.parametrize("total,weights,expected", [
    (2, [1, 1], [1.0, 1.0]),
    (2, [1, 3], [0.5, 1.5]),  # 2 x 1/4, 2 x 3/4
    (6, [2, 1], [4.0, 2.0]),  # 6 x 2/3, 6 x 1/3
])
def test_fair_shares(total, weights, expected):
  assert arbiter.fair_shares(total, weights) == pytest.approx(expected)


@pytest.mark.parametrize("total,weights,caps,expected", [
    # Equal shares 1 and 1; the first is capped at 0.5, its 0.5 goes on.
    (2, [1, 1], [0.5, INF], [0.5, 1.5]),
    # No cap binds: by weight, 3 x 1/3 and 3 x 2/3.
    (3, [1, 2], [INF, INF], [1.0, 2.0]),
    # 4 over [1, 1, 1, 1] is 1 each; caps 0.25 and 0.75 free 1.0, which the
    # two uncapped take: 1.5 each.
    (4, [1, 1, 1, 1], [0.25, 0.75, INF, INF], [0.25, 0.75, 1.5, 1.5]),
    # Every cap reached (0.5 + 0.5 of 2): the spare 1.0 goes by weight.
    (2, [1, 1], [0.5, 0.5], [1.0, 1.0]),
    # Weighted with a cap: shares 1 and 2 of 3; the second is capped at 1.2,
    # its 0.8 goes to the first: 1.8.
    (3, [1, 2], [INF, 1.2], [1.8, 1.2]),
])
def test_water_fill(total, weights, caps, expected):
  shares = arbiter.water_fill(total, weights, caps)
  assert shares == pytest.approx(expected)
  assert sum(shares) == pytest.approx(total)


@pytest.mark.parametrize("cpus,weights,wanted,expected", [
    # Two alike processes that both want more: 1 CPU each.
    (2, [1, 1], [None, None], [1.0, 1.0]),
    # One consumer-bound at 0.2 CPUs: its floor 0.5 x 1 = 0.5 is kept, the
    # other takes the rest, 1.5.
    (2, [1, 1], [0.2, None], [0.5, 1.5]),
    # The module's example: floors [0.5, 0.5, 1], caps [0.5, inf, inf];
    # the 3.5 left go 1:2 -> 3.5/3 and 7/3.
    (4, [1, 1, 2], [0.2, None, None], [0.5, 3.5 / 3, 7 / 3]),
    # Wants 1.2, more than its equal share 1: no cap binds -> 1 each.
    (2, [1, 1], [1.2, None], [1.0, 1.0]),
    # Wants 0.8 (above its floor 0.5): capped there, the other gets 1.2.
    (2, [1, 1], [0.8, None], [0.8, 1.2]),
    # Weight 3 against 1, both input-bound: 2 x 3/4 and 2 x 1/4.
    (2, [3, 1], [None, None], [1.5, 0.5]),
    (8, [], [], []),
])
def test_split_cpus(cpus, weights, wanted, expected):
  shares = arbiter.split_cpus(cpus, weights, wanted)
  assert shares == pytest.approx(expected)
  if weights:
    assert sum(shares) == pytest.approx(cpus)


def test_split_cpus_keeps_the_floor_of_a_heavy_neighbour():
  # Weights [1, 9] of 10 CPUs: fair [1, 9], floors [0.5, 4.5]; the second
  # wants 0 more than 0.1 CPUs but is still given its floor 4.5, and the
  # first (input-bound) takes 5.5.
  assert arbiter.split_cpus(10, [1, 9], [None, 0.1]) == pytest.approx(
      [5.5, 4.5])


@pytest.mark.parametrize("shares,cpus,expected", [
    ([0.5, 1.5], 2, [1, 1]),  # floors [0, 1], 1 left to the tie's first
    ([0.5, 3.5 / 3, 7 / 3], 4, [1, 1, 2]),  # floors [0, 1, 2], 1 to 0.5
    ([0.5] * 4, 2, [1, 1, 1, 1]),  # [1, 1, 0, 0], then at least 1 each
    ([2.0, 2.0], 4, [2, 2]),
    ([1.4, 2.6], 4, [1, 3]),  # floors [1, 2], 1 left to 0.6
])
def test_whole_cpus(shares, cpus, expected):
  assert arbiter.whole_cpus(shares, cpus) == expected


@pytest.mark.parametrize("whole,index,cpu_ids,expected", [
    ([1, 1], 0, [0, 1], [0]),
    ([1, 1], 1, [0, 1], [1]),
    ([1, 2], 1, [0, 1, 2], [1, 2]),  # starts after process 0's one CPU
    ([1, 1, 1, 1], 2, [0, 1], [0]),  # 1 + 1 = 2 CPUs dealt: starts over
    ([1, 1, 1, 1], 3, [0, 1], [1]),
    ([2, 2], 1, [4, 6, 7], [4, 7]),  # CPUs 7 then 4 (wrapped), sorted
    ([3], 0, [0, 1], [0, 1]),  # more than the host: each CPU once
])
def test_place_cpus(whole, index, cpu_ids, expected):
  assert arbiter.place_cpus(whole, index, cpu_ids) == expected


def _share(processes, cpu_ids):
  return arbiter.Share(cpus=len(cpu_ids), cpu_share=1.0, ram=1, processes=
                       processes, host_cpus=2, ram_pool=2, cpu_ids=cpu_ids)


@pytest.mark.parametrize("share,wanted,whole_process,same_cpus,expected", [
    (_share(2, (1,)), None, True, True, (1,)),  # input-bound beside another
    (_share(2, (1,)), 1.0, True, True, None),  # consumer-bound: its model's
    (_share(2, (1,)), None, False, True, None),  # a session does not share
    (_share(2, (1,)), None, True, False, None),  # given other CPUs than it
    (_share(1, (0, 1)), None, True, True, None),  # alone
    (None, None, True, True, None),  # not sharing
])
def test_confine_to(share, wanted, whole_process, same_cpus, expected):
  demand = arbiter.Demand(cpus_wanted=wanted)
  assert arbiter.confine_to(share, demand, whole_process,
                            same_cpus) == expected


@pytest.mark.parametrize("available,buffered,limit,share,expected", [
    (800, 200, 4000, 0.5, 500),  # 0.5 x (800 + 200)
    (8000, 0, 1000, 0.5, 1000),  # 4000, capped by the limit 1000
    (-5, 0, 1000, 0.5, 1),  # nothing available: at least 1 byte
])
def test_ram_pool(available, buffered, limit, share, expected):
  assert arbiter.ram_pool(available, buffered, limit, share) == expected


@pytest.mark.parametrize("pool,weights,expected", [
    (1000, [1, 2], [333, 666]),  # 1000/3 and 2000/3, rounded down
    (1000, [1, 1, 1, 1], [250, 250, 250, 250]),
    (3, [1, 1, 1, 1], [1, 1, 1, 1]),  # at least 1 byte each
])
def test_split_ram(pool, weights, expected):
  assert arbiter.split_ram(pool, weights) == expected


@pytest.mark.parametrize("busy,input_bound,expected", [
    (0.8, False, 1.0),  # 1.25 x 0.8
    (0.8, True, None),  # input-bound: any number
    (0.0, False, None),  # not measured yet
])
def test_cpus_wanted(busy, input_bound, expected):
  assert arbiter.cpus_wanted(busy, input_bound) == expected


# The lease folder.


def _entry(pid: int, **fields) -> dict:
  entry = {"format": arbiter.FORMAT, "pid": pid, "uid": os.getuid(),
           "start": 0.0, "weight": 1.0, "heartbeat": time.time(),
           "rate": 100.0, "busy_cpus": 1.0, "cpus_wanted": None,
           "buffered_bytes": 1000, "cpus": 1, "ram": 1 << 20}
  entry.update(fields)
  return entry


def _write(path: pathlib.Path, data, mode: int = 0o600) -> pathlib.Path:
  path.write_text(data if isinstance(data, str) else json.dumps(data))
  os.chmod(path, mode)
  return path


@pytest.fixture
def folder(tmp_path):
  d = tmp_path / "host"
  arbiter.make_folder(d)
  return d


@pytest.fixture
def sleeper():
  """A live process of ours whose pid a lease can name."""
  p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  yield p.pid
  p.kill()
  p.wait()


def _told(caplog, path) -> list[str]:
  return [r.getMessage() for r in caplog.records
          if r.levelno == logging.WARNING and str(path) in r.getMessage()]


def test_make_folder_is_private(folder):
  info = os.lstat(folder)
  assert stat.S_IMODE(info.st_mode) == 0o700
  assert info.st_uid == os.getuid()


def test_a_live_lease_is_read(folder, sleeper):
  _write(folder / f"{sleeper}.json", _entry(
      sleeper, weight=2.0, confined=[0, 2], given=[0, 1, 2]))
  (lease,) = arbiter.read_leases(folder)
  assert (lease.pid, lease.weight, lease.cpus_wanted, lease.confined,
          lease.given) == (sleeper, 2.0, None, (0, 2), (0, 1, 2))


def test_a_lease_of_a_dead_pid_is_ignored_and_removed(folder):
  p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                     capture_output=True, text=True, check=True)
  dead = int(p.stdout)
  path = _write(folder / f"{dead}.json", _entry(dead))
  assert arbiter.read_leases(folder) == []
  assert path.exists()  # a reader that does not remove leaves it
  assert arbiter.read_leases(folder, remove_dead=True) == []
  assert not path.exists()


def test_a_lease_past_its_heartbeat_is_ignored(folder, sleeper):
  _write(folder / f"{sleeper}.json",
         _entry(sleeper, heartbeat=time.time() - arbiter.LEASE_S - 1))
  assert arbiter.read_leases(folder) == []
  assert len(arbiter.read_leases(folder, now=time.time() - 2)) == 1


def _fifo(folder, pid):
  path = folder / f"{pid}.json"
  os.mkfifo(path, 0o600)
  return path


def _symlink(folder, pid):
  target = _write(folder.parent / "elsewhere.json", _entry(pid))
  path = folder / f"{pid}.json"
  path.symlink_to(target)
  return path


def _garbage(folder, pid):
  return _write(folder / f"{pid}.json", "{not json\x00\xff")


def _huge(folder, pid):
  return _write(folder / f"{pid}.json",
                json.dumps(_entry(pid, pad="x" * arbiter.MAX_ENTRY_BYTES)))


def _other_uid(folder, pid):
  path = _write(folder / f"{pid}.json", _entry(pid))
  os.chown(path, 54321, 54321)
  return path


def _open_mode(folder, pid):
  return _write(folder / f"{pid}.json", _entry(pid), mode=0o666)


def _wrong_types(folder, pid):
  return _write(folder / f"{pid}.json", _entry(pid, weight="heavy"))


def _bad_cpus(folder, pid):
  return _write(folder / f"{pid}.json", _entry(pid, confined=[0, -1]))


def _bad_given(folder, pid):
  return _write(folder / f"{pid}.json", _entry(pid, given="all"))


def _not_a_lease(folder, pid):
  return _write(folder / f"{pid}.json", [1, 2, 3])


def _names_another_pid(folder, pid):
  return _write(folder / f"{pid}.json", _entry(1))


def _a_folder(folder, pid):
  path = folder / f"{pid}.json"
  path.mkdir()
  return path


def _naming_pid(value):
  """A lease of pid `value` in a file of that name: the OS must never be
  asked about it (`os.kill(0, 0)` signals the reader's process group,
  `os.kill(2**31, 0)` raises OverflowError)."""
  def make(folder, pid):
    del pid
    return _write(folder / f"{value}.json", _entry(value))
  return make


def _from_the_future(folder, pid):
  # Would never expire while its pid lives.
  return _write(folder / f"{pid}.json",
                _entry(pid, heartbeat=time.time() + 3600))


@pytest.mark.parametrize("make,reason", [
    (_fifo, "not a regular file"),
    (_symlink, "symbolic link"),
    (_garbage, "not JSON"),
    (_huge, "more than a lease's 4096"),
    (_other_uid, "belongs to uid 54321"),
    (_open_mode, "its mode is 666"),
    (_wrong_types, "field 'weight' is 'heavy'"),
    (_bad_cpus, "field 'confined' is [0, -1]"),
    (_bad_given, "field 'given' is 'all'"),
    (_not_a_lease, "not a intune_tf.host/1 object"),
    (_names_another_pid, "names pid 1"),
    (_a_folder, "not a regular file"),
    (_naming_pid(-1), "field 'pid' is -1, not a process id from 1 to"),
    (_naming_pid(0), "field 'pid' is 0, not a process id from 1 to"),
    (_naming_pid(2**31), "field 'pid' is 2147483648, not a process id"),
    (_naming_pid(2**70), "field 'pid' is 1180591620717411303424, not a"),
    (_from_the_future, "its heartbeat is in the future"),
])
def test_a_hostile_entry_is_ignored_with_one_warning(folder, sleeper, caplog,
                                                     make, reason):
  _write(folder / f"{os.getpid()}.json", _entry(os.getpid()))
  path = make(folder, sleeper)
  result = []
  reader = threading.Thread(
      target=lambda: result.extend(
          [arbiter.read_leases(folder), arbiter.read_leases(folder)]),
      daemon=True)
  reader.start()
  reader.join(10)
  assert not reader.is_alive(), "reading the leases hung"
  # The good lease is read both times; the hostile one never.
  assert [[lease.pid for lease in r] for r in result] == [[os.getpid()]] * 2
  told = _told(caplog, path)
  assert len(told) == 1, told
  assert reason in told[0]


def test_the_arbiter_refuses_a_folder_it_does_not_own(tmp_path, caplog):
  d = tmp_path / "theirs"
  d.mkdir(mode=0o700)
  os.chown(d, 54321, 54321)
  a = arbiter.HostArbiter(d)
  for _ in range(2):
    assert a.update(1.0, arbiter.Demand(), 2, 1000, 4000, 0.5) is None
  told = [r.getMessage() for r in caplog.records
          if "host sharing is off" in r.getMessage()]
  assert len(told) == 1 and "belongs to uid 54321" in told[0]
  assert os.listdir(d) == []


def test_the_arbiter_refuses_a_linked_folder(tmp_path):
  real = tmp_path / "real"
  arbiter.make_folder(real)
  (tmp_path / "link").symlink_to(real)
  a = arbiter.HostArbiter(tmp_path / "link")
  assert a.update(1.0, arbiter.Demand(), 2, 1000, 4000, 0.5) is None
  assert os.listdir(real) == []


def test_update_shares_with_the_live_leases(folder, sleeper):
  # Another process of weight 1 that wants any number of CPUs and buffers
  # 1000 bytes; this one (weight 3) is consumer-bound at 0.2 CPUs.
  _write(folder / f"{sleeper}.json", _entry(sleeper, buffered_bytes=1000))
  a = arbiter.HostArbiter(folder)
  share = a.update(3.0, arbiter.Demand(rate=10, busy_cpus=0.2,
                                       cpus_wanted=0.25,
                                       buffered_bytes=3000),
                   cpus=4, available=12000, limit=10**9, ram_share=0.5,
                   cpu_ids=[0, 1, 2, 3])
  # CPUs: fair [3, 1], floors [1.5, 0.5]; this one is capped at its floor
  # 1.5 (wants 0.25), the other takes 2.5 -> whole [1, 2] + 1 left, and the
  # remainders tie (0.5 each): the lower pid takes it -> [2, 2] or [1, 3]
  # (pids wrap, so the sleeper's may be the lower).
  cpus = 2 if os.getpid() < sleeper else 1
  assert share.cpu_share == pytest.approx(1.5)
  assert (share.cpus, share.processes, share.host_cpus) == (cpus, 2, 4)
  # Placed first (lower pid): CPUs [0, 1]; second, after the other's 2 or
  # 3: [2, 3] or [3].
  assert share.cpu_ids == ((0, 1) if os.getpid() < sleeper else (3,))
  # RAM: pool 0.5 x (12000 + 3000 + 1000) = 8000; 3/4 of it is 6000.
  assert (share.ram_pool, share.ram) == (8000, 6000)
  mine = json.loads((folder / f"{os.getpid()}.json").read_text())
  assert (mine["cpus"], mine["ram"], mine["weight"]) == (cpus, 6000, 3.0)
  assert stat.S_IMODE(os.stat(folder / f"{os.getpid()}.json").st_mode) == (
      0o600)
  a.withdraw()
  assert not (folder / f"{os.getpid()}.json").exists()
  assert a.share() is None


def test_every_process_breaks_ties_alike(folder, sleeper):
  # 3 CPUs, two alike processes: [1.5, 1.5] -> whole [2, 1] in pid order,
  # so the lower pid takes 2 and the other 1 in both processes' views (not
  # 2 each, which would sum to 4).
  _write(folder / f"{sleeper}.json", _entry(sleeper))
  share = arbiter.HostArbiter(folder).update(
      1.0, arbiter.Demand(), cpus=3, available=1000, limit=10**6,
      ram_share=0.5, cpu_ids=[4, 5, 6])
  assert share.cpus == (2 if os.getpid() < sleeper else 1)
  # And each is dealt its own CPUs: the lower pid the first two.
  assert share.cpu_ids == ((4, 5) if os.getpid() < sleeper else (6,))
  assert share.confined is None  # `whole_process` not said


def test_an_input_bound_process_is_confined_and_its_lease_says_so(
    folder, sleeper):
  _write(folder / f"{sleeper}.json", _entry(sleeper, given=[0, 1]))
  a = arbiter.HostArbiter(folder)
  # 2 CPUs [0, 1], two alike processes: 1 each, the lower pid on CPU 0.
  mine = (0,) if os.getpid() < sleeper else (1,)
  share = a.update(1.0, arbiter.Demand(), cpus=2, available=1000,
                   limit=10**6, ram_share=0.5, cpu_ids=[0, 1],
                   whole_process=True)
  assert share.cpu_ids == share.confined == mine
  (me,) = [lease for lease in arbiter.read_leases(folder)
           if lease.pid == os.getpid()]
  assert (me.confined, me.given) == (mine, (0, 1))
  # Consumer-bound (wanted 0.5): not confined, and the lease says so.
  share = a.update(1.0, arbiter.Demand(busy_cpus=0.4, cpus_wanted=0.5),
                   cpus=2, available=1000, limit=10**6, ram_share=0.5,
                   cpu_ids=[0, 1], whole_process=True)
  assert share.confined is None
  assert json.loads(a.path.read_text())["confined"] is None
  a.withdraw()


@pytest.mark.parametrize("given", [[1], [0, 1, 2], None])
def test_processes_given_other_cpus_are_not_confined(folder, sleeper, given):
  # The other was given CPU 1 only (taskset), more CPUs, or says nothing:
  # its deal of `place_cpus` may overlap ours, so neither is confined.
  _write(folder / f"{sleeper}.json", _entry(sleeper, given=given))
  a = arbiter.HostArbiter(folder)
  share = a.update(1.0, arbiter.Demand(), cpus=2, available=1000,
                   limit=10**6, ram_share=0.5, cpu_ids=[0, 1],
                   whole_process=True)
  assert share.processes == 2 and share.cpu_ids
  assert share.confined is None
  a.withdraw()


# The child scripts' reading of where the pipeline runs.
_AFFINITY_SOURCE = """
def affinity():
  # The CPUs of the threads that run the pipeline: every thread but
  # Python's (which host sharing leaves on every CPU given).
  ours = {t.native_id for t in threading.enumerate()}
  cpus = set()
  for tid in os.listdir("/proc/self/task"):
    if int(tid) not in ours:
      try:
        cpus |= os.sched_getaffinity(int(tid))
      except OSError:
        pass  # ended meanwhile
  return sorted(cpus)
"""


CONFINED_SCRIPT = _AFFINITY_SOURCE + """
import json, os, sys, threading
import tensorflow as tf
import intune_tf
from intune_tf import host

def interleave(tuned):
  ds = tf.data.Dataset.range(6).interleave(
      lambda x: tf.data.Dataset.range(x * 10, x * 10 + 4),
      num_parallel_calls=2)
  return intune_tf.tune(ds, policy="manual") if tuned else ds

def elements(ds):
  return [int(x) for x in ds]

plain = elements(interleave(False))
cpu = sorted(os.sched_getaffinity(0))[0]
host.place_process([cpu])  # as host sharing confines an input-bound job
built = interleave(True)
got = elements(built), elements(interleave(False)), elements(built)
host.place_process([cpu])  # the pipelines' threads, started since
print(json.dumps({"plain": plain, "got": got, "cpu": cpu,
                  "others": affinity()}))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                    reason="needs 2 CPUs to confine a process to one")
def test_a_confined_process_builds_and_iterates_as_plain_tf(tmp_path):
  # An interleave with num_parallel_calls=2 and no cycle_length: TensorFlow
  # resolves its cycle_length from the CPUs of the thread that builds it
  # (and again where the iterator rebuilds it). Host sharing confines an
  # input-bound job to one CPU: the pipelines' threads run there, but the
  # elements are plain TF's, where confining every thread failed the build.
  script = tmp_path / "confined.py"
  script.write_text(CONFINED_SCRIPT)
  done = subprocess.run(
      [sys.executable, str(script)], capture_output=True, text=True,
      timeout=300, check=False,
      env=dict(os.environ, INTUNE_HOST_DIR=str(tmp_path / "host"),
               INTUNE_STATUS="off", TF_CPP_MIN_LOG_LEVEL="2"))
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert result["got"] == [result["plain"]] * 3
  assert result["others"] == [result["cpu"]]


# Real processes sharing one host.

_CHILD = r"""
import json, os, sys, threading, time
import tensorflow as tf
import intune_tf

""" + _AFFINITY_SOURCE + r"""
share, seconds = sys.argv[1] == "on", float(sys.argv[2])
# "input-bound": a map of a few ms per element and a consumer that never
# waits; else a cheap map and a consumer that sleeps (consumer-bound).
input_bound = sys.argv[3] == "input-bound"
seen = {}
intune_tf.global_tuner().add_listener(
    lambda session, obs, applied: seen.update(cpu_budget=obs.cpu_budget))
options = tf.data.Options()
options.experimental_intune = intune_tf.IntuneOptions(
    policy="even", period_s=0.1, host_share=share, warm_start=False)
work = ((lambda x: tf.reduce_max(tf.sort(tf.random.stateless_uniform(
    [100000], tf.stack([x, x]))))) if input_bound else (lambda x: x * 2))
ds = tf.data.Dataset.range(10**9).map(
    work, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
        tf.data.AUTOTUNE).with_options(options)
it = iter(ds)
next(it)
session = intune_tf.session_of(it)
end = time.monotonic() + seconds
told = 0.0
while time.monotonic() < end:
  next(it)
  if not input_bound:
    time.sleep(0.0005)
  if time.monotonic() - told >= 0.2:
    told = time.monotonic()
    c = session.counters()
    par = [k.value for k in session.knobs() if k.kind == "parallelism"]
    print(json.dumps({"t": time.time(), "parallelism": par,
                      "affinity": affinity(),
                      **{k: c[k] for k in ("host_cpu_share", "host_ram_share",
                                           "host_processes", "ram_budget")},
                      **seen}), flush=True)
"""


class _Child:
  """A `python -c _CHILD` process and the lines it printed."""

  def __init__(self, host_dir, share: bool, seconds: float = 240.0,
               bound: str = "consumer-bound", cpus=None):
    env = dict(os.environ, INTUNE_HOST_DIR=str(host_dir), INTUNE_STATUS="off",
               TF_CPP_MIN_LOG_LEVEL="2")
    # Run outside the checkout, so that the child imports the installed
    # package (the compat stack's is not editable), and keep its stderr.
    host_dir = pathlib.Path(host_dir)
    work = host_dir.with_name(f"{host_dir.name}-child-{id(self)}")
    work.mkdir()
    self._stderr = open(work / "stderr", "w+")  # closed in kill()
    self.proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, "on" if share else "off",
         str(seconds), bound], stdout=subprocess.PIPE, stderr=self._stderr,
        text=True, env=env, cwd=work,
        preexec_fn=None if cpus is None else (
            lambda: os.sched_setaffinity(0, cpus)))  # as `taskset` does
    self.lines = []
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self):
    for line in self.proc.stdout:
      try:
        self.lines.append(json.loads(line))
      except ValueError:
        pass

  def last(self):
    return self.lines[-1] if self.lines else {}

  def wait_for(self, predicate, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
      if self.lines and predicate(self.last()):
        return self.last()
      assert self.proc.poll() is None, (
          f"child exited ({what}); its stderr ends:\n{self.stderr_tail()}")
      time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; "
                         f"last line {self.last()}")

  def stderr_tail(self, lines: int = 15) -> str:
    self._stderr.seek(0)
    return "".join(self._stderr.readlines()[-lines:])

  def kill(self):
    if self.proc.poll() is None:
      self.proc.kill()
    self.proc.wait()
    self._stderr.close()


@pytest.fixture
def children():
  made = []
  yield lambda *args, **kwargs: made.append(_Child(*args, **kwargs)) or (
      made[-1])
  for child in made:
    child.kill()


def _alone(line, cpus):
  return line.get("host_processes") == 1 and line["host_cpu_share"] == cpus


@pytest.mark.slow
def test_a_new_process_gets_its_share_and_a_killed_one_gives_it_back(
    tmp_path, children):
  from intune_tf import host  # noqa: PLC0415 (only this test)
  cpus = host.usable_cpus()
  if cpus < 2:
    pytest.skip("needs 2 usable CPUs to split")
  a = children(tmp_path, share=True)
  # TensorFlow's import alone takes many seconds on a loaded machine.
  before = a.wait_for(lambda line: _alone(line, cpus) and
                      line.get("cpu_budget") == cpus, 180, "a alone")
  b = children(tmp_path, share=True)
  b.wait_for(lambda line: line.get("host_processes", 0) >= 1, 180,
             "b's first share")
  joined = time.monotonic()
  half = cpus // 2
  b_line = b.wait_for(lambda line: line["host_processes"] == 2 and
                      line["host_cpu_share"] == half, 5, "b's share")
  a_line = a.wait_for(lambda line: line["host_processes"] == 2 and
                      line["host_cpu_share"] == half and
                      line.get("cpu_budget") == half, 5, "a's share")
  took = time.monotonic() - joined
  # Consumer-bound, neither is confined to its share's CPUs
  # (`arbiter.confine_to`).
  given = host.cpu_ids()
  for child in (a, b):
    child.wait_for(lambda line: line["host_processes"] == 2 and
                   line["affinity"] == given, 5, "every CPU while shared")
  # The RAM pool is halved: each about half of what a had alone (the
  # memory available moves a little between readings).
  for line in (a_line, b_line):
    assert line["host_ram_share"] == pytest.approx(
        before["host_ram_share"] / 2, rel=0.1)
  b.kill()  # kill -9, reaped
  killed = time.monotonic()
  back = a.wait_for(lambda line: _alone(line, cpus) and
                    line.get("cpu_budget") == cpus and
                    line["ram_budget"] >= 0.9 * before["ram_budget"], 5,
                    "a's whole host after b's kill -9")
  returned = time.monotonic() - killed
  a.wait_for(lambda line: line["parallelism"] == [cpus], 5,
             "a's parallelism back at the whole host")
  print(f"share taken in {took:.2f} s, returned in {returned:.2f} s; "
        f"RAM budget {before['ram_budget'] >> 20} MB alone, "
        f"{a_line['host_ram_share'] >> 20} MB shared, "
        f"{back['ram_budget'] >> 20} MB after the kill")


@pytest.mark.slow
def test_input_bound_processes_run_on_cpus_of_their_own_until_one_dies(
    tmp_path, children):
  from intune_tf import host  # noqa: PLC0415 (only this test)
  given = host.cpu_ids()
  if len(given) < 2:
    pytest.skip("needs 2 CPUs to give each process its own")
  a = children(tmp_path, share=True, bound="input-bound")
  a.wait_for(lambda line: line["host_processes"] == 1, 180, "a alone")
  assert a.last()["affinity"] == given  # alone: not confined
  b = children(tmp_path, share=True, bound="input-bound")
  b.wait_for(lambda line: line["host_processes"] == 2, 180, "b's share")
  # 2 processes of weight 1 on C CPUs: C / 2 each, dealt out in pid order
  # (`arbiter.place_cpus`): the lower pid on the first half.
  half = len(given) // 2
  first, second = sorted([a, b], key=lambda child: child.proc.pid)
  first.wait_for(lambda line: line["affinity"] == given[:half], 5,
                 "the lower pid on the first half of the CPUs")
  second.wait_for(lambda line: line["affinity"] == given[half:2 * half], 5,
                  "the other on the second half")
  first.kill()  # kill -9, reaped
  second.wait_for(lambda line: line["host_processes"] == 1 and
                  line["affinity"] == given, 5,
                  "the survivor back on every CPU")


@pytest.mark.slow
def test_processes_started_on_other_cpus_stay_on_them(tmp_path, children):
  from intune_tf import host  # noqa: PLC0415 (only this test)
  given = host.cpu_ids()
  if len(given) < 2:
    pytest.skip("needs 2 CPUs to start a process on fewer")
  # b is started on the first CPU only (`taskset -c`); a on every CPU. The
  # deals of `place_cpus` over their two CPU sets would overlap, so neither
  # is confined: each keeps the CPUs it was started with.
  a = children(tmp_path, share=True, bound="input-bound")
  b = children(tmp_path, share=True, bound="input-bound", cpus=given[:1])
  for child in (a, b):
    child.wait_for(lambda line: line["host_processes"] == 2, 180,
                   "both sharing")
  shared = (len(a.lines), len(b.lines))
  time.sleep(3)  # a budget pass each second
  for child, start, cpus in ((a, shared[0], given), (b, shared[1],
                                                     given[:1])):
    seen = [line["affinity"] for line in child.lines[start:]]
    assert len(seen) >= 5 and all(s == cpus for s in seen), seen


@pytest.mark.slow
def test_a_process_that_opts_out_keeps_per_process_budgets(tmp_path,
                                                           children):
  from intune_tf import host  # noqa: PLC0415 (only this test)
  cpus = host.usable_cpus()
  a = children(tmp_path, share=True)
  out = children(tmp_path, share=False)
  out_line = out.wait_for(lambda line: "cpu_budget" in line, 180,
                          "the opted-out process's first step")
  a_line = a.wait_for(lambda line: "cpu_budget" in line and
                      line["host_processes"] >= 1, 180, "a's first share")
  # Let both run a few budget passes side by side.
  time.sleep(3)
  a_line, out_line = a.last(), out.last()
  # The opted-out process is not in the host's split, and plans for every
  # usable CPU and its own half of the memory available.
  assert (out_line["host_processes"], out_line["host_cpu_share"],
          out_line["host_ram_share"]) == (0, 0, 0)
  assert out_line["cpu_budget"] == cpus
  assert out_line["ram_budget"] == pytest.approx(
      0.5 * host.available_memory(), rel=0.15)
  # The sharing process sees itself alone.
  assert _alone(a_line, cpus) and a_line["cpu_budget"] == cpus
  assert [p.name for p in tmp_path.iterdir()] == [f"{a.proc.pid}.json"]


# Fuzzing: the readers of the lease folder in a fresh process (`_fuzz`).


def test_fuzzed_leases_are_read_or_told_once_and_never_stop_the_arbiter():
  out = _fuzz.run_reader("""
      import io, json, logging, os, pathlib, tempfile, time
      import psutil
      import _fuzz
      from intune_tf import arbiter
      from intune_tf.observe import inspect as inspect_lib

      told = _fuzz.warnings_told()
      pids = psutil.pids()

      def valid(rng):
        return {"format": arbiter.FORMAT, "pid": rng.choice(pids),
                "uid": os.getuid(), "start": 0.0,
                "weight": rng.choice([1.0, 2.0, arbiter.MAX_WEIGHT]),
                "heartbeat": time.time(), "rate": 10.0, "busy_cpus": 0.5,
                "cpus_wanted": rng.choice([None, 0.5]),
                "buffered_bytes": 1000, "cpus": 1, "ram": 1 << 30,
                "confined": rng.choice([None, [0]]),
                "given": rng.choice([None, [0, 1]])}

      def name(data, i):
        pid = data.get("pid") if isinstance(data, dict) else None
        if isinstance(pid, int) and not isinstance(pid, bool):
          return f"{pid}.json"
        return f"{10_000_000 + i}.json"

      for seed in SEEDS:
        print("fuzz seed", seed, flush=True)
        folder = pathlib.Path(tempfile.mkdtemp()) / "host"
        arbiter.make_folder(folder)
        paths = _fuzz.fill(folder, seed, 150, valid, name,
                           arbiter.MAX_ENTRY_BYTES)
        start = len(told)
        read = {p: arbiter.read_lease(p) for p in paths}
        leases = arbiter.read_leases(folder, remove_dead=True)
        share = arbiter.HostArbiter(folder).update(
            1.0, arbiter.Demand(), cpus=2, available=1 << 30,
            limit=2 << 30, ram_share=0.5, cpu_ids=(0, 1),
            whole_process=True)
        assert share is not None and 1 <= share.cpus <= 2, share
        inspect_lib.host_split(leases, folder)
        for p in paths:
          named = [m for m in told[start:] if f"ignoring {p}: " in m]
          assert len(named) == (read[p] is None), (seed, p, named)
        print(f"seed {seed}: {len(paths)} files, "
              f"{sum(r is None for r in read.values())} told, "
              f"{len(leases)} live leases", flush=True)
  """)
  print(out)
  assert [line.split()[2] for line in out.splitlines()
          if line.startswith("fuzz seed")] == [str(s) for s in _fuzz.SEEDS]
