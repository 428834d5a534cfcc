"""Tests of intune_tf.sim.simulator: the throughput model, optimum, dynamics."""

import dataclasses
import itertools
import math

import numpy as np
import pytest

from intune_tf import records
from intune_tf.live import registry
from intune_tf.options import IntuneOptions
from intune_tf.sim import simulator as sim

MB = 1 << 20
TWO = (sim.SimStage("A", 0.01), sim.SimStage("B", 0.02))


@pytest.mark.parametrize("parallelism,cpus,expected", [
    # 3 threads on 4 CPUs: no contention. Capacities 1/.01 = 100 and
    # 2/.02 = 100; CPU bound 4 / .03 = 133: 100.
    ((1, 2), 4, 100.0),
    # 6 threads on 4 CPUs: contention 1 + 0.15 * (6/4 - 1) = 1.075. Costs
    # .01075 and .0215; capacities 279 and 139.5; CPU 4 / .03225 = 124.03.
    ((3, 3), 4, 4 / 0.03225),
    # Two threads on one CPU: contention 1 + 0.15 * (2 - 1) = 1.15; the CPU
    # bound 1 / (.03 * 1.15) = 28.99 rules.
    ((1, 1), 1, 1 / (0.03 * 1.15)),
])
def test_throughput_by_hand(parallelism, cpus, expected):
  assert sim.throughput(TWO, parallelism, (0, 0), cpus) == pytest.approx(
      expected)


def test_consumer_bounds_throughput():
  # The consumer takes 20 ms per element: 50/s whatever the pipeline does.
  assert sim.throughput(TWO, (4, 4), (0, 0), 8, consumer_step_s=0.02) == (
      pytest.approx(50.0))


def test_jitter_costs_and_buffers_recover():
  stage = (sim.SimStage("A", 0.01, cv=1.0),)
  # cv 1: variability 1/2; busy 1; loss 0.5 * 0.5 * 1 = 0.25 -> 75/s.
  assert sim.throughput(stage, (1,), (0,), 1) == pytest.approx(75.0)
  # A buffer of 3 does not help a stage that is always busy (busy ** 4 = 1),
  # but one that is 50% busy loses 0.25 * 0.5 ** 4 with it.
  assert sim.throughput(stage, (1,), (3,), 1, consumer_step_s=0.02) == (
      pytest.approx(50 * (1 - 0.25 * 0.5 ** 4)))


@pytest.mark.parametrize("bounds,k,expected", [
    ([3, 4], 2.0, 2.4),  # (1/9 + 1/16) ** -1/2 = (25/144) ** -1/2 = 12/5
    ([3, 4], math.inf, 3.0),
    ([2, 2], 1.0, 1.0),  # (1/2 + 1/2) ** -1
    ([0, 5], 2.0, 0.0),
])
def test_softmin_by_hand(bounds, k, expected):
  assert sim.softmin(bounds, k) == pytest.approx(expected)


def test_imperfect_pipelining_rewards_threads_beyond_the_bottleneck():
  params = sim.SimParams(oversubscription=0.0, pipelining=2.0)
  # (1, 2) on 4 CPUs: bounds 100, 100 and 4 / .03 = 133.3:
  # (2 / 100^2 + (.03 / 4)^2) ** -1/2 = (2.5625e-4) ** -1/2 = 62.47.
  assert sim.throughput(TWO, (1, 2), (0, 0), 4, params=params) == (
      pytest.approx(2.5625e-4 ** -0.5))
  # (2, 4): bounds 200, 200, 133.3: (5e-5 + 5.625e-5) ** -1/2 = 97.0; the
  # hard minimum gives 100 for both allocations.
  assert sim.throughput(TWO, (2, 4), (0, 0), 4, params=params) == (
      pytest.approx(1.0625e-4 ** -0.5))


def _grid_best(pipeline, cpus, params=sim.SimParams()):  # noqa: B008
  n = len(pipeline.stages)
  limit = sim.cpu_limit(n, cpus)
  best = 0.0
  for par in itertools.product(range(1, cpus + 1), repeat=n):
    if sum(par) > limit:
      continue
    best = max(best, sim.throughput(pipeline.stages, par, (0,) * n, cpus,
                                    params=params))
  return best


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("params,rel", [
    (sim.SimParams(), 1e-9),  # hard minimum: the greedy rule is exact
    (sim.SimParams(oversubscription=0.1, pipelining=3.0), 0.01),
    (sim.SimParams(oversubscription=0.0, pipelining=2.0), 0.01),
])
def test_optimum_matches_a_grid_search(seed, params, rel):
  rng = np.random.default_rng(seed)
  stages = tuple(sim.SimStage(f"S{i}", float(rng.lognormal(-5, 1)))
                 for i in range(3))
  cpus = int(rng.integers(3, 7))
  pipeline = sim.SimPipeline(stages, cpus, memory_limit=1e12, ram_budget=0)
  rate, par, buf = sim.optimum(pipeline, params=params)
  assert rate == pytest.approx(_grid_best(pipeline, cpus, params), rel=rel)
  assert sum(par) <= sim.cpu_limit(3, cpus) and buf == [0, 0, 0]


@pytest.mark.parametrize("parallelism,cpus,expected", [
    # 5 threads on 2 CPUs: contention 1 + 0.5 * (5 / 2 - 1) = 1.75; only
    # the stage with more threads than CPUs pays the 0.1 hand-off:
    # 1 * 1.75 = 1.75 and 2 * 1.75 + 0.1 = 3.6.
    ((2, 3), 2, [1.75, 3.6]),
    # 5 threads on 8 CPUs: no contention, no hand-off.
    ((2, 3), 8, [1.0, 2.0]),
    # 2 threads on 1 CPU: 1 + 0.5 * (2 - 1) = 1.5; neither stage has more
    # than one thread.
    ((1, 1), 1, [1.5, 3.0]),
])
def test_effective_costs_by_hand(parallelism, cpus, expected):
  params = sim.SimParams(oversubscription=0.5, handoff_s=0.1)
  got = sim.effective_costs([1.0, 2.0], parallelism, cpus, params)
  assert got == pytest.approx(expected)


def test_random_params_cover_cheap_and_costly_machines():
  rng = np.random.default_rng(0)
  params = [sim.random_params(rng) for _ in range(200)]
  assert all(0 <= p.oversubscription <= 0.3 for p in params)
  assert {p.pipelining for p in params} == {2.0, 3.0, 4.0, 8.0, math.inf}


def test_optimum_fills_buffers_within_the_ram_budget():
  stages = (sim.SimStage("A", 0.01, cv=1.0, buffer=True,
                         bytes_per_element=4 * MB),
            sim.SimStage("B", 0.01, cv=1.0, buffer=True,
                         bytes_per_element=4 * MB))
  pipeline = sim.SimPipeline(stages, 4, memory_limit=1e12,
                             ram_budget=20 * MB)
  rate, _, buf = sim.optimum(pipeline)
  assert sum(buf) * 4 * MB <= 20 * MB and sum(buf) >= 4
  assert rate > sim.optimum(pipeline, ram_budget=0)[0]


def test_simulator_oom_resize_and_determinism():
  stages = (sim.SimStage("A", 0.01),
            sim.SimStage("B", 0.01, buffer=True, bytes_per_element=MB))
  pipeline = sim.SimPipeline(stages, 8, memory_limit=40 * MB,
                             ram_budget=100 * MB, resize=((2, 2),))
  s = sim.Simulator(pipeline, seed=3)
  s.set({"A/parallelism": 8, "B/parallelism": 4})
  assert s.parallelism == [8, 4] and not s.oom
  s.advance()
  s.advance()  # step 2: 8 -> 2 CPUs, parallelism clamped
  assert s.cpus == 2 and s.parallelism == [2, 2]
  s.set({"B/buffer_size": 60})  # 60 x 1 MB > 40 MB limit
  assert s.oom and s.true_rate() == 0.0
  a = sim.Simulator(pipeline, seed=7).observe()
  b = sim.Simulator(pipeline, seed=7).observe()
  assert a.output_rate == b.output_rate
  assert isinstance(a, records.Observation)
  assert [k.name for k in a.knobs] == [
      "A/parallelism", "B/parallelism", "B/buffer_size"]


@pytest.mark.parametrize("policy", ["even", "analytic", "unoptimized"])
def test_baseline_policies_run_unchanged_on_the_simulator(policy):
  rng = np.random.default_rng(0)
  pipeline = sim.random_pipeline(rng, cpus=(8, 8), events=False)
  s = sim.Simulator(pipeline, seed=0)
  p = registry.create(IntuneOptions(policy=policy))
  for _ in range(5):
    s.set(p.step(s.observe()))
    s.advance()
  assert 0 < s.true_rate() <= s.optimum()[0] * (1 + 1e-9)


def test_random_pipelines_span_the_issue_ranges():
  rng = np.random.default_rng(0)
  pipes = [sim.random_pipeline(rng) for _ in range(300)]
  sizes = {len(p.stages) for p in pipes}
  cpus = [p.cpus for p in pipes]
  assert sizes == set(range(3, 9))
  assert min(cpus) == 2 and max(cpus) >= 100
  assert any(p.resize for p in pipes) and any(p.memory_events for p in pipes)
  costs = np.concatenate([[s.cost_s for s in p.stages] for p in pipes])
  # Heavy tail: the largest cost is far above the median.
  assert costs.max() / np.median(costs) > 20


@pytest.mark.parametrize("threads,cpus,background,expected", [
    (12, 8, 0, 8.0),        # no co-tenant: every CPU
    (12, 8, 4, 6.0),        # max(8 - 4, 8 x 12 / 16 = 6)
    (2, 8, 4, 4.0),         # max(8 - 4, 8 x 2 / 6 = 2.67)
])
def test_available_cpus_beside_a_cotenant(threads, cpus, background,
                                          expected):
  assert sim.available_cpus(threads, cpus, background) == pytest.approx(
      expected)


def test_a_cotenant_slows_the_pipeline_and_its_optimum():
  # (3, 3) on 4 CPUs with 2 busy threads beside: contention 1 + 0.15 x
  # (8/4 - 1) = 1.15, costs .0115 and .023; CPUs max(2, 4 x 6/8) = 3;
  # capacities 260.9 and 130.4, CPU bound 3 / .0345 = 86.96.
  assert sim.throughput(TWO, (3, 3), (0, 0), 4, background=2) == (
      pytest.approx(3 / 0.0345))
  pipeline = sim.SimPipeline(TWO, 4, memory_limit=1e12, ram_budget=1e9)
  assert sim.optimum(pipeline, background=2)[0] < sim.optimum(pipeline)[0]


def test_cotenant_cost_and_memory_pressure_events():
  stages = (sim.SimStage("A", 0.01),
            sim.SimStage("B", 0.02, buffer=True, bytes_per_element=MB))
  pipeline = sim.SimPipeline(
      stages, 8, memory_limit=400 * MB, ram_budget=40 * MB,
      cotenant_events=((1, 4), (3, 0)), cost_events=((2, 1, 2.0),),
      pressure_events=((4, 10 * MB),), noise=0.0)
  s = sim.Simulator(pipeline, seed=0)
  s.set({"A/parallelism": 2, "B/parallelism": 4, "B/buffer_size": 30})
  alone = s.true_rate()
  s.advance()  # step 1: 4 busy threads beside the pipeline
  assert s.background == 4 and s.true_rate() < alone
  # The pipeline observes the same CPUs: only its rate and costs tell.
  assert s.observe().usable_cpus == 8
  s.advance()  # step 2: B's cost doubles
  assert s.costs == [0.01, 0.04]
  s.advance()  # step 3: the co-tenant leaves
  assert s.background == 0
  s.advance()  # step 4: 30 MB taken: budget 10 MB, buffer 30 -> 10
  assert s.ram_budget == 10 * MB and s.buffers[1] == 10
  assert s.memory_limit == 370 * MB and not s.oom
  assert s.observe().ram_budget == 10 * MB
  assert s.state_key() == (8, 0.0, 10 * MB, (0.01, 0.04))


@pytest.mark.parametrize("seed", range(3))
def test_buffers_only_raise_the_rate_as_the_optimum_assumes(seed):
  # `optimum` buffers only the totals whose rate at full buffers can still
  # beat the best found: sound when one more element never lowers a rate.
  rng = np.random.default_rng(seed)
  pipe = sim.random_pipeline(rng, cpus=(4, 12), events=False)
  params = sim.random_params(rng)
  rate, par, buf = sim.optimum(pipe, params=params)
  assert sim.throughput(pipe.stages, par, buf, pipe.cpus,
                        pipe.consumer_step_s, params) == pytest.approx(rate)
  for threads in itertools.product(range(1, 4), repeat=len(pipe.stages)):
    par = [t if st.tunable else 1 for t, st in zip(threads, pipe.stages)]
    rates = [sim.throughput(pipe.stages, par,
                            [b if st.buffer else 0 for st in pipe.stages],
                            pipe.cpus, pipe.consumer_step_s, params)
             for b in (0, 1, 4, sim.MAX_BUFFER)]
    assert rates == sorted(rates)


@pytest.mark.parametrize("params", [
    sim.SimParams(),
    sim.SimParams(oversubscription=0.4, handoff_s=2e-3, pipelining=2.0),
    sim.SimParams(oversubscription=0.0, handoff_s=0.0, pipelining=1.0),
])
def test_throughput_batch_is_throughput_over_arrays(params):
  rng = np.random.default_rng(7)
  stages = [sim.SimStage(f"S{i}", float(rng.uniform(1e-4, 1e-2)),
                         cv=float(rng.uniform(0.0, 1.5))) for i in range(4)]
  par = rng.integers(1, 7, size=(3, 20, 4)).astype(float)
  buf = rng.integers(0, 5, size=(3, 20, 4)).astype(float)
  cpus = rng.integers(1, 9, size=(3, 20)).astype(float)
  scales = np.array([0.5, 1.0, 1.3])[:, None, None]
  costs = np.array([st.cost_s for st in stages]) * scales
  batch = sim.throughput_batch(costs, [st.cv for st in stages], par, buf,
                               cpus, params)
  assert batch.shape == (3, 20)
  for k, n in itertools.product(range(3), range(20)):
    scaled = [dataclasses.replace(st, cost_s=st.cost_s * scales[k, 0, 0])
              for st in stages]
    assert batch[k, n] == pytest.approx(sim.throughput(
        scaled, par[k, n], buf[k, n], cpus[k, n], 0.0, params), rel=1e-12)
