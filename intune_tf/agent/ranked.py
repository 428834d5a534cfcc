"""`policy="intune"` (the default) and `policy="intune-search"`: the
pretrained Q-network ranks the moves of a measured accept/revert search.

The learned prior decides what to try first; measurement decides what to
keep. The search loop is `search.MeasuredSearch`'s (measure the base, try a
change, keep it when its rate beats the base's by more than the threshold,
else revert); the candidate changes are `search.ClimbPolicy`'s (each knob's
+-1 and +-5 that `mdp.action_mask` allows, and threads moved from the least
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
the same base, and the search settles (the policy holds, with no trials)
after `patience` rejections in a row (`search.MeasuredSearch`) or when no
candidate's advantage reaches `-prior_margin`: the prior says the rest
would not help, so trials that would only cost throughput are not made. A
settled search re-opens when an observed quantity moves beyond its noise
(`search.held_signals`, `intune_tf.tuning.change`).

`policy="intune"` (also registered as `intune-jump`): `jump-climb`'s
search (`search.JumpClimbPolicy`: jumps, then climb's moves ordered by the
measured evidence, ties in climb's order), whose first jump at each
(re)start (a new context, or a settled search re-opening on a change) is
the allocation network's proposal (`allocator.Allocator`: the whole
configuration the network, trained on the simulator's optima, expects to
be best), then the proportional jumps of `INTUNE_JUMPS` (totals of 1 and
1.5 CPU budgets); and the Q-network adds ONE proposal per search: the first
local move after the jumps is the candidate of the highest Q-advantage, when
that advantage is above 0. Measurement confirms each: kept when it beats
the base, reverted at once otherwise. The networks never reorder what the
measured evidence orders: at that point the search has no evidence (jumps
leave none, and a (re)start forgets it). Its ranker, `jump_ranker.npz`, is
fitted on the states the jump search visits.

`policy="intune-ablated"`: `intune` with both networks' outputs replaced
by constants (`AblatedSearchPolicy`): every move's advantage is 0, so the
Q-network makes no proposal, and the allocation network's share is the
same for every knob and state. The difference between `intune` and
`intune-ablated` is what learning adds.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import TYPE_CHECKING, Sequence

from absl import logging
import numpy as np

from intune_tf import records
from intune_tf.agent import allocator as allocator_lib
from intune_tf.agent import dqn
from intune_tf.tuning import mdp
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
# Candidates whose advantage is below -PRIOR_MARGIN are not tried (Q units;
# values are about 10, so 0.1 is 1% of a step's reward).
PRIOR_MARGIN = float("inf")
# intune-jump's ranker: DEFAULT_WEIGHTS fitted further on the states the
# jump search visits (command in the file's metadata).
JUMP_WEIGHTS = os.path.join(os.path.dirname(__file__), "jump_ranker.npz")
# The proportional jumps of `intune`, after the learned allocation: chosen
# on the tuning set (seed 99, steady and dynamic) among (1.0,), (1.0, 1.25),
# (1.0, 1.5), (1.0, 1.25, 1.5) and `search.JUMP_FRACTIONS`. The 1.5 jump
# reaches optima that hold more threads than CPUs, which the network's
# proposal undershoots; more jumps cost more trials after every event.
INTUNE_JUMPS = (1.0, 1.5)
# Weight of the measured evidence in a candidate's score (Q units per unit
# of `search.measured_evidence`): chosen on the tuning set (0.5, 1 and 2
# tried).
EVIDENCE_WEIGHT = 1.0
# Steps between saves of the warm-start configuration (`JumpSearchPolicy`).
SAVE_EVERY = 20
# The ablated network's output (`AblatedSearchPolicy`), for every action.
ABLATED_Q = 0.0


def candidate_actions(obs: "Observation",
                      values: dict[str, float]) -> list[int] | None:
  """The flat actions (`mdp.action_of`) a candidate's `values` are made of,
  one per knob it changes, or None when a change is not one of `mdp.MOVES`.
  """
  index = {k.name: i for i, k in enumerate(obs.knobs)}
  out = []
  for name, value in values.items():
    i = index[name]
    move = int(round(value - obs.knobs[i].value))
    if move not in mdp.MOVES:
      return None
    out.append(mdp.action_of(i, move))
  return out


def rank(candidates: Sequence[tuple[str, dict[str, float]]],
         obs: "Observation", q: np.ndarray,
         bonus: Sequence[float] | None = None
         ) -> list[tuple[str, dict[str, float], float]]:
  """`candidates` (label, values) with their scores under the flat Q-values
  `q` (`dqn.flat_q`; the no-op last), best first; equal scores keep the
  order of `candidates`.

  A candidate's score is the sum over its moves of Q(s, a) - Q(s, no-op),
  plus its `bonus` (default none); one that is not made of `mdp.MOVES`
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
      patience, reopen).
  """

  def __init__(self, options: "IntuneOptions", weights: str | None = None,
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
    super().__init__(options, jumps=jumps, **kwargs)

  def q_values(self, obs: "Observation") -> np.ndarray:
    """The flat Q-values of `obs` (`dqn.flat_q`)."""
    return dqn.flat_q(dqn.forward(self.weights, mdp.features(obs)))

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
  """`search.JumpClimbPolicy` with the learned allocation first among its
  jumps, the Q-network's one proposal per search (module docstring) and
  the jump-search ranker (`JUMP_WEIGHTS`).

  Live (`bind`), it warm-starts: the configuration saved for the same
  pipeline on the same machine (`intune_tf.agent.warmstart`) is applied
  at the first step and the search goes on from there; the configuration
  in force is saved when the search settles and every `SAVE_EVERY` steps
  when no trial is on. `last_decision` changes only when a step is done,
  with the step's time in it: another thread (the Keras callback's logs,
  a test) never reads a decision without it.

  Args: as `RankedSearchPolicy` (defaults: weights `JUMP_WEIGHTS`, jumps
  `INTUNE_JUMPS`), and `allocator`, the learned allocation (default: the
  shipped network, `allocator.Allocator()`); `evidence_weight` and `order`
  are not used.
  """

  def __init__(self, options: "IntuneOptions", weights: str | None = None,
               jumps: Sequence[float] = INTUNE_JUMPS,
               allocator: allocator_lib.Allocator | None = None, **kwargs):
    self.allocator = allocator or allocator_lib.Allocator()
    super().__init__(options, weights=weights or JUMP_WEIGHTS, jumps=jumps,
                     **kwargs)
    self.session = None
    self.steps = 0
    self._warm = None  # the `warmstart.State` loaded, until applied
    self._decided: "records.Decision | None" = None

  @property
  def last_decision(self) -> "records.Decision | None":
    return self._published

  @last_decision.setter
  def last_decision(self, decision: "records.Decision | None") -> None:
    # The searches set it mid-step; `step` publishes it, timed, at its end.
    self._decided = decision

  _published: "records.Decision | None" = None

  def _reset(self, context: tuple | None) -> None:
    # Whether this search's local moves have begun (the network's one
    # proposal is made at most once per (re)start), and whether the learned
    # allocation was proposed (first, once per (re)start).
    self._local = False
    self._allocated = False
    super()._reset(context)

  def next_jump(self, obs: "Observation"
                ) -> tuple[str, dict[str, float]] | None:
    """The learned allocation first (`allocator.Allocator.propose`), then
    the proportional jumps of `jumps`."""
    if not self._allocated:
      self._allocated = True
      proposal = self.allocator.propose(obs)
      if proposal is not None:
        return proposal
    return super().next_jump(obs)

  def proposal(self, obs: "Observation"
               ) -> tuple[str, dict[str, float], float] | None:
    """The network's proposal from `obs`: the candidate of the highest
    Q-advantage (`rank` without evidence), with its advantage, or None
    when no candidate's advantage is above 0."""
    scored = rank(self.candidates(obs), obs, self.q_values(obs))
    if scored and scored[0][2] > 0:
      return scored[0]
    return None

  def ranked(self, obs: "Observation"
             ) -> list[tuple[str, dict[str, float], float]]:
    """Every candidate from `obs` with its score, in the order tried:
    `search.JumpClimbPolicy`'s (measured evidence, then climb's order),
    with the network's `proposal` first before the search's first local
    move."""
    order = search.JumpClimbPolicy.ranked(self, obs)
    if self._local:
      return order
    pick = self.proposal(obs)
    if pick is None:
      return order
    return [(pick[0], pick[1], math.inf)] + [
        c for c in order if c[0] != pick[0]]

  def propose(self, obs):
    proposal = super().propose(obs)
    if proposal is not None and self._moves:
      self._local = True  # a local move (jumps leave `_moves` empty)
    return proposal

  def bind(self, session) -> None:
    """Loads the warm-start configuration saved for `session`'s pipeline."""
    # Deferred: warmstart fingerprints graphs with the kernel library
    # (TensorFlow); the simulator's policies must not load it at import.
    from intune_tf.agent import warmstart  # noqa: PLC0415
    self.session = session
    state = warmstart.load(session)
    if state is not None:
      self._warm = state

  def _save(self, obs: "Observation") -> None:
    # Deferred: as in `bind`.
    from intune_tf.agent import warmstart  # noqa: PLC0415
    try:
      warmstart.save(self.session, {k.name: k.value for k in obs.knobs},
                     self.base_rate or 0.0)
    except OSError as e:
      logging.log_first_n(logging.WARNING,
                          "InTune: cannot save the warm-start state: %s", 1, e)

  def step(self, obs: "Observation") -> dict[str, float]:
    start = time.perf_counter()
    self.steps += 1
    if self._warm is not None and obs.knobs:
      # Deferred: as in `bind`.
      from intune_tf.agent import warmstart  # noqa: PLC0415
      values = warmstart.fitting(self._warm, obs.knobs)
      self._warm = None
      if values:
        self._decided = records.Decision(0, "warm-start")
        self._publish(start)
        return values
    settled = self.converged
    values = super().step(obs)
    if self.session is not None and not self.on_trial and (
        (self.converged and not settled) or self.steps % SAVE_EVERY == 0):
      self._save(obs)
    self._publish(start)
    return values

  def _publish(self, start: float) -> None:
    if self._decided is not None:
      self._published = dataclasses.replace(
          self._decided, seconds=time.perf_counter() - start)
      self._decided = None


class AblatedSearchPolicy(JumpSearchPolicy):
  """`JumpSearchPolicy` with both networks' outputs replaced by constants:
  the Q-network's by `ABLATED_Q` for every action, the allocation
  network's by the mean share of its training targets (from its weights'
  metadata) for every knob. Everything else, the evidence included, is the
  same, so it carries no learned information.

  Args: as `JumpSearchPolicy`.
  """

  def __init__(self, options: "IntuneOptions", **kwargs):
    if kwargs.get("allocator") is None:
      _, metadata = dqn.load_weights(allocator_lib.ALLOCATOR_WEIGHTS)
      kwargs["allocator"] = allocator_lib.Allocator(
          constant=float(metadata["mean_share"]))
    super().__init__(options, **kwargs)

  def q_values(self, obs: "Observation") -> np.ndarray:
    """`ABLATED_Q` for each of the 4n + 1 actions of `obs`."""
    return np.full(mdp.MOVES_PER_KNOB * len(obs.knobs) + 1, ABLATED_Q,
                   np.float32)
