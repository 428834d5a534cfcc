"""The tuner loop applies policies and survives failing ones."""

import dataclasses
import gc
import os
import re
import subprocess
import sys
import threading
import time

import _observations as observations
from _waiting import poll_for
from _waiting import wait_for
from _waiting import wait_until
from absl import logging
import pytest
import tensorflow as tf

import intune_tf
from intune_tf import arbiter
from intune_tf import host
from intune_tf import options as options_lib
from intune_tf import records
from intune_tf.live import registry
from intune_tf.live import tuner as tuner_lib
from intune_tf.ops import session as session_lib
from intune_tf.tuning import policies


def _iterate(policy, **fields):
  options = tf.data.Options()
  fields.setdefault("period_s", 0.05)
  options.experimental_intune = intune_tf.IntuneOptions(policy=policy,
                                                        **fields)
  ds = tf.data.Dataset.range(10**6).map(
      lambda x: x + 1,
      num_parallel_calls=tf.data.AUTOTUNE).with_options(options)
  it = iter(ds)
  next(it)
  return it, intune_tf.session_of(it)


@pytest.mark.slow
def test_fixed_policy_is_applied_by_the_background_tuner():
  # Knob names are stable for the same pipeline: learn them on a first run.
  it, session = _iterate("even")
  name = [k.name for k in session.knobs() if k.kind == "parallelism"][0]
  del it
  gc.collect()
  it, session = _iterate("fixed", config={name: 1})
  assert wait_for(lambda: {k.name: k.value for k in session.knobs()}
                   .get(name) == 1)
  del it
  gc.collect()


def test_step_can_be_driven_by_hand():
  it, session = _iterate("even", cpu_budget=1)
  intune_tf.global_tuner().step()
  par = [k for k in session.knobs() if k.kind == "parallelism"][0]
  assert par.value == 1  # 1 CPU over 1 parallel stage
  del it
  gc.collect()


class _CountingStatic(policies.Policy):
  static = True
  steps = 0

  def step(self, obs):
    type(self).steps += 1
    return {k.name: k.min for k in obs.knobs}


def test_a_static_policy_is_stepped_once_while_listeners_see_every_step():
  registry.register("counting-static-test", _CountingStatic)
  seen = []
  tuner = intune_tf.global_tuner()
  def listener(session, obs, applied):
    del obs
    seen.append((session.id, applied))

  tuner.add_listener(listener)  # as the status file always is
  it = None
  try:
    it, session = _iterate("counting-static-test", period_s=1000)
    for _ in range(5):
      tuner.step()
      next(it)
    mine = [applied for sid, applied in seen if sid == session.id]
    assert _CountingStatic.steps == 1
    assert len(mine) >= 5
    assert not any(mine[1:])  # the held steps apply nothing
    assert {k.name: k.value for k in session.knobs()} == {
        k.name: k.min for k in session.knobs()}
  finally:
    tuner.remove_listener(listener)
    registry.unregister("counting-static-test")
    del it
    gc.collect()


class _SlowStatic(policies.Policy):
  """A static policy whose step takes 0.5 s and moves every knob to its
  maximum on odd steps and to its minimum on even ones."""
  static = True
  steps = 0

  def step(self, obs):
    type(self).steps += 1
    time.sleep(0.5)
    return {k.name: k.max if type(self).steps % 2 else k.min
            for k in obs.knobs}


def test_steps_of_one_session_from_two_threads_do_not_interleave():
  # A training loop's step_session and the background thread (or a caller's
  # Tuner.step) can reach one session at once: the step under way stands for
  # the other, which waits for it. Without the lock the second saw the
  # knobs unchanged and held, and its listeners saw that held step before
  # the step that applied.
  registry.register("slow-static-test", _SlowStatic)
  seen = []
  tuner = intune_tf.global_tuner()
  listener = lambda session, obs, applied: seen.append((session.id, applied))
  tuner.add_listener(listener)
  it = None
  try:
    it, session = _iterate("slow-static-test", period_s=1000)
    # The background thread steps a new session at once (step 1: every knob
    # to its maximum), then not for 1000 s.
    assert wait_for(lambda: any(sid == session.id for sid, _ in seen),
                    timeout=30)
    tuned = tuner._tuned[session.id]  # noqa: SLF001
    with tuned.stepping:  # that step is over
      pass
    assert _SlowStatic.steps == 1
    # As if its knobs had changed: the next step steps the policy again.
    tuned.static_knobs = None
    del seen[:]
    threads = [threading.Thread(target=tuner.step_session, args=(session.id,))
               for _ in range(2)]
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join()
    mine = [applied for sid, applied in seen if sid == session.id]
    assert _SlowStatic.steps == 2  # step 2: every knob to its minimum
    assert len(mine) == 1 and mine[0], mine
  finally:
    tuner.remove_listener(listener)
    registry.unregister("slow-static-test")
    del it
    gc.collect()


class _Exploding(policies.Policy):
  calls = 0

  def step(self, obs):
    type(self).calls += 1
    if type(self).calls == 1:
      return {k.name: k.min for k in obs.knobs}
    raise RuntimeError("boom")


def test_failing_policy_keeps_last_good_configuration_and_reports_once(
    monkeypatch):
  registry.register("exploding-test", _Exploding)
  errors = []
  monkeypatch.setattr(logging, "error", lambda *a, **k: errors.append(a))
  it = None
  try:
    it, session = _iterate("exploding-test", period_s=0.02)
    assert wait_for(lambda: _Exploding.calls >= 5)
    par = [k for k in session.knobs() if k.kind == "parallelism"][0]
    session_errors = [e for e in errors if "exploding-test" in str(e)]
    assert len(session_errors) == 1 and "boom" in str(session_errors[0])
    assert par.value == par.min  # the last good configuration stays
    assert int(next(it)) > 0
  finally:
    registry.unregister("exploding-test")
    del it
    gc.collect()


class _BrokenConstructor(policies.Policy):

  def __init__(self, options=None):
    raise RuntimeError("bug in a user's policy")

  def step(self, obs):
    return {}


class _RaisingStep(policies.Policy):

  def step(self, obs):
    raise RuntimeError("bug in a user's policy")


def _returning(garbage):
  """A policy class whose `step` returns `garbage(obs)`."""
  return type("_Garbage", (policies.Policy,),
              {"step": lambda self, obs: garbage(obs)})


class _BrokenHeldBytes(policies.Policy):

  def held_bytes(self):
    raise RuntimeError("bug in a user's policy")

  def step(self, obs):
    return {}


_FAULTY = {
    "constructor": _BrokenConstructor,
    "held_bytes": _BrokenHeldBytes,
    "step": _RaisingStep,
    "none": _returning(lambda obs: None),
    "list": _returning(lambda obs: [1, 2]),
    "string value": _returning(lambda obs: {obs.knobs[0].name: "four"}),
    "nan value": _returning(lambda obs: {obs.knobs[0].name: float("nan")}),
    "above max": _returning(lambda obs: {obs.knobs[0].name: 2.0**70}),
}


@pytest.mark.slow
@pytest.mark.parametrize("fault", sorted(_FAULTY))
def test_a_faulty_policy_stops_only_its_own_session_and_is_reported_once(
    fault, monkeypatch):
  name = f"faulty-{fault.replace(' ', '-')}-test"
  registry.register(name, _FAULTY[fault])
  errors = []
  monkeypatch.setattr(logging, "error", lambda *a, **k: errors.append(a))
  broken = healthy = None
  try:
    broken, broken_session = _iterate(name, period_s=0.02)
    # Learn the healthy pipeline's knob name, then ask for a fixed value.
    healthy, session = _iterate("even")
    knob = [k.name for k in session.knobs() if k.kind == "parallelism"][0]
    del healthy
    gc.collect()
    healthy, session = _iterate("fixed", config={knob: 1}, period_s=0.02)
    for _ in range(20):  # many tuner rounds, besides the background thread's
      intune_tf.global_tuner().step()
    assert wait_for(lambda: {k.name: k.value for k in session.knobs()}
                    .get(knob) == 1)
    def mine():
      return [e for e in errors if f"session {broken_session.id}" in str(e)
              or repr(broken_session) in str(e) or name in str(e)]

    # held_bytes is asked once per budget period (1 s).
    assert wait_for(mine, timeout=5)
    for _ in range(20):
      intune_tf.global_tuner().step()
    time.sleep(1.5)  # a budget period more
    assert len(mine()) == 1, mine()
    assert int(next(broken)) > 0 and broken_session.knobs()
    assert int(next(healthy)) > 0
  finally:
    registry.unregister(name)
    del broken, healthy
    gc.collect()


def test_a_failing_listener_never_reaches_a_driven_training_loop(
    monkeypatch):
  errors = []
  monkeypatch.setattr(logging, "error", lambda *a, **k: errors.append(a))

  def full_disk(session, obs, applied):
    raise OSError(28, "No space left on device")

  tuner = intune_tf.global_tuner()
  it, session = _iterate("even")
  tuner.drive(session.id)
  tuner.add_listener(full_disk)
  try:
    for _ in range(5):
      tuner.step_session(session.id)  # raised OSError into model.fit before
      next(it)
  finally:
    tuner.remove_listener(full_disk)
    tuner.release(session.id)
  mine = [e for e in errors if "No space left" in str(e)]
  assert len(mine) == 1
  del it
  gc.collect()


@pytest.mark.parametrize("available,held,share,expected", [
    (800, [100, 100], 0.5, [250, 250]),  # (800 + 200) * 0.5 / 2
    (900, [], 0.5, []),                  # no session with a default budget
    (0, [0], 0.5, [1]),                  # never below one byte
    (-5, [30, 0, 0], 1.0, [10, 10, 10]),  # (0 + 30) / 3; available clamped
])
def test_default_budget_shares(available, held, share, expected):
  assert tuner_lib.default_budget_shares(available, held, share) == expected


@pytest.mark.parametrize("total,count,expected", [
    (1000, 3, [333, 333, 333]),  # 1000 // 3
    (2, 4, [1, 1, 1, 1]),  # never below one byte
    (5, 0, []),
])
def test_even_split(total, count, expected):
  assert tuner_lib.even_split(total, count) == expected


def _seen(rate, busy, latency, wait):
  """An observation of `rate` rows/s from one stage keeping `busy` CPUs
  busy, `latency` s per element in GetNext and `wait` s between calls."""
  stage = records.StageObservation(
      name="Map", rate=rate, cpu_per_element_s=busy / rate, parallelism=2,
      buffer_size=None, buffer_fill=0.0, bytes_per_element=8.0,
      bytes_produced_per_s=0.0, buffered_bytes=0, time_share=1.0)
  return dataclasses.replace(
      observations.obs([]), stages=(stage,), output_rate=rate,
      output_latency_s=latency, consumer_wait_s=wait)


@pytest.mark.parametrize("seen,buffered,expected", [
    # Two consumer-bound sessions: 100 + 50 rows/s, 0.4 + 0.4 CPUs busy,
    # wanted 1.25 x 0.8 = 1.0.
    ([(100, 0.4, 0.001, 0.002), (50, 0.4, 0.001, 0.003)], 10,
     arbiter.Demand(150.0, 0.8, 1.0, 10)),
    # One of them input-bound (0.004 s in GetNext > 0.002 between calls):
    # any number of CPUs.
    ([(100, 0.4, 0.004, 0.002), (50, 0.4, 0.001, 0.003)], 0,
     arbiter.Demand(150.0, 0.8, None, 0)),
    # Nothing observed yet: any number.
    ([], 5, arbiter.Demand(0.0, 0.0, None, 5)),
])
def test_process_demand(seen, buffered, expected):
  demand = tuner_lib.process_demand([_seen(*s) for s in seen], buffered)
  assert demand.rate == pytest.approx(expected.rate)
  assert demand.busy_cpus == pytest.approx(expected.busy_cpus)
  assert demand.cpus_wanted == pytest.approx(expected.cpus_wanted)
  assert demand.buffered_bytes == expected.buffered_bytes


@pytest.mark.parametrize("budget,policy_bytes,expected", [
    (48 << 20, 16 << 20, 32 << 20),  # 48 - 16 MiB
    (48 << 20, 0, 48 << 20),
    (8, 10, 1),                      # never below one byte
    (8, -3, 8),                      # a negative holding counts as 0
])
def test_buffer_budget(budget, policy_bytes, expected):
  assert tuner_lib.buffer_budget(budget, policy_bytes) == expected


class _Holds16MiB(policies.Policy):
  """Holds 16 MiB (as a replay buffer would) and asks for deep buffers."""

  def held_bytes(self):
    return 16 << 20

  def step(self, obs):
    return {k.name: 40 for k in obs.knobs if k.kind == "buffer_size"}


@pytest.mark.slow
@pytest.mark.parametrize("how", ["option", "set_ram_budget"])
def test_the_memory_a_policy_holds_is_taken_from_the_budget(how):
  mib = 1 << 20
  registry.register("holds-16mib-test", _Holds16MiB)
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(
      policy="holds-16mib-test", period_s=0.02,
      ram_budget=48 * mib if how == "option" else None)
  ds = tf.data.Dataset.range(10**6).map(
      lambda x: tf.fill([mib // 4], tf.cast(x, tf.float32)))  # 1 MiB
  it = iter(ds.prefetch(tf.data.AUTOTUNE).with_options(options))
  try:
    next(it)
    session = intune_tf.session_of(it)
    if how == "set_ram_budget":
      session.set_ram_budget(48 * mib)
    assert wait_for(lambda: session.counters()["ram_budget"] == 32 * mib,
                    timeout=10), session.counters()
    for _ in range(60):  # drains what was buffered under the full budget
      next(it)
    peak = 0
    for _ in range(30):  # the consumer pauses: the buffer fills to its cap
      time.sleep(0.05)
      peak = max(peak, session.counters()["buffered_bytes"])
      next(it)
    # Asked 40 elements; 48 MiB - 16 MiB leaves room for about 30.
    assert 0 < peak <= 32 * mib, peak
    assert [k.value for k in session.knobs() if k.kind == "buffer_size"][0] < 40
  finally:
    registry.unregister("holds-16mib-test")
    del it
    gc.collect()


@pytest.mark.slow
def test_a_session_whose_budget_cannot_be_applied_stops_no_other(
    monkeypatch):
  # A budget write that fails for one session (as a pin of 2**63, no int64,
  # once did for every session from then on, logged once).
  mib = 1 << 20
  registry.register("holds-16mib-test", _Holds16MiB)
  errors = []
  monkeypatch.setattr(logging, "error", lambda *a, **k: errors.append(a))
  write = session_lib.TuningSession._apply_ram_budget  # noqa: SLF001
  broken = good = None
  try:
    # Told apart by their budgets, and broken before the session exists: on a
    # busy machine the tuner's first budget pass can come before the next
    # line of the test.
    def fails_for_broken(session, ram_budget, pin=False):
      if session.options.ram_budget == 64 * mib:
        raise OverflowError("int too large to convert")
      return write(session, ram_budget, pin)

    monkeypatch.setattr(session_lib.TuningSession, "_apply_ram_budget",
                        fails_for_broken)
    broken, broken_session = _iterate("holds-16mib-test", ram_budget=64 * mib)
    good, good_session = _iterate("holds-16mib-test", ram_budget=48 * mib)
    # Only the budget pass writes 48 MiB - 16 MiB held by the policy.
    assert wait_for(
        lambda: good_session.counters()["ram_budget"] == 32 * mib,
        timeout=10), good_session.counters()
    time.sleep(2.5)  # two budget periods more: still told once
    mine = [e for e in errors if repr(broken_session) in str(e)]
    assert len(mine) == 1, errors
    assert mine[0][0].startswith("InTune could not apply the RAM budget of")
    assert "the other sessions' budgets are still applied" in mine[0][0]
    assert int(next(broken)) > 0 and int(next(good)) > 0
  finally:
    registry.unregister("holds-16mib-test")
    del broken, good
    gc.collect()


@pytest.mark.parametrize("held,budget,expected", [
    (4_400_000, 11 << 30, False),   # 4.4 MB of 11 GB: 0.04%
    (6 << 20, 24 << 20, True),      # 6 / 24 = 0.25, the threshold
    (5 << 20, 24 << 20, False),     # 5 / 24 = 0.21
    (25 << 20, 24 << 20, True),     # more than the budget
    (0, 24 << 20, False),           # nothing held
    (1, 0, True),                   # no budget left at all
])
def test_unlowerable_matters(held, budget, expected):
  assert tuner_lib.unlowerable_matters(held, budget) is expected


@pytest.mark.parametrize("budget_mib,warns", [
    (16, True),    # 8 x 1 MiB held: 50% of the budget
    (256, False),  # 3%: only in the counters and `intune inspect`
])
def test_what_the_guard_cannot_lower_is_warned_only_when_it_matters(
    caplog, monkeypatch, budget_mib, warns):
  mib = 1 << 20
  caplog.set_level("INFO", logger="absl")
  # Told once per stage name in a process: what earlier tests in this
  # process were told must not hide it (it failed so in `make test`).
  monkeypatch.setattr(intune_tf.global_tuner(), "_unlowerable_told", set())
  ds = tf.data.Dataset.range(10**6).map(
      lambda x: tf.fill([mib // 4], tf.cast(x, tf.float32)))  # 1 MiB
  # Told once per stage name in a process: a Take makes this one's its own.
  ds = ds.shuffle(8, seed=1).take(10**7).prefetch(1)
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(
      policy="manual", ram_budget=budget_mib * mib, period_s=0.02)
  it = iter(ds.with_options(options))
  try:
    next(it)
    session = intune_tf.session_of(it)
    def held():  # the shuffle's buffer is full (and counted by the guard
      # where the budget leaves it little room)
      intune_tf.global_tuner().step()
      counters = session.counters()
      return counters["buffered_bytes"] >= 7 * mib and (
          not warns or counters["unlowerable_bytes"] >= 7 * mib)

    assert wait_for(held, timeout=30), str(session.counters())
    # While nothing changes, a static policy's session is observed once a
    # second (`_HELD_OBSERVE_S`): a few quick steps can all fall before the
    # observation that sees the full shuffle. Step until the warning where
    # it warns, then past more than one observation, before counting.
    def mine():
      intune_tf.global_tuner().step()
      return _told_of(caplog, session, "cannot lower")

    if warns:
      wait_until(mine, what="the cannot-lower warning")
    mine = poll_for(mine, 1.5 * tuner_lib._HELD_OBSERVE_S)  # noqa: SLF001
    assert len(mine) == (1 if warns else 0), mine
    if warns:
      # Told when first seen at a quarter of the budget or more: from 4 of
      # 16 MiB (25%) if the tuner looks while the shuffle fills (on a busy
      # machine), up to the 8 MiB it holds when full (50%).
      told = re.search(r"stage \S*Shuffle holds ([4-8])\.0 MB that the RAM "
                       r"budget guard cannot lower .*, (\d+)% of the budget "
                       r"\(16 MB\)", mine[0])
      assert told, mine[0]
      assert int(told[2]) == round(int(told[1]) / 16 * 100), mine[0]
  finally:
    del it
    gc.collect()


def _told_of(caplog, session, text: str) -> list[str]:
  return [r.getMessage() for r in caplog.records
          if repr(session) in r.getMessage() and text in r.getMessage()]


def test_a_pipeline_with_no_stage_to_tune_is_told_once_at_info(caplog):
  # `knobs() == []` and nothing said: the option silently did nothing.
  caplog.set_level("INFO", logger="absl")
  ds = tf.data.Dataset.range(1000).map(lambda x: x + 1).batch(4)
  it = iter(intune_tf.tune(ds, policy="even", period_s=0.02))
  try:
    next(it)
    session = intune_tf.session_of(it)
    assert session.knobs() == []

    def told():
      next(it)  # noqa: F821
      intune_tf.global_tuner().step()
      return _told_of(caplog, session, "no stage to tune")

    assert wait_for(told, timeout=30)
    for _ in range(5):
      told()
    (message,) = told()
    assert message == (
        f"InTune {session!r}: the pipeline has no stage to tune (no parallel "
        "map, interleave, batch or prefetch left on tf.data.AUTOTUNE), so "
        "the option does nothing for it. Leave the stages to tune on "
        "AUTOTUNE, or set IntuneOptions(include_fixed=True) to tune fixed "
        "ones.")
    assert [r.levelname for r in caplog.records
            if r.getMessage() == message] == ["INFO"]
  finally:
    del it
    gc.collect()


def test_a_budget_smaller_than_one_element_is_warned_naming_the_stage(
    caplog, monkeypatch):
  # Peak buffered 8 MiB, 8x the budget, with no warning: the floor of one
  # element per buffer was written only in docs/benchmarks.md. Then, in CI,
  # no warning again: the static policy's first step saw the buffer before
  # it held an element, and with no listener its session was never observed
  # again. Here the first 64 elements are small, and no listener is set
  # (once the tuner has started, which sets the status writer).
  caplog.set_level("INFO", logger="absl")
  size = lambda i: tf.where(i < 64, 1, 1 << 20)
  ds = tf.data.Dataset.range(10**6).map(
      lambda i: tf.fill([size(i)], tf.cast(i, tf.float32)),  # then 4 MiB
      num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
  it = iter(intune_tf.tune(ds, ram_budget=1 << 20, policy="manual",
                           period_s=0.02))
  try:
    next(it)
    session = intune_tf.session_of(it)
    monkeypatch.setattr(intune_tf.global_tuner(), "_listeners", [])
    intune_tf.global_tuner().step()  # its first step: small elements
    assert not _told_of(caplog, session, "one element of stage")
    for _ in range(64):
      next(it)

    def told():
      next(it)  # noqa: F821
      intune_tf.global_tuner().step()
      return _told_of(caplog, session, "one element of stage Prefetch ")

    assert wait_for(told, timeout=30), caplog.text
    for _ in range(5):
      told()
    (message,) = told()
    # Its size is of the element buffered, else the mean of those produced:
    # above the budget, at most 4 MiB.
    held = re.fullmatch(
        re.escape(f"InTune {session!r}: one element of stage Prefetch holds ")
        + r"(\d+) bytes \((\d+\.\d) MB\)" + re.escape(
            ", more than the RAM budget of 1048576 bytes (1.0 MB). A buffer "
            "keeps at least one element, so the pipeline holds more than the "
            "budget. Give it a ram_budget of at least a few elements, or "
            "make the elements smaller. Reported once per stage."), message)
    assert held, message
    assert 1 << 20 < int(held[1]) <= 1 << 22
    assert held[2] == f"{int(held[1]) / (1 << 20):.1f}"
    every = _told_of(caplog, session, "one element of stage")
    assert len(every) == len(set(every)) <= 2  # once per stage
  finally:
    del it
    gc.collect()


def test_a_bounded_interleave_is_not_warned_as_what_the_guard_cannot_lower(
    caplog, monkeypatch):
  # Its records have no knob, but the guard lowers them through per-input
  # limits: `make test` warned that the interleave "holds 24.8 MB that the
  # RAM budget guard cannot lower". The shuffle above it is truly fixed.
  mib, record = 1 << 20, 256 * 1024
  caplog.set_level("INFO", logger="absl")
  serialized = lambda i: tf.io.serialize_tensor(
      tf.fill([record // 4], tf.cast(i, tf.float32)))
  ds = tf.data.Dataset.range(8).interleave(
      lambda i: tf.data.Dataset.range(10**6).map(serialized),
      cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.shuffle(32, seed=1).batch(2).prefetch(tf.data.AUTOTUNE)
  # Told once per stage name in a process: start with nothing told.
  monkeypatch.setattr(intune_tf.global_tuner(), "_unlowerable_told", set())
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(
      policy="manual", ram_budget=24 * mib, interleave_buffer=256,
      period_s=0.02)
  seen = []  # the tuner's own observations of this session
  listener = lambda session, obs, applied: seen.append((session, obs))
  intune_tf.global_tuner().add_listener(listener)
  it = iter(ds.with_options(options))
  try:
    next(it)
    session = intune_tf.session_of(it)
    interleave = "Prefetch.BatchV2.Shuffle.ParallelInterleaveV4"
    shuffle = "Prefetch.BatchV2.Shuffle"

    def both_hold():
      # 32 x 256 KB in the shuffle; in the interleave (whose workers read
      # ahead) a quarter of the budget, which was warned about as if it
      # could not be lowered.
      intune_tf.global_tuner().step()
      return any(s.id == session.id and
                 o.stage(shuffle).buffered_bytes >= 7 * mib and
                 o.stage(interleave).buffered_bytes >= 6 * mib
                 for s, o in seen)

    assert wait_for(both_hold, timeout=30), str(session.counters())
    obs = next(o for s, o in reversed(seen) if s.id == session.id and
               o.stage(interleave).buffered_bytes >= 6 * mib)
    told = [r.getMessage() for r in caplog.records
            if "cannot lower" in r.getMessage() and
            repr(session) in r.getMessage()]
    assert len(told) == 1, told
    assert f"stage {shuffle} holds" in told[0], told[0]
    assert obs.stage(interleave).parallelism is None  # no knob of its own
    assert interleave not in obs.unlowerable_bytes
    assert obs.unlowerable_bytes[shuffle] >= 7 * mib  # 8 MB of 24: counted
    assert obs.bounded_stages == (interleave,)
  finally:
    intune_tf.global_tuner().remove_listener(listener)
    del it
    gc.collect()


def test_iterators_with_the_default_budget_share_it_and_a_set_one_stays():
  it_a, a = _iterate("even")
  it_b, b = _iterate("even")
  it_c, pinned = _iterate("even")
  pinned.set_ram_budget(123 << 20)

  def budgets():
    intune_tf.global_tuner().step()
    return [s.counters()["ram_budget"] for s in (a, b)]

  def shared():
    first, second = budgets()
    # Every live session with the default budget (a and b, and any other
    # iterator still alive in this process) takes an even share.
    default = [s for s in intune_tf.sessions()
               if s.options.ram_budget is None and s.pinned_ram_budget is None]
    held = [s.counters()["buffered_bytes"] for s in default]
    each = tuner_lib.default_budget_shares(host.available_memory(), held,
                                           options_lib.DEFAULT_RAM_SHARE)[0]
    # 5% tolerance: the host's memory moves between readings.
    return len(default) >= 2 and all(abs(v - each) <= 0.05 * each
                                     for v in (first, second))

  assert wait_for(shared, timeout=10), budgets()
  assert pinned.counters()["ram_budget"] == 123 << 20
  del it_a, it_b, it_c
  gc.collect()


class _BindsThenSteps(policies.Policy):
  """Records bind and step calls; bind fails when the name says so."""
  calls: list = []

  def bind(self, session):
    type(self).calls.append(("bind", session.id))
    if self.options.name == "failing-bind":
      raise RuntimeError("bind failed")

  def step(self, obs):
    type(self).calls.append(("step", None))
    return {}


@pytest.mark.parametrize("name", ["bind", "failing-bind"])
def test_bind_is_called_once_with_the_session_before_the_first_step(
    name, monkeypatch):
  registry.register("binds-test", _BindsThenSteps)
  warnings = []
  monkeypatch.setattr(logging, "warning", lambda *a, **k: warnings.append(a))
  _BindsThenSteps.calls = []
  it = None
  try:
    it, session = _iterate("binds-test", name=name)
    for _ in range(3):
      intune_tf.global_tuner().step()
    calls = list(_BindsThenSteps.calls)
    assert calls[0] == ("bind", session.id)
    assert calls.count(("bind", session.id)) == 1
    assert ("step", None) in calls  # a failing bind does not stop tuning
    failed = [w for w in warnings if "bind" in str(w) and "failed" in str(w)]
    assert len(failed) == (1 if name == "failing-bind" else 0)
  finally:
    registry.unregister("binds-test")
    del it
    gc.collect()


class _RemembersAVanishedKnob(policies.Policy):

  def step(self, obs):
    values = {k.name: k.min for k in obs.knobs}
    values["Gone/parallelism"] = 2.0  # a knob no longer in the session
    return values


def test_values_for_vanished_knobs_are_dropped_and_the_rest_applied():
  registry.register("vanished-knob-test", _RemembersAVanishedKnob)
  it = None
  try:
    it, session = _iterate("vanished-knob-test", cpu_budget=2)
    applied = []
    tuner = intune_tf.global_tuner()
    listener = lambda s, obs, changes: applied.append(changes)
    tuner.add_listener(listener)
    try:
      # A step the tuner's own thread was taking stands for this one, and
      # may have called the listeners before they were added: step again.
      for _ in range(5):
        tuner.step_session(session.id)  # raised KeyError before
        if applied:
          break
    finally:
      tuner.remove_listener(listener)
    par = [k for k in session.knobs() if k.kind == "parallelism"][0]
    assert par.value == par.min
    assert applied and all("Gone/parallelism" not in c
                           for c in applied)
  finally:
    registry.unregister("vanished-knob-test")
    del it
    gc.collect()


def test_listeners_see_every_step():
  seen = []
  listener = lambda session, obs, applied: seen.append((session.id, obs))
  tuner = intune_tf.global_tuner()
  tuner.add_listener(listener)
  try:
    it, session = _iterate("even")
    for _ in range(1000):
      next(it)
    tuner.step()
  finally:
    tuner.remove_listener(listener)
  mine = [obs for sid, obs in seen if sid == session.id]
  assert mine and mine[-1].knobs and mine[-1].usable_cpus >= 1
  del it
  gc.collect()


_EXIT_JOB = """
import atexit, threading

def report():  # registered first, so it runs after intune_tf's handlers
  alive = sorted(t.name for t in threading.enumerate()
                 if t.name.startswith("intune") and t.is_alive())
  print("alive at exit:", alive, flush=True)

atexit.register(report)
import tensorflow as tf
import intune_tf

options = tf.data.Options()
options.experimental_intune = intune_tf.IntuneOptions(period_s=0.02)
ds = tf.data.Dataset.range(10**9).map(
    lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
        tf.data.AUTOTUNE).with_options(options)
it = iter(ds)
while intune_tf.global_tuner().policy(intune_tf.session_of(it).id) is None:
  next(it)
for _ in range(2000):
  next(it)
print("exiting", flush=True)
"""


@pytest.mark.slow
def test_tuner_and_status_threads_are_stopped_before_exit(tmp_path):
  # A daemon thread caught inside an op call at interpreter finalization can
  # abort or hang the process; intune_tf stops its threads at exit.
  script = tmp_path / "job.py"
  script.write_text(_EXIT_JOB)
  result = subprocess.run([sys.executable, str(script)], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path,
                          env=dict(os.environ,
                                   INTUNE_STATUS_DIR=str(tmp_path / "st")))
  assert result.returncode == 0, result.stdout + result.stderr[-2000:]
  assert "exiting\nalive at exit: []\n" in result.stdout


_TF1_JOB = """
import tensorflow as tf
import intune_tf

tf.compat.v1.disable_eager_execution()
options = tf.data.Options()
options.experimental_intune = intune_tf.IntuneOptions(period_s=0.02)
ds = tf.data.Dataset.range(10**9).map(
    lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE).with_options(options)
nxt = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
with tf.compat.v1.Session() as sess:
  print("first", [int(sess.run(nxt)) for _ in range(3)])
  (session,) = intune_tf.sessions()
  tuner = intune_tf.global_tuner()
  while tuner.policy(session.id) is None:
    sess.run(nxt)
  before = session.counters()["elements"]
  for _ in range(3000):
    sess.run(nxt)
  print("tuned", session.counters()["elements"] - before >= 3000, flush=True)
"""


@pytest.mark.slow
def test_a_tf1_style_program_is_tuned(tmp_path):
  # With eager execution off process-wide, the control ops and the policies'
  # networks would only build graphs: the tuner failed on every step.
  script = tmp_path / "tf1.py"
  script.write_text(_TF1_JOB)
  result = subprocess.run([sys.executable, str(script)], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
  assert result.returncode == 0, result.stdout + result.stderr[-2000:]
  assert "first [0, 2, 4]\ntuned True\n" in result.stdout
  for failure in ("tuner step failed", "cannot be tuned"):
    assert failure not in result.stderr, result.stderr[-2000:]


def _stats(name: str, ns: int, elements: int = 100, inputs=()):
  return records.StageStats(name=name, elements=elements,
                            processing_time_ns=ns, buffered_bytes=0,
                            buffered_elements=0, bytes_produced=0,
                            bytes_consumed=0, parameters={},
                            inputs=tuple(inputs))


_BATCH = "Prefetch.ParallelMapV2.ParallelMapV2.ParallelBatch"
# Processing times 10 + 60 + 20 + 5 + 5 = 100 ns: the upper map (features)
# takes 60 / 100 = 0.6, the lower one (parse) 20 / 100 = 0.2.
_CHAIN_STATS = [
    _stats("Prefetch", 10, inputs=["Prefetch.ParallelMapV2"]),
    _stats("Prefetch.ParallelMapV2", 60,
           inputs=["Prefetch.ParallelMapV2.ParallelMapV2"]),
    _stats("Prefetch.ParallelMapV2.ParallelMapV2", 20, inputs=[_BATCH]),
    _stats(_BATCH, 5, inputs=[_BATCH + ".Shuffle"]),
    _stats(_BATCH + ".Shuffle", 5),
]
_REFUSED = ("above it: S (ShuffleDatasetV3) reshuffles each epoch; the map "
            "{map} (ParallelMapDatasetV2) after shuffle S and batch B is not "
            "row-wise{below}: {why}")


@pytest.mark.parametrize("below,why,expected", [
    # The first map above the batch is refused: the parse, 0.2.
    ("", "where (Where) in f keeps a number of rows that depends on their "
     "values (a mask)", ("Prefetch.ParallelMapV2.ParallelMapV2", 0.2)),
    # One row-wise map below it: the next map up, the features, 0.6.
    (" (M1 below it is)", "Max (Max) in g reduces over the batch axis",
     ("Prefetch.ParallelMapV2", 0.6)),
    # Random: no move of the map makes its output the same every epoch.
    (" (M1 below it is)", "n (RandomStandardNormal) in g is random", None),
    # Two row-wise maps below, but only two maps: none is found.
    (" (M1, M2 below it is)", "x (Max) in g reduces over the batch axis",
     None),
])
def test_refused_map_share_finds_the_refused_map_above_the_batch(
    below, why, expected):
  reason = _REFUSED.format(map="M", below=below, why=why)
  found = tuner_lib.refused_map_share(reason, _CHAIN_STATS)
  if expected is None:
    assert found is None
  else:
    assert found == (expected[0], why, pytest.approx(expected[1]))


def test_refused_map_share_waits_for_elements_and_needs_a_refusal():
  reason = _REFUSED.format(map="M", below="", why="w (Where) in f masks")
  few = [dataclasses.replace(s, elements=3) for s in _CHAIN_STATS]
  assert tuner_lib.refused_map_share(reason, few) is None
  placed = ("above it: S reshuffles each epoch; the map after shuffle S and "
            "batch B is row-wise (M): a candidate for a row store")
  assert tuner_lib.refused_map_share(placed, _CHAIN_STATS) is None


def test_an_expensive_refused_map_above_a_shuffle_is_told_once_with_its_op(
    caplog):
  caplog.set_level("INFO", logger="absl")

  def heavy_then_sum(x):
    # Row-wise work (a sine over 4,000 values per row), then a sum over the
    # batch axis, which the proof refuses.
    wide = tf.expand_dims(tf.cast(x, tf.float32), 1) * tf.constant(
        [[0.5] * 4000])
    return tf.reduce_sum(tf.math.sin(wide) * 2.0, axis=0)

  ds = intune_tf.tune(
      tf.data.Dataset.range(4_000).map(lambda x: x * 3).shuffle(64, seed=1)
      .batch(16).map(heavy_then_sum, num_parallel_calls=tf.data.AUTOTUNE)
      .prefetch(2), policy="even", period_s=0.02)
  # Epoch 1 fills the cache (below the shuffle) and is not told: the map
  # is told in an epoch the cache serves, where it runs again.
  first = iter(ds)
  next(first)
  for _ in first:
    intune_tf.global_tuner().step()
  assert not _told_of(caplog, intune_tf.session_of(first),
                      "of the pipeline's CPU")
  del first
  it = iter(ds)
  try:
    next(it)
    session = intune_tf.session_of(it)

    def told():
      for _ in range(5):
        next(it)  # noqa: F821
      intune_tf.global_tuner().step()
      return _told_of(caplog, session, "of the pipeline's CPU")

    assert wait_for(told, timeout=60), caplog.text
    for _ in range(3):
      told()
    (message,) = told()
    assert "the map Prefetch.ParallelMapV2 takes " in message, message
    assert "(Sum) " in message and "reduces over the batch axis" in message
    share = int(re.search(r"takes (\d+)% of", message).group(1))
    assert 10 <= share <= 100, message
  finally:
    del it
    gc.collect()
