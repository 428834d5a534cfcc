"""The tuner loop applies policies and survives failing ones."""

import gc
import time

from absl import logging
import pytest
import tensorflow as tf

import intune_tf
from intune_tf import policies


def _iterate(policy, **fields):
  options = tf.data.Options()
  fields.setdefault("period_s", 0.05)
  options.experimental_intune = intune_tf.IntuneOptions(policy=policy,
                                                        **fields)
  ds = tf.data.Dataset.range(10**6).map(
      lambda x: x + 1, num_parallel_calls=tf.data.AUTOTUNE).with_options(options)
  it = iter(ds)
  next(it)
  return it, intune_tf.sessions()[-1]


def _wait_for(predicate, timeout=10.0):
  end = time.monotonic() + timeout
  while time.monotonic() < end:
    if predicate():
      return True
    time.sleep(0.02)
  return False


def test_fixed_policy_is_applied_by_the_background_tuner():
  # Knob names are stable for the same pipeline: learn them on a first run.
  it, session = _iterate("even")
  name = [k.name for k in session.knobs() if k.kind == "parallelism"][0]
  del it
  gc.collect()
  it, session = _iterate("fixed", config={name: 1})
  assert _wait_for(lambda: {k.name: k.value for k in session.knobs()}
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


class _Exploding(policies.Policy):
  calls = 0

  def step(self, obs):
    type(self).calls += 1
    if type(self).calls == 1:
      return {k.name: k.min for k in obs.knobs}
    raise RuntimeError("boom")


def test_failing_policy_keeps_last_good_configuration_and_reports_once(
    monkeypatch):
  policies.register("exploding-test", _Exploding)
  errors = []
  monkeypatch.setattr(logging, "error", lambda *a, **k: errors.append(a))
  it = None
  try:
    it, session = _iterate("exploding-test", period_s=0.02)
    assert _wait_for(lambda: _Exploding.calls >= 5)
    par = [k for k in session.knobs() if k.kind == "parallelism"][0]
    session_errors = [e for e in errors if "exploding-test" in str(e)]
    assert len(session_errors) == 1 and "boom" in str(session_errors[0])
    assert par.value == par.min  # the last good configuration stays
    assert int(next(it)) > 0
  finally:
    del policies._REGISTRY["exploding-test"]
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
