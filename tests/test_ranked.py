"""The Q-ranked measured search (intune_tf.agent.ranked) on hand-built
observations, with the Q-values given."""

import dataclasses

from _observations import at
from _observations import knob
from _observations import obs
from _observations import two_stages
import numpy as np
import pytest

from intune_tf.agent import allocator
from intune_tf.agent import ranked
from intune_tf.live import registry
from intune_tf.options import IntuneOptions
from intune_tf.sim import simulator
from intune_tf.tuning import mdp
from intune_tf.tuning import search


class _NoAllocation(allocator.Allocator):
  """An allocator that proposes nothing: the searches' other parts alone."""

  def __init__(self):
    super().__init__(constant=0.0)

  def propose(self, obs):
    return None


def _policy(q, **kwargs):
  """A policy whose Q-values are `q` (flat: 4 per knob, then the no-op)."""
  policy = ranked.RankedSearchPolicy(IntuneOptions(), **kwargs)
  policy.q_values = lambda obs: np.asarray(q, float)
  return policy


@pytest.mark.parametrize("name,cls", [
    ("intune", ranked.JumpSearchPolicy),
    ("intune-jump", ranked.JumpSearchPolicy),
    ("intune-ablated", ranked.AblatedSearchPolicy),
    ("intune-search", ranked.RankedSearchPolicy)])
def test_registered(name, cls):
  policy = registry.create(IntuneOptions(policy=name))
  assert type(policy) is cls
  if cls is not ranked.RankedSearchPolicy:
    assert policy.jumps == ranked.INTUNE_JUMPS


def test_the_default_is_the_q_ranked_jump_search():
  assert IntuneOptions().policy == "intune"
  assert type(registry.create(IntuneOptions())) is ranked.JumpSearchPolicy


def test_the_ablated_network_output_is_a_constant():
  # The same ranker file as intune; its Q-values differ across states,
  # the ablated ones never do.
  intune = ranked.JumpSearchPolicy(IntuneOptions())
  ablated = ranked.AblatedSearchPolicy(IntuneOptions())
  states = [at(two_stages(), rate) for rate in (10.0, 100.0, 1000.0)]
  states.append(obs([knob("A/parallelism", "parallelism", 3, hi=8),
                     knob("B/parallelism", "parallelism", 6, hi=8)],
                    cpu_budget=8, costs={"A": 0.05, "B": 0.001}))
  learned = [intune.q_values(o) for o in states]
  assert any(not np.allclose(learned[0], q) for q in learned[1:])
  for o in states:
    q = ablated.q_values(o)
    assert q.shape == (mdp.MOVES_PER_KNOB * len(o.knobs) + 1,)
    assert np.all(q == ranked.ABLATED_Q)
  # The ablated allocation network's output too: the mean share of the
  # shipped network's training targets, whatever the state.
  _, metadata = ranked.dqn.load_weights(allocator.ALLOCATOR_WEIGHTS)
  learned_shares = [intune.allocator.shares(o) for o in states[:3]]
  assert any(not np.allclose(learned_shares[0], x)
             for x in learned_shares[1:])
  for o in states:
    assert np.all(ablated.allocator.shares(o) == np.float32(
        metadata["mean_share"]))
  # So its ranking is jump-climb's: evidence, then climb's order.
  o = at(two_stages(), 100.0)
  climb = search.JumpClimbPolicy(IntuneOptions())
  assert [c[0] for c in ablated.ranked(o)] == [c[0] for c in climb.ranked(o)]


def test_the_highest_q_move_is_tried_first():
  o = two_stages()
  q = np.zeros(9)
  q[mdp.action_of(0, 1)] = 0.5   # A +1: the prior's favourite
  q[mdp.action_of(1, 5)] = 0.2   # B +5: climb's first
  policy = _policy(q)
  assert policy.step(at(o, 100.0)) == {"A/parallelism": 3.0}


def test_a_rejected_move_is_not_retried_at_the_same_base():
  o = two_stages()
  q = np.zeros(9)
  q[mdp.action_of(0, 1)] = 0.5
  q[mdp.action_of(1, 5)] = 0.2
  policy = _policy(q, evidence_weight=0.0)  # the prior's order alone
  assert policy.step(at(o, 100.0)) == {"A/parallelism": 3.0}
  # 100 is not above the base's 100 x 1.02: reverted.
  assert policy.step(at(o, 100.0, A=3)) == {"A/parallelism": 2.0}
  # The base again; A +1 still has the highest Q, but it was rejected
  # here: the next best, B +5.
  assert policy.step(at(o, 100.0, A=2)) == {"B/parallelism": 7.0}
  assert policy.step(at(o, 100.0, B=7)) == {"B/parallelism": 2.0}
  # Kept changes start a new base, where A +1 may be tried again.
  assert policy.step(at(o, 100.0)) == {"B/parallelism": 3.0}   # B +1
  assert policy.step(at(o, 110.0, B=3)) == {"A/parallelism": 3.0}


def test_ties_keep_climbs_bottleneck_first_order():
  o = two_stages()
  policy = _policy(np.zeros(9))
  # All advantages 0: climb's first candidate, the busiest stage's +5.
  assert policy.step(at(o, 100.0)) == {"B/parallelism": 7.0}


def test_masked_moves_are_never_tried():
  mb = 1 << 20
  o = obs([knob("A/parallelism", "parallelism", 2, hi=8),
           knob("B/buffer_size", "buffer_size", 1, lo=0, hi=64)],
          cpu_budget=2, ram_budget=40 * mb, bytes_per_element=10 * mb,
          costs={"A": 0.02, "B": 0.001})
  mask = mdp.action_mask(o)
  # On 2 CPUs A cannot move; B +5 would commit 60 MB > 40 MB.
  assert not mask[mdp.action_of(0, 1)] and not mask[mdp.action_of(1, 5)]
  q = np.zeros(9)
  q[mdp.action_of(0, 1)] = 9.0
  q[mdp.action_of(1, 5)] = 8.0
  q[mdp.action_of(1, 1)] = 0.1
  policy = _policy(q)
  assert policy.step(at(o, 100.0)) == {"B/buffer_size": 2.0}
  for label, values, _ in policy.ranked(o):
    for a in ranked.candidate_actions(o, values):
      assert mask[a], label


def test_the_search_settles_after_patience_trials_without_progress():
  o = two_stages()
  policy = _policy(np.zeros(9), patience=1)
  assert policy.step(at(o, 100.0)) == {"B/parallelism": 7.0}
  assert policy.step(at(o, 100.0, B=7)) == {"B/parallelism": 2.0}
  assert policy.step(at(o, 100.0)) == {}
  assert policy.converged


def test_moves_the_prior_rules_out_are_not_tried():
  o = two_stages()
  q = np.full(9, -1.0)
  q[-1] = 0.0
  q[mdp.action_of(0, -1)] = 0.0  # A -1 is not allowed (floor 2) anyway
  policy = _policy(q, prior_margin=0.5)
  # Every allowed move is 1.0 below the no-op: nothing to try.
  assert policy.step(at(o, 100.0)) == {}
  assert policy.converged


def test_rank_scores_transfers_by_the_sum_of_their_moves():
  o = two_stages()
  q = np.zeros(9)
  q[mdp.action_of(0, -1)] = -0.1
  q[mdp.action_of(1, 1)] = 0.3
  q[-1] = 0.1
  out = ranked.rank([("B +1", {"B/parallelism": 3.0}),
                     ("A -1, B +1", {"A/parallelism": 1.0,
                                     "B/parallelism": 3.0}),
                     ("B +2", {"B/parallelism": 4.0})], o, q)
  assert [label for label, _, _ in out] == ["B +1", "A -1, B +1", "B +2"]
  assert out[0][2] == pytest.approx(0.2)
  assert out[1][2] == pytest.approx(0.2 - 0.2)
  assert out[2][2] == -np.inf


def test_move_gains_try_each_valid_move_and_restore_the_state():
  from intune_tf.sim import pretrain  # noqa: PLC0415
  from intune_tf.sim import simulator as sim_lib  # noqa: PLC0415
  rng = np.random.default_rng(3)
  sim = sim_lib.Simulator(sim_lib.random_pipeline(rng, cpus=(8, 16),
                                                  events=False), seed=1)
  sim.set({k.name: 2.0 for k in sim.observe().knobs})
  before = (list(sim.parallelism), list(sim.buffers), sim.true_rate())
  o = sim.observe()
  gains, mask = pretrain.move_gains(sim, o)
  assert (list(sim.parallelism), list(sim.buffers), sim.true_rate()) == before
  # The deployed mask is the training mask.
  np.testing.assert_array_equal(mask.astype(bool), mdp.action_mask(o))
  assert gains[-1] == 0 and np.all(gains[~mask.astype(bool)] == 0)


def test_the_jump_search_tries_its_jumps_first_then_the_ranked_moves():
  o = two_stages()
  q = np.zeros(9)
  q[mdp.action_of(0, 1)] = 0.5   # A +1: the prior's favourite
  policy = ranked.JumpSearchPolicy(IntuneOptions(), jumps=(1.0, 0.5),
                                   allocator=_NoAllocation())
  policy.q_values = lambda obs: q
  # The first jump (f = 1: A 3, B 5), measured against the base's 100.
  assert policy.step(at(o, 100.0)) == {"A/parallelism": 3.0,
                                        "B/parallelism": 5.0}
  # 101 is not above 102: reverted; f = 0.5 changes nothing, so the ranked
  # search's favourite, A +1, comes next.
  assert policy.step(at(o, 101.0, A=3, B=5)) == {"A/parallelism": 2.0,
                                                  "B/parallelism": 2.0}
  assert policy.step(at(o, 100.0)) == {"A/parallelism": 3.0}


def _jumped(o):
  """A jump search (one jump, f = 1, Q all zero) after its first step, the
  jump to A 3, B 5 from a base measured at 100."""
  policy = ranked.JumpSearchPolicy(IntuneOptions(), jumps=(1.0,),
                                   allocator=_NoAllocation())
  policy.q_values = lambda obs: np.zeros(9)
  assert policy.step(at(o, 100.0)) == {"A/parallelism": 3.0,
                                        "B/parallelism": 5.0}
  return policy


def test_a_kept_jump_is_the_new_base():
  o = two_stages()
  policy = _jumped(o)
  # 110 > 102: kept; the next trial is a single move from A 3, B 5 (not
  # a revert), measured against the new base's 110.
  values = policy.step(at(o, 110.0, A=3, B=5))
  assert len(values) == 1
  assert values not in ({"A/parallelism": 2.0}, {"B/parallelism": 2.0})
  assert policy.base_rate == 110.0


def test_jumps_are_made_again_when_the_cpu_budget_changes():
  o = two_stages()
  policy = _jumped(o)
  assert policy.step(at(o, 100.0, A=3, B=5)) == {"A/parallelism": 2.0,
                                                  "B/parallelism": 2.0}
  # At the same budget the jump is not made again: a single move.
  assert len(policy.step(at(o, 100.0))) == 1
  # 16 CPUs: a new context, whose first change is the jump at 16 threads
  # (costs 1 : 3: B's 1 + 10.5 is capped at its knob's 8, the surplus goes
  # to A: A 8, B 8).
  wider = dataclasses.replace(o, cpu_budget=16, usable_cpus=16)
  assert policy.step(at(wider, 100.0, A=2, B=2)) == {
      "A/parallelism": 8.0, "B/parallelism": 8.0}


def test_rank_adds_each_candidates_bonus():
  o = two_stages()
  q = np.zeros(9)
  q[mdp.action_of(0, 1)] = 0.5
  q[mdp.action_of(1, 1)] = 0.2
  out = ranked.rank([("A +1", {"A/parallelism": 3.0}),
                     ("B +1", {"B/parallelism": 3.0})], o, q, [0.0, 0.4])
  # B +1: 0.2 + 0.4 = 0.6 over A +1's 0.5.
  assert [(label, score) for label, _, score in out] == [
      ("B +1", pytest.approx(0.6)), ("A +1", pytest.approx(0.5))]


@pytest.mark.parametrize("weight, after_keep", [
    # The evidence: A's raise measured +1% (0.1), B's +10% (clipped to 1):
    # B +1 scores 0 + 1 x 1 = 1 against A +1's 0.5 + 0.1.
    (1.0, {"B/parallelism": 8.0}),
    # Without it, the Q-network's favourite, A +1, again.
    (0.0, {"A/parallelism": 3.0}),
])
def test_measured_gains_reorder_the_moves_at_later_bases(weight, after_keep):
  o = two_stages()
  q = np.zeros(9)
  q[mdp.action_of(0, 1)] = 0.5   # A +1 first
  q[mdp.action_of(1, 5)] = 0.2   # then B +5
  policy = _policy(q, evidence_weight=weight)
  assert policy.step(at(o, 100.0)) == {"A/parallelism": 3.0}
  # 101 against the base's 100: +1%, reverted (threshold 2%).
  assert policy.step(at(o, 101.0, A=3)) == {"A/parallelism": 2.0}
  assert policy.last_gain == pytest.approx(0.01)
  assert policy.step(at(o, 100.0)) == {"B/parallelism": 7.0}
  # +10%: kept, and the next move from the new base is tried at once.
  assert policy.step(at(o, 110.0, B=7)) == after_keep
  assert policy.evidence == {"A/parallelism": (pytest.approx(0.1), 0.0),
                             "B/parallelism": (1.0, 0.0)}


def test_a_new_context_forgets_the_evidence():
  o = two_stages()
  policy = _policy(np.zeros(9))
  assert policy.step(at(o, 100.0)) == {"B/parallelism": 7.0}
  policy.step(at(o, 50.0, B=7))
  assert policy.evidence == {"B/parallelism": (-1.0, 0.0)}
  wider = dataclasses.replace(o, cpu_budget=16, usable_cpus=16)
  policy.step(at(wider, 100.0))
  assert policy.evidence == {}


def _jump_search(q, cls=ranked.JumpSearchPolicy, **kwargs):
  """A jump search without jumps or learned allocation whose Q-values are
  `q` (flat)."""
  policy = cls(IntuneOptions(), jumps=(), allocator=_NoAllocation(),
               **kwargs)
  if cls is ranked.JumpSearchPolicy:
    policy.q_values = lambda obs: np.asarray(q, float)
  return policy


def test_intune_makes_one_proposal_then_follows_jump_climbs_order():
  o = two_stages()
  q = np.zeros(9)
  q[mdp.action_of(0, 1)] = 0.5   # A +1: the network's proposal
  q[mdp.action_of(0, 5)] = 0.4   # A +5: its second choice, never first
  policy = _jump_search(q)
  assert policy.step(at(o, 100.0)) == {"A/parallelism": 3.0}
  # 100 is not above 102: reverted at once.
  assert policy.step(at(o, 100.0, A=3)) == {"A/parallelism": 2.0}
  # From here jump-climb's order (no evidence on B: climb's, B +5 first),
  # not the network's A +5.
  climb = search.JumpClimbPolicy(IntuneOptions(), jumps=())
  assert climb.step(at(o, 100.0)) == {"B/parallelism": 7.0}
  assert policy.step(at(o, 100.0)) == {"B/parallelism": 7.0}


@pytest.mark.parametrize("cls, q_a", [
    # No advantage above 0: no proposal.
    (ranked.JumpSearchPolicy, 0.0),
    (ranked.JumpSearchPolicy, -0.5),
    # The ablated network's constant output: no proposal ever.
    (ranked.AblatedSearchPolicy, None),
])
def test_without_a_positive_advantage_intune_is_jump_climb(cls, q_a):
  o = two_stages()
  q = np.full(9, -1.0)
  q[-1] = 0.0
  if q_a is not None:
    q[mdp.action_of(0, 1)] = q_a
  policy = _jump_search(q, cls)
  climb = search.JumpClimbPolicy(IntuneOptions(), jumps=())
  for state in (at(o, 100.0), at(o, 100.0, B=7), at(o, 100.0)):
    assert policy.step(state) == climb.step(state)


def test_a_reopened_search_gets_a_new_proposal():
  o = obs([knob("A/parallelism", "parallelism", 2, hi=8)], cpu_budget=8,
          costs={"A": 0.02})
  q = np.zeros(5)
  q[mdp.action_of(0, 1)] = 0.5   # A +1 proposed (climb: A +5 first)
  policy = _jump_search(q, patience=1)
  assert policy.step(at(o, 100.0)) == {"A/parallelism": 3.0}
  # Reverted, and with patience 1 the search settles.
  assert policy.step(at(o, 100.0, A=3)) == {"A/parallelism": 2.0}
  policy.step(at(o, 100.0))
  assert policy.converged
  for _ in range(10):
    assert policy.step(at(o, 100.0)) == {}
  # The rate falls by 20%: the search re-opens, the proposal first again.
  # A stream without noise (the sigma floor): the third low value alarms
  # (test_change.py).
  assert [policy.step(at(o, 80.0)) for _ in range(2)] == [{}, {}]
  assert policy.step(at(o, 80.0)) == {"A/parallelism": 3.0}
  assert policy.last_decision.action.startswith("re-open")


def test_a_decision_is_seen_only_when_its_step_is_done(monkeypatch):
  # The Keras callback reads `last_decision` on its own thread: mid-step
  # (here, while the state is saved) it still sees the last whole step's.
  monkeypatch.setattr(ranked, "SAVE_EVERY", 1)
  o = two_stages()
  q = np.zeros(9)
  q[mdp.action_of(0, 1)] = 0.5
  policy = _jump_search(q)
  policy.session = "a session"
  seen = []
  monkeypatch.setattr(policy, "_save",
                      lambda obs: seen.append(policy.last_decision))
  policy.step(at(o, 100.0))           # try A +1: on trial, nothing saved
  tried = policy.last_decision
  assert tried.action == "try A/parallelism +1" and tried.seconds >= 0
  policy.step(at(o, 100.0, A=3))      # reverted, then saved
  assert seen == [tried]
  assert policy.last_decision.action == "revert A/parallelism +1"
  assert policy.last_decision.seconds >= 0


def _trajectory(policy, pipeline, params, steps=80):
  """The configurations `policy` applies on a seeded simulator."""
  sim = simulator.Simulator(pipeline, seed=7, params=params)
  out = []
  for _ in range(steps):
    values = policy.step(sim.observe())
    if values:
      sim.set(values)
    out.append((tuple(sim.parallelism), tuple(sim.buffers)))
    sim.advance()
  return out


@pytest.mark.slow
def test_on_the_simulator_the_ablation_decides_as_jump_climb():
  # Without the allocation network's proposal, the ablation is jump-climb
  # with intune's jumps: the networks' outputs are all that differ.
  rng = np.random.default_rng(3)
  pipeline = simulator.random_pipeline(rng, events=False)
  params = simulator.random_params(rng)
  ablated = _trajectory(ranked.AblatedSearchPolicy(
      IntuneOptions(), allocator=_NoAllocation()), pipeline, params)
  climb = _trajectory(search.JumpClimbPolicy(
      IntuneOptions(), jumps=ranked.INTUNE_JUMPS), pipeline, params)
  assert ablated == climb
  # Something was searched: the configuration moved.
  assert len(set(climb)) > 1


def test_the_learned_allocation_is_tried_first_at_each_start():
  o = two_stages()  # A 2, B 2 threads on 8 CPUs; A costs 0.01, B 0.03
  # Shares 0.25 and 0.75: A 2, B 6 (A's is the threads in force).
  policy = ranked.JumpSearchPolicy(
      IntuneOptions(), jumps=(1.0,), allocator=_Shares([0.25, 0.75]))
  policy.q_values = lambda obs: np.zeros(9)
  assert policy.step(at(o, 100.0)) == {"B/parallelism": 6.0}
  assert policy.last_decision.action == f"try {allocator.LABEL}"
  # 101 is not above 102: reverted at once; then the proportional jump
  # (costs 1 : 3 of 8 threads: A 3, B 5).
  assert policy.step(at(o, 101.0, B=6)) == {"B/parallelism": 2.0}
  assert policy.step(at(o, 100.0)) == {"A/parallelism": 3.0,
                                        "B/parallelism": 5.0}
  # A new CPU budget is a new start: the allocation first again, at
  # 0.25 x 16 = 4 and 0.75 x 16 = 12 threads, B's capped at its knob's 8.
  wider = dataclasses.replace(o, cpu_budget=16, usable_cpus=16)
  assert policy.step(at(wider, 100.0, A=3, B=5)) == {
      "A/parallelism": 4.0, "B/parallelism": 8.0}


def test_intune_jumps_to_more_threads_than_cpus_after_the_proportional_jump():
  # Where the optimum holds more threads than CPUs, the allocation falls
  # short and the jump at the CPU budget does not reach: intune's second
  # jump does (INTUNE_JUMPS).
  o = two_stages()  # A 2, B 2 threads on 8 CPUs; A costs 0.01, B 0.03
  policy = ranked.JumpSearchPolicy(IntuneOptions(),
                                   allocator=_Shares([0.25, 0.75]))
  policy.q_values = lambda obs: np.zeros(9)
  assert policy.step(at(o, 100.0)) == {"B/parallelism": 6.0}
  assert policy.step(at(o, 101.0, B=6)) == {"B/parallelism": 2.0}
  # Costs 1 : 3 at 8 threads: A 3, B 5; rejected (101 is not above 102).
  assert policy.step(at(o, 100.0)) == {"A/parallelism": 3.0,
                                        "B/parallelism": 5.0}
  assert policy.step(at(o, 101.0, A=3, B=5)) == {"A/parallelism": 2.0,
                                                 "B/parallelism": 2.0}
  # At round(1.5 x 8) = 12 threads, 1 : 3 is A 3, B 9; B is capped at its
  # knob's 8 and A takes the rest: A 4, B 8, 12 threads on 8 CPUs.
  assert policy.step(at(o, 100.0)) == {"A/parallelism": 4.0,
                                        "B/parallelism": 8.0}
  assert policy.last_decision.action == "try proportional at 1.5 x 8 CPUs"


class _Shares(allocator.Allocator):
  """An allocator whose network outputs `shares` (one per knob)."""

  def __init__(self, shares):
    super().__init__(constant=0.0)
    self.given = np.asarray(shares, np.float32)

  def shares(self, obs):
    return self.given


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_default_policy_gives_a_cheap_stage_one_thread_on_short_cores(
    seed):
  # 3 stages on 2 CPUs, each starting at 2 threads: 6 threads on 2 cores.
  # With contention (each thread beyond the CPUs costs every stage 20%) and
  # stages that wait on each other (k = 4), the cheap last stage's second
  # thread costs the others more than it gives: the optimum is [2, 2, 1].
  stages = (simulator.SimStage("Stage2.Stage1.Stage0", 0.01),
            simulator.SimStage("Stage2.Stage1", 0.01),
            simulator.SimStage("Stage2", 0.002, buffer=True))
  pipeline = simulator.SimPipeline(stages, cpus=2, memory_limit=1e12,
                                   ram_budget=64 * simulator.MB)
  params = simulator.SimParams(oversubscription=0.2, pipelining=4.0)
  best, threads, _ = simulator.optimum(pipeline, params=params)
  assert threads == [2, 2, 1]
  # Contention 1 + 0.2 x (6 / 2 - 1) = 1.4 against 1.3 at 5 threads.
  assert best > 1.05 * simulator.throughput(stages, [2, 2, 2], [0, 0, 0], 2,
                                            params=params)
  sim = simulator.Simulator(pipeline, seed=seed, params=params)
  sim.set({k.name: 2.0 for k in sim.knobs() if k.kind == "parallelism"})
  policy = registry.create(IntuneOptions())
  assert isinstance(policy, ranked.JumpSearchPolicy)
  trajectory = []
  for _ in range(60):
    values = policy.step(sim.observe())
    if values:
      sim.set(values)
    trajectory.append(tuple(sim.parallelism))
    sim.advance()
  # Reached within 30 steps, and kept from there on.
  assert (2, 2, 1) in trajectory[:30], trajectory
  assert all(t == (2, 2, 1) for t in trajectory[30:])
  assert policy.converged
