"""Status files, `intune inspect` and the decision log."""

import contextlib
import functools
import io
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import _fuzz
from _waiting import wait_until
import numpy as np
import pytest
import tensorflow as tf

import intune_tf
from intune_tf import arbiter
from intune_tf import files
from intune_tf import records
from intune_tf.bench import demo
from intune_tf.live import registry
from intune_tf.observe import inspect as inspect_lib
from intune_tf.observe import status
from intune_tf.service import controllers
from intune_tf.service import manager as manager_lib
from intune_tf.service import scalers
from intune_tf.tuning import policies

_TIMEOUT_S = 240.0
_INTUNE = str(pathlib.Path(sys.executable).with_name("intune"))


class _Deciding(policies.EvenPolicy):
  """"even", recording a decision the way the learning agent does."""

  def __init__(self, options):
    super().__init__(options)
    self._n = 0

  def step(self, obs):
    self._n += 1
    # A numpy reward, as an agent would give: logged as a plain JSON number.
    self.last_decision = records.Decision(
        step=self._n, action=str(self._n % 3),
        reward=np.float32(0.5 * self._n))
    return super().step(obs)


registry.register("test_deciding", _Deciding)


_wait = functools.partial(wait_until, timeout=_TIMEOUT_S)


def _pipeline(policy="even", name="inspected"):
  ds = tf.data.Dataset.range(10**9)
  ds = ds.map(demo.busy_udf(3000), num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.map(lambda x: x + 1, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.prefetch(tf.data.AUTOTUNE)
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(
      policy=policy, period_s=0.1, name=name)
  return ds.with_options(options)


def _stage(name, rate, cpu_per_element_s, parallelism=None, buffer_size=None,
           time_share=0.0, buffered_bytes=0):
  return records.StageObservation(
      name=name, rate=rate, cpu_per_element_s=cpu_per_element_s,
      parallelism=parallelism, buffer_size=buffer_size, buffer_fill=0.5,
      bytes_per_element=8.0, bytes_produced_per_s=8.0 * rate,
      buffered_bytes=buffered_bytes, time_share=time_share)


def _observation(stages):
  return records.Observation(
      time=0.0, interval_s=1.0, knobs=(), stages=tuple(stages),
      output_rate=100.0, output_latency_s=0.002, consumer_wait_s=0.001,
      usable_cpus=2, cpu_budget=2, free_memory=1 << 30, total_memory=2 << 30,
      ram_budget=1 << 20, buffered_bytes=0, cpu_mhz=0.0, dram_gbps=1.0,
      model_step_s=None)


def test_stage_rows_flag_the_least_headroom():
  # a: 100 elem/s x 5 ms = 0.5 CPUs on 2 threads -> 25% busy.
  # b: 100 elem/s x 3 ms = 0.3 CPUs on 1 thread (no knob) -> 30%: bottleneck,
  #    although a has the larger CPU share.
  rows = status.stage_rows(_observation([
      _stage("Prefetch", 100, 0.0, buffer_size=4),
      _stage("Prefetch.ParallelMapV2", 100, 0.005, parallelism=2,
             time_share=0.625),
      _stage("Prefetch.ParallelMapV2.Batch", 100, 0.003, time_share=0.375),
  ]))
  by_name = {r["stage"]: r for r in rows}
  assert by_name["Prefetch.ParallelMapV2"]["cpus"] == pytest.approx(0.5)
  assert by_name["Prefetch.ParallelMapV2"]["utilization"] == pytest.approx(0.25)
  batch = "Prefetch.ParallelMapV2.Batch"
  assert by_name[batch]["utilization"] == pytest.approx(0.3)
  assert [r["stage"] for r in rows if r["bottleneck"]] == [batch]
  assert by_name["Prefetch"]["buffer"] == 4
  assert by_name["Prefetch"]["parallelism"] is None


def test_stage_rows_without_work_flag_nothing():
  rows = status.stage_rows(_observation([
      _stage("Prefetch.ParallelMapV2", 0, 0.0, parallelism=2)]))
  assert not any(r["bottleneck"] for r in rows)


def test_status_file_after_steps(tmp_path):
  writer = status.StatusWriter(tmp_path, period_s=0.1)
  writer.set_info(role="test")
  writer.start()
  tuner = intune_tf.global_tuner()
  tuner.add_listener(writer)
  try:
    it = iter(_pipeline())
    next(it)
    session = intune_tf.session_of(it)

    def stepped():
      for _ in range(20):
        next(it)  # noqa: F821
      data = status.read_all(tmp_path)
      mine = [s for d in data for s in d["sessions"] if s["id"] == session.id]
      # A step that fell in the sleep between polls saw no output: wait for
      # one that did, rather than asserting on whichever step was last.
      return (mine and mine[0]["steps"] >= 5
              and (mine[0]["output_rate"] or 0) > 0 and mine[0])
    entry = _wait(stepped, what="5 tuning steps with output in the status file")
  finally:
    tuner.remove_listener(writer)
  data = json.loads(writer.path.read_text())
  assert data["format"] == status.FORMAT
  assert data["pid"] == os.getpid() and data["role"] == "test"
  assert entry["name"] == "inspected" and entry["policy"] == "even"
  assert entry["alive"]
  assert set(entry["knobs"]) == {k.name for k in session.knobs()}
  assert entry["changes"] >= 1  # "even" moved the knobs at its first step
  stages = {r["stage"] for r in entry["stages"]}
  assert {k.stage for k in session.knobs()} <= stages
  assert sum(r["bottleneck"] for r in entry["stages"]) == 1
  # The iterator goes away: the session moves to the ended ones.
  del it
  ended = _wait(lambda: [s for s in json.loads(writer.path.read_text())[
      "ended_sessions"] if s["id"] == session.id], what="the session to end")
  assert not ended[0]["alive"] and ended[0]["ended"] is not None
  writer.close()
  assert not writer.path.exists()


def test_a_step_of_a_session_gone_is_written_without_its_cache(tmp_path):
  writer = status.StatusWriter(tmp_path)
  gone = intune_tf.TuningSession(10**6, intune_tf.IntuneOptions(
      cache=True, name="gone").to_json())
  writer(gone, _observation([_stage("Prefetch", 100, 0.0, buffer_size=4)]),
         {})
  entry = writer.snapshot()["sessions"][0]
  assert entry["name"] == "gone" and entry["cache"] is None
  writer.close()


def test_inspect_prints_the_table_of_a_live_file(tmp_path):
  writer = status.StatusWriter(tmp_path)
  writer(intune_tf.TuningSession(7, intune_tf.IntuneOptions(policy="even",
                                                   name="demo").to_json()),
         _observation([_stage("Prefetch", 100, 0.0, buffer_size=4),
                       _stage("Prefetch.Shuffle", 100, 0.0,
                              buffered_bytes=3 << 19),
                       _stage("Prefetch.Shuffle.ParallelMapV2", 100, 0.009,
                              parallelism=1, time_share=1.0)]), {})
  writer.write_now()
  out = io.StringIO()
  assert inspect_lib.inspect(tmp_path, out=out) == 0
  text = out.getvalue()
  assert f"pid {os.getpid()}" in text
  assert "session 7 'demo': policy even, step 1" in text
  assert "input-bound" in text  # GetNext 2 ms > consumer 1 ms
  lines = text.splitlines()
  header = next(i for i, l in enumerate(lines) if l.strip().startswith("stage"))
  assert lines[header].split() == ["stage", "parallelism", "buffer", "fill",
                                   "elem/s", "CPUs", "CPU", "share", "util",
                                   "bottleneck"]
  # The shuffle's 1.5 MB cannot be lowered by the guard.
  assert ("not lowerable by the guard (counted against the budget): "
          "Prefetch.Shuffle 1.5 MB") in text
  row = next(l for l in lines
             if "Prefetch.Shuffle.ParallelMapV2 " in l).split()
  # parallelism 1, no buffer, 100 elem/s, 0.9 CPUs, 100% share, 90% busy.
  assert row[1:] == ["1", "-", "-", "100", "0.90", "100%", "90%", "<==",
                     "bottleneck"]
  assert inspect_lib.inspect(tmp_path, pid=1, out=io.StringIO()) == 1
  writer.close()


@contextlib.contextmanager
def _status_and_log(folder: pathlib.Path):
  """The global tuner writes status files to `folder / "status"` and its
  decision log to `folder / "decisions.jsonl"` inside the block."""
  writer = status.StatusWriter(folder / "status", period_s=0.05)
  writer.start()
  tuner = intune_tf.global_tuner()
  log = status.DecisionLog(folder / "decisions.jsonl", tuner)
  tuner.add_listener(writer)
  tuner.add_listener(log)
  try:
    yield
  finally:
    tuner.remove_listener(writer)
    tuner.remove_listener(log)
    log.close()
    writer.close()


def test_inspect_and_the_decision_log_show_what_the_cache_gave(tmp_path):
  ds = tf.data.Dataset.range(64).map(
      lambda x: tf.reduce_sum(tf.sin(tf.cast(tf.range(x + 100), tf.float32))),
      num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(
      policy="manual", period_s=0.02, cache=True, warm_start=False)
  ds = ds.with_options(options)
  with _status_and_log(tmp_path):
    assert len(list(ds)) == 64  # epoch 1 fills the cache
    it = iter(ds)  # epoch 2, a session of its own, is read from it
    session = intune_tf.session_of(it)
    for _ in range(32):
      next(it)

    def shown():
      mine = [s for d in status.read_all(tmp_path / "status")
              for s in d["sessions"] if s["id"] == session.id]
      return (mine and (mine[0].get("cache") or {}).get("served") == 1.0
              and mine[0]["cache"])
    cache = _wait(shown, what="the second epoch's cache in the status file")
    out = io.StringIO()
    assert inspect_lib.inspect(tmp_path / "status", out=out) == 0
  assert cache["state"] == "placed"
  assert cache["point"] and cache["point"] == session.cache()["point"]
  assert cache["complete"] and cache["elements"] == 64
  assert cache["bytes"] >= 64 * 4  # 64 float32 scalars at least
  assert (f"cache after {cache['point']}: " in out.getvalue() and
          "64 elements, a whole epoch; 100% of this epoch's reads served "
          "from it" in out.getvalue()), out.getvalue()
  lines = [json.loads(line) for line in
           (tmp_path / "decisions.jsonl").read_text().splitlines()]
  logged = [r["cache"] for r in lines if r["session"] == session.id]
  assert logged and logged[-1]["point"] == cache["point"]
  assert max(c["served"] for c in logged) == 1.0
  del it


def _heavy(x):
  return tf.reduce_sum(tf.sin(tf.cast(tf.range(x % 100 + 100), tf.float32)))


# (pipeline, what became of its cache, whether it has a point, words of its
# reason): placed; declined by the rewrite, which found no place for it;
# declined by the cache itself at its first element, an epoch of 2**50
# elements being far more than its room.
_CACHE_STATES = [
    (lambda: tf.data.Dataset.range(64).map(
        _heavy, num_parallel_calls=tf.data.AUTOTUNE),
     records.CacheState.PLACED, True, "the whole pipeline repeats each epoch"),
    (lambda: tf.data.Dataset.range(64).map(
        _heavy, num_parallel_calls=tf.data.AUTOTUNE).cache(),
     records.CacheState.DECLINED, False, "the pipeline has its own cache"),
    (lambda: tf.data.Dataset.range(2**50).map(
        _heavy, num_parallel_calls=tf.data.AUTOTUNE),
     records.CacheState.DECLINED, True, "the RAM budget leaves it room for "),
]


@pytest.mark.parametrize("make,state,has_point,reason", _CACHE_STATES,
                         ids=["placed", "no_place", "declined_at_run_time"])
def test_the_session_the_status_file_and_the_log_tell_one_cache_state(
    tmp_path, make, state, has_point, reason):
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(
      policy="manual", period_s=0.02, cache=True, warm_start=False)
  with _status_and_log(tmp_path):
    it = iter(make().with_options(options))
    session = intune_tf.session_of(it)
    for _ in range(8):
      next(it)

    def shown():
      filed = [s.get("cache") for d in status.read_all(tmp_path / "status")
               for s in d["sessions"] if s["id"] == session.id]
      logged = [json.loads(line)["cache"] for line in
                (tmp_path / "decisions.jsonl").read_text().splitlines()
                if json.loads(line)["session"] == session.id]
      done = (filed and filed[0] and filed[0]["state"] == state.value and
              logged and logged[-1]["state"] == state.value)
      return done and (filed[0], logged[-1])
    filed, logged = _wait(shown, what="the cache's state in both files")
    out = io.StringIO()
    assert inspect_lib.inspect(tmp_path / "status", out=out) == 0
  told = session.cache()
  assert told["state"] is state
  assert bool(told["point"]) == has_point, told
  assert told["reason"].startswith(reason), told
  for kept in (filed, logged):
    assert {k: kept[k] for k in ("state", "point", "reason")} == {
        "state": state.value, "point": told["point"],
        "reason": told["reason"]}
  line = inspect_lib.cache_line(filed)
  assert line in out.getvalue()
  said = (f"no cache: {told['reason']}" if state is records.CacheState.DECLINED
          else f"cache after {told['point']}: ")
  assert line.startswith(said), line
  del it


@pytest.mark.parametrize("cache,line", [
    ({"state": "declined", "point": "",
      "reason": "nothing to save below RangeDataset"},
     "no cache: nothing to save below RangeDataset"),
    # Declined where it was placed: the place is said.
    ({"state": "declined", "point": "MapDataset/_2",
      "reason": "the input never ends, so no share of an epoch fits"},
     "no cache: the input never ends, so no share of an epoch fits (its "
     "point: after MapDataset/_2)"),
    # 3 MiB of 1 GiB, 1.5 s saved; the epoch's first half only.
    ({"state": "placed", "point": "MapDataset/_2",
      "reason": "above it: a shuffle", "bytes": 3 << 20, "limit": 1 << 30,
      "elements": 1200, "complete": False, "served": 0.25, "saved_s": 1.5},
     "cache after MapDataset/_2: 3.0 MB of 1.0 GB, 1,200 elements; 25% of "
     "this epoch's reads served from it, 1.50 s of upstream time saved "
     "(above it: a shuffle)"),
])
def test_cache_line(cache, line):
  assert inspect_lib.cache_line(cache) == line


def test_inspect_shows_how_the_host_is_split(tmp_path):
  writer = status.StatusWriter(tmp_path / "status")
  writer(intune_tf.TuningSession(
             7, intune_tf.IntuneOptions(policy="even").to_json()),
         _observation([_stage("Prefetch", 100, 0.0, buffer_size=4)]), {})
  writer.write_now()
  host_dir = tmp_path / "host"
  arbiter.make_folder(host_dir)
  # Two live processes (this one and a sleeping child) share the host.
  other = subprocess.Popen([sys.executable, "-c",
                            "import time; time.sleep(60)"])
  try:
    for pid, weight, cpus, wanted, ram, confined in (
        (os.getpid(), 1.0, 1, None, 3 << 30, [1]),
        (other.pid, 2.0, 1, 0.5, 6 << 30, None)):
      files.write_json(host_dir / f"{pid}.json", {
          "format": arbiter.FORMAT, "pid": pid, "uid": os.getuid(),
          "start": 0.0, "weight": weight, "heartbeat": time.time(),
          "rate": 1234.0, "busy_cpus": 0.4, "cpus_wanted": wanted,
          "buffered_bytes": 5 << 20, "cpus": cpus, "ram": ram,
          "confined": confined})
    out = io.StringIO()
    assert inspect_lib.inspect(tmp_path / "status", out=out,
                               host_dir=host_dir) == 0
    lines = out.getvalue().splitlines()
  finally:
    other.kill()
    other.wait()
    writer.close()
  first, second = sorted((os.getpid(), other.pid))
  assert lines[0] == (f"host split: 2 InTune processes share this host "
                      f"({host_dir})")
  split = {int(line.split()[1].rstrip(":")): line for line in lines[1:3]}
  assert split[os.getpid()] == (
      f"  pid {os.getpid()}: weight 1, CPU budget 1 (can use any; runs on "
      "CPUs 1), RAM "
      "budget 3.0 GB, 1,234 rows/s, 0.40 CPUs busy, buffered 5.0 MB")
  assert split[other.pid].endswith(
      "weight 2, CPU budget 1 (can use 0.50), RAM budget 6.0 GB, 1,234 "
      "rows/s, 0.40 CPUs busy, buffered 5.0 MB")
  assert lines[1].startswith(f"  pid {first}:")
  assert lines[2].startswith(f"  pid {second}:")
  assert any(f"pid {os.getpid()} on" in line for line in lines[3:])


def test_inspect_shows_the_pool_a_dispatcher_sizes(tmp_path):
  # The pool as the dispatcher reports it: a manager's report, in a status
  # file of role dispatcher, as `service.run_dispatcher` writes it.
  fail = [True]

  def scale(n):
    if fail[0]:
      raise OSError("cluster API unreachable")
  manager = manager_lib.PoolManager(
      controllers.IntuneController(1, 8),
      scalers.CallbackScaler(scale, 1, 8, initial=2))
  # 2 workers of 100 rows/s, 500 asked: the controller wants 6.
  reading = functools.partial(
      controllers.PoolReading, workers=2, wait_share=0.6, consumer_rate=500.0,
      worker_capacities=(100.0, 100.0))
  manager.step(reading(time_s=0.0))
  # A failed change is shown with its error.
  failed = inspect_lib.pool_table(manager.report())
  assert failed[2].split() == ["callback", "2", "2", "0", "1-8", "0", "1"]
  assert failed[3] == f"last reason: {manager.reason}"
  assert failed[4] == (
      "last change: 2 -> 6 workers failed: the scale callback failed for 6 "
      "workers: OSError: cluster API unreachable; the pool stays at 2.")
  fail[0] = False
  manager.step(reading(time_s=10.0))
  assert manager.scaler.size() == 6 and manager.failures == 1
  writer = status.StatusWriter(tmp_path)
  writer.set_info(role="dispatcher", service={"port": 5050},
                  workers=6, pool=manager.report())
  writer.write_now()
  out = io.StringIO()
  try:
    assert inspect_lib.inspect(tmp_path, service_only=True, out=out) == 0
  finally:
    writer.close()
  lines = out.getvalue().splitlines()
  # After the host split, where this process's other tests left a share.
  lines = lines[next(i for i, line in enumerate(lines)
                     if line.startswith(f"pid {os.getpid()} on ")):]
  assert "tf.data service dispatcher on port 5050" in lines[0]
  assert lines[1].split() == ["worker", "pool", "size", "serving",
                              "standby", "MIN-MAX", "lost", "failures"]
  assert lines[3].split() == ["callback", "6", "6", "0", "1-8", "0", "1"]
  assert manager.reason.startswith("trainer waits 60%")
  assert lines[4] == f"  last reason: {manager.reason}"
  assert lines[5] == "  last change: 2 -> 6 workers"


def test_inspect_with_nothing_running(tmp_path):
  out = io.StringIO()
  assert inspect_lib.inspect(tmp_path / "none", out=out) == 1
  assert out.getvalue() == (f"no running InTune job found (looked in "
                            f"{tmp_path / 'none'})\n")


def test_files_of_dead_processes_are_ignored_and_removed(tmp_path):
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  host = socket.gethostname()
  stale = tmp_path / status.file_name(dead.pid)
  files.write_json(stale, {"format": status.FORMAT, "pid": dead.pid,
                                   "host": host, "process_start": time.time(),
                                   "updated": time.time(), "sessions": []})
  # A live pid whose start time differs: a reused pid, also stale.
  reused = tmp_path / status.file_name(os.getpid())
  files.write_json(reused, {"format": status.FORMAT,
                                    "pid": os.getpid(), "host": host,
                                    "process_start": 1.0,
                                    "updated": time.time(), "sessions": []})
  # Files of other hosts (a shared dir): live while recently updated, and
  # never deleted by this host.
  remote = {"format": status.FORMAT, "pid": os.getpid(), "host": "elsewhere",
            "process_start": 1.0, "sessions": []}
  fresh = tmp_path / status.file_name(1, "elsewhere")
  files.write_json(fresh, {**remote, "pid": 1,
                                   "updated": time.time()})
  old = tmp_path / status.file_name(2, "elsewhere")
  files.write_json(old, {**remote, "pid": 2, "updated": time.time() -
                                 status.REMOTE_STALE_S - 1})
  assert [d["pid"] for d in status.read_all(tmp_path)] == [1]
  assert sorted(status.remove_stale(tmp_path)) == sorted([stale, reused])
  assert sorted(tmp_path.iterdir()) == sorted([fresh, old])


def test_files_that_are_not_status_files_are_skipped_at_once(tmp_path):
  files.write_json(tmp_path / status.file_name(1, "elsewhere"), {
      "format": status.FORMAT, "pid": 1, "host": "elsewhere",
      "process_start": 1.0, "updated": time.time(), "sessions": []})
  os.mkfifo(tmp_path / "fifo.json")  # no writer: a plain read blocks forever
  (tmp_path / "huge.json").write_bytes(b" " * (5 << 20))
  with pytest.raises(ValueError, match="not a regular file"):
    status.read_json_file(tmp_path / "fifo.json")
  with pytest.raises(ValueError, match="more than the"):
    status.read_json_file(tmp_path / "huge.json")
  assert [d["pid"] for d in status.read_all(tmp_path)] == [1]


@pytest.mark.parametrize("bad,problem", [
    ({"sessions": "garbage"},
     "sessions is 'garbage' (str), expected a list of session objects"),
    ({"sessions": [{"id": 3, "output_rate": "fast"}]},
     "sessions[0].output_rate is 'fast' (str), expected int or float or "
     "null"),
    ({"sessions": [{"id": 3, "stages": [{"stage": "Map", "rate": []}]}]},
     "sessions[0].stages[0].rate is [] (list), expected int or float or "
     "null"),
    ({"pid": "7"}, "pid is '7' (str), expected a process id from 1 to "
     "4194304"),
    ({"pid": -1}, "pid is -1 (int), expected a process id from 1 to 4194304"),
    ({"pid": 0}, "pid is 0 (int), expected a process id from 1 to 4194304"),
    ({"pid": 2**70}, "pid is 1180591620717411303424 (int), expected a "
     "process id from 1 to 4194304"),
    ({"host": 7}, "host is 7 (int), expected a host name"),
    ({"updated": float("nan")}, "updated is nan (float), expected a finite "
     "number >= 0"),
    ({"sessions": [{"id": 3, "output_rate": float("inf")}]},
     "sessions[0].output_rate is inf (float), expected a finite number >= 0"),
    ({"sessions": [{"id": 3, "stages": [{"stage": "Map", "rate": -1}]}]},
     "sessions[0].stages[0].rate is -1 (int), expected a finite number >= 0"),
    ({"sessions": [{"id": 3, "cache": {"point": "Map", "served": -0.5}}]},
     "sessions[0].cache.served is -0.5 (float), expected a finite number >= "
     "0"),
    ({"sessions": [{"id": 3, "cache": {"point": 7}}]},
     "sessions[0].cache.point is 7 (int), expected str"),
    ({"pool": [1, 2]}, "pool is [1, 2] (list), expected an object"),
    ({"pool": {"size": -1}},
     "pool.size is -1 (int), expected a finite number >= 0"),
    ({"pool": {"serving": 1.5}}, "pool.serving is 1.5 (float), expected int"),
    ({"pool": {"standby": "1"}}, "pool.standby is '1' (str), expected int"),
    ({"pool": {"decisions": [{"before": 1, "error": 3}]}},
     "pool.decisions[0].error is 3 (int), expected str or null"),
])
def test_a_status_file_with_wrong_field_types_is_skipped_with_one_warning(
    tmp_path, caplog, bad, problem):
  # Used to make `intune inspect` print a traceback for everyone sharing the
  # status folder.
  good = {"format": status.FORMAT, "pid": 1, "host": "elsewhere",
          "process_start": 1.0, "updated": time.time(),
          "sessions": [{"id": 5, "name": "fine", "output_rate": 12.0}]}
  files.write_json(tmp_path / status.file_name(1, "elsewhere"), good)
  broken = tmp_path / status.file_name(2, "elsewhere")
  files.write_json(broken, {**good, "pid": 2, **bad})
  for _ in range(2):  # `--watch` reads again: told once
    out = io.StringIO()
    assert inspect_lib.inspect(tmp_path, out=out) == 0
    assert "session 5 'fine'" in out.getvalue()
    assert "pid 2 " not in out.getvalue()
  told = [r.getMessage() for r in caplog.records
          if "skipped the status file" in r.getMessage()]
  assert told == [f"InTune: skipped the status file {broken}: {problem}. "
                  "The other processes' files are still read; delete this "
                  "one if its process is gone, or update the intune_tf of "
                  "the process that wrote it."]


def test_a_status_file_of_pid_minus_one_stops_neither_a_writer_nor_inspect(
    tmp_path, caplog):
  # Used to stop every new iterator of a tuned dataset in every process
  # using the folder, and `intune inspect`, hiding the valid files:
  # `ValueError: pid must be a positive integer (got -1)` through
  # remove_stale -> _is_live -> psutil.Process(-1).
  here = socket.gethostname()
  bad = tmp_path / status.file_name(1, here)
  files.write_json(bad, {"format": status.FORMAT, "pid": -1, "host": here,
                         "process_start": 1.0, "sessions": []})
  writer = status.StatusWriter(tmp_path)
  writer.start()  # what a tuned iterator's first step runs (`install`)
  try:
    for _ in range(2):  # `--watch` reads again: told once
      out = io.StringIO()
      assert inspect_lib.inspect(tmp_path, out=out) == 0
      assert f"pid {os.getpid()} on {here}" in out.getvalue()
  finally:
    writer.close()
  assert bad.exists()  # not this reader's to delete
  told = [r.getMessage() for r in caplog.records if str(bad) in r.getMessage()]
  assert told == [f"InTune: skipped the status file {bad}: pid is -1 (int), "
                  "expected a process id from 1 to 4194304. The other "
                  "processes' files are still read; delete this one if its "
                  "process is gone, or update the intune_tf of the process "
                  "that wrote it."]


@pytest.mark.slow
def test_fuzzed_status_files_are_read_or_told_once_and_never_stop_a_reader():
  out = _fuzz.run_reader("""
      import io, logging, os, pathlib, socket, tempfile, time
      import psutil
      import _fuzz
      from intune_tf.observe import inspect as inspect_lib
      from intune_tf.observe import status

      told = _fuzz.warnings_told()
      me = psutil.Process()

      def valid(rng):
        stage = {"stage": "Prefetch.ParallelMapV2", "parallelism": 2,
                 "buffer": 4, "buffer_fill": 0.5, "rate": 100.0,
                 "cpus": 0.5, "cpu_share": 0.6, "utilization": 0.25,
                 "buffered_bytes": 64, "bottleneck": True}
        session = {"id": 1, "name": "fuzz", "policy": "even", "alive": True,
                   "steps": 3, "changes": 1, "output_rate": 100.0,
                   "output_latency_s": 0.002, "consumer_wait_s": 0.001,
                   "bound": "input", "cpu_budget": 2, "usable_cpus": 2,
                   "buffered_bytes": 64, "ram_budget": 1 << 20,
                   "unlowerable_bytes": {"Shuffle": 8}, "stages": [stage]}
        return {"format": status.FORMAT, "pid": me.pid,
                "host": rng.choice([socket.gethostname(), "elsewhere"]),
                "process_start": me.create_time(), "updated": time.time(),
                "role": rng.choice(["process", "worker", "dispatcher"]),
                "service": {"worker_address": "h:1", "port": 1},
                "sessions": [session], "ended_sessions": [session]}

      for seed in SEEDS:
        print("fuzz seed", seed, flush=True)
        folder = pathlib.Path(tempfile.mkdtemp())
        paths = _fuzz.fill(folder, seed, 150, valid,
                           lambda data, i: f"{i}@fuzz.json", 4 << 20)
        start = len(told)
        status.remove_stale(folder)  # a writer's start
        live = status.read_all(folder)
        for ended in (False, True):
          inspect_lib.inspect(folder, out=io.StringIO(), include_ended=ended,
                              host_dir=folder / "no-leases")
        for p in paths:
          named = [m for m in told[start:] if f"status file {p}: " in m]
          fine = not os.path.lexists(p) or status._read(p) is not None
          assert len(named) == (not fine), (seed, p, named)
        print(f"seed {seed}: {len(paths)} files, {len(told) - start} told, "
              f"{len(live)} live", flush=True)
  """)
  print(out)
  assert [line.split()[2] for line in out.splitlines()
          if line.startswith("fuzz seed")] == [str(s) for s in _fuzz.SEEDS]


def test_decision_log_lines(tmp_path):
  path = tmp_path / "logs" / "decisions.jsonl"
  tuner = intune_tf.global_tuner()
  log = status.DecisionLog(path, tuner)
  tuner.add_listener(log)
  try:
    it = iter(_pipeline(policy="test_deciding", name="logged"))
    next(it)
    session = intune_tf.session_of(it)

    def lines():
      for _ in range(20):
        next(it)  # noqa: F821
      found = [json.loads(l) for l in path.read_text().splitlines()]
      found = [r for r in found if r["session"] == session.id]
      return len(found) >= 4 and found
    records = _wait(lines, what="4 decision log lines")
  finally:
    tuner.remove_listener(log)
    log.close()
  first = records[0]
  assert [r["step"] for r in records] == list(range(1, len(records) + 1))
  assert first["name"] == "logged" and first["policy"] == "test_deciding"
  assert first["pid"] == os.getpid()
  assert set(first["knobs"]) == {k.name for k in session.knobs()}
  assert first["applied"]  # the first step sets the "even" values
  for r in records:
    assert r["reward"] == 0.5 * r["step"]
    assert r["action"] == str(r["step"] % 3)
    assert r["output_rate"] >= 0 and isinstance(r["time"], float)
  del it


class _Obs:
  """The fields of an observation that the decision log reads."""
  time, output_rate, buffered_bytes, cpu_budget = 1.0, 2.0, 3, 2
  knobs = ()


def test_decision_log_is_private_rotated_and_never_follows_a_symlink(
    tmp_path):
  it = iter(_pipeline(policy="test_deciding", name="rotated"))
  next(it)
  session = intune_tf.session_of(it)
  path = tmp_path / "decisions.jsonl"
  log = status.DecisionLog(path, max_bytes=2000)
  try:
    for _ in range(100):
      log(session, _Obs(), {})
  finally:
    log.close()
  assert path.stat().st_mode & 0o777 == 0o600
  rotated = pathlib.Path(f"{path}.1")
  assert rotated.exists()
  # At most one line past the limit in each file, whole lines only.
  line = len(rotated.read_text().splitlines()[0]) + 1
  assert 2000 <= rotated.stat().st_size < 2000 + line
  assert path.stat().st_size < 2000 + line
  steps = [json.loads(l)["step"] for f in (rotated, path)
           for l in f.read_text().splitlines()]
  assert steps == list(range(steps[0], 101))
  target = tmp_path / "elsewhere"
  link = tmp_path / "link.jsonl"
  link.symlink_to(target)
  with pytest.raises(OSError, match="is a symlink"):
    status.DecisionLog(link)
  assert not target.exists()
  del it



@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_decision_log_that_is_not_a_regular_file_is_refused_at_once(
    tmp_path, kind):
  # A FIFO with no reader blocked the tuner's start (and `iter(ds)`) for
  # ever.
  path = tmp_path / "decisions"
  if kind == "fifo":
    os.mkfifo(path)
  else:
    path.mkdir()
  result = []

  def open_log():
    try:
      result.append(status.DecisionLog(path))
    except OSError as e:
      result.append(e)

  thread = threading.Thread(target=open_log, daemon=True)
  thread.start()
  thread.join(30)
  assert result, "DecisionLog blocked"
  assert isinstance(result[0], OSError), result
  assert "is not a regular file" in str(result[0])


def test_a_full_disk_drops_lines_and_warns_once(monkeypatch):
  it = iter(_pipeline(policy="test_deciding", name="full"))
  next(it)
  session = intune_tf.session_of(it)
  warnings = []
  monkeypatch.setattr(status.logging, "warning",
                      lambda *a, **k: warnings.append(a))
  log = status.DecisionLog("/dev/full")  # every write fails with ENOSPC
  try:
    for _ in range(20):
      log(session, _Obs(), {})  # never raises
  finally:
    log.close()
  assert len(warnings) == 1 and "/dev/full" in str(warnings[0])
  del it


_JOB = textwrap.dedent("""
    import signal, sys, time
    # Ctrl-C must raise KeyboardInterrupt even where the job inherits an
    # ignored SIGINT (a background job of a shell without job control).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, {tests!r})
    import test_inspect  # registers the "test_deciding" policy
    it = iter(test_inspect._pipeline(policy="test_deciding", name="job"))
    print("running", flush=True)
    try:
      while True:
        next(it)
    except KeyboardInterrupt:
      signal.signal(signal.SIGINT, signal.SIG_IGN)  # the test presses again
""")


@pytest.mark.slow
@pytest.mark.main_stack_only(covered_by=(
    "test_inspect.py::test_status_file_after_steps",
    "test_inspect.py::test_inspect_prints_the_table_of_a_live_file"))
def test_inspect_cli_against_a_running_job(tmp_path):
  status_dir = tmp_path / "status"
  log_path = tmp_path / "decisions.jsonl"
  script = tmp_path / "job.py"
  script.write_text(_JOB.format(tests=str(pathlib.Path(__file__).parent)))
  env = dict(os.environ, INTUNE_STATUS_DIR=str(status_dir),
             INTUNE_DECISION_LOG=str(log_path))
  job_log = open(tmp_path / "job.log", "wb")
  job = subprocess.Popen([sys.executable, str(script)], env=env,
                         stdout=job_log, stderr=subprocess.STDOUT)
  try:
    status_file = status_dir / status.file_name(job.pid)

    def stepping():
      assert job.poll() is None, "the job died"
      try:
        data = json.loads(status_file.read_text())
      except (OSError, ValueError):
        return False
      return any(s["steps"] >= 3 for s in data["sessions"])
    _wait(stepping, what="the job's status file")
    result = subprocess.run(
        [_INTUNE, "inspect", "--status-dir", str(status_dir), "--pid",
         str(job.pid)], capture_output=True, text=True, timeout=_TIMEOUT_S,
        check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"pid {job.pid}" in result.stdout
    assert "session 1 'job': policy test_deciding" in result.stdout
    assert "ParallelMapV2 " in result.stdout
    assert result.stdout.count("<== bottleneck") == 1
  finally:
    # Plain TF itself sometimes swallows a Ctrl-C that lands inside an
    # eager op's Python cleanup (2 of 20 runs of this pipeline without
    # InTune), so press it again, as a user would, until the job exits.
    def interrupted():
      if job.poll() is not None:
        return True
      job.send_signal(signal.SIGINT)
      try:
        job.wait(5.0)
      except subprocess.TimeoutExpired:
        return False
      return True
    try:
      _wait(interrupted, what="the job to exit on Ctrl-C")
    except AssertionError:
      job.kill()
      job.wait()
      raise
    finally:
      job_log.close()
  # Removed at exit; the decision log has the policy's fields.
  assert not status_file.exists()
  records = [json.loads(l) for l in log_path.read_text().splitlines()]
  assert len(records) >= 3
  assert {"action", "reward", "knobs", "output_rate", "step"} <= set(
      records[-1])


@pytest.mark.slow
def test_inspect_cli_with_nothing_running(tmp_path):
  result = subprocess.run(
      [_INTUNE, "inspect", "--status-dir", str(tmp_path)],
      capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
  assert result.returncode == 1
  assert result.stdout == (f"no running InTune job found (looked in "
                           f"{tmp_path})\n")


def test_inspect_watch_redraws_until_interrupted(tmp_path):
  writer = status.StatusWriter(tmp_path)
  writer(intune_tf.TuningSession(
             3, intune_tf.IntuneOptions(policy="even").to_json()),
         _observation([_stage("Prefetch.ParallelMapV2", 100, 0.009,
                              parallelism=1, time_share=1.0)]), {})
  writer.write_now()

  def interrupt(signum, frame):
    del signum, frame
    raise KeyboardInterrupt

  old = signal.signal(signal.SIGALRM, interrupt)
  signal.setitimer(signal.ITIMER_REAL, 1.2)  # Ctrl-C after 1.2 s
  out = io.StringIO()
  try:
    assert inspect_lib.inspect(tmp_path, watch=0.5, out=out) == 0
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)
    writer.close()
  # Drawn at 0, 0.5 and 1.0 s (the last may miss the 1.2 s interrupt on a
  # loaded machine), each after clearing the screen.
  screens = out.getvalue().split("\x1b[H\x1b[2J")[1:]
  assert 2 <= len(screens) <= 3
  assert all("session 3: policy even, step 1" in s for s in screens)
  assert all("(every 0.5 s, Ctrl-C to stop)" in s for s in screens)
