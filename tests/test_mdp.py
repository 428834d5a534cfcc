"""Tests of intune_tf.tuning.mdp: reward, action mask, actions, features."""

import dataclasses

from _observations import knob as _knob
from _observations import obs as _obs
import numpy as np
import pytest

from intune_tf.tuning import mdp


def _column(name: str) -> int:
  return mdp.FEATURE_NAMES.index(name)


def test_feature_names_name_every_column_once():
  assert len(mdp.FEATURE_NAMES) == mdp.NUM_FEATURES == 18
  assert len(set(mdp.FEATURE_NAMES)) == mdp.NUM_FEATURES
  knobs = [_knob("A/parallelism", "parallelism", 2)]
  assert mdp.features(_obs(knobs)).shape == (1, len(mdp.FEATURE_NAMES))


@pytest.mark.parametrize("rate,reference,memory,expected", [
    (50, 100, 0.5, 0.5),        # 50/100 * 1
    (50, 100, 0.95, 0.25),      # 0.5 * (1 - 0.95) / 0.1
    (50, 100, 1.2, 0.0),        # memory over 100%: nothing
    (300, 100, 0.0, 2.0),       # 3.0 capped at 2
    (10, 0, 0.0, 0.0),          # no reference yet
])
def test_reward_by_hand(rate, reference, memory, expected):
  assert mdp.reward(rate, reference, memory) == pytest.approx(expected)



def test_action_mask_at_budget_edges():
  knobs = [_knob("A/parallelism", "parallelism", 4),
           _knob("B/parallelism", "parallelism", 4),
           _knob("C/parallelism", "parallelism", 3),
           _knob("D/parallelism", "parallelism", 3),
           _knob("P/buffer_size", "buffer_size", 2, lo=0, hi=100)]
  # 4 CPUs: each stage at most 4 threads, all at most 2 * (4 + 4 - 1) = 14,
  # 14 in use. RAM: 2 x 10 MB of 40 MB.
  mask = mdp.action_mask(_obs(knobs, cpu_budget=4))
  expected = {
      # A, B: 4 -> -1 below min; 3 ok; 5 > 4 CPUs; 9 no.
      "A": [False, True, False, False],
      "B": [False, True, False, False],
      # C, D: 3 -> -2 no; 2 ok; 4 fits 4 CPUs but makes 15 > 14 threads; 8 no.
      "C": [False, True, False, False],
      "D": [False, True, False, False],
      # P: 2 -> -3 no, 1 ok, 3 (30 MB) ok, 7 (70 MB > 40 MB) no.
      "P": [False, True, True, False],
  }
  assert mask.tolist() == (expected["A"] + expected["B"] + expected["C"] +
                           expected["D"] + expected["P"] + [True])
  # One thread fewer in use (C at 2): C may grow to 3 (14 threads). 4
  # stages at 2 threads would hold 8 > 4 CPUs, so thread_floor(4, 4) = 1,
  # but C at 1 thread would be busy 0.01 x 100 / 1 = 1 > LONE_BUSY: it may
  # not shrink; at a cost of 0.004 (0.4) it may.
  knobs[2] = _knob("C/parallelism", "parallelism", 2)
  mask = mdp.action_mask(_obs(knobs, cpu_budget=4))
  assert mask[8:12].tolist() == [False, False, True, False]
  mask = mdp.action_mask(_obs(knobs, cpu_budget=4, costs={"C": 0.004}))
  assert mask[8:12].tolist() == [False, True, True, False]


@pytest.mark.parametrize("cpus,value,expected", [
    # 1 CPU: floor min(1, 2) = 1; 2 -> 1 ok, 3 > 1 CPU no.
    (1, 2, [False, True, False, False]),
    # 4 CPUs: floor 2; 2 -> 1 no, 3 ok; 7 > 4 CPUs no.
    (4, 2, [False, False, True, False]),
    # A stage below the floor (set by someone else) may grow, not shrink.
    (4, 1, [False, False, True, False]),
    # 8 CPUs: 3 -> 2 ok (the floor), 8 ok (2 * (8 + 1 - 1) = 16 threads).
    (8, 3, [False, True, True, True]),
])
def test_action_mask_keeps_parallel_stages_at_the_thread_floor(
    cpus, value, expected):
  knobs = [_knob("A/parallelism", "parallelism", value, hi=64)]
  assert mdp.action_mask(_obs(knobs, cpu_budget=cpus)).tolist() == (
      expected + [True])


@pytest.mark.parametrize("cpus,stages,start,floor", [
    (1, 1, 1, 1),    # min(1, 2) = 1 either way
    (2, 1, 2, 2),    # 1 x 2 <= 2 CPUs
    (2, 3, 2, 1),    # 3 x 2 = 6 > 2 CPUs: below the start only by a move
    (8, 4, 2, 2),    # 4 x 2 = 8 <= 8
    (8, 5, 2, 1),    # 5 x 2 = 10 > 8
])
def test_a_stage_goes_below_its_start_only_where_the_stages_do_not_fit(
    cpus, stages, start, floor):
  assert mdp.start_threads(cpus) == start
  assert mdp.thread_floor(cpus, stages) == floor
  k = _knob("A/parallelism", "parallelism", 2, hi=64)
  assert mdp.knob_bounds(k, cpus, stages) == (floor, min(64, cpus))
  assert mdp.proposal_bounds(k, cpus) == (start, min(64, cpus))


def test_action_mask_lets_a_cheap_stage_drop_to_one_thread_on_short_cores():
  # 3 stages at 2 threads on 2 CPUs: 6 threads > 2 CPUs, thread_floor 1.
  # At 100 elements/s on 1 thread, A would be busy 0.002 x 100 = 0.2 <=
  # LONE_BUSY = 0.5: it may go to 1 (-1), not below (-5); B (0.5) may too;
  # C (0.01 x 100 = 1) may not. +1 and +5 pass 2 CPUs.
  knobs = [_knob(f"{n}/parallelism", "parallelism", 2) for n in "ABC"]
  o = _obs(knobs, cpu_budget=2, costs={"A": 0.002, "B": 0.005, "C": 0.01})
  assert mdp.action_mask(o).tolist() == (
      [False, True, False, False] * 2 + [False] * 4 + [True])


@pytest.mark.parametrize("cost,rate,threads,expected", [
    (0.002, 100.0, 1, True),    # 0.002 x 100 / 1 = 0.2
    (0.002, 300.0, 1, False),   # 0.6
    (0.002, 300.0, 2, True),    # 0.3
    (0.002, 0.0, 1, False),     # nothing measured yet
])
def test_may_go_below_start_by_hand(cost, rate, threads, expected):
  o = _obs([_knob("A/parallelism", "parallelism", 2)], output_rate=rate,
           costs={"A": cost})
  assert mdp.may_go_below_start(o, o.knobs[0], threads) == expected


def test_action_mask_keeps_buffers_at_one_element():
  knobs = [_knob("P/buffer_size", "buffer_size", 1, lo=0, hi=100),
           _knob("Q/buffer_size", "buffer_size", 0, lo=0, hi=100)]
  mask = mdp.action_mask(_obs(knobs, bytes_per_element=0.0, ram_budget=1))
  # P: 1 -> -4, 0 below MIN_BUFFER = 1 although the knob allows 0; 2, 6 ok.
  # Q: 0 (set by someone else) -> may grow to 1 and 5, not shrink.
  assert mask.tolist() == [False, False, True, True,
                           False, False, True, True, True]


def test_action_mask_unknown_element_size_allows_growth():
  knobs = [_knob("P/buffer_size", "buffer_size", 2, lo=0, hi=100)]
  mask = mdp.action_mask(_obs(knobs, bytes_per_element=0.0, ram_budget=1))
  assert mask.tolist() == [False, True, True, True, True]


def test_apply_and_describe_actions():
  knobs = [_knob("A/parallelism", "parallelism", 2),
           _knob("P/buffer_size", "buffer_size", 6, lo=0, hi=64)]
  obs = _obs(knobs)
  assert mdp.apply_action(obs, 3) == {"A/parallelism": 7.0}  # +5
  assert mdp.apply_action(obs, 4) == {"P/buffer_size": 1.0}  # -5
  assert mdp.apply_action(obs, 8) == {}
  assert mdp.describe_action(obs, 6) == "P/buffer_size +1"
  assert mdp.describe_action(obs, 8) == "no-op"




def test_features_mark_the_bottleneck_and_gap():
  knobs = [_knob("A/parallelism", "parallelism", 1),
           _knob("B/parallelism", "parallelism", 3)]
  obs = _obs(knobs, costs={"A": 0.03, "B": 0.01})
  f = mdp.features(obs)
  assert f.shape == (2, mdp.NUM_FEATURES)
  # A: busy = 100/s * 0.03 s / 1 thread = 3 -> capped at 2; B: 100*.01/3.
  assert f[:, _column("busy")].tolist() == pytest.approx([2.0, 1 / 3])
  assert f[:, _column("is_bottleneck")].tolist() == [1.0, 0.0]
  # Proportional share of 4 CPUs: A 3, B 1. Gap A (3 - 1)/3, B (1 - 3)/3.
  assert f[:, _column("gap_or_fill")].tolist() == pytest.approx(
      [2 / 3, -2 / 3])
  # Cost shares 0.03 / 0.04 and 0.01 / 0.04; threads / 4 CPUs.
  assert f[:, _column("cost_share")].tolist() == pytest.approx([0.75, 0.25])
  assert f[:, _column("value")].tolist() == pytest.approx([0.25, 0.75])
  assert f[:, _column("is_parallelism")].tolist() == [1.0, 1.0]


def test_features_do_not_read_the_hosts_clock_or_bandwidth():
  # The simulator models neither, so the network never learned from them: a
  # live host (here 44 GB/s, 3.9 GHz) gets the state the simulator's gives.
  knobs = [_knob("A/parallelism", "parallelism", 2),
           _knob("B/buffer_size", "buffer", 4)]
  trained = _obs(knobs, costs={"A": 0.02, "B": 0.01})
  live = dataclasses.replace(trained, cpu_mhz=3900.0, dram_gbps=44.0)
  np.testing.assert_array_equal(mdp.features(live), mdp.features(trained))
  # 2500 MHz / 5000, 10 GB/s / 50.
  f = mdp.features(live)
  assert f[0, _column("cpu_mhz")] == pytest.approx(0.5)
  assert f[0, _column("dram_gbps")] == pytest.approx(0.2)


