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
(`search.measured_evidence`, weighted by `evidence_weight`): the gain the
search last measured when it moved the same knobs the same way, at an
earlier base; `search.JumpClimbPolicy` (`jump-climb`) is the same search
ranked by the evidence alone, without learning. Candidates are
tried from the highest score down (climb's bottleneck-first order breaks
ties), a rejected one is not tried again at
the same base, and the search at a base ends (the policy holds) after
`max_tries` rejections or when no candidate's advantage reaches
`-prior_margin`: the prior says the rest would not help, so trials that
would only cost throughput are not made.

`policy="intune-jump"`: the same search, first trying whole-configuration
jumps (`search.proportional_jumps`): threads in proportion to each stage's
measured cost at a total of f x the CPU budget, for each f of
`search.JUMP_FRACTIONS` in turn, each measured and kept only when it beats the
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
# Weight of the measured evidence in a candidate's score (Q units per unit
# of `search.measured_evidence`): chosen on the tuning set (0.5, 1 and 2
# tried).
EVIDENCE_WEIGHT = 1.0


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
  return search.best_first(scored)


class RankedSearchPolicy(search.JumpClimbPolicy):
  """The Q-network's ranking inside a measured accept/revert search (module
  docstring): `search.JumpClimbPolicy` with the candidates scored by the
  Q-network and the evidence.

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
      order, before the local search (`search.proportional_jumps`). Default
      () (none).
    evidence_weight: weight of the measured evidence in a candidate's score
      (`search.measured_evidence`; 0: the Q-network alone). Default
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
    self.evidence_weight = evidence_weight
    self.prior_margin = prior_margin
    if order not in ("q", "climb"):
      raise ValueError(f"order must be 'q' or 'climb', got {order!r}.")
    self.order = order
    if agent_weights is None:
      weights_list, _ = dqn.load_weights(weights or DEFAULT_WEIGHTS)
      agent_weights = weights_list
    self.weights = [np.asarray(w, np.float32) for w in agent_weights]
    super().__init__(options, jumps=jumps, max_tries=max_tries, **kwargs)

  def q_values(self, obs: "Observation") -> np.ndarray:
    """The flat Q-values of `obs` (`dqn.flat_q`)."""
    return dqn.flat_q(dqn.forward(self.weights, dqn.features(obs)))

  def ranked(self, obs: "Observation"
             ) -> list[tuple[str, dict[str, float], float]]:
    """Every candidate from `obs` with its score, in the order tried."""
    candidates = self.candidates(obs)
    bonus = None
    if self.evidence_weight and self.evidence:
      bonus = [self.evidence_weight * search.measured_evidence(
          obs, values, self.evidence) for _, values in candidates]
    scored = rank(candidates, obs, self.q_values(obs), bonus)
    if self.order == "climb":
      score = {label: s for label, _, s in scored}
      return [(label, values, score[label]) for label, values in candidates]
    return scored

  def worth_trying(self, score: float) -> bool:
    return score >= -self.prior_margin


class JumpSearchPolicy(RankedSearchPolicy):
  """`RankedSearchPolicy` with `search.JUMP_FRACTIONS` jumps first and the
  jump-search ranker (`JUMP_WEIGHTS`); module docstring.

  Args: as `RankedSearchPolicy` (defaults: weights `JUMP_WEIGHTS`, jumps
  `search.JUMP_FRACTIONS`).
  """

  def __init__(self, options: "IntuneOptions", weights: str | None = None,
               jumps: Sequence[float] = search.JUMP_FRACTIONS, **kwargs):
    super().__init__(options, weights=weights or JUMP_WEIGHTS, jumps=jumps,
                     **kwargs)


policies.register("intune-search", RankedSearchPolicy)
policies.register("intune-jump", JumpSearchPolicy)
