"""Offline pretraining of the agent in the simulator, and scoring policies.

`intune pretrain --seed S --out PATH` trains a fresh agent on randomized
simulated pipelines (`simulator.random_pipeline`: 3-8 stages, 2-128 CPUs,
heavy-tailed costs, resize and memory events) on randomized machines
(`simulator.random_params`: oversubscription cost, pipelining). `intune simulate` scores
policies against the simulator's optimum on random pipelines.
"""

from __future__ import annotations

import json
import time
from typing import Callable

from absl import logging
import numpy as np

from intune_tf.agent import dqn
from intune_tf.options import IntuneOptions
from intune_tf.sim import simulator as sim_lib
from intune_tf.tuning import policies

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
  costs = dqn.stage_costs(obs)
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
    if mask[dqn.action_of(i, move)]:
      return dqn.action_of(i, move)
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
  from intune_tf.agent import policy as agent_lib
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
    import tqdm
    bar = tqdm.tqdm(total=steps, desc="pretrain", unit="step")
  t0 = time.time()
  step, episodes, recent = 0, 0, []
  while step < steps:
    sim = sim_lib.Simulator(make_pipeline(rng), seed=int(rng.integers(2**31)),
                            params=make_params(rng))
    _start(sim, rng)
    obs = sim.observe()
    ref, ref_cpus = 0.0, None
    state, mask = dqn.features(obs), dqn.action_mask(obs)
    for _ in range(EPISODE_STEPS):
      eps = epsilon_at(step, steps)
      if rng.random() < eps * GUIDED_SHARE:
        a = guided_action(obs, mask, rng)
      else:
        a = agent.act(state, mask, eps * (1 - GUIDED_SHARE))
      sim.set(dqn.apply_action(obs, a))
      sim.advance()
      fix = _fit(sim.observe())
      if fix:
        sim.set(fix)
      obs = sim.observe()
      if obs.usable_cpus != ref_cpus:
        ref, ref_cpus = 0.0, obs.usable_cpus
      ref = max(ref, dqn.reference_rate(obs))
      r = dqn.reward(obs.output_rate, ref, dqn.memory_fraction(obs))
      state2, mask2 = dqn.features(obs), dqn.action_mask(obs)
      agent.replay.add(state, a, r, state2, mask2, sim.oom)
      state, mask = state2, mask2
      step += 1
      if step % train_every == 0:
        agent.learn()
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


def run_policy(policy: policies.Policy, sim: sim_lib.Simulator,
               steps: int = EPISODE_STEPS, tail: int = 20) -> float:
  """Steps `policy` on `sim`; the mean noise-free throughput of the last
  `tail` steps (0 after an OOM)."""
  rates = []
  for _ in range(steps):
    obs = sim.observe()
    values = policy.step(obs)
    if values:
      sim.set(values)
    sim.advance()
    rates.append(sim.true_rate())
  return float(np.mean(rates[-tail:]))


def score(make_policy: Callable[[], policies.Policy], pipelines,
          seed: int = 0, steps: int = EPISODE_STEPS,
          start: str = "even") -> np.ndarray:
  """Each policy's steady throughput / the optimum, per (pipeline, params)
  pair of `pipelines`."""
  ratios = []
  for i, (pipe, params) in enumerate(pipelines):
    sim = sim_lib.Simulator(pipe, seed=seed + i, params=params)
    if start == "even":
      sim.set(policies.EvenPolicy(IntuneOptions()).step(sim.observe()))
    rate = run_policy(make_policy(), sim, steps)
    opt = sim.optimum()[0]
    ratios.append(rate / opt if opt > 0 else 1.0)
  return np.asarray(ratios)


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


def compare(weights: str | None = None, count: int = 200, seed: int = 1234,
            steps: int = EPISODE_STEPS) -> dict:
  """Scores intune, analytic and even on the same random pipelines."""
  # Deferred: the online policy loads TensorFlow (warm start, rewrites);
  # the simulation part must not at import.
  from intune_tf.agent import policy as agent_lib
  pipes = evaluation_pipelines(count, seed)
  opts = IntuneOptions()
  agent = dqn.Agent(seed=seed, replay_capacity=5_000, batch_size=32)
  agent.load(weights or agent_lib.DEFAULT_WEIGHTS)
  pretrained = agent.get_weights()

  def make_intune():
    agent.set_weights(pretrained)
    agent.replay = dqn.Replay(5_000)
    return agent_lib.IntunePolicy(opts, agent=agent)

  result = {}
  for name, make in (("intune", make_intune),
                     ("analytic", lambda: policies.AnalyticPolicy(opts)),
                     ("even", lambda: policies.EvenPolicy(opts))):
    ratios = score(make, pipes, seed=seed, steps=steps)
    result[name] = {"median": float(np.median(ratios)),
                    "p10": float(np.percentile(ratios, 10)),
                    "min": float(ratios.min()),
                    "mean": float(ratios.mean())}
  result["pipelines"] = count
  result["steps"] = steps
  return result


def main_pretrain(args) -> int:
  agent, stats = pretrain(seed=args.seed, steps=args.steps)
  stats.update(seed=args.seed, command=f"intune pretrain --seed {args.seed} "
               f"--steps {args.steps} --out {args.out}")
  agent.save(args.out, stats)
  logging.info("Saved %s: %s", args.out, json.dumps(stats))
  print(json.dumps(stats, indent=1))
  return 0


def main_simulate(args) -> int:
  result = compare(args.weights, args.pipelines, args.seed, args.steps)
  print(f"{'policy':10} {'median':>8} {'p10':>8} {'min':>8}   (of the optimum, "
        f"{result['pipelines']} pipelines, {result['steps']} steps)")
  for name in ("intune", "analytic", "even"):
    r = result[name]
    print(f"{name:10} {r['median']:8.3f} {r['p10']:8.3f} {r['min']:8.3f}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=1)
  return 0


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "pretrain", help="Pretrain the agent in the simulator.")
  p.add_argument("--seed", type=int, default=0, help="Random seed.")
  p.add_argument("--steps", type=int, default=60_000,
                 help="Simulator steps.")
  p.add_argument("--out", required=True, help="Weights file to write (.npz).")
  p.set_defaults(func=main_pretrain)
  p = subparsers.add_parser(
      "simulate", help="Score intune, analytic and even against the "
      "simulator's optimum on random pipelines.")
  p.add_argument("--weights", default=None, help="Agent weights (.npz).")
  p.add_argument("--pipelines", type=int, default=200)
  p.add_argument("--seed", type=int, default=1234)
  p.add_argument("--steps", type=int, default=EPISODE_STEPS)
  p.add_argument("--json", default=None, help="Write the scores here.")
  p.set_defaults(func=main_simulate)
