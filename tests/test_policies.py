"""Policies: the pure allocation maths and the baseline policies."""

import gc

from _waiting import wait_for
from absl import logging
import pytest
import tensorflow as tf

import intune_tf
from intune_tf.live import registry
from intune_tf.options import IntuneOptions
from intune_tf.records import Knob
from intune_tf.records import Observation
from intune_tf.records import StageObservation
from intune_tf.tuning import policies


@pytest.mark.parametrize("total,parts,expected", [
    (4, 2, [2, 2]),
    (5, 2, [3, 2]),       # 5 = 2*2 + 1: the remainder goes to the first
    (7, 3, [3, 2, 2]),    # 7 = 3*2 + 1
    (1, 3, [1, 1, 1]),    # fewer CPUs than stages: each still gets 1
    (8, 0, []),
])
def test_even_split(total, parts, expected):
  assert policies.even_split(total, parts) == expected


@pytest.mark.parametrize("ram,bpe,cap,expected", [
    (64e6, 8e6, 16, 8),    # 64 MB / 8 MB = 8 elements
    (64e6, 8e6, 4, 4),     # capped
    (10e6, 8e6, 16, 1),    # 10 / 8 = 1.25 -> 1
    (1e6, 8e6, 16, 1),     # never below 1
    (64e6, 0.0, 16, 1),    # unknown size: safe start
])
def test_buffer_elements(ram, bpe, cap, expected):
  assert policies.buffer_elements(ram, bpe, cap) == expected


@pytest.mark.parametrize("costs,total,maxs,expected", [
    # 1 each, then 2 left: exact 2*3/4 = 1.5, 2*1/4 = 0.5 -> ints 1, 0;
    # the last unit to the larger remainder (tie 0.5/0.5: the first) -> [3, 1].
    ([3, 1], 4, None, [3, 1]),
    # 1 each, 3 left: exact 0.75, 0.75, 1.5 -> ints 0, 0, 1; the 2 left go to
    # the remainders 0.75, 0.75 -> [2, 2, 2].
    ([1, 1, 2], 6, None, [2, 2, 2]),
    ([0, 0], 5, None, [3, 2]),        # no information: even
    ([10, 1], 2, None, [1, 1]),       # never below 1
    # 1 each, 6 left: exact 5.45, 0.55 -> the first is capped at 4 (3 more);
    # the surplus goes to the second in the next round -> [4, 4].
    ([10, 1], 8, [4, 8], [4, 4]),
    ([1, 3], 1, None, [1, 1]),        # fewer CPUs than stages
])
def test_proportional_allocation(costs, total, maxs, expected):
  assert policies.proportional_allocation(costs, total, maxs) == expected


def _obs(knobs, stages=(), cpu_budget=7, ram=20_000_000, output_rate=100.0):
  return Observation(
      time=0, interval_s=1, knobs=tuple(knobs), stages=tuple(stages),
      output_rate=output_rate, output_latency_s=0, consumer_wait_s=0,
      usable_cpus=cpu_budget, cpu_budget=cpu_budget, free_memory=ram,
      total_memory=ram, ram_budget=ram, buffered_bytes=0, cpu_mhz=0,
      dram_gbps=0, model_step_s=None)


def _stage(name, cpu, rate=100.0, bpe=0.0):
  return StageObservation(name=name, rate=rate, cpu_per_element_s=cpu,
                          parallelism=1, buffer_size=None, buffer_fill=0,
                          bytes_per_element=bpe, bytes_produced_per_s=0,
                          buffered_bytes=0, time_share=0)


_KNOBS = [
    Knob("P.Map.Map.Interleave/parallelism", "parallelism", 1, 1,
         2),
    Knob("P.Map.Map/parallelism", "parallelism", 1, 1, 8),
    Knob("P.Map/parallelism", "parallelism", 1, 1, 8),
    Knob("P/buffer_size", "buffer_size", 0, 0, 1e9),
]


def test_even_policy_splits_cpus_and_memory():
  policy = registry.create(IntuneOptions(policy="even"))
  values = policy.step(_obs(_KNOBS, [_stage("P", 0, bpe=4e6)]))
  # 7 CPUs over 3 stages -> 3, 2, 2; the interleave's max is 2.
  assert values["P.Map.Map.Interleave/parallelism"] == 2
  assert values["P.Map.Map/parallelism"] == 2
  assert values["P.Map/parallelism"] == 2
  # One buffer: 20 MB / 4 MB = 5 elements (under the cap of 8).
  assert values["P/buffer_size"] == 5


def test_analytic_policy_follows_measured_costs():
  policy = registry.create(IntuneOptions(policy="analytic"))
  stages = [_stage("P.Map.Map.Interleave", 0.001),
            _stage("P.Map.Map", 0.004),
            _stage("P.Map", 0.002)]
  values = policy.step(_obs(_KNOBS, stages, cpu_budget=8))
  # Costs 1 : 4 : 2 over 8 CPUs: 1 each, 5 left -> 5/7, 20/7, 10/7 =
  # 0.71, 2.86, 1.43 -> ints 0, 2, 1 (3 given), 2 left to the largest
  # remainders 0.86 and 0.71 -> [2, 4, 2].
  assert [values[k.name] for k in _KNOBS[:3]] == [2, 4, 2]


def test_analytic_policy_is_even_until_measured():
  policy = registry.create(IntuneOptions(policy="analytic"))
  values = policy.step(_obs(_KNOBS, [], cpu_budget=4))
  assert [values[k.name] for k in _KNOBS[:3]] == [2, 1, 1]


def test_unoptimized_policy():
  values = registry.create(IntuneOptions(policy="unoptimized")).step(
      _obs(_KNOBS))
  assert set(values.values()) == {1}


def test_fixed_policy_applies_its_config_clamped(monkeypatch):
  warnings = []
  monkeypatch.setattr(logging, "warning", lambda *a, **k: warnings.append(a))
  options = IntuneOptions(policy="fixed", config={
      "P.Map/parallelism": 3,
      "P.Map.Map.Interleave/parallelism": 5,  # max is 2
      "NotHere/parallelism": 1})
  policy = registry.create(options)
  for _ in range(2):
    values = policy.step(_obs(_KNOBS))
    assert values == {"P.Map/parallelism": 3,
                      "P.Map.Map.Interleave/parallelism": 2}
  assert len(warnings) == 1  # once per policy, that is per session
  assert "['NotHere/parallelism'], which match no knob" in (
      warnings[0][0] % warnings[0][1:])


def test_manual_policy_changes_nothing():
  assert registry.create(IntuneOptions(policy="manual")).step(
      _obs(_KNOBS)) == {}


# --- on a live pipeline ------------------------------------------------------

_A = tf.data.AUTOTUNE
# Pipelines whose tuned stages are re-created every epoch (40 elements): the
# names of their map and prefetch stages. Above the repeat, the prefetch that
# TF injects over a pipeline ending in a synchronous stage (inject_prefetch),
# as on plain TF.
_EPOCHS = {
    "repeat": (lambda: tf.data.Dataset.range(40).map(
        lambda x: x + 1, num_parallel_calls=_A).prefetch(_A).repeat(),
               "Prefetch.ForeverRepeat.Prefetch"),
    "take_of_repeat": (lambda: tf.data.Dataset.range(40).map(
        lambda x: x + 1, num_parallel_calls=_A).prefetch(_A).repeat().take(
            10**6), "Prefetch.FiniteTake.ForeverRepeat.Prefetch"),
}


@pytest.mark.parametrize("pipeline", sorted(_EPOCHS))
def test_fixed_config_holds_in_every_epoch(pipeline):
  make, prefetch = _EPOCHS[pipeline]
  config = {f"{prefetch}.ParallelMapV2/parallelism": 1.0,
            f"{prefetch}/buffer_size": 3.0, "Prefetch/buffer_size": 2.0}
  options = tf.data.Options()
  # One tuning step (the first): a static policy steps again only when the
  # pipeline's knob names change, and they do not.
  # Without the cache, under which the map would run in the first epoch
  # only (test_warmstart covers a configuration with the cache).
  options.experimental_intune = IntuneOptions(
      policy="fixed", config=config, period_s=60.0, warm_start=False,
      cache=False)
  it = iter(make().with_options(options))
  next(it)
  session = intune_tf.session_of(it)
  values = lambda: {k.name: k.value for k in session.knobs()}
  assert wait_for(lambda: values() == config), values()
  displays = set()
  for _ in range(3):
    for _ in range(40):
      next(it)
    assert values() == config
    displays.add(tuple(k.display for k in session.knobs()))
  assert len(displays) == 3  # new stages every epoch, at the config
  del it


def test_fixed_config_names_matching_no_knob_are_told_once_with_the_knobs(
    monkeypatch):
  warnings = []
  monkeypatch.setattr(logging, "warning", lambda *a, **k: warnings.append(a))
  options = tf.data.Options()
  # No cache: a cache entry of the same pipeline left by another test of
  # this process would serve the first elements, and the map's knob would
  # be listed only once the map ran.
  options.experimental_intune = IntuneOptions(
      policy="fixed", config={"Nope/parallelism": 2}, period_s=0.02,
      cache=False)
  ds = tf.data.Dataset.range(10**6).map(
      lambda x: x + 1, num_parallel_calls=_A).prefetch(_A)
  it = iter(ds.with_options(options))
  next(it)
  session = intune_tf.session_of(it)
  told = lambda: [w for w in warnings if "Nope/parallelism" in str(w)]
  try:
    for _ in range(5):
      intune_tf.global_tuner().step()
    assert wait_for(told)
    for _ in range(5):
      intune_tf.global_tuner().step()
    assert len(told()) == 1  # once per session
    message = told()[0][0] % told()[0][1:]
    knobs = sorted(k.name for k in session.knobs())
    assert any(k.endswith("/parallelism") for k in knobs)
    assert any(k.endswith("/buffer_size") for k in knobs)
    assert (f"InTune {session!r}: IntuneOptions.config names "
            "['Nope/parallelism'], which match no knob of this pipeline, so "
            'the "fixed" policy does not apply them. The pipeline\'s knobs: '
            f"{knobs}.") in message
  finally:
    del it
    gc.collect()
