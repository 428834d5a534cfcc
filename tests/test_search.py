"""The search baselines (intune_tf.tuning.search), step by step on
hand-built observations, and on simulated pipelines for the limits."""

import dataclasses
import functools

from _observations import at
from _observations import knob
from _observations import obs
from _observations import two_stages
import numpy as np
import pytest

from intune_tf.live import registry
from intune_tf.options import IntuneOptions
from intune_tf.sim import simulator as sim_lib
from intune_tf.tuning import mdp
from intune_tf.tuning import search


@pytest.mark.parametrize("name,cls", [("climb", search.ClimbPolicy),
                                      ("coordinate", search.CoordinatePolicy),
                                      ("plumber", search.PlumberPolicy),
                                      ("jump-climb", search.JumpClimbPolicy)])
def test_registered(name, cls):
  assert isinstance(registry.create(IntuneOptions(policy=name)), cls)


def test_climb_tries_the_busiest_stage_first_and_reverts_what_did_not_help():
  policy = search.ClimbPolicy(IntuneOptions())
  o = obs([knob("A/parallelism", "parallelism", 2, hi=8),
           knob("B/parallelism", "parallelism", 2, hi=8)],
          cpu_budget=8, costs={"A": 0.01, "B": 0.03})
  # Utilization at 100/s: A 0.01 x 100 / 2 = 0.5, B 0.03 x 100 / 2 = 1.5:
  # B is the busiest; +5 first (7 <= 8 CPUs; 9 threads <= cpu_limit 18).
  assert policy.step(at(o, 100.0)) == {"B/parallelism": 7.0}
  assert policy.on_trial
  # 101 is 1% above the base's 100, not more than 2%: reverted.
  assert policy.step(at(o, 101.0, B=7)) == {"B/parallelism": 2.0}
  assert policy.last_gain == pytest.approx(0.01)
  assert not policy.on_trial
  # The base measured again (100), then the next candidate: B +1.
  assert policy.step(at(o, 100.0, B=2)) == {"B/parallelism": 3.0}
  assert policy.base_rate == pytest.approx(100.0)
  # 110 > 102: kept; the new base is 110. B is still the busiest
  # (0.03 x 110 / 3 = 1.1 against A's 0.55): B +5 again (8 <= 8).
  assert policy.step(at(o, 110.0, B=3)) == {"B/parallelism": 8.0}
  assert policy.base_rate == pytest.approx(110.0)
  assert policy.last_gain == pytest.approx(0.1)
  # 111 is not above 110 x 1.02 = 112.2: back to 3.
  assert policy.step(at(o, 111.0, B=8)) == {"B/parallelism": 3.0}


def test_climb_moves_threads_from_the_least_busy_stage_at_the_limit():
  policy = search.ClimbPolicy(IntuneOptions())
  o = obs([knob("A/parallelism", "parallelism", 8, hi=8),
           knob("B/parallelism", "parallelism", 8, hi=8),
           knob("C/parallelism", "parallelism", 4, hi=8)],
          cpu_budget=8, costs={"A": 0.01, "B": 0.02, "C": 0.1})
  # cpu_limit(3, 8) = 2 (8 + 3 - 1) = 20 threads, all in use. Utilization
  # at 100/s: A 0.125, B 0.25, C 2.5. C +5 would be 9 > 8 CPUs (out of
  # range); C +1 exceeds the limit, so one thread moves from A, the least
  # busy: A 7, C 5 (20 threads).
  mask = mdp.action_mask(o)
  assert not mask[mdp.action_of(2, 1)] and mask[mdp.action_of(0, -1)]
  assert policy.step(at(o, 100.0)) == {"A/parallelism": 7.0,
                                        "C/parallelism": 5.0}


def test_climb_never_proposes_a_masked_move():
  policy = search.ClimbPolicy(IntuneOptions())
  mb = 1 << 20
  o = obs([knob("A/parallelism", "parallelism", 2, hi=8),
           knob("B/buffer_size", "buffer_size", 1, lo=0, hi=64)],
          cpu_budget=2, ram_budget=40 * mb, bytes_per_element=10 * mb,
          costs={"A": 0.02, "B": 0.001})
  # On 2 CPUs the thread floor and the per-stage maximum are both 2: A
  # cannot move. B +5 would commit 6 x 10 MB > 40 MB; B +1 (20 MB) fits.
  assert policy.step(at(o, 100.0)) == {"B/buffer_size": 2.0}
  assert policy.step(at(o, 100.0, B=2)) == {"B/buffer_size": 1.0}
  # Then the decreases, least busy first: B -1 -> 0 is below MIN_BUFFER,
  # B -5 below 0, A -1 below the floor: nothing is left; the search holds.
  assert policy.step(at(o, 100.0, B=1)) == {}
  assert policy.converged


def test_coordinate_cycles_knobs_and_shrinks_its_step():
  policy = search.CoordinatePolicy(IntuneOptions())
  o = obs([knob("A/parallelism", "parallelism", 4, hi=8),
           knob("B/parallelism", "parallelism", 4, hi=8)],
          cpu_budget=8, costs={"A": 0.01, "B": 0.01})
  # Step 5: A +5 = 9 > 8 CPUs, A -5 = -1 below the floor 2, the same for
  # B: a pass without a kept move, the step drops to 1: A +1.
  assert policy.step(at(o, 100.0)) == {"A/parallelism": 5.0}
  assert policy.step(at(o, 100.0, A=5)) == {"A/parallelism": 4.0}
  # Base again, then the other direction: A -1.
  assert policy.step(at(o, 100.0, A=4)) == {"A/parallelism": 3.0}
  # 105 > 102: kept, and the same move again: A -1.
  assert policy.step(at(o, 105.0, A=3)) == {"A/parallelism": 2.0}
  # 106 is not above 105 x 1.02 = 107.1: reverted; A is done, B +1 next.
  assert policy.step(at(o, 106.0, A=2)) == {"A/parallelism": 3.0}
  assert policy.step(at(o, 105.0, A=3)) == {"B/parallelism": 5.0}


def test_plumber_allocates_by_cost_and_searches_the_total():
  policy = search.PlumberPolicy(IntuneOptions())
  o = obs([knob("A/parallelism", "parallelism", 4, hi=16),
           knob("B/parallelism", "parallelism", 4, hi=16)],
          cpu_budget=8, costs={"A": 0.03, "B": 0.01})
  # Costs 0.03 : 0.01 per output element; 8 CPUs in proportion: 6 and 2.
  assert policy.step(at(o, 100.0)) == {"A/parallelism": 6.0,
                                        "B/parallelism": 2.0}
  # Kept (120 > 102). The total steps by 8 // 4 = 2: 10 threads: one each,
  # then 8 more at 3:1 -> 6 and 2 -> 7 and 3.
  assert policy.step(at(o, 120.0, A=6, B=2)) == {"A/parallelism": 7.0,
                                                  "B/parallelism": 3.0}
  # Not above 120 x 1.02: reverted; then the other direction, 6 threads:
  # one each, 4 more at 3:1 -> 4 and 2.
  assert policy.step(at(o, 121.0, A=7, B=3)) == {"A/parallelism": 6.0,
                                                  "B/parallelism": 2.0}
  assert policy.step(at(o, 120.0, A=6, B=2)) == {"A/parallelism": 4.0,
                                                  "B/parallelism": 2.0}
  # Reverted too; the step halves to 1: 9 threads: one each, 7 more at 3:1
  # = 5.25 and 1.75 -> 5 and 1, the last thread to the larger remainder
  # (B's 0.75) -> 6 and 3.
  assert policy.step(at(o, 119.0, A=4, B=2)) == {"A/parallelism": 6.0,
                                                  "B/parallelism": 2.0}
  assert policy.step(at(o, 120.0, A=6, B=2)) == {"A/parallelism": 6.0,
                                                  "B/parallelism": 3.0}


def _random_sims(count):
  rng = np.random.default_rng(7)
  for i in range(count):
    pipe = sim_lib.random_pipeline(rng, cpus=(2, 64), events=False)
    yield sim_lib.Simulator(pipe, seed=i, params=sim_lib.random_params(rng))


@pytest.mark.parametrize("cls", [
    search.ClimbPolicy, search.CoordinatePolicy,
    functools.partial(search.JumpClimbPolicy, jumps=())])
def test_single_moves_stay_within_the_agents_mask(cls):
  tried = 0
  for sim in _random_sims(12):
    policy = cls(IntuneOptions())
    for _ in range(40):
      o = sim.observe()
      values = policy.step(o)
      if values and policy.last_decision.action.startswith("try"):
        tried += 1
        index = {k.name: i for i, k in enumerate(o.knobs)}
        # One move, or a transfer: the decrease first, then the increase,
        # each allowed by the mask where it is made.
        moves = sorted(((values[n] - o.knobs[index[n]].value, n)
                        for n in values))
        current = o
        for move, name in moves:
          mask = mdp.action_mask(current)
          assert mask[mdp.action_of(index[name], int(move))], (name, move)
          current = search._moved(current, {name: values[name]})  # noqa: SLF001
      sim.set(values)
      sim.advance()
  assert tried > 50


def test_plumber_stays_within_the_agents_limits():
  tried = 0
  for sim in _random_sims(12):
    policy = search.PlumberPolicy(IntuneOptions())
    for _ in range(40):
      o = sim.observe()
      values = policy.step(o)
      if values and policy.last_decision.action.startswith("try"):
        tried += 1
        parallel = [k for k in o.knobs if k.kind == "parallelism"]
        for k in o.knobs:
          lo, hi = mdp.proposal_bounds(k, o.cpu_budget)
          assert lo <= values[k.name] <= hi
        assert sum(values[k.name] for k in parallel) <= mdp.cpu_limit(
            len(parallel), o.cpu_budget)
        floor = {k.name: mdp.proposal_bounds(k, o.cpu_budget)[0]
                 for k in o.knobs}
        assert (mdp.committed_bytes(o, values) <= o.ram_budget or
                mdp.committed_bytes(o, floor) > o.ram_budget)
      sim.set(values)
      sim.advance()
  assert tried > 12


def test_a_settled_search_holds_through_noise_and_reopens_on_a_move():
  policy = search.ClimbPolicy(IntuneOptions())
  o = obs([knob("A/parallelism", "parallelism", 2, hi=8)], cpu_budget=2,
          costs={"A": 0.02})
  # On 2 CPUs A cannot move: settled at once; +-3% around 100 for 300
  # steps changes nothing and re-opens nothing (`change.Cusum`).
  assert policy.step(at(o, 100.0)) == {} and policy.converged
  for t in range(300):
    assert policy.step(at(o, 100.0 * (1 + 0.03 * (-1) ** t))) == {}
    assert policy.converged
  # The rate falls by 20%: the fourth low measurement re-opens the search
  # (the detector's arithmetic for this stream is in test_change.py), which
  # finds nothing to try and settles again at the new rate.
  decisions = []
  for _ in range(4):
    policy.step(at(o, 80.0))
    decisions.append(policy.last_decision.action)
  assert decisions == ["hold"] * 3 + ["re-open: rate moved; converged"]
  assert policy.base_rate == pytest.approx(80.0)
  assert policy.converged


@pytest.mark.parametrize("moved", ["cost", "memory", "cpus"])
def test_a_settled_search_reopens_when_what_it_observes_moves(moved):
  policy = search.ClimbPolicy(IntuneOptions())
  o = obs([knob("A/parallelism", "parallelism", 2, hi=8)], cpu_budget=2,
          costs={"A": 0.02})
  for t in range(20):
    policy.step(at(o, 100.0 * (1 + 0.03 * (-1) ** t)))
  assert policy.converged
  # The rate holds; only the stage's cost, the memory in use or the
  # usable CPUs (not the CPU budget) move.
  if moved == "cost":
    stages = tuple(dataclasses.replace(s, cpu_per_element_s=0.03)
                   for s in o.stages)
    changed = dataclasses.replace(o, stages=stages)
    expected = "cost A"
  elif moved == "memory":
    changed = dataclasses.replace(o, free_memory=2 << 30)
    expected = "memory"
  else:
    changed = dataclasses.replace(o, usable_cpus=1)
    expected = "usable CPUs"
  actions = []
  for _ in range(4):
    policy.step(at(changed, 100.0))
    actions.append(policy.last_decision.action)
  # A stream without noise (the sigma floor, 0.01): the third value alarms
  # (test_change.py); the rate's alternating noise delays nothing here.
  assert f"re-open: {expected} moved; converged" in actions[2:], actions


def test_a_search_without_progress_settles_after_patience_trials():
  o = two_stages()
  policy = search.ClimbPolicy(IntuneOptions(), patience=3)
  changes = 0
  for _ in range(40):
    # Every trial measures the same as the base: no progress.
    values = policy.step(at(o, 100.0))
    changes += bool(values)
  # 3 trials, each set then reverted: 6 changes, then nothing.
  assert policy.converged and changes == 6


def test_a_window_in_which_nothing_was_returned_is_no_measurement():
  # A pipeline still filling its buffers returns nothing for 10 steps: the
  # base's window starts at the first step that returns something, so no
  # trial is judged against a base of 0.
  o = obs([knob("A/parallelism", "parallelism", 2, hi=8)], cpu_budget=8,
          costs={"A": 0.02})
  policy = search.ClimbPolicy(IntuneOptions())
  for _ in range(10):
    assert policy.step(at(o, 0.0)) == {}
  assert policy.base_rate is None and not policy.on_trial
  # 100/s x 0.5 s = 50 elements: the base, then the first trial, A +5.
  assert policy.step(at(o, 100.0)) == {"A/parallelism": 7.0}
  assert policy.base_rate == 100.0
  # 101 is not above 102: reverted.
  assert policy.step(at(o, 101.0, A=7)) == {"A/parallelism": 2.0}
  # A trial that stops the pipeline: its window counts every step, 1 + 6
  # waiting for elements, and it is reverted at the 7th.
  assert policy.step(at(o, 100.0)) == {"A/parallelism": 3.0}
  for _ in range(6):
    assert policy.step(at(o, 0.0, A=3)) == {}
  assert policy.step(at(o, 0.0, A=3)) == {"A/parallelism": 2.0}
  assert policy.last_decision.action == "revert A/parallelism +1"


@pytest.mark.parametrize("last,settles", [(100.0, True), (106.0, False)])
def test_a_kept_neutral_move_is_not_progress(last, settles):
  o = obs([knob("A/parallelism", "parallelism", 2, hi=8)], cpu_budget=8,
          costs={"A": 0.02})
  policy = search.ClimbPolicy(IntuneOptions(), patience=3)
  # Candidates from A = 2: +5, +1 (the floor is 2). A +5 is rejected (1
  # trial without progress); the base measured again (100, twice) is
  # where progress starts.
  assert policy.step(at(o, 100.0)) == {"A/parallelism": 7.0}
  assert policy.step(at(o, 100.0, A=7)) == {"A/parallelism": 2.0}
  assert policy.step(at(o, 100.0)) == {"A/parallelism": 3.0}
  # 103 > 102: A +1 is kept (2 trials); from A = 3, A +5 at once.
  assert policy.step(at(o, 103.0, A=3)) == {"A/parallelism": 8.0}
  # Rejected (3 trials); reverted.
  assert policy.step(at(o, 100.0, A=8)) == {"A/parallelism": 3.0}
  # The base measured again: (103 + 100) / 2 = 101.5 is not above 100 x
  # 1.02: no progress after 3 trials, the search settles. (103 + 106) / 2
  # = 104.5 is: progress, and A +1 is tried.
  values = policy.step(at(o, last, A=3))
  assert policy.converged == settles
  assert values == ({} if settles else {"A/parallelism": 4.0})


def test_fit_threads_clips_to_bounds_then_trims_the_largest():
  o = obs([knob("A/parallelism", "parallelism", 2, hi=8),
           knob("B/parallelism", "parallelism", 2, hi=8),
           knob("C/parallelism", "parallelism", 2, hi=8)], cpu_budget=8)
  # Bounds [2, 8] each: 12 -> 8, 3.4 -> 3, 0 -> 2; 13 threads fit the
  # limit 2 x (8 + 3 - 1) = 20.
  assert search.fit_threads(o, {"A/parallelism": 12, "B/parallelism": 3.4,
                                "C/parallelism": 0}) == {
      "A/parallelism": 8.0, "B/parallelism": 3.0, "C/parallelism": 2.0}
  # 8 + 8 + 8 = 24 > 20: four threads come off the largest, ties to the
  # last name: C 7, B 7, A 7, then C 6 (7 + 7 + 6 = 20).
  assert search.fit_threads(o, {"A/parallelism": 8, "B/parallelism": 8,
                                "C/parallelism": 8}) == {
      "A/parallelism": 7.0, "B/parallelism": 7.0, "C/parallelism": 6.0}
  # A knob missing from the values keeps its own (A 2).
  assert search.fit_threads(o, {"B/parallelism": 5})["A/parallelism"] == 2.0


def test_proportional_jumps_split_f_times_the_budget_by_cost():
  o = two_stages()   # A 2, B 2 threads on 8 CPUs; costs A 0.01, B 0.03
  # f = 1: 8 threads; each stage's first, then 6 split 1.5 : 4.5 -> 1 and
  # 4, the remainder to A (ties to the first): A 3, B 5.
  # f = 0.5: 4 threads: 1 + 0.5 -> 1, 1 + 1.5 -> 2 then A's +1 (remainders
  # 0.5 each, the first wins): A 2, B 2, the floor 2 each: no change, left
  # out.
  jumps = search.proportional_jumps(o, (1.0, 0.5))
  assert jumps == [("proportional at 1 x 8 CPUs",
                    {"A/parallelism": 3.0, "B/parallelism": 5.0})]
  # f = 2: 16 threads: B's share (1 + 10.5) is capped at its 8 and the
  # surplus goes to A: A 8, B 8 (16 within the limit 2 x (8 + 1) = 18).
  assert search.proportional_jumps(o, (2.0,)) == [
      ("proportional at 2 x 8 CPUs",
       {"A/parallelism": 8.0, "B/parallelism": 8.0})]
  # No measured costs (nothing returned yet): no jumps.
  assert search.proportional_jumps(at(o, 0.0), (1.0,)) == []


def test_measured_evidence_sums_the_gains_of_the_directions_moved():
  o = two_stages()   # A 2, B 2
  evidence = {"A/parallelism": (0.3, -0.5), "B/parallelism": (1.0, 0.2)}
  # A up (0.3) + B down (0.2) = 0.5.
  assert search.measured_evidence(
      o, {"A/parallelism": 3.0, "B/parallelism": 1.0}, evidence) == (
          pytest.approx(0.5))
  # A down: -0.5; a knob without evidence or not moved adds 0.
  assert search.measured_evidence(o, {"A/parallelism": 1.0}, evidence) == (
      -0.5)
  assert search.measured_evidence(o, {"A/parallelism": 2.0}, evidence) == 0
  assert search.measured_evidence(o, {"A/parallelism": 3.0}, {}) == 0


def test_jump_climb_jumps_first_and_a_jump_leaves_no_evidence():
  o = two_stages()
  policy = search.JumpClimbPolicy(IntuneOptions(), jumps=(1.0,))
  # The jump at 1 x 8 CPUs (test_proportional_jumps_...): A 3, B 5.
  assert policy.step(at(o, 100.0)) == {"A/parallelism": 3.0,
                                        "B/parallelism": 5.0}
  assert policy.step(at(o, 90.0, A=3, B=5)) == {"A/parallelism": 2.0,
                                                 "B/parallelism": 2.0}
  assert policy.evidence == {}
  # Then climb's first move (B, the busiest, +5).
  assert policy.step(at(o, 100.0)) == {"B/parallelism": 7.0}


@pytest.mark.parametrize("cls, after_keep", [
    # A's raises measured +1.5% (not kept) then +3% (kept): A +5 scores
    # 0.3 against B's 0, whatever the busiest stage.
    (search.JumpClimbPolicy, {"A/parallelism": 8.0}),
    # climb goes back to the busiest stage, B.
    (search.ClimbPolicy, {"B/parallelism": 7.0}),
])
def test_jump_climb_tries_first_what_measured_gains_at_earlier_bases(
    cls, after_keep):
  o = two_stages()
  policy = (cls(IntuneOptions(), jumps=()) if cls is search.JumpClimbPolicy
            else cls(IntuneOptions()))
  steps = [
      (at(o, 100.0), {"B/parallelism": 7.0}),          # B +5
      (at(o, 100.0, B=7), {"B/parallelism": 2.0}),     # 0%: reverted
      (at(o, 100.0), {"B/parallelism": 3.0}),          # B +1
      (at(o, 100.0, B=3), {"B/parallelism": 2.0}),     # 0%: reverted
      (at(o, 100.0), {"A/parallelism": 7.0}),          # A +5
      (at(o, 101.5, A=7), {"A/parallelism": 2.0}),     # +1.5%: reverted
      (at(o, 100.0), {"A/parallelism": 3.0}),          # A +1
  ]
  for observation, decision in steps:
    assert policy.step(observation) == decision
  # +3% over the base's 100: kept; the next move from the new base.
  assert policy.step(at(o, 103.0, A=3)) == after_keep
  if cls is search.JumpClimbPolicy:
    # 0.015 and 0.03 x GAIN_SCALE 10; B's raises measured 0.
    assert policy.evidence == {"A/parallelism": (pytest.approx(0.3), 0.0),
                               "B/parallelism": (0.0, 0.0)}
