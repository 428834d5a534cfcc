"""Tuning policies: what value each knob of a pipeline should have.

A policy sees a session's knobs, per-stage statistics and budgets at every
tuning step and returns the knob values it wants. The registry
(`intune_tf.live.registry`) maps the names `IntuneOptions(policy=NAME)`
selects to policies.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Sequence

from absl import logging

from intune_tf import records

if TYPE_CHECKING:
  from intune_tf.ops.session import TuningSession
  from intune_tf.options import IntuneOptions
  from intune_tf.records import Decision
  from intune_tf.records import Observation

# Largest prefetch buffer (elements) the "even" policy gives a stage.
MAX_EVEN_BUFFER = 8


class Policy(abc.ABC):
  """Decides knob values for one tuning session.

  Subclasses implement `step`. The tuner calls it once per tuning step with
  an `intune_tf.records.Observation` (knobs in force, per-stage
  statistics, budgets, host readings); the returned values are applied
  atomically (knobs left out keep their value). A policy that raises keeps
  the pipeline at its last good configuration.
  """

  # A static policy decides from the knobs alone (not from statistics): the
  # tuner steps it again only when the pipeline's set of knobs changes.
  static = False
  # What the last step did, for the decision log; None: nothing to say.
  last_decision: "Decision | None" = None

  def __init__(self, options: IntuneOptions):
    self.options = options

  def bind(self, session: "TuningSession") -> None:
    """Called once by the tuner, before the first step, with the session the
    policy tunes (for state kept between runs, such as warm start). A
    failure is logged and tuning goes on. Default: does nothing."""
    del session

  @abc.abstractmethod
  def step(self, obs: "Observation") -> dict[str, float]:
    """Returns `{knob name: value}` for this step."""

  def held_bytes(self) -> int:
    """Host memory the policy holds (replay buffers, networks): the tuner
    takes it from the session's RAM budget, so that the pipeline's buffers
    and the policy fit together. Default: 0."""
    return 0


def even_split(total: int, parts: int) -> list[int]:
  """Splits `total` units over `parts` as evenly as possible, each at least 1.

  The remainder goes to the first parts: even_split(5, 2) == [3, 2].
  """
  if parts <= 0:
    return []
  base, extra = divmod(max(total, parts), parts)
  return [base + (1 if i < extra else 0) for i in range(parts)]


def buffer_elements(ram_bytes: float, bytes_per_element: float,
                    cap: int) -> int:
  """Elements a buffer may hold within `ram_bytes`, in [1, cap].

  An unknown element size (0) gives 1, the safe start.
  """
  if bytes_per_element <= 0:
    return 1
  return int(max(1, min(cap, ram_bytes // bytes_per_element)))


def proportional_allocation(costs: Sequence[float], total: int,
                            maxs: Sequence[float] | None = None) -> list[int]:
  """Integer shares of `total` in proportion to `costs`, each in [1, max].

  Largest-remainder rounding; a stage capped at its max gives its surplus to
  the others. With no cost information (all 0) the split is even.
  Example: costs [3, 1], total 4 -> [3, 1]; costs [1, 1, 2], total 6 ->
  [2, 1, 3] (exact shares 1.5, 1.5, 3; the first remainder wins the tie).
  """
  n = len(costs)
  if n == 0:
    return []
  maxs = list(maxs) if maxs is not None else [float("inf")] * n
  if sum(costs) <= 0:
    return [int(min(v, m)) for v, m in zip(even_split(total, n), maxs)]
  result = [1] * n
  free = [i for i in range(n) if maxs[i] > 1]
  remaining = max(total, n) - n
  while remaining > 0 and free:
    weight = sum(costs[i] for i in free) or len(free)
    exact = {i: remaining * (costs[i] / weight if weight else 1 / len(free))
             for i in free}
    given = {i: int(min(exact[i], maxs[i] - result[i])) for i in free}
    order = sorted(free, key=lambda i: exact[i] - int(exact[i]), reverse=True)
    left = remaining - sum(given.values())
    for i in order:
      if left <= 0:
        break
      if result[i] + given[i] < maxs[i]:
        given[i] += 1
        left -= 1
    if sum(given.values()) == 0:
      break
    for i in free:
      result[i] += given[i]
    remaining -= sum(given.values())
    free = [i for i in free if result[i] < maxs[i]]
  return result


def _clamp(value: float, knob) -> float:
  return float(min(max(value, knob.min), knob.max))


def even_buffers(obs, buffers) -> dict[str, float]:
  """The RAM budget split evenly over `buffers`, each at most
  `MAX_EVEN_BUFFER` elements."""
  values = {}
  bpe = obs.bytes_per_element
  for knob in buffers:
    share = obs.ram_budget / len(buffers)
    values[knob.name] = _clamp(
        buffer_elements(share, bpe.get(knob.stage, 0.0), MAX_EVEN_BUFFER), knob)
  return values


class EvenPolicy(Policy):
  """Usable CPUs split evenly over the parallel stages (the paper's start).

  The RAM budget is split evenly over the buffers, each holding at most
  `MAX_EVEN_BUFFER` elements.
  """

  def step(self, obs):
    parallel = [k for k in obs.knobs if k.kind == "parallelism"]
    buffers = [k for k in obs.knobs if k.kind == "buffer_size"]
    values = {k.name: _clamp(c, k) for k, c in
              zip(parallel, even_split(obs.cpu_budget, len(parallel)))}
    values.update(even_buffers(obs, buffers))
    return values


class UnoptimizedPolicy(Policy):
  """Parallelism 1 and buffer 1 per stage."""

  static = True

  def step(self, obs):
    return {k.name: _clamp(1, k) for k in obs.knobs}


class AnalyticPolicy(Policy):
  """A Plumber-style allocator: parallelism in proportion to CPU cost.

  Each parallel stage's cost is its share of the pipeline's processing time
  (CPU-seconds it spends per output element), smoothed over steps; the CPU
  budget is split in proportion (`proportional_allocation`), re-solved every
  step, so a change of usable CPUs is followed at once. Buffers as "even".
  Until a stage has been measured the split is even.
  """

  SMOOTHING = 0.3

  def __init__(self, options):
    super().__init__(options)
    self._cost: dict[str, float] = {}

  def step(self, obs):
    parallel = [k for k in obs.knobs if k.kind == "parallelism"]
    buffers = [k for k in obs.knobs if k.kind == "buffer_size"]
    for k in parallel:
      st = obs.stage(k.stage)
      if st is None or st.rate <= 0 or obs.output_rate <= 0:
        continue
      cost = records.stage_cost(st.cpu_per_element_s, st.rate,
                                obs.output_rate)
      old = self._cost.get(k.stage)
      self._cost[k.stage] = cost if old is None else (
          self.SMOOTHING * cost + (1 - self.SMOOTHING) * old)
    costs = [self._cost.get(k.stage, 0.0) for k in parallel]
    if any(c <= 0 for c in costs):
      costs = [0.0] * len(parallel)
    shares = proportional_allocation(costs, obs.cpu_budget,
                                     [k.max for k in parallel])
    values = {k.name: _clamp(p, k) for k, p in zip(parallel, shares)}
    values.update(even_buffers(obs, buffers))
    return values


class FixedPolicy(Policy):
  """Applies `IntuneOptions.config` (clamped to each knob's range).

  Config names that match no knob of the pipeline are logged once per
  session, with the pipeline's knob names: they are not applied.
  """

  static = True

  def __init__(self, options):
    super().__init__(options)
    self._session: "TuningSession | None" = None
    self._told_unmatched = False

  def bind(self, session):
    self._session = session

  def step(self, obs):
    config = self.options.config or {}
    names = [k.name for k in obs.knobs]
    unmatched = sorted(set(config) - set(names))
    if unmatched and not self._told_unmatched:
      self._told_unmatched = True
      logging.warning(
          "InTune %r: IntuneOptions.config names %s, which match no knob of "
          "this pipeline, so the \"fixed\" policy does not apply them. The "
          "pipeline's knobs: %s. Use these names (as TuningSession.config() "
          "returns them). Reported once per session.",
          self._session if self._session is not None else "(unbound)",
          unmatched, sorted(names))
    return {k.name: _clamp(config[k.name], k) for k in obs.knobs
            if k.name in config}


class ManualPolicy(Policy):
  """Changes nothing: the user sets knobs through `TuningSession.set`."""

  static = True

  def step(self, obs):
    return {}
