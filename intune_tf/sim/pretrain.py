"""Offline pretraining of the agent in the simulator, and scoring policies.

`intune pretrain --seed S --out PATH` trains a fresh agent on randomized
simulated pipelines (`simulator.random_pipeline`: 3-8 stages, 2-128 CPUs,
heavy-tailed costs, resize and memory events) on randomized machines
(`simulator.random_params`: oversubscription cost, pipelining).
`intune simulate` (`compare`) scores the agent and the non-learning baselines
(`BASELINES`) against the simulator's optimum on random pipelines, and each
against the best baseline.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import Callable, Mapping

from absl import logging
import numpy as np

from intune_tf import arguments
from intune_tf.agent import allocator as allocator_lib
from intune_tf.agent import dqn
from intune_tf.agent import ranked
from intune_tf.options import IntuneOptions
from intune_tf.sim import cluster
from intune_tf.sim import simulator as sim_lib
from intune_tf.tuning import env as env_lib
from intune_tf.tuning import mdp
from intune_tf.tuning import policies
from intune_tf.tuning import search

EPISODE_STEPS = 120
# Share of exploratory moves that follow `guided_action`.
GUIDED_SHARE = 0.5


def epsilon_at(step: int, total: int, start: float = 1.0, end: float = 0.05,
               fraction: float = 0.5) -> float:
  """Linear exploration schedule: `start` -> `end` over `fraction` of
  `total` steps, then `end`. epsilon_at(25, 100) == 0.525: 1 - 0.95 * 25/50."""
  span = max(1, int(total * fraction))
  return end if step >= span else start + (end - start) * step / span


def guided_action(obs, mask: np.ndarray, rng: np.random.Generator) -> int:
  """An exploratory move towards the proportional (analytic) allocation.

  Half of pretraining's exploration uses it instead of a uniform random
  move, so the replay holds many transitions that rebalance threads (free
  one stage's threads, give them to the bottleneck), which uniform
  exploration rarely strings together on 100-CPU pipelines. The agent
  still learns from rewards (off-policy), so it can beat the guide.
  """
  parallel = [i for i, k in enumerate(obs.knobs) if k.kind == "parallelism"]
  costs = mdp.stage_costs(obs)
  if not parallel or not costs:
    return int(rng.choice(np.flatnonzero(mask)))
  target = policies.proportional_allocation(
      [costs.get(obs.knobs[i].stage, 0.0) for i in parallel], obs.cpu_budget,
      [obs.knobs[i].max for i in parallel])
  gaps = {i: t - obs.knobs[i].value for i, t in zip(parallel, target)}
  for i in sorted(gaps, key=lambda i: -abs(gaps[i])):
    gap = gaps[i]
    if gap == 0:
      break
    move = (5 if gap >= 5 else 1) if gap > 0 else (-5 if gap <= -5 else -1)
    if mask[mdp.action_of(i, move)]:
      return mdp.action_of(i, move)
  return int(rng.choice(np.flatnonzero(mask)))


def _start(sim: sim_lib.Simulator, rng: np.random.Generator) -> None:
  """Episodes start at the even split (the live tuner's usual start) or at a
  random allocation, half and half."""
  obs = sim.observe()
  if rng.random() < 0.5:
    values = policies.EvenPolicy(IntuneOptions()).step(obs)
  else:
    values = {}
    for k in obs.knobs:
      hi = k.max if k.kind == "parallelism" else 16
      values[k.name] = float(rng.integers(int(max(k.min, 1)), int(hi) + 1))
  sim.set(values)
  fix = _fit(sim.observe())
  if fix:
    sim.set(fix)


def _fit(obs) -> dict[str, float]:
  # Deferred: the online policy loads TensorFlow (warm start, rewrites);
  # the simulation part must not at import.
  from intune_tf.agent import policy as agent_lib  # noqa: PLC0415
  return agent_lib.project_to_budget(obs)


def pretrain(seed: int = 0, steps: int = 60_000, train_every: int = 2,
             progress: bool = True, agent: dqn.Agent | None = None,
             make_pipeline: Callable[[np.random.Generator],
                                     sim_lib.SimPipeline] | None = None,
             make_params: Callable[[np.random.Generator],
                                   sim_lib.SimParams] | None = None
             ) -> tuple[dqn.Agent, dict]:
  """Trains an agent in the simulator.

  Args:
    seed: seeds pipelines, noise, network and exploration. Default 0.
    steps: simulator steps (tuning periods). Default 60,000.
    train_every: simulator steps per gradient step. Default 2.
    progress: show a progress bar. Default True.
    agent: continue training this agent. Default: a fresh one.
    make_pipeline: pipeline generator. Default `simulator.random_pipeline`.
    make_params: machine generator. Default `simulator.random_params`.

  Returns:
    (agent, statistics of the run).
  """
  rng = np.random.default_rng(seed)
  agent = agent or dqn.Agent(seed=seed)
  make_pipeline = make_pipeline or sim_lib.random_pipeline
  make_params = make_params or sim_lib.random_params
  bar = None
  if progress:
    # Deferred: optional, from the [bench] extra.
    import tqdm  # noqa: PLC0415
    bar = tqdm.tqdm(total=steps, desc="pretrain", unit="step")
  t0 = time.time()
  collector = dqn.Collector(agent, learn_every=train_every)
  step, episodes, recent = 0, 0, []
  while step < steps:
    sim = sim_lib.Simulator(make_pipeline(rng), seed=int(rng.integers(2**31)),
                            params=make_params(rng))
    _start(sim, rng)
    collector.begin()
    obs = sim.observe()
    state, mask = mdp.features(obs), mdp.action_mask(obs)
    for _ in range(EPISODE_STEPS):
      eps = epsilon_at(step, steps)
      if rng.random() < eps * GUIDED_SHARE:
        a = guided_action(obs, mask, rng)
      else:
        a = agent.act(state, mask, eps * (1 - GUIDED_SHARE))
      sim.set(mdp.apply_action(obs, a))
      collector.acted(state, a)
      sim.advance()
      fix = _fit(sim.observe())
      if fix:
        sim.set(fix)
      obs = sim.observe()
      state, mask, _, _ = collector.collect(obs, done=sim.oom)
      step += 1
      if bar is not None:
        bar.update(1)
      if sim.oom or step >= steps:
        break
    episodes += 1
    opt = sim.optimum()[0]
    recent.append(sim.true_rate() / opt if opt > 0 else 1.0)
    if bar is not None and episodes % 20 == 0:
      bar.set_postfix(of_optimum=f"{np.median(recent[-100:]):.3f}")
  if bar is not None:
    bar.close()
  stats = {"steps": steps, "episodes": episodes, "seconds": time.time() - t0,
           "gradient_steps": agent.gradient_steps,
           "final_of_optimum_median_last100": float(np.median(recent[-100:]))}
  return agent, stats


# The dynamic pipelines of the allocation network's training data are
# `dynamic_pipelines(count, ALLOCATOR_DATA_SEED + seed)`: apart from the
# evaluation sets (1234, 1, 2, 3) and the tuning set (99).
ALLOCATOR_DATA_SEED = 555


def allocation_samples(count: int = 150, seed: int = ALLOCATOR_DATA_SEED,
                       every: int = 2) -> tuple[np.ndarray, np.ndarray]:
  """The allocation network's training data: the states `jump-climb` meets
  on `dynamic_pipelines(count, seed)` (every `every`th step, once the
  pipeline returned elements), each parallelism knob's feature row
  (`mdp.features`) with its threads at the optimum of that state, as a
  share of the CPU budget.

  Returns:
    (rows [n, mdp.NUM_FEATURES], shares [n]).
  """
  rows, shares = [], []
  for i, (pipe, params) in enumerate(dynamic_pipelines(count, seed)):
    sim = sim_lib.Simulator(pipe, seed=i, params=params)
    sim.set(policies.EvenPolicy(IntuneOptions()).step(sim.observe()))
    policy = search.JumpClimbPolicy(IntuneOptions())
    stage_of = {name: j for name, _, j in sim.pipeline.knob_names()}
    optima: dict[tuple, list[int]] = {}
    for t in range(DYNAMIC_STEPS):
      obs = sim.observe()
      if t % every == 0 and obs.output_rate > 0:
        key = sim.state_key()
        if key not in optima:
          optima[key] = sim.optimum()[1]
        parallel = [j for j, k in enumerate(obs.knobs)
                    if k.kind == "parallelism"]
        rows.append(mdp.features(obs)[parallel])
        shares.append([optima[key][stage_of[obs.knobs[j].name]] /
                       max(1, obs.cpu_budget) for j in parallel])
      env_lib.policy_step(sim, policy, obs)
      sim.advance()
  return (np.concatenate(rows).astype(np.float32),
          np.concatenate(shares).astype(np.float32))


def pretrain_allocator(seed: int = 0, pipelines: int = 150,
                       epochs: int = 8) -> tuple[list[np.ndarray], dict]:
  """Trains the allocation network (`allocator.build_network`) on
  `allocation_samples(pipelines, ALLOCATOR_DATA_SEED + seed)`: Huber loss,
  Adam 1e-3, batches of 512, 10% held out.

  Args:
    seed: seeds the data's pipelines and the network. Default 0.
    pipelines: dynamic pipelines of training data. Default 150.
    epochs: passes over the data. Default 8.

  Returns:
    (weights, statistics: samples, seconds, the held-out mean |error| of
    the network and of the threads in force, and `mean_share`, the mean
    target, which the ablation proposes for every knob).
  """
  # Deferred: Keras only to train: proposing runs the weights in numpy.
  import keras  # noqa: PLC0415
  t0 = time.time()
  x, y = allocation_samples(pipelines, ALLOCATOR_DATA_SEED + seed)
  order = np.random.default_rng(seed).permutation(len(x))
  x, y = x[order], y[order]
  held = max(1, len(x) // 10)
  network = allocator_lib.build_network(seed=seed)
  network.compile(keras.optimizers.Adam(1e-3), keras.losses.Huber())
  network.fit(x[held:], y[held:], batch_size=512, epochs=epochs, verbose=0)
  weights = [np.asarray(w, np.float32) for w in network.get_weights()]
  predicted = dqn.forward(weights, x[:held])[:, 0]
  value = x[:held, mdp.FEATURE_NAMES.index("value")]
  stats = {"samples": int(len(x)), "pipelines": pipelines, "epochs": epochs,
           "seconds": time.time() - t0,
           "held_out_error": float(np.mean(np.abs(predicted - y[:held]))),
           "held_out_error_of_threads_in_force": float(
               np.mean(np.abs(value - y[:held]))),
           "mean_share": float(y[held:].mean())}
  return weights, stats


def move_gains(sim: sim_lib.Simulator, obs) -> tuple[np.ndarray, np.ndarray]:
  """Every valid move's one-step gain from the simulator's state: the
  noise-free throughput after the move / before it - 1, times
  `search.GAIN_SCALE` (-1 x `search.GAIN_SCALE` for a move into an OOM).
  The state is restored after each move.

  Returns:
    (gains, mask), both of length 4n + 1 (the no-op's gain is 0).
  """
  mask = mdp.action_mask(obs)
  gains = np.zeros(len(mask), np.float32)
  restore = {k.name: k.value for k in obs.knobs}
  now = max(sim.true_rate(), 1e-12)
  for a in np.flatnonzero(mask[:-1]):
    sim.set(mdp.apply_action(obs, int(a)))
    gains[a] = search.GAIN_SCALE * (
        (0.0 if sim.oom else sim.true_rate()) / now - 1)
    sim.oom = False
    sim.set(restore)
  return gains, mask.astype(np.float32)


def pretrain_ranker(seed: int = 0, steps: int = 30_000,
                    init: str | None = None, learn_per_step: int = 2,
                    explore: float = 0.3, batch_size: int = 64,
                    capacity: int = 50_000, progress: bool = True,
                    jumps: tuple[float, ...] = ()):
  """Trains the Q-network's advantages for `intune-search`
  (`ranked.RankedSearchPolicy`) in the simulator.

  Episodes are run by the ranked search itself (with climb's order in
  `explore` of the steps, and its `jumps` first), so states are those it
  visits. At every step,
  each valid move is tried in the simulator and its one-step gain
  (`move_gains`) recorded; gradient steps regress each move's advantage
  over the no-op, Q(s, a) - Q(s, no-op) (`dqn.flat_q`), on its gain (Huber
  loss, Adam 1e-3): a Q-function with discount 0 trained on the
  simulator's counterfactuals, so the ranking does not rest on the
  small differences of bootstrapped values.

  Args:
    seed: seeds pipelines, noise, network and exploration. Default 0.
    steps: simulator steps. Default 30,000.
    init: weights to start from. Default: the shipped agent's.
    learn_per_step: gradient steps per simulator step. Default 2.
    explore: share of steps that follow climb's order. Default 0.3.
    batch_size: states per gradient step. Default 64.
    capacity: states kept. Default 50,000.
    progress: show a progress bar. Default True.
    jumps: the search's proportional jumps (`ranked.RankedSearchPolicy`'s
      `jumps`; `search.JUMP_FRACTIONS` for intune-jump). Default () (none).

  Returns:
    (weights, statistics of the run).
  """
  # Deferred: TensorFlow only to train: acting and the simulator use numpy.
  import keras  # noqa: PLC0415
  import tensorflow as tf  # noqa: PLC0415
  rng = np.random.default_rng(seed)
  network = dqn.build_network(seed=seed)
  network.set_weights(dqn.load_weights(init or ranked.AGENT_WEIGHTS)[0])
  optimizer = keras.optimizers.Adam(1e-3)
  k, actions = dqn.MAX_KNOBS, mdp.MOVES_PER_KNOB * dqn.MAX_KNOBS + 1
  states = np.zeros((capacity, k, mdp.NUM_FEATURES), np.float32)
  knobs = np.zeros((capacity, k), np.float32)
  gains = np.zeros((capacity, actions - 1), np.float32)
  masks = np.zeros((capacity, actions - 1), np.float32)
  huber = keras.losses.Huber(reduction="none")

  @tf.function(reduce_retracing=True)
  def train(state, knob_mask, gain, mask):
    with tf.GradientTape() as tape:
      per_knob = network(state, training=True)
      # The network is dqn's: its private output layout.
      moves = tf.gather(per_knob, dqn._MOVE_OUTPUTS, axis=2)  # noqa: SLF001
      flat = tf.reshape(moves, [tf.shape(state)[0], -1])
      noop = tf.reduce_sum(
          per_knob[:, :, dqn._STAY] * knob_mask, 1) / (  # noqa: SLF001
              tf.maximum(tf.reduce_sum(knob_mask, 1), 1.0))
      error = (flat - noop[:, None] - gain)[..., None]
      loss = tf.reduce_sum(huber(tf.zeros_like(error), error) * mask) / (
          tf.maximum(tf.reduce_sum(mask), 1.0))
    grads = tape.gradient(loss, network.trainable_variables)
    optimizer.apply_gradients(zip(grads, network.trainable_variables))
    return loss

  bar = None
  if progress:
    # Deferred: optional, from the [bench] extra.
    import tqdm  # noqa: PLC0415
    bar = tqdm.tqdm(total=steps, desc="pretrain ranker", unit="step")
  opts = IntuneOptions()
  t0 = time.time()
  step = episodes_run = size = slot = 0
  losses: list[float] = []
  while step < steps:
    sim = sim_lib.Simulator(sim_lib.random_pipeline(rng),
                            seed=int(rng.integers(2**31)),
                            params=sim_lib.random_params(rng))
    _start(sim, rng)
    weights = [np.asarray(w) for w in network.get_weights()]
    policy = ranked.RankedSearchPolicy(opts, agent_weights=weights,
                                       jumps=jumps)
    for _ in range(EPISODE_STEPS):
      obs = sim.observe()
      n = len(obs.knobs)
      if 0 < n <= k:
        g, m = move_gains(sim, obs)
        states[slot] = 0
        states[slot, :n] = mdp.features(obs)
        knobs[slot] = 0
        knobs[slot, :n] = 1
        gains[slot] = 0
        masks[slot] = 0
        gains[slot, :4 * n] = g[:-1]
        masks[slot, :4 * n] = m[:-1]
        slot, size = (slot + 1) % capacity, min(size + 1, capacity)
      if step % 10 == 0:
        policy.weights = [np.asarray(w) for w in network.get_weights()]
      policy.order = "climb" if rng.random() < explore else "q"
      env_lib.policy_step(sim, policy, obs)
      sim.advance()
      fix = _fit(sim.observe())
      if fix:
        sim.set(fix)
      step += 1
      if size >= batch_size:
        for _ in range(learn_per_step):
          i = rng.integers(0, size, batch_size)
          losses.append(float(train(states[i], knobs[i], gains[i], masks[i])))
      if bar is not None:
        bar.update(1)
      if sim.oom or step >= steps:
        break
    episodes_run += 1
  if bar is not None:
    bar.close()
  stats = {"steps": steps, "episodes": episodes_run,
           "seconds": time.time() - t0,
           "gradient_steps": len(losses),
           "loss_last500": float(np.mean(losses[-500:])) if losses else None}
  return [np.asarray(w, np.float32) for w in network.get_weights()], stats


@dataclasses.dataclass(frozen=True)
class Episode:
  """What one policy did on one simulated pipeline.

  Attributes:
    rate: mean noise-free throughput of the last `tail` steps (0 after an
      OOM).
    of_optimum: `rate` / the optimum at the end.
    steps_to_95: the first step whose noise-free throughput reached 95% of
      the optimum in force (recomputed every `OPTIMUM_EVERY` steps when
      costs drift), or None if none did.
    changes: steps that changed the configuration in force.
    tail_changes: those among the last `tail` steps.
  """
  rate: float
  of_optimum: float
  steps_to_95: int | None
  changes: int
  tail_changes: int


# Steps between recomputations of the optimum of a pipeline whose costs
# drift, for `Episode.steps_to_95`.
OPTIMUM_EVERY = 5


class _Optima:
  """`simulator.optimum` of a pipeline's state, computed once per state
  (CPUs and costs): the policies of one comparison see the same cost path
  (the noise and drift of a seeded simulator do not depend on the policy),
  so they share the computations."""

  def __init__(self):
    self._cache: dict[tuple, float] = {}

  def __call__(self, sim: sim_lib.Simulator) -> float:
    key = (id(sim.pipeline),) + sim.state_key()
    if key not in self._cache:
      self._cache[key] = sim.optimum()[0]
    return self._cache[key]


def _policy_step(sim: sim_lib.Simulator, policy: policies.Policy) -> bool:
  """One step of `policy` on `sim` (`env.policy_step`), then a tuning
  period. Returns whether the configuration changed."""
  changed = env_lib.policy_step(sim, policy).changed
  sim.advance()
  return changed


def run_episode(policy: policies.Policy, sim: sim_lib.Simulator,
                steps: int = EPISODE_STEPS, tail: int = 20,
                optima: Callable[[sim_lib.Simulator], float] | None = None
                ) -> Episode:
  """Steps `policy` on `sim` for `steps` tuning periods.

  Args:
    policy: the policy.
    sim: the simulator, at the start configuration.
    steps: tuning periods. Default `EPISODE_STEPS` (120).
    tail: last steps whose throughput is the score. Default 20.
    optima: the optimum of a simulator's state (a shared `_Optima` cache).
      Default: computed.
  """
  optima = optima or (lambda s: s.optimum()[0])
  rates, changed = [], []
  reached, optimum = None, None
  for t in range(steps):
    changed.append(_policy_step(sim, policy))
    rates.append(sim.true_rate())
    if reached is None:
      if optimum is None or (sim.pipeline.drift and t % OPTIMUM_EVERY == 0):
        optimum = optima(sim)
      if rates[-1] >= 0.95 * optimum:
        reached = t + 1
  rate = float(np.mean(rates[-tail:]))
  opt = optima(sim)
  return Episode(rate=rate, of_optimum=rate / opt if opt > 0 else 1.0,
                 steps_to_95=reached, changes=int(sum(changed)),
                 tail_changes=int(sum(changed[-tail:])))


def run_policy(policy: policies.Policy, sim: sim_lib.Simulator,
               steps: int = EPISODE_STEPS, tail: int = 20) -> float:
  """Steps `policy` on `sim`; the mean noise-free throughput of the last
  `tail` steps (0 after an OOM)."""
  return run_episode(policy, sim, steps, tail).rate


# The dynamic suite's events (`dynamic_pipelines`), each at a fraction of
# the run: 60, 120, 180, 240, 300 and 350 of 400 steps.
EVENTS = (("CPUs halved", 0.15), ("CPUs doubled", 0.3),
          ("co-tenant arrives", 0.45), ("co-tenant leaves", 0.6),
          ("a stage's cost doubles", 0.75), ("memory pressure", 0.875))
DYNAMIC_STEPS = 400


def event_steps(steps: int) -> list[int]:
  """The steps of `EVENTS` in a run of `steps`: round(fraction x steps).

  event_steps(400) == [60, 120, 180, 240, 300, 350].
  """
  return [int(round(f * steps)) for _, f in EVENTS]


def dynamic_pipelines(count: int = 200, seed: int = 1234,
                      steps: int = DYNAMIC_STEPS):
  """`evaluation_pipelines(count, seed)` without cost drift, each with the
  events of `EVENTS` at `event_steps(steps)`: its C CPUs halved (at least
  2), then back to C; a co-tenant keeping C / 2 threads busy on the same
  CPUs (the pipeline still observes C usable CPUs), then gone; the cost of
  its costliest tunable stage doubled; and a quarter of its RAM budget
  left to it (memory taken from outside).

  Returns:
    [(SimPipeline, SimParams)] of length `count`.
  """
  at = event_steps(steps)
  out = []
  for pipe, params in evaluation_pipelines(count, seed):
    tunable = [i for i, st in enumerate(pipe.stages) if st.tunable]
    costliest = max(tunable, key=lambda i: pipe.stages[i].cost_s)
    c = pipe.cpus
    out.append((dataclasses.replace(
        pipe, drift=0.0, resize=((at[0], max(2, c // 2)), (at[1], c)),
        cotenant_events=((at[2], max(1, c // 2)), (at[3], 0)),
        cost_events=((at[4], costliest, 2.0),),
        pressure_events=((at[5], pipe.ram_budget / 4),)), params))
  return out


@dataclasses.dataclass(frozen=True)
class DynamicEpisode:
  """What one policy did on one pipeline of the dynamic suite.

  Attributes:
    regret: rows lost against the per-phase oracle, as a fraction: 1 -
      (sum of the noise-free rates) / (sum of each step's phase optimum).
    recovery_steps: per event, the steps from it until the noise-free rate
      first reached 95% of the new phase's optimum (None: not within the
      phase).
    steps_to_95: the same from the start, in the first phase.
    changes_after_recovery: configuration changes per phase after the
      phase's 95% was reached (the mean over the phases that reached it;
      None when none did).
    changes: steps that changed the configuration.
    tail_changes: those among the last 20 steps.
  """
  regret: float
  recovery_steps: tuple[int | None, ...]
  steps_to_95: int | None
  changes_after_recovery: float | None
  changes: int
  tail_changes: int


def recovery(rates: np.ndarray, optimum: float, start: int,
             end: int) -> int | None:
  """Steps from `start` until `rates[start:end]` first reach 95% of
  `optimum` (1 when the first does), or None.

  recovery([1, 5, 10, 10], 10, 1, 4) == 2: 5 < 9.5, 10 >= 9.5.
  """
  for i in range(start, end):
    if rates[i] >= 0.95 * optimum:
      return i - start + 1
  return None


def run_dynamic_episode(policy: policies.Policy, sim: sim_lib.Simulator,
                        steps: int = DYNAMIC_STEPS, tail: int = 20,
                        optima: Callable[[sim_lib.Simulator], float] |
                        None = None) -> DynamicEpisode:
  """Steps `policy` on a pipeline of `dynamic_pipelines` for `steps` and
  scores it against each phase's optimum (`DynamicEpisode`).

  Args:
    policy: the policy.
    sim: the simulator, at the start configuration.
    steps: tuning periods. Default `DYNAMIC_STEPS` (400).
    tail: last steps whose changes are `tail_changes`. Default 20.
    optima: the optimum of a simulator's state (a shared `_Optima` cache).
      Default: computed.
  """
  optima = optima or (lambda s: s.optimum()[0])
  rates, best, changed = [], [], []
  for _ in range(steps):
    changed.append(_policy_step(sim, policy))
    rates.append(sim.true_rate())
    best.append(optima(sim))
  rates_a, best_a = np.asarray(rates), np.asarray(best)
  # Step s's event shows first in rates[s - 1] (set, then advance).
  bounds = [0] + [s - 1 for s in event_steps(steps)
                  if 0 < s <= steps] + [steps]
  reached, after = [], []
  for p in range(len(bounds) - 1):
    lo, hi = bounds[p], bounds[p + 1]
    r = recovery(rates_a, float(best_a[lo]), lo, hi) if lo < hi else None
    reached.append(r)
    if r is not None:
      after.append(sum(changed[lo + r:hi]))
  total = float(best_a.sum())
  return DynamicEpisode(
      regret=1.0 - float(rates_a.sum()) / total if total > 0 else 0.0,
      recovery_steps=tuple(reached[1:]), steps_to_95=reached[0],
      changes_after_recovery=float(np.mean(after)) if after else None,
      changes=int(sum(changed)), tail_changes=int(sum(changed[-tail:])))


def episodes(make_policy: Callable[[], policies.Policy], pipelines,
             seed: int = 0, steps: int = EPISODE_STEPS, start: str = "even",
             optima: Callable[[sim_lib.Simulator], float] | None = None,
             run: Callable[..., Episode | DynamicEpisode] | None = None
             ) -> list:
  """One episode of a fresh policy per (pipeline, params) pair of
  `pipelines`, each simulator seeded `seed + i` (the same noise for every
  policy), from the even split (`start="even"`) or one thread each; each
  run by `run` (default `run_episode`; `run_dynamic_episode` for the
  dynamic suite)."""
  run = run or run_episode
  out = []
  for i, (pipe, params) in enumerate(pipelines):
    sim = sim_lib.Simulator(pipe, seed=seed + i, params=params)
    if start == "even":
      sim.set(policies.EvenPolicy(IntuneOptions()).step(sim.observe()))
    out.append(run(make_policy(), sim, steps, optima=optima))
  return out


def score(make_policy: Callable[[], policies.Policy], pipelines,
          seed: int = 0, steps: int = EPISODE_STEPS,
          start: str = "even") -> np.ndarray:
  """Each policy's steady throughput / the optimum, per (pipeline, params)
  pair of `pipelines`."""
  return np.asarray([e.of_optimum for e in episodes(
      make_policy, pipelines, seed, steps, start)])


def evaluation_pipelines(count: int = 200, seed: int = 1234,
                         cpus: tuple[int, int] = (8, 128)):
  """The issue's evaluation set: 3-8 stages, 8-128 CPUs, no events; each
  pipeline with its machine constants (`simulator.random_params`).

  Returns:
    [(SimPipeline, SimParams)] of length `count`.
  """
  rng = np.random.default_rng(seed)
  return [(sim_lib.random_pipeline(rng, cpus=cpus, events=False),
           sim_lib.random_params(rng)) for _ in range(count)]


# The non-learning baselines `compare` scores the agent against.
BASELINES = ("jump-climb", "climb", "coordinate", "plumber", "analytic",
             "even")
# The learners `compare` scores by default: the default policy and its
# ablation (the network's output a constant). Also known to `compare`:
# "intune-search" (the ranked search without jumps) and "intune-dqn" (the
# DQN acting alone).
LEARNERS = ("intune", "intune-ablated")
POLICIES = LEARNERS + BASELINES
# Every policy `compare` knows (`intune simulate --policies`).
SIMULATED = POLICIES + ("intune-search", "intune-dqn")


def paired_difference(a: np.ndarray, b: np.ndarray, seed: int = 0,
                      resamples: int = 10_000) -> tuple[float, float, float]:
  """Mean of the paired differences a - b and its 95% confidence interval
  (percentile bootstrap over the pairs, seeded).

  Returns:
    (mean, low, high).
  """
  d = np.asarray(a, float) - np.asarray(b, float)
  rng = np.random.default_rng(seed)
  means = d[rng.integers(0, len(d), (resamples, len(d)))].mean(axis=1)
  return float(d.mean()), float(np.percentile(means, 2.5)), float(
      np.percentile(means, 97.5))


def describe_pipeline(pipe: sim_lib.SimPipeline,
                      params: sim_lib.SimParams) -> str:
  """A pipeline's shape in one line: stages (costs relative to the
  cheapest, "f" fixed, "b" buffered, "cv" variability), CPUs, machine
  constants, consumer, RAM budget."""
  low = min(st.cost_s for st in pipe.stages)
  parts = []
  for st in pipe.stages:
    tags = ("" if st.tunable else "f") + ("b" if st.buffer else "")
    cv = f" cv{st.cv:g}" if st.cv else ""
    parts.append(f"{st.cost_s / low:.1f}{tags}{cv}")
  ceiling = pipe.cpus / sum(st.cost_s for st in pipe.stages)
  consumer = (f", consumer at {1 / pipe.consumer_step_s / ceiling:.2f} of "
              "the work ceiling" if pipe.consumer_step_s else "")
  bpe = sum(st.bytes_per_element for st in pipe.stages if st.buffer)
  return (f"{len(pipe.stages)} stages [{' '.join(parts)}], {pipe.cpus} CPUs, "
          f"k={params.pipelining:g}, oversubscription "
          f"{params.oversubscription:.2f}{consumer}, RAM budget "
          f"{pipe.ram_budget / bpe:g}x the buffered elements"
          + (", costs drift" if pipe.drift else ""))


def _makers(names, weights, search_weights, jump_weights, seed
            ) -> dict[str, Callable[[], policies.Policy]]:
  """A maker of a fresh policy for each of `names` (`compare`'s)."""
  opts = IntuneOptions()
  makers: dict[str, Callable[[], policies.Policy]] = {
      "analytic": lambda: policies.AnalyticPolicy(opts),
      "even": lambda: policies.EvenPolicy(opts),
      "climb": lambda: search.ClimbPolicy(opts),
      "coordinate": lambda: search.CoordinatePolicy(opts),
      "plumber": lambda: search.PlumberPolicy(opts),
      "jump-climb": lambda: search.JumpClimbPolicy(opts),
  }
  if "intune" in names or "intune-ablated" in names:
    jumper = dqn.load_weights(jump_weights or ranked.JUMP_WEIGHTS)[0]
    learned = allocator_lib.Allocator()
    makers["intune"] = lambda: ranked.JumpSearchPolicy(
        opts, agent_weights=jumper, allocator=learned)
    makers["intune-ablated"] = lambda: ranked.AblatedSearchPolicy(
        opts, agent_weights=jumper)
  if "intune-search" in names:
    ranker = dqn.load_weights(search_weights or ranked.DEFAULT_WEIGHTS)[0]
    makers["intune-search"] = lambda: ranked.RankedSearchPolicy(
        opts, agent_weights=ranker)
  if "intune-dqn" in names:
    # Deferred: the online policy loads TensorFlow (warm start, rewrites);
    # the simulation part must not at import.
    from intune_tf.agent import policy as agent_lib  # noqa: PLC0415
    agent = dqn.Agent(seed=seed, replay_capacity=5_000, batch_size=32)
    agent.load(weights or agent_lib.DEFAULT_WEIGHTS)
    pretrained = agent.get_weights()

    def make_dqn():
      agent.set_weights(pretrained)
      agent.replay = dqn.Replay(5_000)
      return agent_lib.IntunePolicy(opts, agent=agent)
    makers["intune-dqn"] = make_dqn
  return makers


def _summary(name: str, r: np.ndarray, eps: list, dynamic: bool) -> dict:
  """One policy's summary in `compare`'s result (its docstring)."""
  times = np.asarray([np.inf if e.steps_to_95 is None else e.steps_to_95
                      for e in eps], float)
  median_time = float(np.median(times))
  order = np.argsort(r, kind="stable")
  p10_index = int(order[min(len(r) - 1, int(round(0.1 * (len(r) - 1))))])
  out = {
      "median": float(np.median(r)), "p10": float(np.percentile(r, 10)),
      "min": float(r.min()), "mean": float(r.mean()),
      "ratios": [float(x) for x in r],
      "steps_to_95": median_time if np.isfinite(median_time) else None,
      "reached_95": float(np.isfinite(times).mean()),
      "changes": float(np.median([e.changes for e in eps])),
      "tail_changes": float(np.median([e.tail_changes for e in eps])),
      "min_pipeline": int(order[0]), "p10_pipeline": p10_index,
  }
  if dynamic:
    regret = np.asarray([e.regret for e in eps])
    steps = np.asarray([[np.nan if t is None else t
                         for t in e.recovery_steps] for e in eps], float)
    after = [e.changes_after_recovery for e in eps
             if e.changes_after_recovery is not None]
    out.update({
        "regret": float(regret.mean()),
        "regret_median": float(np.median(regret)),
        "regret_p90": float(np.percentile(regret, 90)),
        "regret_max": float(regret.max()),
        "regrets": [float(x) for x in regret],
        "recovery_steps": (float(np.median(np.nan_to_num(steps, nan=np.inf)))
                           if steps.size else None),
        "recovered": float(np.isfinite(steps).mean()) if steps.size else 1.0,
        "recovery_by_event": {
            label: float(np.median(np.nan_to_num(steps[:, i], nan=np.inf)))
            for i, (label, _) in enumerate(EVENTS) if i < steps.shape[1]},
        "changes_after_recovery": (float(np.median(after)) if after
                                   else None),
    })
    if out["recovery_steps"] is not None and not np.isfinite(
        out["recovery_steps"]):
      out["recovery_steps"] = None
    out["recovery_by_event"] = {
        k: (v if np.isfinite(v) else None)
        for k, v in out["recovery_by_event"].items()}
  return out


def compare(weights: str | None = None, count: int = 200, seed: int = 1234,
            steps: int = EPISODE_STEPS,
            names: tuple[str, ...] = POLICIES,
            search_weights: str | None = None,
            jump_weights: str | None = None,
            dynamic: bool = False) -> dict:
  """Scores the policies `names` on the same random pipelines, each
  against the simulator's optimum, and each against the best non-learning
  baseline (the one of `BASELINES` among `names` with the highest mean
  score).

  Steady state (default): `evaluation_pipelines`, the score of a pipeline
  its steady throughput / the optimum. `dynamic`: `dynamic_pipelines`
  (events, `EVENTS`), the score 1 - its whole-run regret against the
  per-phase optimum (`run_dynamic_episode`).

  Returns:
    {"policies": {name: summary}, "best_baseline": name, "pipelines",
    "steps", "dynamic", "shapes": [pipeline descriptions]}; a summary holds
    median, p10, min, mean of the scores, per-pipeline scores (`ratios`),
    steps_to_95 (median, never counted as infinite: None when more than
    half never reached it; `reached_95`: the share that did), changes and
    tail_changes (medians per pipeline, over the run and its last 20
    steps), the pipelines at the minimum and the 10th percentile,
    `vs_best`: the paired difference to the best baseline (mean, 95% CI
    low and high, share of pipelines where better), and for "intune"
    `vs`: its paired difference to every other policy. With `dynamic`
    also regret (mean; regret_median, regret_p90, regret_max: the worst
    case; regrets per pipeline), recovery_steps (the median over every
    pipeline's events of the steps to 95% of the new optimum, an event
    not recovered within its phase counting as never; `recovered`: the
    share that did; `recovery_by_event`) and changes_after_recovery
    (median per pipeline of the changes per phase after its 95%).
    `weights` is the "intune-dqn" agent's file, `search_weights` the
    "intune-search" ranker's, `jump_weights` the ranker of "intune" and
    "intune-ablated" (defaults: the shipped files).
  """
  pipes = (dynamic_pipelines(count, seed, steps) if dynamic
           else evaluation_pipelines(count, seed))
  optima = _Optima()
  makers = _makers(names, weights, search_weights, jump_weights, seed)
  unknown = [n for n in names if n not in makers]
  if unknown:
    raise ValueError(f"Unknown policies {unknown}; valid: {list(makers)}.")
  run = run_dynamic_episode if dynamic else run_episode
  runs = {name: episodes(makers[name], pipes, seed=seed, steps=steps,
                         optima=optima, run=run) for name in names}
  result: dict = {"policies": {}, "pipelines": count, "steps": steps,
                  "dynamic": dynamic,
                  "shapes": [describe_pipeline(*p) for p in pipes]}
  ratios = {n: np.asarray([1.0 - e.regret if dynamic else e.of_optimum
                           for e in runs[n]]) for n in names}
  baselines = [n for n in names if n in BASELINES]
  best = max(baselines, key=lambda n: ratios[n].mean()) if baselines else None
  result["best_baseline"] = best
  for name in names:
    summary = _summary(name, ratios[name], runs[name], dynamic)
    if best is not None:
      mean, low, high = paired_difference(ratios[name], ratios[best], seed)
      summary["vs_best"] = {"mean": mean, "low": low, "high": high,
                            "better": float((ratios[name] >
                                             ratios[best]).mean())}
    if name == "intune":
      summary["vs"] = {}
      for other in names:
        if other != name:
          mean, low, high = paired_difference(ratios[name], ratios[other],
                                              seed)
          summary["vs"][other] = {"mean": mean, "low": low, "high": high}
    result["policies"][name] = summary
  return result


def main_pretrain(args) -> int:
  if args.allocator:
    weights, stats = pretrain_allocator(seed=args.seed,
                                        pipelines=args.pipelines)
    stats.update(seed=args.seed, command=(
        f"intune pretrain --allocator --seed {args.seed} --pipelines "
        f"{args.pipelines} --out {args.out}"))
    dqn.save_weights(args.out, weights, stats)
    print(json.dumps(stats, indent=1))
    return 0
  if args.ranker:
    jumps = search.JUMP_FRACTIONS if args.jumps else ()
    weights, stats = pretrain_ranker(seed=args.seed, steps=args.steps,
                                     init=args.init, jumps=jumps)
    stats.update(seed=args.seed, command=(
        f"intune pretrain --ranker --seed {args.seed} --steps {args.steps} "
        f"--init {args.init}{' --jumps' if args.jumps else ''} "
        f"--out {args.out}"))
    dqn.save_weights(args.out, weights, stats)
    print(json.dumps(stats, indent=1))
    return 0
  agent, stats = pretrain(seed=args.seed, steps=args.steps)
  stats.update(seed=args.seed, command=f"intune pretrain --seed {args.seed} "
               f"--steps {args.steps} --out {args.out}")
  agent.save(args.out, stats)
  logging.info("Saved %s: %s", args.out, json.dumps(stats))
  print(json.dumps(stats, indent=1))
  return 0


def _steps_text(t: float | None) -> str:
  return "-" if t is None else f"{t:.0f}"


def format_comparison(result: dict) -> str:
  """`compare`'s result as the tables `intune simulate` prints."""
  best = result["best_baseline"]
  dynamic = result.get("dynamic", False)
  what = ("1 - whole-run regret against the per-phase optimum" if dynamic
          else "steady throughput / the optimum")
  lines = [f"{result['pipelines']} pipelines, {result['steps']} steps; "
           f"score: {what}; vs best: the paired difference of scores "
           f"to the best non-learning baseline ({best}, highest mean), mean "
           "[95% CI] and the share of pipelines where better; to 95%: "
           "median steps from the start (- when most never reach it) and "
           "the share that do; changes: configuration changes per pipeline "
           "(median), over the run / in the last 20 steps.",
           f"{'policy':15}{'median':>7}{'p10':>7}{'min':>7}{'mean':>7}"
           f"{'vs best [95% CI]':>28}{'better':>7}{'to 95%':>8}{'reach':>6}"
           f"{'changes':>10}"]
  for name, r in result["policies"].items():
    vs = r.get("vs_best")
    vs_text = (f"{vs['mean']:+.3f} [{vs['low']:+.3f}, {vs['high']:+.3f}]"
               if vs and name != best else "-")
    better = f"{vs['better']:.2f}" if vs and name != best else "-"
    lines.append(
        f"{name:15}{r['median']:7.3f}{r['p10']:7.3f}{r['min']:7.3f}"
        f"{r['mean']:7.3f}{vs_text:>28}{better:>7}"
        f"{_steps_text(r['steps_to_95']):>8}{r['reached_95']:6.2f}"
        f"{r['changes']:6.0f} /{r['tail_changes']:3.0f}")
  if dynamic:
    labels = [label for label, _ in EVENTS]
    lines.append(
        "Dynamic: regret (rows lost against the per-phase optimum) mean, "
        "median, 90th percentile and worst; recovery: median steps from an "
        "event to 95% of the new optimum over every pipeline's events (- "
        "when most never recover within the phase) and the share that "
        "recover; after: changes per phase once recovered (median per "
        "pipeline); then the median recovery after each event: "
        + "; ".join(f"{i + 1} {label}" for i, label in enumerate(labels))
        + ".")
    lines.append(f"{'policy':15}{'regret':>7}{'median':>7}{'p90':>7}"
                 f"{'worst':>7}{'recovery':>9}{'share':>6}{'after':>6}"
                 + "".join(f"{i + 1:>5}" for i in range(len(labels))))
    for name, r in result["policies"].items():
      after = r["changes_after_recovery"]
      lines.append(
          f"{name:15}{r['regret']:7.3f}{r['regret_median']:7.3f}"
          f"{r['regret_p90']:7.3f}{r['regret_max']:7.3f}"
          f"{_steps_text(r['recovery_steps']):>9}{r['recovered']:6.2f}"
          f"{'-' if after is None else f'{after:.1f}':>6}"
          + "".join(f"{_steps_text(r['recovery_by_event'].get(label)):>5}"
                    for label in labels))
  intune = result["policies"].get("intune")
  if intune and intune.get("vs"):
    lines.append("intune against each policy, paired over the pipelines, "
                 "mean [95% CI] of the score difference (positive: intune "
                 "better" + ("; it is the regret difference with the sign "
                 "turned" if dynamic else "") + "); tail changes (last 20 "
                 f"steps, median) beside: intune {intune['tail_changes']:.0f}"
                 ":")
    for other, d in intune["vs"].items():
      excludes = d["low"] > 0 or d["high"] < 0
      lines.append(
          f"  vs {other:15}{d['mean']:+.3f} [{d['low']:+.3f}, "
          f"{d['high']:+.3f}]{' (CI excludes 0)' if excludes else '':16}"
          f" tail changes {result['policies'][other]['tail_changes']:.0f}")
  lines.append("Where the low cases come from (pipeline #: stage costs "
               "relative to the cheapest, f fixed, b buffered):")
  for name, r in result["policies"].items():
    for what_case in ("min", "p10"):
      i = r[f"{what_case}_pipeline"]
      others = ", ".join(f"{n} {o['ratios'][i]:.3f}"
                         for n, o in result["policies"].items() if n != name)
      lines.append(f"  {name} {what_case} {r['ratios'][i]:.3f} on #{i}: "
                   f"{result['shapes'][i]} ({others})")
  return "\n".join(lines)


def main_simulate(args) -> int:
  if args.service:
    return cluster.main(args)
  names = tuple(n for n in args.policies.split(",") if n)
  steps = args.steps
  if steps is None:
    steps = DYNAMIC_STEPS if args.dynamic else EPISODE_STEPS
  if args.dynamic and steps < len(EVENTS) * 2:
    raise SystemExit(f"intune simulate --dynamic: --steps {steps} cannot "
                     f"hold its {len(EVENTS)} events with a phase each; "
                     f"pass at least {len(EVENTS) * 2} (default "
                     f"{DYNAMIC_STEPS}).")
  result = compare(args.weights, args.pipelines, args.seed, steps, names,
                   args.search_weights, args.jump_weights,
                   dynamic=args.dynamic)
  print(format_comparison(result))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=1)
  return 0


def _weights_file(path: str) -> str:
  """An argparse type: the path of a readable agent weights file.

  Checked when the command line is parsed, so that a bad file stops the
  command before any training or simulation (`dqn.load_weights`: no
  unpickling).
  """
  try:
    dqn.load_weights(path)
  except ValueError as e:
    raise argparse.ArgumentTypeError(
        f"{e} Pass an .npz written by `intune pretrain --out`.") from e
  except OSError as e:
    raise argparse.ArgumentTypeError(
        f"cannot read {path}: {e.strerror or e}. Pass an .npz written by "
        "`intune pretrain --out`.") from e
  return path


def add_parser(subparsers, helps: Mapping[str, str]) -> None:
  p = subparsers.add_parser(
      "pretrain", help=helps["pretrain"])
  p.add_argument("--seed", type=arguments.non_negative_int, default=0,
                 help="Random seed, 0 or more (default 0).")
  p.add_argument("--steps", type=arguments.positive_int, default=60_000,
                 help="Simulator steps (at least 1).")
  p.add_argument("--out", type=arguments.output_file, required=True,
                 help="Weights file to write (.npz).")
  p.add_argument("--allocator", action="store_true",
                 help="Train the allocation network of intune "
                 "(pretrain_allocator).")
  p.add_argument("--pipelines", type=arguments.positive_int, default=150,
                 help="With --allocator: dynamic pipelines of training data "
                 "(at least 1).")
  p.add_argument("--ranker", action="store_true",
                 help="Train the intune-search ranker (pretrain_ranker).")
  p.add_argument("--init", type=_weights_file, default=None,
                 help="With --ranker: weights to start from (default: the "
                 "shipped agent's).")
  p.add_argument("--jumps", action="store_true",
                 help="With --ranker: episodes run the intune-jump search "
                 "(proportional jumps first).")
  p.set_defaults(func=main_pretrain)
  p = subparsers.add_parser(
      "simulate", help=helps["simulate"])
  p.add_argument("--weights", type=_weights_file, default=None,
                 help="The intune-dqn agent's weights (.npz).")
  p.add_argument("--search-weights", type=_weights_file, default=None,
                 help="The intune-search ranker's weights (.npz).")
  p.add_argument("--jump-weights", type=_weights_file, default=None,
                 help="The ranker of intune and intune-ablated (.npz).")
  p.add_argument("--pipelines", type=arguments.positive_int, default=200,
                 help="Random pipelines to score on (at least 1).")
  p.add_argument("--seed", type=arguments.non_negative_int, default=1234)
  p.add_argument("--steps", type=arguments.positive_int, default=None,
                 help=f"Tuning steps per pipeline (default {EPISODE_STEPS}; "
                 f"{DYNAMIC_STEPS} with --dynamic).")
  p.add_argument("--dynamic", action="store_true",
                 help="The dynamic suite: CPUs halved and doubled, a "
                 "co-tenant, a stage's cost doubling, memory pressure; "
                 "scored by regret against the per-phase optimum.")
  p.add_argument("--policies", default=",".join(POLICIES),
                 type=arguments.names_in(lambda: SIMULATED, "policy"),
                 help="Comma-separated policies (default: intune, "
                 "intune-ablated and every baseline; also intune-search, "
                 "intune-dqn).")
  p.add_argument("--json", type=arguments.output_file, default=None,
                 help="Write the scores here.")
  p.add_argument("--service", action="store_true",
                 help="Score the tf.data service worker-pool controllers "
                 "(intune, tf-formula, cachew, fixed-best) on a simulated "
                 "job instead (docs/service.md).")
  p.add_argument("--workers", type=arguments.int_in(1, 512, "pool size"),
                 default=64,
                 help="With --service: the pool's MAX, 1 to 512 (default "
                 "64).")
  p.add_argument("--seeds", type=arguments.positive_int, default=1,
                 help="With --service: score seeds --seed, --seed + 1, ... "
                 "this many, with paired 95%% CIs (default 1).")
  p.set_defaults(func=main_simulate)
