"""Tests of intune_tf.service scalers, manager and local worker processes."""

import logging
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

from _waiting import wait_until
import numpy as np
import psutil
import pytest

from intune_tf.service import addresses
from intune_tf.service import consumer
from intune_tf.service import controllers
from intune_tf.service import manager as manager_lib
from intune_tf.service import scalers
from intune_tf.service import workers


@pytest.mark.parametrize("text,expected", [
    ("local:1-4", (1, 4)),
    (" local:2-2 ", (2, 2)),
])
def test_parse_local_spec(text, expected):
  assert scalers.parse_pool_spec(text, ("local",))[1:] == expected


@pytest.mark.parametrize("text,message", [
    ("local:4-1", r"MIN \(4\) is above its MAX \(1\)"),
    ("local:-1-3", "MIN must be at least 1"),
    ("local:0-3", "MIN must be at least 1"),
    ("local:1", "must be local:MIN-MAX"),
    ("remote:1-2", "must be local:MIN-MAX"),
    ("local:a-b", "must be local:MIN-MAX"),
])
def test_parse_local_spec_rejects(text, message):
  with pytest.raises(ValueError, match=message):
    scalers.parse_pool_spec(text, ("local",))[1:]


@pytest.mark.parametrize("text,expected", [
    ("local:1-4", ("local", 1, 4)),
    ("command:2-64", ("command", 2, 64)),
    (" command:3-3 ", ("command", 3, 3)),
])
def test_parse_pool_spec(text, expected):
  assert scalers.parse_pool_spec(text) == expected


@pytest.mark.parametrize("text,message", [
    ("command:4-1", "'command:4-1': the pool's MIN (4) is above its MAX (1); "
     "pass local:MIN-MAX or command:MIN-MAX with 1 <= MIN <= MAX."),
    ("command:-1-3", "'command:-1-3': the pool's MIN must be at least 1 "
     "worker, got -1; pass local:MIN-MAX or command:MIN-MAX"),
    ("k8s:1-2", "a worker pool must be local:MIN-MAX or command:MIN-MAX with "
     "1 <= MIN <= MAX (for example local:1-4), got 'k8s:1-2'."),
    ("command:1", "got 'command:1'."),
    ("command:1-2.5", "got 'command:1-2.5'."),
])
def test_parse_pool_spec_rejects(text, message):
  with pytest.raises(ValueError) as raised:
    scalers.parse_pool_spec(text)
  assert message in str(raised.value)


def test_parse_local_spec_refuses_a_command_pool():
  with pytest.raises(ValueError, match=r"must be local:MIN-MAX with 1 <= "
                     r"MIN <= MAX \(for example local:1-4\), got "
                     "'command:1-4'"):
    scalers.parse_pool_spec("command:1-4", ("local",))


def test_check_template():
  command = "kubectl scale deployment/w --replicas={n}"
  assert scalers.check_template(command) == command
  with pytest.raises(ValueError, match=r"must contain \{n\} where the count "
                     r"goes \(for example 'kubectl scale"):
    scalers.check_template("kubectl scale deployment/w --replicas=3")


def test_command_scaler_serving_is_capped_by_what_is_registered():
  registered = [0]
  s = scalers.CommandScaler("true {n}", 1, 8, initial=0,
                            serving=lambda: registered[0])
  s.resize(3)
  assert (s.size(), s.serving()) == (3, 0)
  registered[0] = 2
  assert s.serving() == 2
  registered[0] = 5  # workers the dispatcher has not dropped yet
  assert s.serving() == 3
  assert scalers.CommandScaler("true {n}", 1, 8, initial=2).serving() == 2


def test_command_scaler_runs_the_command_with_the_count(tmp_path):
  out = tmp_path / "replicas"
  s = scalers.CommandScaler(f"echo {{n}} > {out}", 1, 8, initial=2)
  assert s.command(5) == f"echo 5 > {out}"
  s.resize(5)
  assert out.read_text().strip() == "5" and s.size() == 5
  s.resize(5)  # no change: the command does not run again
  out.unlink()
  s.resize(5)
  assert not out.exists()


def test_a_failing_command_gives_one_clear_error_and_the_pool_stays(
    tmp_path):
  s = scalers.CommandScaler("echo replicas={n} >&2; exit 3", 1, 8,
                            initial=2)
  with pytest.raises(scalers.ScalerError,
                     match=r"failed \(exit status 3\): replicas=4; the "
                     "pool stays at 2"):
    s.resize(4)
  assert s.size() == 2


def test_a_hanging_command_times_out_and_is_killed(tmp_path):
  pid_file = tmp_path / "pid"
  s = scalers.CommandScaler(f"echo $$ > {pid_file}; sleep 60; echo {{n}}",
                            1, 8, initial=3, timeout_s=0.5)
  start = time.monotonic()
  with pytest.raises(scalers.ScalerError,
                     match=r"did not finish within 0.5 s and was killed; "
                     "the pool stays at 3"):
    s.resize(6)
  assert time.monotonic() - start < 10
  assert s.size() == 3
  pid = int(pid_file.read_text())
  with pytest.raises(ProcessLookupError):  # the shell and its sleep are gone
    os.kill(pid, 0)


def test_a_command_that_starts_workers_in_the_background_is_done_at_once(
    tmp_path):
  # The background process keeps the command's output open: the command is
  # done when its shell is, and what it started lives on.
  pid_file = tmp_path / "pid"
  s = scalers.CommandScaler(f"sleep 60 & echo $! > {pid_file}; echo {{n}}",
                            1, 8, initial=1, timeout_s=20)
  start = time.monotonic()
  s.resize(2)
  assert time.monotonic() - start < 10 and s.size() == 2
  pid = int(pid_file.read_text())
  try:
    os.kill(pid, 0)  # the background "worker" still runs
  finally:
    os.kill(pid, signal.SIGKILL)


def test_workers_a_command_asked_for_that_never_serve_count_as_failed():
  # The command exits 0 and starts nothing: past the start timeout the
  # pool stops waiting for them, says so, and counts a failure.
  s = scalers.CommandScaler("true {n}", 1, 3, initial=0,
                            serving=lambda: 0, start_timeout_s=0.3)
  manager = manager_lib.PoolManager(
      controllers.make_controller("intune", 1, 3), s)
  s.resize(1)
  assert manager.give_up_unstarted(1.0) == 0  # within its start timeout
  missing = wait_until(lambda: manager.give_up_unstarted(2.0), timeout=10,
                       what="the start timeout")
  assert missing == 1 and s.size() == 0
  report = manager.report()
  assert report["failures"] == 1 and report["size"] == 0
  event = report["decisions"][-1]
  assert (event["before"], event["size"]) == (1, 0)
  assert "did not start serving in time" in event["error"]


@pytest.mark.parametrize("n", [0, -1, 9, 2.5, True])
def test_resize_outside_min_max_raises_and_runs_nothing(tmp_path, n):
  out = tmp_path / "ran"
  s = scalers.CommandScaler(f"echo {{n}} > {out}", 1, 8, initial=2)
  with pytest.raises(ValueError, match="must stay within MIN 1 and MAX 8"):
    s.resize(n)
  assert not out.exists() and s.size() == 2


@pytest.mark.parametrize("kwargs,message", [
    ({"template": "kubectl scale --replicas=3"}, r"must contain \{n\}"),
    ({"timeout_s": 0}, "timeout must be finite seconds above 0"),
    ({"timeout_s": float("nan")}, "timeout must be finite seconds above 0"),
    ({"timeout_s": float("inf")}, "timeout must be finite seconds above 0"),
    ({"min_workers": 3, "max_workers": 2}, "above its MAX"),
    ({"min_workers": -2}, "at least 1"),
])
def test_command_scaler_rejects_bad_setup(kwargs, message):
  args = dict(template="echo {n}", min_workers=1, max_workers=4)
  args.update(kwargs)
  with pytest.raises(ValueError, match=message):
    scalers.CommandScaler(**args)


def test_callback_scaler():
  calls = []
  s = scalers.CallbackScaler(calls.append, 1, 4)
  assert s.size() == 1
  s.resize(3)
  assert calls == [3] and s.size() == 3
  # It cannot tell a worker that died: nothing to replace, nothing called.
  assert s.replace_lost() == [] and calls == [3]
  # numpy integers, as Python's: the callback gets an int.
  numpy_bounds = scalers.CallbackScaler(calls.append, np.int64(1), np.int64(4))
  numpy_bounds.resize(np.int64(2))
  assert calls[-1] == 2 and type(calls[-1]) is int

  def broken(n):
    raise RuntimeError(f"quota exceeded at {n}")
  s = scalers.CallbackScaler(broken, 1, 4, initial=2)
  with pytest.raises(scalers.ScalerError,
                     match="RuntimeError: quota exceeded at 4; the pool "
                     "stays at 2"):
    s.resize(4)
  assert s.size() == 2


def _reading(i, workers, pace, capacity=100.0):
  supply = workers * capacity
  wait = max(0.0, 1 - supply / pace)
  return controllers.PoolReading(time_s=10.0 * i, workers=workers,
                          wait_share=wait, consumer_rate=pace,
                          worker_capacities=(capacity,) * workers)


def test_manager_records_a_failed_resize_and_keeps_the_pool():
  fail = [True]
  calls = []

  def scale(n):
    calls.append(n)
    if fail[0]:
      raise OSError("cluster API unreachable")
  manager = manager_lib.PoolManager(controllers.IntuneController(1, 8),
                                scalers.CallbackScaler(scale, 1, 8,
                                                       initial=2))
  # 2 workers of 100 rows/s, 500 asked: the controller wants 6.
  decision = manager.step(_reading(0, 2, 500.0))
  assert decision.size == 6
  assert manager.scaler.size() == 2 and manager.failures == 1
  event = manager.history[-1]
  assert (event.before, event.size) == (2, 6)
  assert "cluster API unreachable; the pool stays at 2" in event.error
  fail[0] = False
  manager.step(_reading(1, 2, 500.0))
  assert calls == [6, 6] and manager.scaler.size() == 6


def test_manager_reports_the_pool_for_the_status_file():
  manager = manager_lib.PoolManager(
      controllers.IntuneController(1, 8),
      scalers.CallbackScaler(lambda n: None, 1, 8, initial=2))
  assert manager.report() == {
      "kind": "callback", "min": 1, "max": 8, "size": 2, "serving": 2,
      "standby": 0, "lost": 0, "failures": 0, "reason": None, "decisions": []}
  decision = manager.step(_reading(0, 2, 500.0))
  report = manager.report()
  assert (report["size"], report["reason"]) == (6, decision.reason)
  assert report["decisions"] == [{"time_s": 0.0, "before": 2, "size": 6,
                                  "reason": decision.reason, "error": None}]
  # The last REPORTED_DECISIONS only.
  manager.history *= 12
  assert len(manager.report()["decisions"]) == manager_lib.REPORTED_DECISIONS


def test_manager_under_a_flapping_consumer_does_not_flap():
  calls = []
  scaler = scalers.CallbackScaler(calls.append, 1, 64, initial=3)
  manager = manager_lib.PoolManager(controllers.IntuneController(1, 64), scaler)
  for i in range(200):
    manager.step(_reading(i, scaler.size(), 500.0 if i % 2 else 100.0))
  assert len(calls) <= 2, manager.history
  assert 1 <= min(calls) and max(calls) <= 64


def test_manager_logs_each_change_and_a_hold_once_per_wording(caplog):
  scaler = scalers.CallbackScaler(lambda n: None, 1, 8, initial=2)
  manager = manager_lib.PoolManager(controllers.IntuneController(1, 8), scaler)
  reasons = []
  with caplog.at_level(logging.INFO, logger="absl"):
    manager.hold("no consumer report (ConsumerMeter)")
    manager.hold("no consumer report (ConsumerMeter)")
    for i in range(10):  # 500 rows/s asked of 100 per worker, all along
      reasons.append(manager.step(_reading(i, scaler.size(), 500.0)).reason)
  lines = [r.getMessage() for r in caplog.records
           if r.getMessage().startswith("Worker pool")]
  assert lines.pop(0) == ("Worker pool holds at 2: no consumer report "
                          "(ConsumerMeter)")
  # 2 workers give 200 of 500 asked: the wait is 1 - 200/500 = 60%, and
  # ceil(500 x 1.05 / 100) = 6 workers.
  assert lines[0] == ("Worker pool 2 -> 6: trainer waits 60%: 500 rows/s "
                      "asked, 100 per worker (wait 60%, pace 500 rows/s, 2 "
                      "serving)")
  holds = [line for line in lines[1:] if line.startswith("Worker pool holds")]
  assert holds == lines[1:]
  # Every hold wording is logged, each once: the last 6 periods are "calm".
  assert [h.split(": ", 1)[1].split(" (")[0] for h in holds] == list(
      dict.fromkeys(reasons[1:]))
  assert reasons[-6:] == ["calm"] * 6 and len(holds) < len(reasons) - 1
  assert all(h.startswith("Worker pool holds at 6: ") for h in holds)


@pytest.mark.parametrize("reason, wording", [
    ("trainer waits 2%", "trainer waits #%"),
    ("1 -> 2 gave +-0 rows/s of +3 predicted (wait 23.1% -> 25.9%)",
     "# -> # gave +# rows/s of # predicted (wait #% -> #%)"),
    ("calm", "calm"),
])
def test_hold_wording_masks_the_figures(reason, wording):
  assert manager_lib.hold_wording(reason) == wording


@pytest.mark.parametrize("reading, text", [
    (controllers.PoolReading(0.0, 2, wait_share=0.4, consumer_rate=177.0,
                      worker_rates=(100.0, 108.0)),
     "wait 40%, pace 177 rows/s, 2 serving at 104 rows/s"),  # (100+108)/2
    (controllers.PoolReading(0.0, 1, starting=1, consumer_rate=50.4),
     "wait 0%, pace 50 rows/s, 1 serving, 1 starting"),
])
def test_describe_reading(reading, text):
  assert manager_lib.describe_reading(reading) == text


# A stand-in for `intune service worker` (LocalWorkers' `program`): takes
# its flags, waits for a port on stdin with --standby, says it registered
# on --ready-fd (once the file $STAND_IN_GATE exists, when set), then lives
# until its stdin ends or SIGTERM.
_STAND_IN = """
import os, pathlib, sys, time
args = sys.argv[1:]
port = args[args.index("--port") + 1] if "--port" in args else None
if "--standby" in args:
  line = sys.stdin.readline()
  if not line:
    sys.exit(0)
  port = line.split()[0]
gate = os.environ.get("STAND_IN_GATE")
while gate and not pathlib.Path(gate).exists():
  time.sleep(0.02)
with open(int(args[args.index("--ready-fd") + 1]), "w") as ready:
  ready.write(f"registered {port}\\n")
sys.stdin.read()
"""


def _stand_ins(tmp_path, min_workers, max_workers, **kwargs):
  """LocalWorkers whose workers are `_STAND_IN` processes."""
  return workers.LocalWorkers("127.0.0.1:1", min_workers, max_workers,
                              log_dir=str(tmp_path),
                              program=(sys.executable, "-c", _STAND_IN),
                              **kwargs)


def _ports(s):
  """The ports of `s`'s workers, oldest first."""
  return [w.port for w in s.workers]


def test_local_workers_take_a_vacated_port_first_when_it_is_free(tmp_path):
  s = _stand_ins(tmp_path, 1, 4, standby=0)
  with socket.socket() as busy:
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    taken = busy.getsockname()[1]
    free_1, free_2 = addresses.free_port(), addresses.free_port()
    s.vacated = [taken, free_1, free_2]
    assert not addresses.port_is_free(taken)
    try:
      # The busy port is passed over (and dropped), the oldest free one
      # used.
      s.resize(1)
      assert _ports(s) == [free_1] and s.vacated == [free_2]
      s.resize(2)
      assert _ports(s) == [free_1, free_2] and s.vacated == []
      s.resize(3)
      assert _ports(s)[2] not in (taken, free_1, free_2)
      wait_until(lambda: s.serving() == 3, what="the stand-ins to register")
    finally:
      s.close()


def test_local_workers_replace_the_dead_on_their_ports(tmp_path):
  s = _stand_ins(tmp_path, 1, 3, standby=0)
  try:
    s.resize(2)
    assert s.replace_lost() == []
    dead = s.workers[0]
    dead.proc.kill()
    dead.proc.wait()
    assert s.replace_lost() == [dead.port]
    assert s.size() == 2 and s.lost == 1
    assert s.workers[-1].port == dead.port
    s.resize(1)  # a shrink is not undone
    assert s.replace_lost() == [] and s.size() == 1
  finally:
    s.close()


# --- local worker processes (real `intune service` processes on loopback) --

_TIMEOUT_S = 240.0


def _service(*args, log):
  return subprocess.Popen([sys.executable, "-m", "intune_tf", "service",
                           *args], stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture
def dispatcher(tmp_path):
  port = addresses.free_port()
  log = open(tmp_path / "dispatcher.log", "wb")
  proc = _service("dispatcher", "--port", str(port), "--worker-timeout-ms",
                  "2000", log=log)

  def listening():
    assert proc.poll() is None, (tmp_path / "dispatcher.log").read_text()
    with socket.socket() as s:
      return s.connect_ex(("127.0.0.1", port)) == 0
  wait_until(listening, timeout=_TIMEOUT_S, what="the dispatcher")
  yield f"127.0.0.1:{port}"
  proc.send_signal(signal.SIGTERM)
  try:
    proc.wait(30)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()
  log.close()


@pytest.mark.slow
def test_local_workers_start_stop_and_a_dead_one_leaves_the_pool(
    dispatcher, tmp_path, monkeypatch):
  # A user who silenced TensorFlow's INFO lines: the workers still tell
  # when they registered.
  monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
  s = workers.LocalWorkers(dispatcher, 1, 2, log_dir=str(tmp_path),
                           env={"INTUNE_STATUS_DIR": str(tmp_path),
                                "TF_CPP_MIN_LOG_LEVEL": "1"},
                           worker_args=("--heartbeat-interval-ms", "500",
                                        "--dispatcher-wait", "120"))
  try:
    s.resize(2)
    assert s.size() == 2
    wait_until(lambda: s.serving() == 2, timeout=_TIMEOUT_S,
               what="two local workers to register")
    with pytest.raises(ValueError, match="MIN 1 and MAX 2"):
      s.resize(3)
    assert s.size() == 2
    victim = s.workers[0]
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait()
    assert s.size() == 1 and s.lost == 1
    s.resize(1)  # already 1: nothing starts
    assert s.size() == 1
    survivor = s.workers[0].proc
    s.resize(2)
    assert s.size() == 2 and s.workers[0].proc is survivor
    # The replacement serves at the lost worker's address.
    assert s.workers[1].port == victim.port and s.vacated == []
    wait_until(lambda: s.serving() == 2, timeout=_TIMEOUT_S,
               what="the replacement to register at the same address")
  finally:
    s.close()
  assert s.size() == 0
  logs = list(pathlib.Path(tmp_path).glob("worker*.log"))
  assert len(logs) == 3


@pytest.mark.slow
def test_a_standby_worker_joins_on_its_port_and_is_replaced(dispatcher,
                                                           tmp_path):
  s = workers.LocalWorkers(dispatcher, 1, 3, log_dir=str(tmp_path),
                           env={"INTUNE_STATUS_DIR": str(tmp_path)},
                           worker_args=("--heartbeat-interval-ms", "500",
                                        "--dispatcher-wait", "120"),
                           standby=1, standby_delay_s=0.0, pause=False)
  standbys = []
  try:
    s.resize(1)
    assert s.size() == 1 and s.standby_count() == 1
    standby = s.standbys[0]
    standbys.append(standby.proc)
    wait_until(lambda: "Standby worker ready" in standby.log_path.read_text(
        errors="replace"), timeout=_TIMEOUT_S, what="the standby to load")
    wait_until(lambda: s.serving() == 1, timeout=_TIMEOUT_S,
               what="the first worker to register")
    assert not standby.registered()  # warm, but not in the pool
    s.resize(2)
    joined = s.workers[1]
    # The standby took the new worker's port; a new standby replaces it.
    assert joined.proc is standby.proc and joined.port > 0
    assert joined.log_path.name.endswith(f"-{joined.port}.log")
    assert s.standby_count() == 1 and s.standbys[0].proc is not joined.proc
    standbys.append(s.standbys[0].proc)
    wait_until(lambda: s.serving() == 2, timeout=_TIMEOUT_S,
               what="the standby to register")
    assert f"127.0.0.1:{joined.port}" in joined.log_path.read_text(
        errors="replace")
    s.resize(1)  # the newest (the one that was a standby) stops
    assert joined.proc.poll() is not None and s.standby_count() == 1
    assert s.vacated == [joined.port]
  finally:
    s.close()
  assert s.size() == 0 and s.standby_count() == 0
  assert all(p.poll() is not None for p in standbys)


def test_a_pool_at_max_keeps_no_standby_and_a_bad_count_is_refused(
    tmp_path):
  with pytest.raises(ValueError, match="standby must be a count of 0 or "
                     "more processes, got -1"):
    workers.LocalWorkers("127.0.0.1:1", 1, 2, standby=-1)
  numpy_count = workers.LocalWorkers("127.0.0.1:1", np.int64(1), np.int64(2),
                                     standby=np.int64(0), log_dir=tmp_path)
  assert type(numpy_count.standby) is int and numpy_count.max_workers == 2
  numpy_count.close()
  s = _stand_ins(tmp_path, 2, 2)
  try:
    s.resize(2)  # at MAX: a standby would never be taken
    assert s.standby_count() == 0 and s.refill() == 0
  finally:
    s.close()


def _tiers(fail=None):
  """A LocalFirst of a host tier of 1-3 and a remote tier of up to 4
  (callbacks that record each count; `fail` = (tier, n) raises there)."""
  calls = []

  def tier(name):
    def set_count(n):
      if (name, n) == fail:
        raise OSError(f"{name} unreachable")
      calls.append((name, n))
    return set_count
  pool_ = scalers.LocalFirst(
      scalers.CallbackScaler(tier("local"), 1, 3),
      scalers.CallbackScaler(tier("remote"), 1, 4, initial=0))
  return pool_, calls


def test_local_first_splits_by_hand():
  tiers, _ = _tiers()
  # Bounds: MIN the host's (1), MAX 3 + 4 = 7.
  assert (tiers.min_workers, tiers.max_workers) == (1, 7)
  # 5 = the host's 3, then 2 remote; 2 fits on the host: 0 remote.
  assert tiers.split(5) == (3, 2) and tiers.split(2) == (2, 0)
  assert tiers.size() == 1 and tiers.kind == "local-first"


def test_local_first_fills_the_host_first_and_gives_remote_back_first():
  tiers, calls = _tiers()
  tiers.resize(2)
  tiers.resize(5)
  assert calls == [("local", 2), ("local", 3), ("remote", 2)]
  calls.clear()
  tiers.resize(1)  # the remote tier goes to 0, below its own MIN of 1
  assert calls == [("remote", 0), ("local", 1)]
  assert tiers.size() == 1
  with pytest.raises(ValueError, match="MIN 1 and MAX 7"):
    tiers.resize(8)


def test_local_first_puts_the_host_back_when_the_remote_tier_fails():
  tiers, calls = _tiers(fail=("remote", 1))
  tiers.resize(2)
  with pytest.raises(scalers.ScalerError) as failed:
    tiers.resize(4)  # host 2 -> 3, then remote 0 -> 1 fails
  assert str(failed.value) == (
      "the callback tier failed (the scale callback failed for 1 workers: "
      "OSError: remote unreachable; the pool stays at 0.); the pool stays "
      "at 2.")
  assert calls == [("local", 2), ("local", 3), ("local", 2)]
  assert tiers.size() == 2 and tiers.split(tiers.size()) == (2, 0)


def test_local_first_starts_with_the_remote_tier_set_whatever_it_held():
  tiers, calls = _tiers()
  tiers.start(1)  # the remote tier read 0: it is set to 0 all the same
  tiers.start(5)  # 5 = the host's 3, then 2 remote: remote first
  assert calls == [("remote", 0), ("remote", 2), ("local", 3)]
  assert tiers.size() == 5
  with pytest.raises(ValueError, match="MIN 1 and MAX 7"):
    tiers.start(0)
  failing, calls = _tiers(fail=("remote", 0))
  with pytest.raises(scalers.ScalerError) as failed:
    failing.start(2)
  assert str(failed.value) == (
      "the callback tier failed at start (the scale callback failed for 0 "
      "workers: OSError: remote unreachable; the pool stays at 0.); no "
      "local worker was started.")
  assert calls == [] and failing.size() == 1


def test_a_standby_that_died_is_replaced_and_never_handed_a_port(tmp_path):
  # The OOM killer takes the standby: it leaves the count, a new one
  # starts, and a growth never writes its port to a dead one.
  s = _stand_ins(tmp_path, 1, 4, standby=1, standby_delay_s=0.0)
  try:
    s.resize(1)
    first = s.standbys[0].proc
    first.kill()
    first.wait()
    assert s.standby_count() == 0
    assert s.refill() == 1 and s.standbys[0].proc is not first
    second = s.standbys[0].proc
    second.kill()
    second.wait()
    s.resize(2)  # the dead standby is passed over: a cold start
    assert s.workers[1].proc not in (first, second)
    assert s.workers[1].port > 0
    wait_until(lambda: s.serving() == 2, what="the cold start to register")
  finally:
    s.close()


def test_a_shrink_starts_the_replacement_standby_before_its_delay(tmp_path):
  s = _stand_ins(tmp_path, 1, 4, standby=1, standby_delay_s=600.0)
  try:
    s.resize(1)  # a cold worker, then the standby
    assert s.size() == 1 and s.standby_count() == 1
    s.resize(2)  # the standby is taken; its replacement waits 600 s
    assert s.standby_count() == 0 and s.refill() == 0
    s.resize(1)  # the shrink frees CPU: the replacement loads now
    assert s.standby_count() == 1
  finally:
    s.close()


def _stopped(proc) -> bool:
  """Whether `proc` is stopped (SIGSTOP)."""
  return psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED


def test_a_paused_worker_keeps_its_place_and_is_resumed_first(tmp_path):
  s = _stand_ins(tmp_path, 1, 3, standby=0, pause=True)
  try:
    s.resize(2)
    wait_until(lambda: s.serving() == 2, what="the stand-ins to register")
    paused = s.workers[1]
    s.resize(1)
    # Out of the pool, its port not vacated: it keeps its address.
    assert (s.size(), s.serving(), s.vacated) == (1, 1, [])
    wait_until(lambda: _stopped(paused.proc), what="the worker to pause")
    s.resize(3)  # the paused worker first, then a new one
    assert s.workers[1] is paused and paused.proc.poll() is None
    assert len({*_ports(s)}) == 3 and s.serving() >= 2
    wait_until(lambda: not _stopped(paused.proc), what="it to resume")
    procs = [w.proc for w in s.workers]
    s.resize(1)  # two pause; closing ends all three
  finally:
    s.close()
  assert all(proc.poll() is not None for proc in procs)
  assert s.size() == 0 and s.paused == []


# A pool of 2 stand-ins (argv[2]) shrunk to 1 by pausing; prints the pids,
# then lives until it is killed.
_PAUSING_POOL = """
import sys, time
from intune_tf.service import workers
s = workers.LocalWorkers("127.0.0.1:1", 1, 2, log_dir=sys.argv[1], standby=0,
                         program=(sys.executable, "-c", sys.argv[2]))
s.resize(2)
s.resize(1)
print(s.workers[0].proc.pid, s.paused[0].proc.pid, flush=True)
time.sleep(600)
"""


def test_paused_workers_end_with_their_pool_killed_with_sigkill(tmp_path):
  # As the OOM killer ends a dispatcher: nothing closes the pool, and a
  # stopped worker cannot watch its stdin.
  pool = subprocess.Popen([sys.executable, "-c", _PAUSING_POOL, str(tmp_path),
                           _STAND_IN], stdout=subprocess.PIPE, text=True)
  try:
    pids = [int(p) for p in pool.stdout.readline().split()]
    assert len(pids) == 2, pool.wait()
    wait_until(lambda: psutil.Process(pids[1]).status() ==
               psutil.STATUS_STOPPED, what="the second worker to pause")
  finally:
    pool.kill()
    pool.wait()

  def gone(pid):
    try:
      return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
      return True
  for pid in pids:
    wait_until(lambda pid=pid: gone(pid), timeout=30,
               what=f"worker pid {pid} to end with its pool")


# A trainer reading a repeated distributed_epoch dataset from the
# dispatcher argv[1]: one line per batch, the pid of the worker that made it.
_TRAINER = """
import sys, time
import tensorflow as tf

def pid_of_worker(x):
  return x, tf.strings.to_number(tf.strings.split(
      tf.io.read_file("/proc/self/stat"), " ")[0], tf.int64)

ds = tf.data.Dataset.range(10**9).map(pid_of_worker).batch(8).apply(
    tf.data.experimental.service.distribute(
        "distributed_epoch", "grpc://" + sys.argv[1]))
for _, pid in ds:
  print(int(pid[0]), flush=True)
  time.sleep(0.01)
"""


@pytest.mark.slow
def test_a_paused_worker_serves_the_trainer_again_once_resumed(dispatcher,
                                                             tmp_path):
  # Paused, the worker keeps its address and its tasks: the trainer reads
  # from it again once it resumes, and meanwhile the pool's reading leaves
  # it out. How soon it serves: benchmarks/service_rejoin.py.
  s = workers.LocalWorkers(dispatcher, 1, 2, log_dir=str(tmp_path),
                           env={"INTUNE_STATUS_DIR": str(tmp_path)},
                           worker_args=("--heartbeat-interval-ms", "500",
                                        "--dispatcher-wait", "120"),
                           standby=0, pause=True)
  seen = []
  trainer = None

  def read():  # the pid of the worker that made each batch
    for line in trainer.stdout:
      seen.append((time.monotonic(), int(line)))
  reader = threading.Thread(target=read, daemon=True)

  def status_pids():
    return {w["pid"] for w in consumer.worker_status(str(tmp_path),
                                                     dispatcher)}
  try:
    s.resize(2)
    wait_until(lambda: s.serving() == 2, timeout=_TIMEOUT_S,
               what="two local workers to register")
    trainer = subprocess.Popen([sys.executable, "-c", _TRAINER, dispatcher],
                               stdout=subprocess.PIPE, text=True)
    reader.start()
    pids = {w.proc.pid for w in s.workers}
    wait_until(lambda: pids <= {p for _, p in seen} and
               status_pids() == pids, timeout=_TIMEOUT_S,
               what="rows and a status file from both workers")
    paused = s.workers[1]
    s.resize(1)
    wait_until(lambda: status_pids() == {s.workers[0].proc.pid},
               what="the paused worker to leave the workers' status")
    s.resize(2)
    resumed = time.monotonic()
    assert s.workers[1] is paused
    wait_until(lambda: any(t > resumed and p == paused.proc.pid
                           for t, p in seen),
               timeout=_TIMEOUT_S, what="rows from the resumed worker")
    assert status_pids() == pids
  finally:
    if trainer is not None:
      trainer.kill()
      trainer.wait()
    s.close()
