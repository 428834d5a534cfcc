"""tf.data service with InTune: a real dispatcher and two workers.

The cluster runs as separate `intune service ...` processes on loopback
ports, each writing its status file into a temporary status dir, from which
the tests read what each worker's tuner did.
"""

import collections
import functools
import inspect
import io
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from typing import Any

from _waiting import wait_until
from absl import logging
import keras
import numpy as np
import psutil
import pytest
import tensorflow as tf

import intune_tf
from intune_tf import cli
from intune_tf import keras as intune_keras
from intune_tf import service
from intune_tf.bench import demo
from intune_tf.observe import status as intune_status
from intune_tf.service import scalers
from intune_tf.service import workers
from intune_tf.tuning import policies

# Starting a process that imports TensorFlow takes a minute on this 2-core
# machine when other jobs run; everything waits at most this long.
_TIMEOUT_S = 240.0
_INTUNE = str(pathlib.Path(sys.executable).with_name("intune"))
_CPU_BUDGET = 2


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


_wait = functools.partial(wait_until, timeout=_TIMEOUT_S)


class _Server:
  """One `intune service ...` process with its log file."""

  def __init__(self, args, status_dir, log_path, cpus=None):
    self.args = args
    self.log_path = log_path
    env = dict(os.environ, INTUNE_STATUS_DIR=str(status_dir))
    self.log = open(log_path, "wb")
    # A worker says on this pipe that it registered (`--ready-fd`).
    self._ready, said = os.pipe()
    os.set_blocking(self._ready, False)
    if args[0] == "worker":
      args = [*args, "--ready-fd", str(said)]
    self.proc = subprocess.Popen(
        [_INTUNE, "service", *args], env=env, stdout=self.log,
        stderr=subprocess.STDOUT, pass_fds=(said,),
        preexec_fn=None if cpus is None else (
            lambda: os.sched_setaffinity(0, cpus)))
    os.close(said)
    self.pid = self.proc.pid
    self.said = b""

  def registered(self) -> bool:
    """Whether the worker said it registered with its dispatcher."""
    try:
      self.said += os.read(self._ready, 64)
    except BlockingIOError:
      pass
    return self.said.startswith(b"registered ")

  def output(self) -> str:
    return pathlib.Path(self.log_path).read_text(errors="replace")

  def stop(self, sig=signal.SIGTERM):
    if self.proc.poll() is None:
      self.proc.send_signal(sig)
      try:
        self.proc.wait(30)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()
    self.log.close()
    os.close(self._ready)


class _Cluster:
  """A dispatcher and two workers on loopback."""

  def __init__(self, tmp: pathlib.Path):
    self.tmp = tmp
    self.status_dir = tmp / "status"
    self.status_dir.mkdir()
    self.port = _free_port()
    self.address = f"127.0.0.1:{self.port}"
    self.dispatcher = _Server(
        ["dispatcher", "--port", str(self.port), "--worker-timeout-ms",
         "3000"], self.status_dir, tmp / "dispatcher.log")
    self.worker_ports = [_free_port(), _free_port()]
    self.workers = [self._start_worker(i) for i in range(2)]
    for w in self.workers:
      self.wait_registered(w)

  def _start_worker(self, i: int) -> _Server:
    return _Server(
        ["worker", "--dispatcher", self.address, "--port",
         str(self.worker_ports[i]), "--heartbeat-interval-ms", "500",
         "--dispatcher-wait", str(_TIMEOUT_S)],
        self.status_dir, self.tmp / f"worker{i}-{time.monotonic_ns()}.log")

  def add_worker(self) -> _Server:
    """Starts a worker on a new port; it stays in the cluster."""
    self.worker_ports.append(_free_port())
    worker = self._start_worker(len(self.worker_ports) - 1)
    self.workers.append(worker)
    self.wait_registered(worker)
    return worker

  def restart_worker(self, i: int) -> _Server:
    self.workers[i] = self._start_worker(i)
    self.wait_registered(self.workers[i])
    return self.workers[i]

  def wait_registered(self, worker: _Server) -> None:
    def registered():
      assert worker.proc.poll() is None, worker.output()
      return worker.registered() and self.status(worker) is not None
    _wait(registered, what=f"worker {worker.pid} to register")

  def status(self, worker: _Server):
    """The worker's status dict, or None."""
    found = [d for d in service.worker_status(self.status_dir, self.address)
             if d["pid"] == worker.pid]
    return found[0] if found else None

  def stop(self):
    for w in self.workers:
      w.stop()
    self.dispatcher.stop()


# What each processing mode promises when workers join and leave
# (docs/service.md).
VISITATION = {
    "distributed_epoch": (
        "at most once: the elements of the splits a worker held when it "
        "left (stopped or killed) are lost; TensorFlow cannot drain a "
        "worker"),
    "parallel_epochs": (
        "every worker produces the whole dataset: a worker joining adds a "
        "full pass, one leaving takes the rest of its pass; nothing per "
        "element"),
}


class EpochTally:
  """Counts the elements a consumer received in one epoch of a
  distributed dataset against the elements its source holds.

  With `distributed_epoch` (at most once) `lost` is what workers that left
  took with them; an element received twice breaks the promise and is
  counted in `extra`. An epoch that lost a worker ends (and can be
  reported) only once a worker serves again at that worker's address
  (docs/service.md).

  Args:
    expected: the elements of one epoch (e.g. the source's cardinality
      before `distribute`).
    mode: the processing mode. Default "distributed_epoch".

  Raises:
    ValueError: a negative count or an unknown mode.
  """

  def __init__(self, expected: int, mode: str = "distributed_epoch"):
    if isinstance(expected, bool) or not isinstance(expected, int) or (
        expected < 0):
      raise ValueError(f"expected must be a count of 0 or more, got "
                       f"{expected!r}.")
    if mode not in VISITATION:
      raise ValueError(f"unknown processing mode {mode!r}; known: "
                       f"{', '.join(VISITATION)}.")
    self.expected = expected
    self.mode = mode
    self.received = 0

  def add(self, elements: int = 1) -> None:
    """Counts `elements` more received."""
    self.received += elements

  @property
  def lost(self) -> int:
    return max(0, self.expected - self.received)

  @property
  def extra(self) -> int:
    return max(0, self.received - self.expected)

  def report(self) -> dict[str, Any]:
    """{"mode", "promise", "expected", "received", "lost", "extra"}; logs a
    warning when elements were lost or received more than once."""
    result = {"mode": self.mode, "promise": VISITATION[self.mode],
              "expected": self.expected, "received": self.received,
              "lost": self.lost, "extra": self.extra}
    if self.lost or self.extra:
      logging.warning(
          "tf.data service epoch (%s): %d of %d elements received, %d lost, "
          "%d extra (%s).", self.mode, self.received, self.expected,
          self.lost, self.extra, VISITATION[self.mode])
    return result


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
  c = _Cluster(tmp_path_factory.mktemp("service"))
  yield c
  c.stop()


def _pure_busy_udf(x):
  v = tf.cast(tf.range(20_000, dtype=tf.int64) + x, tf.float32)
  for _ in range(3):
    v = tf.math.cumsum(tf.sin(v))
  return x + tf.cast(tf.reduce_sum(v) * 0.0, tf.int64)


def _pipeline(n: int, name: str = "svc",
              cache: bool = False) -> tf.data.Dataset:
  """range(n) -> a ~0.3 ms UDF (parallel, AUTOTUNE) -> prefetch, tuned (its
  tuner sessions named `name`). With `cache`, InTune's cache is on and the
  UDF is one without random numbers, so that the cache can hold it."""
  ds = tf.data.Dataset.range(n)
  ds = ds.map(_pure_busy_udf if cache else demo.busy_udf(2000),
              num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.prefetch(tf.data.AUTOTUNE)
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(
      policy="even", cpu_budget=_CPU_BUDGET, period_s=0.25, name=name,
      cache=cache)
  return ds.with_options(options)


def _distribute(ds, mode, cluster):
  return ds.apply(tf.data.experimental.service.distribute(
      mode, f"grpc://{cluster.address}", job_name=None))


def _tuned_as_even(session) -> bool:
  """The worker's tuner moved every knob to what "even" asks."""
  knobs = session["knobs"]
  parallel = sorted(v for k, v in knobs.items() if k.endswith("/parallelism"))
  buffers = [v for k, v in knobs.items() if k.endswith("/buffer_size")]
  want = sorted(policies.even_split(_CPU_BUDGET, len(parallel)))
  return (session["changes"] >= 1 and session["steps"] >= 2 and
          knobs != session["initial_knobs"] and parallel == want and
          all(b >= 1 for b in buffers))


def _sessions(status):
  return (status or {}).get("sessions", []) + (status or {}).get(
      "ended_sessions", [])


@pytest.mark.slow
def test_distributed_output_equals_local_and_its_workers_are_tuned(cluster):
  n = 3000
  local = collections.Counter(int(x) for x in
                              _pipeline(n).as_numpy_iterator())
  assert local == collections.Counter(range(n))
  distributed = collections.Counter(
      int(x) for x in _distribute(_pipeline(n), "distributed_epoch",
                                  cluster).as_numpy_iterator())
  # Dynamic sharding: every element exactly once over both workers.
  assert distributed == local
  # A worker that received no split may never make an iterator; each one
  # that did is tuned.
  working = 0
  for w in cluster.workers:
    status = cluster.status(w)
    tuned = [s for s in _sessions(status) if s["name"] == "svc"]
    if not tuned:
      continue
    working += 1
    assert any(_tuned_as_even(s) for s in tuned), tuned
    # The RAM budget was resolved by the worker (not the client's value).
    assert all(s["ram_budget"] > 0 for s in tuned)
  assert working >= 1


@pytest.mark.slow
def test_parallel_epochs_gives_every_element_once_per_worker(cluster):
  n = 1000
  local = collections.Counter(int(x) for x in
                              _pipeline(n).as_numpy_iterator())
  distributed = collections.Counter(
      int(x) for x in _distribute(_pipeline(n), "parallel_epochs",
                                  cluster).as_numpy_iterator())
  assert distributed == collections.Counter(
      {k: 2 * v for k, v in local.items()})


@pytest.mark.slow
def test_workers_cache_whole_epochs_but_never_the_dispatchers_splits(cluster):
  n = 3000
  want = collections.Counter(range(n))
  # parallel_epochs: each worker makes every epoch, so its cache replays it.
  for epoch in range(3):
    got = collections.Counter(int(x) for x in _distribute(
        _pipeline(n, "svc-parallel", cache=True), "parallel_epochs",
        cluster).as_numpy_iterator())
    assert got == collections.Counter({k: 2 * v for k, v in want.items()}), (
        f"parallel_epochs, epoch {epoch + 1}")
  # distributed_epoch: the splits a worker gets differ each epoch. A cache
  # would replay the first epoch's (it did: 44 elements of range(40) in
  # epoch 2).
  for epoch in range(3):
    got = collections.Counter(int(x) for x in _distribute(
        _pipeline(n, "svc-splits", cache=True), "distributed_epoch",
        cluster).as_numpy_iterator())
    assert got == want, f"distributed_epoch, epoch {epoch + 1}"

  def caches(name):
    return [s.get("cache") or {} for w in cluster.workers
            for s in _sessions(cluster.status(w)) if s["name"] == name]

  def told():
    splits = caches("svc-splits")
    return (any(c.get("point") for c in caches("svc-parallel")) and splits
            and all(not c.get("point") for c in splits) and
            any("distributed_epoch" in c.get("reason", "") for c in splits))
  _wait(told, what="the workers to say where they cache and why not the "
        "dispatcher's splits")


def _live_steps(cluster, worker, name: str = "svc") -> int:
  """Steps of the worker's live sessions named `name`."""
  return sum(s["steps"] for s in (cluster.status(worker) or {}).get(
      "sessions", []) if s["name"] == name)


@pytest.mark.slow
def test_killed_worker_job_continues_survivor_tuned_restart_tuned(cluster):
  # A long job with dynamic sharding (at-most-once: no element repeats).
  it = iter(_distribute(_pipeline(10**7), "distributed_epoch", cluster))
  seen = []

  def pull_until(predicate, what):
    def step():
      for _ in range(50):
        seen.append(int(next(it)))  # noqa: F821
      return predicate()
    return _wait(step, what=what)

  survivor, victim = cluster.workers
  pull_until(lambda: _live_steps(cluster, survivor) >= 2 and
             _live_steps(cluster, victim) >= 2, "both workers tuning the job")
  victim.stop(signal.SIGKILL)
  assert victim.proc.returncode == -signal.SIGKILL
  assert cluster.status(victim) is None  # its stale file is ignored
  before_elements = len(seen)
  before_steps = _live_steps(cluster, survivor)
  # The job goes on, served by the survivor, whose tuner keeps stepping.
  pull_until(lambda: _live_steps(cluster, survivor) >= before_steps + 8,
             "the survivor's tuner to keep stepping")
  assert len(seen) > before_elements
  survivor_session = [s for s in cluster.status(survivor)["sessions"]
                      if s["name"] == "svc"][-1]
  assert _tuned_as_even(survivor_session)
  # A worker restarted on the same port joins the job and is tuned again.
  restarted = cluster.restart_worker(1)
  assert restarted.pid != victim.pid
  pull_until(lambda: any(_tuned_as_even(s) for s in _sessions(
      cluster.status(restarted)) if s["name"] == "svc"),
             "the restarted worker to be tuned")
  after_restart = len(seen)
  pull_until(lambda: len(seen) >= after_restart + 200, "more elements")
  del it
  # At-most-once visitation: nothing repeated, nothing invented.
  assert len(seen) == len(set(seen))
  assert all(0 <= x < 10**7 for x in seen)


# Seconds without an element after which the survivor is taken to have run
# out of splits (it serves hundreds of elements a second before that).
_STALL_S = 15.0


@pytest.mark.slow
def test_killed_worker_epoch_ends_when_its_address_serves_again(cluster):
  # distributed_epoch, a worker killed mid-epoch. TensorFlow's dispatcher
  # keeps the lost worker's task unfinished (a timeout only logs it), so the
  # epoch cannot end until a worker serves at that address again (one at a
  # new address does not do); the one restarted there gets the task, finds
  # the splits used up and finishes it (docs/service.md, "Workers joining
  # and leaving").
  n = 10_000
  tally = EpochTally(n)
  seen = []
  it = iter(_distribute(_pipeline(n, name="epoch"), "distributed_epoch",
                        cluster))
  survivor, victim = cluster.workers[:2]

  def both_serving():
    for _ in range(10):
      seen.append(int(next(it)))
    return all(_live_steps(cluster, w, "epoch") >= 1
               for w in (survivor, victim))
  _wait(both_serving, what="both workers serving the epoch")
  assert len(seen) < n // 2, "the epoch was mostly read before the kill"
  victim.stop(signal.SIGKILL)
  killed_at = time.monotonic()
  at_kill = len(seen)
  last = [killed_at]
  done = threading.Event()
  errors = []

  def read_the_rest():
    try:
      for x in it:
        seen.append(int(x))
        last[0] = time.monotonic()
    except Exception as e:  # noqa: BLE001 - reported by the test
      errors.append(e)
    finally:
      done.set()
  threading.Thread(target=read_the_rest, daemon=True).start()
  # The job goes on: the survivor serves the rest of the splits, then
  # nothing comes, and the epoch does not end.
  _wait(lambda: done.is_set() or time.monotonic() - last[0] > _STALL_S,
        what="the survivor to stop delivering")
  survivor_done_at = last[0]
  assert not errors, errors
  assert not done.is_set(), (
      "the epoch ended with no worker at the lost worker's address")
  at_stall = len(seen)
  assert at_stall > at_kill  # the survivor served after the kill
  # A worker at a new address gets a task of its own, not the lost one's:
  # the epoch still does not end.
  cluster.add_worker()
  joined_at = time.monotonic()
  _wait(lambda: done.is_set() or time.monotonic() - joined_at > _STALL_S,
        what="the epoch to end or the wait to pass")
  assert not errors, errors
  assert not done.is_set(), "the epoch ended with a worker at a new address"
  at_newcomer = len(seen)
  # A worker at the lost worker's address lets the epoch end.
  restarted_at = time.monotonic()
  restarted = cluster.restart_worker(1)
  registered_at = time.monotonic()
  assert restarted.pid != victim.pid
  assert done.wait(_TIMEOUT_S), "the epoch did not end after the restart"
  ended_at = time.monotonic()
  assert not errors, errors
  tally.add(len(seen))
  report = tally.report()
  print(f"epoch of {n}: {at_kill} read before the kill; the survivor "
        f"served {at_stall - at_kill} more, its last "
        f"{survivor_done_at - killed_at:.1f} s after the kill; a worker at "
        f"a new address: {at_newcomer - at_stall} more, no end in "
        f"{_STALL_S:g} s; restart "
        f"registered {registered_at - restarted_at:.1f} s after it began; "
        f"{len(seen) - at_newcomer} elements after the restart; the epoch "
        f"ended {ended_at - registered_at:.1f} s after the registration; "
        f"{report}")
  # At most once: nothing repeated or invented, the loss counted.
  assert len(set(seen)) == len(seen)
  assert all(0 <= x < n for x in seen)
  assert report["received"] == len(seen)
  assert report["lost"] == n - len(seen)
  assert report["extra"] == 0
  # The killed worker held splits it had not delivered.
  assert report["lost"] > 0


def test_parse_address():
  assert service.parse_address("127.0.0.1:5050") == ("127.0.0.1", 5050)
  assert service.parse_address("grpc://host-1.example:80") == (
      "host-1.example", 80)
  assert service.parse_address("[::1]:5050") == ("[::1]", 5050)
  for bad in ("localhost", "localhost:", ":5050", "host:port", "host:0",
              "host:70000", "a b:1", "http://host:1"):
    with pytest.raises(service.ServiceError, match="HOST:PORT"):
      service.parse_address(bad)


def test_check_port_free():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    with pytest.raises(service.ServiceError,
                       match=f"port {port} is not available"):
      service.check_port_free(port)
  service.check_port_free(port)  # closed: free again


def _run_cli(*args, timeout=_TIMEOUT_S):
  return subprocess.run([_INTUNE, "service", *args], capture_output=True,
                        text=True, timeout=timeout, check=False)


@pytest.mark.slow
@pytest.mark.main_stack_only(covered_by=(
    "test_service.py::test_cli_no_dispatcher_exits_1",))
def test_cli_bad_dispatcher_address_exits_2():
  result = _run_cli("worker", "--dispatcher", "localhost", "--port",
                    str(_free_port()))
  assert result.returncode == 2
  assert ("--dispatcher must be HOST:PORT with a port in 1..65535" in
          result.stdout), result.stdout + result.stderr


@pytest.mark.parametrize("flags", [[], ["--port", "5051", "--standby"]])
def test_a_worker_takes_a_port_or_waits_for_one_not_both(flags, capsys):
  args = cli.parse_args(["service", "worker", "--dispatcher",
                         "127.0.0.1:5050", *flags])
  assert args.func(args) == 2
  assert capsys.readouterr().out == (
      "intune service worker: error: pass --port, or --standby to read the "
      "port from stdin once it is needed\n")


@pytest.mark.parametrize("text,told", [
    ("5051\n", 5051), ("  80 \n", 80), ("", None)])
def test_standby_port_reads_one_line(text, told):
  assert service.standby_port(io.StringIO(text)) == told


@pytest.mark.parametrize("text", ["0\n", "http\n", "70000\n", "\n",
                                  "5051 taken\n", "5051 kept\n"])
def test_a_standby_given_no_port_says_what_it_got(text):
  with pytest.raises(service.ServiceError,
                     match=f"a standby worker got {text.strip()!r} on stdin, "
                     "not a port: "):
    service.standby_port(io.StringIO(text))


@pytest.mark.slow
@pytest.mark.parametrize("stdin,code,said", [
    ("", 0, "stdin closed; exiting unused"),
    ("http\n", 1, "intune service worker: error: a standby worker got "
     "'http' on stdin, not a port"),
])
def test_a_standby_worker_exits_unused_or_on_a_bad_port(stdin, code, said):
  result = subprocess.run(
      [_INTUNE, "service", "worker", "--dispatcher", "127.0.0.1:1",
       "--standby"], input=stdin, capture_output=True, text=True,
      timeout=_TIMEOUT_S, check=False)
  assert result.returncode == code, result.stdout + result.stderr
  assert said in result.stdout + result.stderr, result.stdout + result.stderr
  assert "Standby worker ready" in result.stderr


@pytest.mark.slow
def test_cli_port_in_use_exits_1():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    result = _run_cli("dispatcher", "--port", str(port))
  assert result.returncode == 1
  assert (f"intune service dispatcher: error: port {port} is not available"
          in result.stdout), result.stdout + result.stderr


def test_cli_unusable_work_dir_exits_1_with_the_reason():
  result = _run_cli("dispatcher", "--port", str(_free_port()), "--work-dir",
                    "/dev/null/journal", timeout=60)
  assert result.returncode == 1, result.stdout + result.stderr
  assert ("intune service dispatcher: error: --work-dir /dev/null/journal: "
          "cannot use it as the dispatcher's journal folder (Not a "
          "directory); give a folder this user can write." in
          result.stdout), result.stdout + result.stderr
  assert "Traceback" not in result.stdout + result.stderr


@pytest.mark.parametrize("low,high,cpus,capped,level,said", [
    # MIN above the CPUs: MIN workers start all the same, and it says so.
    (3, 3, 2, True, logging.WARNING, "MIN 3 is more than the 2 CPU(s) this "
     "host gives: 3 local workers start and share them; pass a MIN of at "
     "most 2."),
    (1, 4, 2, True, logging.INFO, "InTune grows it to at most 2 worker(s), "
     "the CPUs this host gives."),
    (1, 4, 2, False, logging.WARNING, "the host's tier is filled to its MAX "
     "before the command adds a worker, and this host gives 2 CPU(s)"),
    (1, 2, 2, True, None, None),
    (2, 2, 2, False, None, None),
])
def test_cpu_note_tells_what_a_local_pool_gets(low, high, cpus, capped, level,
                                               said):
  note = service.cpu_note(low, high, cpus, capped)
  if said is None:
    assert note is None
  else:
    assert note[0] == level and note[1].startswith(said), note


@pytest.mark.slow
def test_a_worker_whose_dispatcher_is_another_service_exits_in_its_wait():
  # Something that accepts TCP connections and never answers.
  with socket.socket() as other:
    other.bind(("127.0.0.1", 0))
    other.listen()
    port = other.getsockname()[1]
    result = _run_cli("worker", "--dispatcher", f"127.0.0.1:{port}",
                      "--port", str(_free_port()), "--dispatcher-wait", "5")
  assert result.returncode == 1, result.stdout + result.stderr
  assert (f"intune service worker: error: something accepts connections at "
          f"127.0.0.1:{port} but gave no tf.data service dispatcher answer "
          "(DEADLINE_EXCEEDED) within" in result.stdout), (
              result.stdout + result.stderr)


@pytest.mark.slow
def test_cli_no_dispatcher_exits_1():
  port = _free_port()
  result = _run_cli("worker", "--dispatcher", f"127.0.0.1:{port}", "--port",
                    str(_free_port()), "--dispatcher-wait", "1")
  assert result.returncode == 1
  assert f"no dispatcher reachable at 127.0.0.1:{port}" in result.stdout, (
      result.stdout + result.stderr)


@pytest.mark.parametrize("received,lost,extra", [(10, 0, 0), (7, 3, 0),
                                                 (12, 0, 2), (0, 10, 0)])
def test_epoch_tally_by_hand(received, lost, extra):
  tally = EpochTally(10)
  tally.add(received)
  report = tally.report()
  assert (report["lost"], report["extra"]) == (lost, extra)
  assert report["expected"] == 10 and report["received"] == received


@pytest.mark.parametrize("expected,mode,message", [
    (-1, "distributed_epoch", "count of 0 or more"),
    (1.5, "distributed_epoch", "count of 0 or more"),
    (10, "dynamic", "unknown processing mode 'dynamic'"),
])
def test_epoch_tally_rejects(expected, mode, message):
  with pytest.raises(ValueError, match=message):
    EpochTally(expected, mode)


def _consumer_file(status_dir, name, **data):
  folder = pathlib.Path(status_dir) / "pool"
  folder.mkdir(parents=True, exist_ok=True)
  (folder / name).write_text(json.dumps(data))


def test_pool_reading_from_the_consumers_reports(tmp_path):
  now = 1000.0
  dispatcher = "127.0.0.1:5050"
  _consumer_file(tmp_path, "1@h.json", dispatcher=dispatcher, time=now - 1,
                 wait_share=0.2, consumer_rate=300.0)
  _consumer_file(tmp_path, "2@h.json", dispatcher="10.0.0.1:5050",
                 time=now - 2, wait_share=0.5, consumer_rate=100.0)
  # Stale, another dispatcher's, and broken reports are left out.
  _consumer_file(tmp_path, "3@h.json", dispatcher=dispatcher, time=now - 99,
                 wait_share=0.9, consumer_rate=1e6)
  _consumer_file(tmp_path, "4@h.json", dispatcher="127.0.0.1:6060",
                 time=now, wait_share=0.9, consumer_rate=1e6)
  _consumer_file(tmp_path, "5@h.json", dispatcher=dispatcher, time=now,
                 wait_share="x", consumer_rate=1.0)
  (tmp_path / "pool" / "6@h.json").write_text("{not json")
  reading = service.pool_reading(dispatcher, 2, 1, tmp_path, now=now,
                                 consumer_addresses=("10.0.0.1:5050",))
  # Paces summed (300 + 100), the largest wait share (0.5).
  assert reading.consumer_rate == 400.0 and reading.wait_share == 0.5
  assert (reading.workers, reading.starting) == (2, 1)
  assert service.pool_reading("127.0.0.1:7070", 2, 0, tmp_path,
                              now=now) is None


def test_pool_reading_counts_workers_under_either_address(tmp_path):
  # A worker that names the dispatcher by its advertised address (a remote
  # tier's) counts in a pool read under the loopback one.
  now = time.time()
  _consumer_file(tmp_path, "1@h.json", dispatcher="127.0.0.1:5050",
                 time=now, wait_share=0.1, consumer_rate=10.0)
  writer = intune_status.StatusWriter(tmp_path)
  writer.set_info(role="worker", service={
      "dispatcher": "10.0.0.1:5050", "worker_address": "10.0.0.2:6000"})
  writer.write_now()
  try:
    alone = service.pool_reading("127.0.0.1:5050", 1, 0, tmp_path, now=now)
    both = service.pool_reading("127.0.0.1:5050", 1, 0, tmp_path, now=now,
                                consumer_addresses=("127.0.0.1:5050",
                                                    "10.0.0.1:5050"))
  finally:
    writer.close()
  assert alone.worker_rates == () and both.worker_rates == (0.0,)


def _finishes(function, seconds: float = 30.0):
  """function()'s result or exception, run in a thread that must end
  within `seconds` (a read that blocks for ever fails the test)."""
  result = []

  def run():
    try:
      result.append(function())
    except Exception as e:  # noqa: BLE001  handed to the test
      result.append(e)

  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  thread.join(seconds)
  assert result, f"{function} still runs after {seconds} s"
  return result[0]


def _bad_report(kind: str, path: pathlib.Path) -> None:
  if kind == "fifo":
    os.mkfifo(path)
  elif kind == "dev-zero":
    path.symlink_to("/dev/zero")
  elif kind == "sparse-1gb":
    with open(path, "wb") as f:
      f.truncate(1 << 30)
  elif kind == "dispatcher-list":
    path.write_text(json.dumps({"dispatcher": [], "time": time.time(),
                                "wait_share": 0.9, "consumer_rate": 1e6}))
  elif kind == "json-list":
    path.write_text("[1, 2]")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "sparse-1gb",
                                  "dispatcher-list", "json-list"])
def test_pool_reading_skips_a_report_it_must_not_read(tmp_path, kind):
  # Each of these stopped (FIFO: for ever), crashed (a list where the
  # address goes) or exhausted (/dev/zero, 1 GB read whole each period)
  # the dispatcher's pool loop.
  now = time.time()
  _consumer_file(tmp_path, "1@h.json", dispatcher="127.0.0.1:5050",
                 time=now, wait_share=0.25, consumer_rate=40.0)
  _bad_report(kind, tmp_path / "pool" / "2@h.json")
  tracemalloc.start()
  try:
    reading = _finishes(lambda: service.pool_reading(
        "127.0.0.1:5050", 1, 0, tmp_path, now=now))
    _, peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  assert not isinstance(reading, BaseException), reading
  assert (reading.consumer_rate, reading.wait_share) == (40.0, 0.25)
  assert peak < 16 << 20  # bytes: nothing of the bad file was read whole


def test_pool_reading_matches_a_dispatcher_named_by_host_name(tmp_path):
  # The trainer says localhost, the dispatcher is 127.0.0.1: one address.
  now = time.time()
  _consumer_file(tmp_path, "1@h.json", dispatcher="localhost:5050",
                 time=now, wait_share=0.5, consumer_rate=10.0)
  reading = service.pool_reading("127.0.0.1:5050", 1, 0, tmp_path, now=now)
  assert reading is not None and reading.wait_share == 0.5
  assert service.pool_reading("127.0.0.1:5051", 1, 0, tmp_path,
                              now=now) is None


@pytest.mark.parametrize("value", ["2", 0, -5, float("nan"), float("inf"),
                                   True, None])
def test_consumer_meter_refuses_bad_elements_per_item(tmp_path, value):
  with pytest.raises(ValueError, match=re.escape(
      f"elements_per_item is the elements (as the workers count them) in "
      f"one item the iterator yields, a finite number above 0 (default 1; "
      f"the batch size for batched elements), got {value!r}.")):
    service.ConsumerMeter("127.0.0.1:5050", str(tmp_path),
                          elements_per_item=value)


def test_consumer_meter_counts_numpy_and_fractional_items(tmp_path):
  for per_item, total in ((np.int64(4), 12), (2.5, 7.5)):
    meter = service.ConsumerMeter("127.0.0.1:5050", str(tmp_path),
                                  elements_per_item=per_item)
    assert list(meter.iterate(range(3))) == [0, 1, 2]
    # 3 items of 4 elements = 12; of 2.5 = 7.5.
    assert meter.report()["elements"] == total
    meter.close()


def test_consumer_meter_warns_once_and_trains_on_without_its_folder(
    tmp_path, caplog):
  # The status dir cannot be made (a file is in its way): the training
  # loop goes on, told once.
  (tmp_path / "file").write_text("")
  meter = service.ConsumerMeter("127.0.0.1:5050",
                                str(tmp_path / "file" / "status"))
  meter.record(0.1, 0.3, 4)
  for _ in range(3):
    assert meter.report()["wait_share"] >= 0
  assert list(meter.iterate(range(3))) == [0, 1, 2]
  meter.close()
  warnings = [r for r in caplog.records
              if "ConsumerMeter: cannot write its report" in r.getMessage()]
  assert len(warnings) == 1, caplog.text


def test_consumer_meter_reports_wait_share_and_pace(tmp_path):
  meter = service.ConsumerMeter("127.0.0.1:5050", str(tmp_path),
                                elements_per_item=4)
  # 2 steps: 0.1 s waiting + 0.3 s computing, 4 elements each: the wait
  # share is 0.2 / 0.8 = 0.25, the pace 8 elements / 0.6 s = 13.33.
  meter.record(0.1, 0.3, 4)
  meter.record(0.1, 0.3, 4)
  data = meter.report()
  assert data["wait_share"] == pytest.approx(0.25)
  assert data["consumer_rate"] == pytest.approx(8 / 0.6)
  assert json.loads(meter.path.read_text())["dispatcher"] == "127.0.0.1:5050"
  items = list(meter.iterate(range(3)))
  assert items == [0, 1, 2]
  meter.close()
  assert not meter.path.exists()


def test_a_wait_under_way_is_reported_while_it_lasts(tmp_path, monkeypatch):
  # A trainer stuck on a worker that a shrink stopped sent no report, so
  # the controller never saw it wait and the epoch never ended.
  monkeypatch.setattr(service.consumer, "CONSUMER_REPORT_PERIOD_S", 0.2)
  meter = service.ConsumerMeter("127.0.0.1:5050", str(tmp_path))
  meter.record(0.0, 0.5, 10)  # a pace of 10 / 0.5 = 20 elements/s
  meter.report()
  seen = []

  def stalls():
    yield 0
    deadline = time.monotonic() + 2.0  # the stall, inside next()
    while time.monotonic() < deadline:
      time.sleep(0.05)
      seen.append(json.loads(meter.path.read_text()))
    yield 1

  got = []
  for item in meter.iterate(stalls()):
    got.append(item)
    time.sleep(0.05)  # a step of 1 element in 0.05 s: 20 elements/s
  assert got == [0, 1]
  stalled = [r for r in seen if r["elements"] == 0]
  # About 2.0 / 0.2 = 10 reports; each says the trainer waits all the
  # time, at the last pace measured (about 20/s: the sleep overshoots).
  assert len({r["time"] for r in stalled}) >= 3, seen
  assert {r["wait_share"] for r in stalled} == {1.0}
  (pace,) = {r["consumer_rate"] for r in stalled}
  assert 0 < pace <= 20.0
  # What was reported is not counted again when the wait ends: about a
  # period's worth (0.2 s, plus scheduling on a busy machine) is left of
  # the 2.0 s.
  assert meter._wait < 1.0  # noqa: SLF001
  assert not [t for t in threading.enumerate()
              if t.name == "intune-consumer-meter"]


@pytest.mark.slow
@pytest.mark.parametrize("spec,message", [
    ("local:3-1", "the pool's MIN (3) is above its MAX (1)"),
    ("local:-1-2", "the pool's MIN must be at least 1 worker, got -1"),
])
def test_cli_bad_worker_pool_exits_2(spec, message):
  result = _run_cli("dispatcher", "--port", str(_free_port()), "--workers",
                    spec)
  assert result.returncode == 2
  assert message in result.stderr, result.stdout + result.stderr


_K8S = "kubectl scale deployment/w --replicas={n}"


@pytest.mark.parametrize("flags,message", [
    # Each flag alone, by its type.
    (["--workers", "command:4-1"],
     "argument --workers: 'command:4-1': the pool's MIN (4) is above its "
     "MAX (1); pass local:MIN-MAX or command:MIN-MAX with 1 <= MIN <= MAX."),
    (["--workers", "k8s:1-4"],
     "argument --workers: a worker pool must be local:MIN-MAX or "
     "command:MIN-MAX with 1 <= MIN <= MAX (for example local:1-4), got "
     "'k8s:1-4'."),
    (["--workers", "command:1-4", "--scale-command", "kubectl scale x"],
     "argument --scale-command: the scale command must contain {n} where "
     "the count goes (for example 'kubectl scale "
     "deployment/tfdata-workers --replicas={n}'), got 'kubectl scale x'."),
    (["--workers", "command:1-4", "--scale-command", _K8S,
      "--scale-timeout", "nan"],
     "argument --scale-timeout: 'nan' is not a duration; pass finite "
     "seconds above 0."),
    (["--workers", "command:1-4", "--scale-command", _K8S,
      "--scale-timeout", "-5"],
     "argument --scale-timeout: '-5' is not a duration; pass finite "
     "seconds above 0."),
    (["--workers", "local:1-4", "--pool-controller", "fixed"],
     "argument --pool-controller: invalid choice: 'fixed'"),
    (["--workers", "local:1-2", "--scale-out", "-1", "--scale-command",
      _K8S],
     "argument --scale-out: '-1' is not a positive integer; pass 1 or more."),
])
def test_bad_pool_flags_stop_the_dispatcher_at_parsing(flags, message,
                                                       capsys):
  with pytest.raises(SystemExit) as stopped:
    cli.parse_args(["service", "dispatcher", "--port", "5050", *flags])
  assert stopped.value.code == 2
  err = capsys.readouterr().err
  assert message in err, err


@pytest.mark.parametrize("flags,message", [
    (["--workers", "command:1-4"],
     "--workers command:MIN-MAX needs --scale-command, the shell command "
     "that sets the pool to {n} workers; pass for example --scale-command "
     "'kubectl scale deployment/tfdata-workers --replicas={n}'."),
    (["--workers", "local:1-4", "--scale-command", _K8S],
     "--scale-command is for --workers command:MIN-MAX or local:MIN-MAX "
     "with --scale-out, not --workers local:MIN-MAX alone; pass one of them "
     "or drop --scale-command."),
    (["--scale-command", _K8S],
     "--scale-command is for --workers command:MIN-MAX or local:MIN-MAX "
     "with --scale-out, not no --workers;"),
    (["--workers", "local:1-4", "--scale-timeout", "5"],
     "--scale-timeout is for --workers command:MIN-MAX or local:MIN-MAX "
     "with --scale-out, not --workers local:MIN-MAX alone; pass one of them "
     "or drop --scale-timeout."),
    (["--workers", "local:1-2", "--scale-out", "8"],
     "--scale-out needs --scale-command, the shell command that sets the "
     "workers beyond the host's to {n}; pass for example --scale-command "
     "'kubectl scale deployment/tfdata-workers --replicas={n}'."),
    (["--workers", "command:1-2", "--scale-out", "8", "--scale-command",
      _K8S],
     "--scale-out adds workers beyond those of --workers local:MIN-MAX, not "
     "--workers command:MIN-MAX; pass --workers local:MIN-MAX or drop "
     "--scale-out."),
    (["--scale-out", "8"],
     "--scale-out adds workers beyond those of --workers local:MIN-MAX, not "
     "no --workers;"),
    (["--pool-controller", "cachew"],
     "--pool-controller cachew sizes a pool: pass --workers local:MIN-MAX or "
     "command:MIN-MAX, or drop --pool-controller."),
    (["--pool-period", "5"],
     "--pool-period paces the decisions on a pool: pass --workers "
     "local:MIN-MAX or command:MIN-MAX, or drop --pool-period."),
    (["--pool-min-interval", "0"],
     "--pool-min-interval paces the decisions on a pool: pass --workers "
     "local:MIN-MAX or command:MIN-MAX, or drop --pool-min-interval."),
    (["--workers", "command:1-4", "--scale-command", _K8S, "--pool-standby",
      "1"],
     "--pool-standby keeps local workers warm: pass --workers local:MIN-MAX "
     "or drop --pool-standby."),
])
def test_pool_flags_that_do_not_go_together_exit_2_before_anything_starts(
    flags, message, capsys, monkeypatch):
  started = []
  monkeypatch.setattr(service.dispatcher, "run_dispatcher",
                      lambda *a, **k: started.append(a) or 0)
  args = cli.parse_args(["service", "dispatcher", "--port", "5050", *flags])
  assert args.func(args) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"intune service dispatcher: error: {message}"), err
  assert err.count("\n") == 1, err
  assert not started


@pytest.mark.parametrize("kwargs,message", [
    ({"workers": (1, 2), "controller": "fixed"},
     "unknown pool controller 'fixed'; known: intune, tf-formula, cachew."),
    ({"scaler": "callback"}, "scaler= needs workers=(MIN, MAX) equal to the "
     "scaler's (1, 3) and no scale_command."),
    ({"scaler": "callback", "workers": (1, 4)}, "scaler= needs workers="),
    ({"scaler": "callback", "workers": (1, 3), "scale_command": _K8S},
     "scaler= needs workers="),
    ({"workers": (1, 2), "scale_out": 4},
     "scale_out= is the workers the scale command adds beyond the local "
     "ones: it needs workers=(MIN, MAX) and scale_command, and a count of "
     "at least 1, got 4."),
    ({"workers": (1, 2), "scale_command": _K8S, "scale_out": 0},
     "a count of at least 1, got 0."),
])
def test_run_dispatcher_refuses_what_does_not_go_together(kwargs, message):
  port = _free_port()
  if kwargs.get("scaler") == "callback":
    kwargs["scaler"] = scalers.CallbackScaler(lambda n: None, 1, 3)
  with pytest.raises(ValueError, match=re.escape(message)):
    service.run_dispatcher(port, **kwargs)
  service.check_port_free(port)  # nothing listens on it


def test_a_command_pool_reaches_the_dispatcher(monkeypatch):
  # What `run_dispatcher` receives, its defaults applied, however it is
  # called; the stand-in has its signature.
  received = []
  signature = inspect.signature(service.run_dispatcher)

  @functools.wraps(service.run_dispatcher)
  def run_dispatcher(*args, **kwargs):
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    received.append(dict(bound.arguments))
    return 0

  monkeypatch.setattr(service.dispatcher, "run_dispatcher", run_dispatcher)

  def run(*flags):
    args = cli.parse_args(["service", "dispatcher", "--port", "5050",
                           *flags])
    assert args.func(args) == 0
    return received[-1]

  unset = {"port": 5050, "host": "127.0.0.1", "work_dir": None,
           "worker_timeout_ms": None, "workers": None, "pool_period_s": 10.0,
           "pool_min_interval_s": 30.0, "scale_command": None,
           "scale_timeout_s": 60.0, "controller": "intune", "scaler": None,
           "standby": workers.DEFAULT_STANDBY, "scale_out": None}
  assert run() == unset
  assert run("--workers", "command:2-8", "--scale-command", _K8S) == {
      **unset, "workers": (2, 8), "scale_command": _K8S}
  assert run("--workers", "command:2-8", "--scale-command", _K8S,
             "--scale-timeout", "2.5") == {
      **unset, "workers": (2, 8), "scale_command": _K8S,
      "scale_timeout_s": 2.5}
  assert run("--workers", "local:1-3", "--pool-controller",
             "tf-formula") == {**unset, "workers": (1, 3),
                               "controller": "tf-formula"}
  assert run("--workers", "local:1-3", "--pool-standby", "0") == {
      **unset, "workers": (1, 3), "standby": 0}
  # The host's 1-2 workers first, then up to 16 through the command.
  assert run("--workers", "local:1-2", "--scale-out", "16",
             "--scale-command", _K8S, "--scale-timeout", "9") == {
      **unset, "workers": (1, 2), "scale_command": _K8S,
      "scale_timeout_s": 9.0, "scale_out": 16}
  assert run("--host", "10.0.0.2", "--work-dir", "/j",
             "--worker-timeout-ms", "500", "--workers", "local:1-4",
             "--pool-period", "2", "--pool-min-interval", "0") == {
      **unset, "host": "10.0.0.2", "work_dir": "/j",
      "worker_timeout_ms": 500, "workers": (1, 4), "pool_period_s": 2.0,
      "pool_min_interval_s": 0.0}


@pytest.mark.slow
def test_dispatcher_starts_its_local_pool_at_min_and_stops_it(tmp_path):
  status_dir = tmp_path / "status"
  status_dir.mkdir()
  port = _free_port()
  # On one CPU: InTune's controller would grow the pool to 1 at most.
  dispatcher = _Server(["dispatcher", "--port", str(port), "--workers",
                        "local:1-2", "--pool-period", "1"], status_dir,
                       tmp_path / "dispatcher.log",
                       cpus=[min(os.sched_getaffinity(0))])
  try:
    def pool_up():
      assert dispatcher.proc.poll() is None, dispatcher.output()
      found = [d for d in intune_status.read_all(status_dir)
               if d.get("role") == "dispatcher"]
      info = found[0].get("pool") if found else None
      return info if info and info["serving"] == 1 else None
    info = _wait(pool_up, what="the dispatcher's pool of 1 to serve")
    assert (info["min"], info["max"], info["size"]) == (1, 2, 1)
    assert info["reason"] == "no consumer report (ConsumerMeter)"
    assert ("InTune grows it to at most 1 worker(s), the CPUs this host "
            "gives." in dispatcher.output())
    # The worker counts as serving once the dispatcher logged it registered;
    # its own status file may come a period later on a busy machine.
    workers = _wait(lambda: service.worker_status(
        status_dir, f"127.0.0.1:{port}"), what="the worker's status file")
    assert len(workers) == 1
    worker_pid = workers[0]["pid"]
    assert service.dispatcher_pool(f"127.0.0.1:{port}", status_dir)[
        "size"] == 1
    # The pool in the Keras logs of a `fit`.
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    history = model.fit(
        np.zeros((8, 2)), np.zeros((8, 1)), epochs=2, verbose=0,
        callbacks=[intune_keras.PoolCallback(f"127.0.0.1:{port}",
                                              str(status_dir))])
    assert history.history["intune/pool_size"] == [1, 1]
    assert history.history["intune/pool_serving"] == [1, 1]
    # A local worker killed is replaced at its address within a period,
    # without a decision (no consumer reports here): an epoch that lost it
    # can end.
    worker_port = workers[0]["service"]["port"]
    os.kill(worker_pid, signal.SIGKILL)
    replaced = _wait(lambda: [w for w in service.worker_status(
        status_dir, f"127.0.0.1:{port}") if w["pid"] != worker_pid],
                     what="the killed local worker to be replaced")
    assert replaced[0]["service"]["port"] == worker_port
    assert service.dispatcher_pool(f"127.0.0.1:{port}", status_dir)[
        "lost"] == 1
    worker_pid = replaced[0]["pid"]
  finally:
    dispatcher.stop()
  assert dispatcher.proc.returncode == 0
  # Without a consumer the pool holds, and says why once.
  assert dispatcher.output().count(
      "Worker pool holds at 1: no consumer report (ConsumerMeter)") == 1
  # Its worker went with it.
  _wait(lambda: not _alive(worker_pid), what="the local worker to stop")


# A stand-in for `kubectl scale`: keeps argv[1] `intune service worker`
# processes for the dispatcher argv[2], their pid and log files in argv[3],
# and appends each count asked for to argv[3]/calls.
_SCALE_SCRIPT = """
import os, pathlib, signal, socket, subprocess, sys
n, dispatcher, state = int(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])
with open(state / "calls", "a") as calls:
  calls.write(f"{n}\\n")
pids = sorted(state.glob("*.pid"))
for path in pids[n:]:
  os.kill(int(path.read_text()), signal.SIGTERM)
  path.unlink()
for _ in range(len(pids), n):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  with open(state / f"{port}.log", "wb") as log:
    proc = subprocess.Popen(
        [INTUNE, "service", "worker", "--dispatcher", dispatcher, "--port",
         str(port)], stdin=subprocess.DEVNULL, stdout=log,
        stderr=subprocess.STDOUT, start_new_session=True)
  (state / f"{port}.pid").write_text(str(proc.pid))
"""


@pytest.mark.slow
@pytest.mark.parametrize("pool_flags, kind, calls", [
    # The command sets the whole pool: 1 at start, then 2.
    (["--workers", "command:1-2"], "command", ["1", "2"]),
    # A local worker first; the command sets the rest: 0 at start, then 1.
    (["--workers", "local:1-1", "--scale-out", "1", "--pool-standby", "0"],
     "local-first", ["0", "1"]),
])
def test_a_scale_command_grows_a_pool_of_real_workers(tmp_path, pool_flags,
                                                      kind, calls):
  status_dir = tmp_path / "status"
  status_dir.mkdir()
  state = tmp_path / "workers"
  state.mkdir()
  script = tmp_path / "scale.py"
  script.write_text(_SCALE_SCRIPT.replace("INTUNE", repr(_INTUNE)))
  port = _free_port()
  address = f"127.0.0.1:{port}"
  dispatcher = _Server(
      ["dispatcher", "--port", str(port), *pool_flags,
       "--scale-command", f"{sys.executable} {script} {{n}} {address} {state}",
       "--pool-period", "1"], status_dir, tmp_path / "dispatcher.log")
  try:
    def serving(n):
      assert dispatcher.proc.poll() is None, dispatcher.output()
      info = service.dispatcher_pool(address, status_dir)
      return info if info and info["serving"] >= n else None
    info = _wait(lambda: serving(1), what="the pool's first worker")
    assert (info["kind"], info["size"]) == (kind, 1)
    assert (state / "calls").read_text().split() == calls[:1]
    # A trainer that computes nothing waits for every element: the pool
    # grows to MAX through the command.
    meter = service.ConsumerMeter(address, str(status_dir))
    it = meter.iterate(tf.data.experimental.service.distribute(
        "distributed_epoch", f"grpc://{address}", job_name=None)(
            _pipeline(10**7)))

    def grown():
      for _ in range(100):
        next(it)
      info = service.dispatcher_pool(address, status_dir)
      return [e for e in info["decisions"]
              if (e["before"], e["size"]) == (1, 2)] if info else None
    event, = _wait(grown, what="the pool to grow to 2")
    assert event["error"] is None
    assert event["reason"].startswith("trainer waits"), event
    assert (state / "calls").read_text().split()[:2] == calls
    # The workers the command started registered and served.
    assert len(list(state.glob("*.log"))) == int(calls[1])
    _wait(lambda: serving(2), what="the pool of 2 to serve")
    assert "Worker pool 1 -> 2: trainer waits" in dispatcher.output()
    it.close()
  finally:
    dispatcher.stop()
    for path in state.glob("*.pid"):
      try:
        os.kill(int(path.read_text()), signal.SIGKILL)
      except ProcessLookupError:
        pass
  assert dispatcher.proc.returncode == 0


def _alive(pid: int) -> bool:
  try:
    return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return False


@pytest.mark.slow
def test_local_workers_end_with_a_dispatcher_killed_with_sigkill(tmp_path):
  # As the OOM killer ends it: no SIGTERM handler runs, no scaler closes.
  status_dir = tmp_path / "status"
  status_dir.mkdir()
  port = _free_port()
  # Below MAX: a standby is kept warm too.
  dispatcher = _Server(["dispatcher", "--port", str(port), "--workers",
                        "local:1-2", "--pool-standby", "1", "--pool-period",
                        "1"], status_dir, tmp_path / "dispatcher.log")
  try:
    workers = _wait(lambda: service.worker_status(
        status_dir, f"127.0.0.1:{port}"), what="the local worker to serve")
    children = _wait(lambda: len(psutil.Process(dispatcher.pid).children())
                     == 2 and psutil.Process(dispatcher.pid).children(),
                     what="the worker and its standby")
    assert workers[0]["pid"] in {c.pid for c in children}
  finally:
    dispatcher.stop(signal.SIGKILL)
  for child in children:
    _wait(lambda child=child: not _alive(child.pid),
          what=f"local worker pid {child.pid} to end with its dispatcher")
