"""`policy="intune-search"`: the pretrained Q-network ranks the moves of a
measured accept/revert search.

The learned prior decides what to try first; measurement decides what to
keep. The search loop is `search.MeasuredSearch`'s (measure the base, try a
change, keep it when its rate beats the base's by more than the threshold,
else revert); the candidate changes are `search.ClimbPolicy`'s (each knob's
+-1 and +-5 that `dqn.action_mask` allows, and threads moved from the least
busy stage when the thread limit forbids adding them). Each candidate is
scored by the Q-network: a single move by its advantage over the no-op,
Q(s, a) - Q(s, no-op); a transfer of threads by the sum of its two moves'
advantages. To that score is added the search's measured evidence
(`measured_evidence`, weighted by `evidence_weight`): the gain the
search last measured when it moved the same knobs the same way, at an
earlier base. The state says what each stage costs; only the measurement
says how the rate answered a move (a stage whose cost varies gains from
threads beyond its share, one of constant cost does not). Candidates are
tried from the highest score down (climb's bottleneck-first order breaks
ties), a rejected one is not tried again at
the same base, and the search at a base ends (the policy holds) after
`max_tries` rejections or when no candidate's advantage reaches
`-prior_margin`: the prior says the rest would not help, so trials that
would only cost throughput are not made.

`policy="intune-jump"`: the same search, first trying whole-configuration
jumps (`proportional_jumps`): threads in proportion to each stage's
measured cost at a total of f x the CPU budget, for each f of
`JUMP_FRACTIONS` in turn, each measured and kept only when it beats the
configuration in force (accept/revert); then the Q-ranked local search
from wherever that landed. The jumps are made again when the CPU budget or
the knobs change. Its ranker, `jump_ranker.npz`, is fitted on the states
this search visits.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Sequence

import numpy as np

from intune_tf.agent import dqn
from intune_tf.tuning import policies
from intune_tf.tuning import search

if TYPE_CHECKING:
  from intune_tf.options import IntuneOptions
  from intune_tf.records import Observation

# The pretrained agent shipped with the package (see docs/agent.md): where
# `intune pretrain --ranker` starts.
AGENT_WEIGHTS = os.path.join(os.path.dirname(__file__), "weights.npz")
# The ranker: AGENT_WEIGHTS advantage-trained by pretrain_ranker's loop
# (12,000 steps of seed 0, then 30,000 of seed 1; metadata in the file).
DEFAULT_WEIGHTS = os.path.join(os.path.dirname(__file__), "ranker.npz")
# Rejected trials at one base before the search holds there (None: no
# limit; 3 or 6 lost 0.03-0.08 of the optimum on the simulator).
MAX_TRIES = None
# Candidates whose advantage is below -PRIOR_MARGIN are not tried (Q units;
# values are about 10, so 0.1 is 1% of a step's reward).
PRIOR_MARGIN = float("inf")
# intune-jump's ranker: DEFAULT_WEIGHTS fitted further on the states the
# jump search visits (command in the file's metadata).
JUMP_WEIGHTS = os.path.join(os.path.dirname(__file__), "jump_ranker.npz")
# Totals of intune-jump's proportional jumps, in CPU budgets, in the order
# tried: chosen on the tuning set apart from `intune simulate`'s (60
# pipelines of `evaluation_pipelines(seed=99)`).
JUMP_FRACTIONS = (1.0, 0.75, 1.25, 0.5, 1.5)
# Relative gains are scaled by this in the ranker's targets (a 1% gain is
# 0.1 Q units), and measured gains in the evidence.
GAIN_SCALE = 10.0
# Weight of the measured evidence in a candidate's score (Q units per unit
# of `measured_evidence`): chosen on the tuning set (0.5, 1 and 2 tried).
EVIDENCE_WEIGHT = 1.0


def fit_threads(obs: "Observation",
                values: dict[str, float]) -> dict[str, float]:
  """Parallelism `values` (knob name -> threads) rounded and made to fit
  the agent's limits: each within `dqn.knob_bounds`, then the largest taken
  down one thread at a time until the total is within `dqn.cpu_limit`.
  Knobs of `obs` missing from `values` keep their value."""
  parallel = [k for k in obs.knobs if k.kind == "parallelism"]
  limit = dqn.cpu_limit(len(parallel), obs.cpu_budget)
  bounds = {k.name: dqn.knob_bounds(k, obs.cpu_budget) for k in parallel}
  out = {}
  for k in parallel:
    lo, hi = bounds[k.name]
    out[k.name] = float(min(max(round(values.get(k.name, k.value)), lo), hi))
  while sum(out.values()) > limit:
    above = [n for n in out if out[n] > bounds[n][0]]
    if not above:
      break
    out[max(above, key=lambda n: (out[n], n))] -= 1
  return out


def proportional_jumps(obs: "Observation",
                       fractions: Sequence[float] = JUMP_FRACTIONS
                       ) -> list[tuple[str, dict[str, float]]]:
  """Whole-configuration jumps: for each f of `fractions` (default
  `JUMP_FRACTIONS`), threads in proportion to each parallel stage's cost
  (`dqn.stage_costs`, `policies.proportional_allocation`) at a total of
  round(f x the CPU budget), made to fit (`fit_threads`). Each as (label,
  the knob values it changes); jumps that change nothing and repeats are
  left out; [] without parallel knobs or measured costs."""
  parallel = [k for k in obs.knobs if k.kind == "parallelism"]
  costs = dqn.stage_costs(obs)
  if not parallel or not costs:
    return []
  c = [costs.get(k.stage, 0.0) for k in parallel]
  current = {k.name: k.value for k in parallel}
  out, seen = [], set()
  for f in fractions:
    total = int(round(f * obs.cpu_budget))
    shares = policies.proportional_allocation(c, total,
                                              [k.max for k in parallel])
    values = fit_threads(obs, {k.name: s for k, s in zip(parallel, shares)})
    changed = {n: v for n, v in values.items() if v != current[n]}
    key = tuple(sorted(changed.items()))
    if changed and key not in seen:
      seen.add(key)
      out.append((f"proportional at {f:g} x {obs.cpu_budget} CPUs", changed))
  return out


def candidate_actions(obs: "Observation",
                      values: dict[str, float]) -> list[int] | None:
  """The flat actions (`dqn.action_of`) a candidate's `values` are made of,
  one per knob it changes, or None when a change is not one of `dqn.MOVES`.
  """
  index = {k.name: i for i, k in enumerate(obs.knobs)}
  out = []
  for name, value in values.items():
    i = index[name]
    move = int(round(value - obs.knobs[i].value))
    if move not in dqn.MOVES:
      return None
    out.append(dqn.action_of(i, move))
  return out


def measured_evidence(obs: "Observation", values: dict[str, float],
                      evidence: dict[str, tuple[float, float]]) -> float:
  """The sum, over the knobs `values` changes, of `evidence[knob]`'s entry
  for the direction of the change: (raised, lowered), each the relative
  gain last measured for a trial that moved the knob that way, times
  GAIN_SCALE and clipped to +-1 (`RankedSearchPolicy` keeps them); 0 for a
  knob without evidence."""
  total = 0.0
  current = {k.name: k.value for k in obs.knobs}
  for name, value in values.items():
    if name in evidence and value != current[name]:
      total += evidence[name][0 if value > current[name] else 1]
  return total


def rank(candidates: Sequence[tuple[str, dict[str, float]]],
         obs: "Observation", q: np.ndarray,
         bonus: Sequence[float] | None = None
         ) -> list[tuple[str, dict[str, float], float]]:
  """`candidates` (label, values) with their scores under the flat Q-values
  `q` (`dqn.flat_q`; the no-op last), best first; equal scores keep the
  order of `candidates`.

  A candidate's score is the sum over its moves of Q(s, a) - Q(s, no-op),
  plus its `bonus` (default none); one that is not made of `dqn.MOVES`
  scores -inf.
  """
  noop = q[-1]
  scored = []
  for i, (label, values) in enumerate(candidates):
    actions = candidate_actions(obs, values)
    score = (-np.inf if actions is None else
             float(sum(q[a] - noop for a in actions)) +
             (bonus[i] if bonus is not None else 0.0))
    scored.append((label, values, score))
  order = sorted(range(len(scored)), key=lambda i: (-scored[i][2], i))
  return [scored[i] for i in order]


class RankedSearchPolicy(search.MeasuredSearch):
  """The Q-network's ranking inside a measured accept/revert search (module
  docstring).

  Args:
    options: the session's options.
    weights: agent weights file. Default: the shipped pretrained agent.
    max_tries: rejected trials at one base before the search holds.
      Default `MAX_TRIES` (None: no limit).
    prior_margin: candidates whose advantage over the no-op is below
      -prior_margin are not tried. Default `PRIOR_MARGIN` (inf: all are).
    order: "q" ranks by the Q-network; "climb" keeps climb's order (the
      ablation without the learned prior). Default "q".
    agent_weights: network weights in place of a file (`dqn.forward`'s
      list). Default: read from `weights`.
    jumps: totals (in CPU budgets) of the proportional jumps tried, in
      order, before the local search (`proportional_jumps`); made again
      when the knobs or the CPU budget change. Default () (none).
    evidence_weight: weight of the measured evidence in a candidate's score
      (`measured_evidence`; 0: the Q-network alone). Default
      `EVIDENCE_WEIGHT`.
    **kwargs: `search.MeasuredSearch`'s (threshold, samples, min_elements,
      restart).
  """

  def __init__(self, options: "IntuneOptions", weights: str | None = None,
               max_tries: int | None = MAX_TRIES,
               prior_margin: float = PRIOR_MARGIN, order: str = "q",
               agent_weights: Sequence[np.ndarray] | None = None,
               jumps: Sequence[float] = (),
               evidence_weight: float = EVIDENCE_WEIGHT, **kwargs):
    self.max_tries = max_tries
    self.evidence_weight = evidence_weight
    self.jumps = tuple(jumps)
    self.prior_margin = prior_margin
    if order not in ("q", "climb"):
      raise ValueError(f"order must be 'q' or 'climb', got {order!r}.")
    self.order = order
    if agent_weights is None:
      weights_list, _ = dqn.load_weights(weights or DEFAULT_WEIGHTS)
      agent_weights = weights_list
    self.weights = [np.asarray(w, np.float32) for w in agent_weights]
    self._climb = search.ClimbPolicy(options)
    super().__init__(options, **kwargs)

  def _reset(self, context: tuple | None) -> None:
    # Jumps are made once per context (knobs, CPU budget), not again when
    # a converged search restarts on a moved rate: on the tuning set, the
    # second round of jumps cost more trials than it found.
    self._next_jump = 0
    # Knob name -> (raised, lowered) measured gains (`measured_evidence`),
    # kept across bases until the context changes.
    self.evidence: dict[str, tuple[float, float]] = {}
    self._moves: dict[str, int] = {}
    super()._reset(context)

  def restart_search(self) -> None:
    self._tried: set[str] = set()
    self._tries = 0

  def accepted(self, obs, label):
    self._record()
    self._tried = set()
    self._tries = 0

  def rejected(self, obs, label):
    self._record()
    self._tries += 1

  def _record(self) -> None:
    """The last trial's measured gain as evidence on the knobs it moved
    (jumps move many knobs at once and leave none)."""
    gain = float(np.clip(self.last_gain * GAIN_SCALE, -1.0, 1.0))
    for name, sign in self._moves.items():
      raised, lowered = self.evidence.get(name, (0.0, 0.0))
      self.evidence[name] = (gain, lowered) if sign > 0 else (raised, gain)
    self._moves = {}

  def q_values(self, obs: "Observation") -> np.ndarray:
    """The flat Q-values of `obs` (`dqn.flat_q`)."""
    return dqn.flat_q(dqn.forward(self.weights, dqn.features(obs)))

  def ranked(self, obs: "Observation"
             ) -> list[tuple[str, dict[str, float], float]]:
    """Every candidate from `obs` with its score, in the order tried."""
    candidates = self._climb.candidates(obs)
    bonus = None
    if self.evidence_weight and self.evidence:
      bonus = [self.evidence_weight * measured_evidence(obs, values,
                                                        self.evidence)
               for _, values in candidates]
    scored = rank(candidates, obs, self.q_values(obs), bonus)
    if self.order == "climb":
      score = {label: s for label, _, s in scored}
      return [(label, values, score[label]) for label, values in candidates]
    return scored

  def next_jump(self, obs: "Observation"
                ) -> tuple[str, dict[str, float]] | None:
    """The next of `jumps` not yet tried that changes something, or None
    when none is left."""
    while self._next_jump < len(self.jumps):
      fraction = self.jumps[self._next_jump]
      self._next_jump += 1
      found = proportional_jumps(obs, (fraction,))
      if found:
        return found[0]
    return None

  def propose(self, obs):
    self._moves = {}
    jump = self.next_jump(obs)
    if jump is not None:
      return jump
    if self.max_tries is not None and self._tries >= self.max_tries:
      return None
    current = {k.name: k.value for k in obs.knobs}
    for label, values, score in self.ranked(obs):
      if score >= -self.prior_margin and label not in self._tried:
        self._tried.add(label)
        self._moves = {n: 1 if v > current[n] else -1
                       for n, v in values.items() if v != current[n]}
        return label, values
    return None


class JumpSearchPolicy(RankedSearchPolicy):
  """`RankedSearchPolicy` with `JUMP_FRACTIONS` jumps first and the
  jump-search ranker (`JUMP_WEIGHTS`); module docstring.

  Args: as `RankedSearchPolicy` (defaults: weights `JUMP_WEIGHTS`, jumps
  `JUMP_FRACTIONS`).
  """

  def __init__(self, options: "IntuneOptions", weights: str | None = None,
               jumps: Sequence[float] = JUMP_FRACTIONS, **kwargs):
    super().__init__(options, weights=weights or JUMP_WEIGHTS, jumps=jumps,
                     **kwargs)


policies.register("intune-search", RankedSearchPolicy)
policies.register("intune-jump", JumpSearchPolicy)
