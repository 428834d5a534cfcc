"""What the jump search would need to know to beat the best search by +0.02.

`intune-jump` (`intune_tf/agent/ranked.py`) tries candidate moves in the
order of a ranking and keeps what measures better. This script runs that
same search on simulated pipelines under seven rankings, each against
`climb` (paired, with a 95% bootstrap interval):

- `climb order`: no ranking (climb's bottleneck-first order);
- `climb order by the evidence`: the gains the search itself measured
  for earlier trials of the same knob moves (`search.measured_evidence`),
  no learning;
- `learned, without the evidence`: the shipped ranker (`jump_ranker.npz`),
  which sees the state;
- `learned`: intune-jump as shipped: the ranker's scores plus the
  evidence;
- `model on measured costs`: a bottleneck model (soft minimum of the
  stages' and the CPUs' bounds, k = 3, oversubscription 0.15: the best of
  four settings tried on the tuning set) on the costs the observation
  measures;
- `truth without variability`: the simulator itself (true costs, its k,
  contention and hand-off), but every stage's cost variability set to 0;
- `truth`: the simulator's exact one-step gain (an oracle).

Three more rows take away the measurement noise (the simulated pipelines'
rate and statistics exact, `SimPipeline.noise` 0), so what is left is the
search itself: `jump-climb` with its threshold (2%), `jump-climb` keeping
any gain over 0.5%, and the oracle ranking keeping any gain over 0.5%.
Each row is also given against `jump-climb` as shipped, the best
non-learning baseline of `intune simulate`. (A pipeline whose costs drift
follows another path without the noise: the simulator draws both from one
generator.)

Last (`predicted gains`), how well the shipped ranker predicts the small
gains that measurement cannot resolve: at the states intune-jump visits
after its first 60 steps (every 15th step, with no trial in force), each
allowed move's predicted gain (its advantage over the no-op /
`search.GAIN_SCALE`) against the simulator's exact one-step gain
(`pretrain.move_gains`), by bins of the prediction.

Run: `python benchmarks/ranking_information.py [pipelines] [seed] [rows]`
(default 60 and 99: the tuning set apart from `intune simulate`'s, about 3
minutes; rows: the names of the rows to run, and `predicted gains`;
default all).
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from intune_tf.agent import dqn
from intune_tf.agent import ranked
from intune_tf.options import IntuneOptions
from intune_tf.sim import pretrain
from intune_tf.sim import simulator as sim_lib
from intune_tf.tuning import mdp
from intune_tf.tuning import policies
from intune_tf.tuning import search


class _Ranking(ranked.JumpSearchPolicy):
  """The jump search with candidates ordered by the relative rise of
  `rate(obs, values)` over `rate(obs, {})` (all 0 when that is None)."""

  def rate(self, obs, values: dict[str, float]) -> float | None:
    raise NotImplementedError

  def ranked(self, obs):
    now = self.rate(obs, {})
    return search.best_first([
        (label, values, self.rate(obs, values) / now - 1 if now else 0.0)
        for label, values in self.candidates(obs)])


class _MeasuredModel(_Ranking):
  K, OVERSUBSCRIPTION = 3.0, 0.15

  def rate(self, obs, values):
    costs = mdp.stage_costs(obs)
    if not costs:
      return None
    threads = {k.stage: k.value for k in obs.knobs
               if k.kind == "parallelism"}
    threads.update({name.rsplit("/", 1)[0]: v for name, v in values.items()
                    if name.endswith("/parallelism")})
    names = list(costs)
    stages = [sim_lib.SimStage(name=s, cost_s=max(costs[s], 1e-12))
              for s in names]
    return sim_lib.throughput(
        stages, [max(1.0, threads.get(s, 1.0)) for s in names],
        [0.0] * len(names), obs.cpu_budget,
        params=sim_lib.SimParams(oversubscription=self.OVERSUBSCRIPTION,
                                 pipelining=self.K))


class _Truth(_Ranking):
  """Ranks by the simulator `sim`'s noise-free rate (with `variability`
  False, every stage's cv taken as 0)."""

  def __init__(self, options, sim: sim_lib.Simulator, variability: bool,
               **kwargs):
    super().__init__(options, **kwargs)
    self.sim, self.variability = sim, variability

  def rate(self, obs, values):
    sim = self.sim
    index = {st.name: i for i, st in enumerate(sim.pipeline.stages)}
    par, buf = list(sim.parallelism), list(sim.buffers)
    for name, v in values.items():
      stage, kind = name.rsplit("/", 1)
      (par if kind == "parallelism" else buf)[index[stage]] = v
    stages = sim.pipeline.stages if self.variability else [
        dataclasses.replace(st, cv=0.0) for st in sim.pipeline.stages]
    return sim_lib.throughput(stages, par, buf, sim.cpus,
                              sim.pipeline.consumer_step_s, sim.params,
                              sim.costs)


# The threshold of the rows that keep small gains (`search.THRESHOLD` is
# 0.02).
FINE = 0.005


# Bins of predicted relative gain for `predicted_gains`.
GAIN_BINS = (-np.inf, -0.05, -0.02, -0.005, 0.005, 0.01, 0.02, 0.05, np.inf)


def predicted_gains(pipes, seed: int, weights, steps: int = 300,
                    after: int = 60, every: int = 15) -> None:
  """Prints the ranker `weights`' predicted gains against the exact ones
  (module docstring), by `GAIN_BINS` of the prediction."""
  opts = IntuneOptions()
  predicted, exact = [], []
  for i, (pipe, params) in enumerate(pipes):
    sim = sim_lib.Simulator(pipe, seed=seed + i, params=params)
    sim.set(policies.EvenPolicy(opts).step(sim.observe()))
    policy = ranked.JumpSearchPolicy(opts, agent_weights=weights)
    for t in range(steps):
      obs = sim.observe()
      if (t >= after and t % every == 0 and policy.base_rate is not None
          and not policy.on_trial):
        gains, mask = pretrain.move_gains(sim, obs)
        q = policy.q_values(obs)
        valid = mask[:-1] > 0
        predicted += list((q[:-1] - q[-1])[valid] / search.GAIN_SCALE)
        exact += list(gains[:-1][valid] / search.GAIN_SCALE)
      values = policy.step(obs)
      if values:
        sim.set(values)
      sim.advance()
  predicted, exact = np.asarray(predicted), np.asarray(exact)
  print(f"\n{len(predicted)} moves; correlation of predicted and exact "
        f"gains {np.corrcoef(predicted, exact)[0, 1]:.2f}\n")
  print("| predicted gain | moves | exact gain (mean) | exact > 0 "
        "| exact > 0.5% |")
  print("|---|---|---|---|---|")
  for lo, hi in zip(GAIN_BINS[:-1], GAIN_BINS[1:]):
    inside = (predicted >= lo) & (predicted < hi)
    if inside.any():
      e = exact[inside]
      label = (f"under {hi:+.1%}" if lo == -np.inf else
               f"{lo:+.1%} and over" if hi == np.inf else
               f"{lo:+.1%} to {hi:+.1%}")
      print(f"| {label} | {inside.sum()} | {e.mean():+.2%} | "
            f"{(e > 0).mean():.2f} | {(e > 0.005).mean():.2f} |")


def main(count: int = 60, seed: int = 99,
         only: tuple[str, ...] = ()) -> None:
  opts = IntuneOptions()
  pipes = pretrain.evaluation_pipelines(count, seed)
  learned = dqn.load_weights(ranked.JUMP_WEIGHTS)[0]

  quiet = [(dataclasses.replace(pipe, noise=0.0), params)
           for pipe, params in pipes]

  def run(make, exact: bool = False):
    out = []
    for i, (pipe, params) in enumerate(quiet if exact else pipes):
      sim = sim_lib.Simulator(pipe, seed=seed + i, params=params)
      sim.set(policies.EvenPolicy(opts).step(sim.observe()))
      out.append(pretrain.run_episode(make(sim), sim, 300).of_optimum)
    return np.asarray(out)

  noisy = {
      "climb order": lambda sim: ranked.JumpSearchPolicy(
          opts, agent_weights=learned, order="climb"),
      "climb order by the evidence": lambda sim: search.JumpClimbPolicy(
          opts),
      "learned, without the evidence": lambda sim: ranked.JumpSearchPolicy(
          opts, agent_weights=learned, evidence_weight=0.0),
      "learned": lambda sim: ranked.JumpSearchPolicy(
          opts, agent_weights=learned),
      "model on measured costs": lambda sim: _MeasuredModel(
          opts, agent_weights=learned),
      "truth without variability": lambda sim: _Truth(
          opts, sim, False, agent_weights=learned),
      "truth": lambda sim: _Truth(opts, sim, True, agent_weights=learned),
  }
  exact = {
      "jump-climb, exact statistics": lambda sim: search.JumpClimbPolicy(
          opts),
      "jump-climb, exact, keeping gains over 0.5%": (
          lambda sim: search.JumpClimbPolicy(opts, threshold=FINE)),
      "truth, exact, keeping gains over 0.5%": (
          lambda sim: _Truth(opts, sim, True, agent_weights=learned,
                             threshold=FINE)),
  }
  rows = {name: (make, name in exact)
          for name, make in (noisy | exact).items()
          if not only or name in only}
  if rows:
    table(rows, run, count, seed)
  if not only or "predicted gains" in only:
    predicted_gains(pipes, seed, learned)


def table(rows, run, count: int, seed: int) -> None:
  """Prints each of `rows` (name -> (policy of a simulator, whether its
  statistics are exact)) run by `run`, against climb and jump-climb."""
  opts = IntuneOptions()
  climb = run(lambda sim: search.ClimbPolicy(opts))
  best = run(lambda sim: search.JumpClimbPolicy(opts))
  print(f"{count} pipelines of evaluation_pipelines(seed={seed}), 300 steps;"
        f" climb: median {np.median(climb):.3f}, mean {climb.mean():.3f}\n")
  print("| ranking | median | p10 | mean | vs climb [95% CI] "
        "| vs jump-climb [95% CI] |")
  print("|---|---|---|---|---|---|")
  for name, (make, exact) in rows.items():
    r = run(make, exact)
    cells = [f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]" for m, lo, hi in (
        pretrain.paired_difference(r, climb),
        pretrain.paired_difference(r, best))]
    print(f"| {name} | {np.median(r):.3f} | {np.percentile(r, 10):.3f} | "
          f"{r.mean():.3f} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
  main(*(int(a) for a in sys.argv[1:3]), tuple(sys.argv[3:]))
