"""The `TuningEnv` contract and the one policy step, on the simulator and on a
live session by the same script."""

from __future__ import annotations

import re
from typing import Callable

import _observations as observations
import numpy as np
import pytest
import tensorflow as tf

import intune_tf
from intune_tf import records
from intune_tf.live import observation
from intune_tf.options import IntuneOptions
from intune_tf.sim import simulator as sim_lib
from intune_tf.tuning import env as env_lib
from intune_tf.tuning import policies
from intune_tf.tuning import search


def _knob(name: str, value: float) -> records.Knob:
  return observations.knob(name, "parallelism", value, hi=8)


def _obs(*knobs: records.Knob) -> records.Observation:
  return observations.obs(list(knobs), cpu_budget=8)


def test_changes_keeps_only_known_knobs_that_move():
  knobs = [_knob("a/parallelism", 2), _knob("b/parallelism", 3)]
  # a moves (2 -> 4), b stays (3 == 3), c is no knob.
  wanted = {"a/parallelism": 4, "b/parallelism": 3, "c/parallelism": 1}
  assert env_lib.changes(knobs, wanted) == {"a/parallelism": 4}
  assert env_lib.changes(knobs, {}) == {}


def test_changes_leaves_idle_knobs_alone():
  idle = records.Knob("c/parallelism", "parallelism", 2, 1, 8, idle=True)
  knobs = [_knob("a/parallelism", 2), idle]
  # a moves (2 -> 3); c would (2 -> 5) but its stage does not run.
  wanted = {"a/parallelism": 3, "c/parallelism": 5}
  assert env_lib.changes(knobs, wanted) == {"a/parallelism": 3}


def test_step_in_force_and_changed():
  obs = _obs(_knob("a/parallelism", 2), _knob("b/parallelism", 3))
  moved = env_lib.Step(obs, {"a/parallelism": 5}, {"a/parallelism": 4.0})
  # The environment applied 4 of the 5 asked: 4 is in force, and a moved.
  assert moved.in_force == {"a/parallelism": 4.0, "b/parallelism": 3}
  assert moved.changed
  # Applied at the value in force (the budget kept a buffer where it was).
  assert not env_lib.Step(obs, {"a/parallelism": 9},
                          {"a/parallelism": 2.0}).changed


class _Env:
  """A `TuningEnv` of two knobs that counts its calls to `set`."""

  def __init__(self):
    self.values = {"a/parallelism": 2.0, "b/parallelism": 3.0}
    self.sets = 0

  def knobs(self) -> list[records.Knob]:
    return [_knob(n, v) for n, v in self.values.items()]

  def observe(self) -> records.Observation:
    return _obs(*self.knobs())

  def set(self, values):
    self.sets += 1
    self.values.update(values)
    return dict(values)


class _Returns(policies.Policy):

  def __init__(self, result):
    super().__init__(IntuneOptions())
    self.result = result

  def step(self, obs):
    if isinstance(self.result, Exception):
      raise self.result
    return self.result


@pytest.mark.parametrize("result,message", [
    (RuntimeError("injected"),
     r"_Returns.step failed: RuntimeError\('injected'"),
    ([("a/parallelism", 1)], "not a mapping of knob names to values"),
])
def test_a_failing_policy_leaves_the_environment_alone(result, message):
  env = _Env()
  with pytest.raises(env_lib.PolicyError, match=message) as raised:
    env_lib.policy_step(env, _Returns(result))
  assert env.sets == 0 and env.values["a/parallelism"] == 2.0
  if isinstance(result, Exception):
    assert raised.value.__cause__ is result


def test_a_step_sets_only_what_moves():
  env = _Env()
  step = env_lib.policy_step(
      env, _Returns({"a/parallelism": 2, "b/parallelism": 6, "gone/x": 1}))
  assert step.applied == {"b/parallelism": 6} and env.sets == 1
  assert step.changed and step.in_force["b/parallelism"] == 6
  # Nothing moves: `set` is not called at all.
  assert not env_lib.policy_step(env, _Returns({"b/parallelism": 6})).changed
  assert env.sets == 1


# --- one script, both implementations ---------------------------------------


def _drive(env: env_lib.TuningEnv, advance: Callable[[], None],
           steps: int = 8) -> None:
  """Steps a shipped search on `env`, checking the contract at each step,
  then the contract's refusals."""
  policy = search.ClimbPolicy(IntuneOptions())
  for _ in range(steps):
    before = {k.name: k for k in env.knobs()}
    step = env_lib.policy_step(env, policy)
    assert [k.name for k in step.observation.knobs] == list(before)
    assert set(step.applied) <= set(before)
    after = {k.name: k.value for k in env.knobs()}
    for name, value in step.applied.items():
      assert before[name].min <= value <= before[name].max
      assert after[name] == value
    assert step.in_force == after
    advance()

  knobs = env.knobs()
  values = {k.name: k.value for k in knobs}
  par = next(k for k in knobs if k.kind == "parallelism")
  other = par.min if par.value != par.min else par.min + 1
  refused = [
      ({par.name: other, "nope/parallelism": 1}, KeyError, "nope/parallelism"),
      ({par.name: par.max + 1}, ValueError, re.escape(par.name)),
      ({par.name: float("nan")}, ValueError, "finite"),
  ]
  for values_asked, error, message in refused:
    with pytest.raises(error, match=message):
      env.set(values_asked)
    # All or none: the valid value beside the bad one was not applied.
    assert {k.name: k.value for k in env.knobs()} == values
  assert env.set({par.name: other}) == {par.name: other}
  assert next(k.value for k in env.knobs() if k.name == par.name) == other


def test_the_simulator_is_a_tuning_env():
  pipeline = sim_lib.random_pipeline(np.random.default_rng(3))
  sim = sim_lib.Simulator(pipeline, seed=3)
  _drive(sim, sim.advance)


@pytest.mark.slow
def test_a_live_session_is_a_tuning_env():
  options = tf.data.Options()
  # "manual": the tuner's own thread leaves the knobs alone.
  options.experimental_intune = intune_tf.IntuneOptions(policy="manual")
  ds = tf.data.Dataset.range(10**9).map(
      lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE).map(
          lambda x: x + 1, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
              tf.data.AUTOTUNE).with_options(options)
  iterator = iter(ds)
  next(iterator)
  env = observation.LiveEnv(intune_tf.session_of(iterator))

  def advance():
    for _ in range(500):
      next(iterator)

  _drive(env, advance)
