"""Search baselines: policies that try a change and keep it only when the
measured throughput says it helped.

- `climb` (`ClimbPolicy`): a bottleneck-first hill climber: the busiest
  stage's knobs are tried first.
- `coordinate` (`CoordinatePolicy`): a coordinate climber: each knob in
  turn, up then down.
- `plumber` (`PlumberPolicy`): parallelism in proportion to each stage's
  measured cost, with the total number of threads searched.
- `jump-climb` (`JumpClimbPolicy`): proportional jumps first, then climb's
  moves in the order of what the search measured for them at earlier
  bases (`measured_evidence`).

They are the non-learning baselines `intune simulate` scores the agent
against, and they run live like any policy (`IntuneOptions(policy="climb")`,
`intune bench --policies climb,...`). They move within the agent's limits:
`climb`, `coordinate` and `jump-climb`'s moves are the agent's own moves
(`mdp.MOVES`) that `mdp.action_mask` allows; `plumber` and `jump-climb`'s
jumps set whole configurations, every knob within `mdp.proposal_bounds`
(no parallel stage below `mdp.start_threads`), the threads within
`mdp.cpu_limit` (and `plumber`'s buffers within the RAM budget). Only a
local move takes a stage below its start, where the stages cannot all hold
it on the CPUs (`mdp.thread_floor`).

Measurement and accept/revert (`MeasuredSearch`): a measurement is the
output rate over `samples` tuning steps (and at least `min_elements`
elements, or 6 steps more; the base's window starts at the first step
that returns something). The configuration in force (the "base") is
measured; a change is applied and measured; it is kept when its rate
beats the base's by more than `threshold`, else the previous values are
restored and the next candidate is tried after the base is measured again
(each measurement of the base is averaged into its estimate); a trial that
measures worse is reverted at the next measurement, the one that judges
it.

Settling: the search converges, and holds its configuration with no trial at
all, when no candidate is left or when `patience` trials in a row made no
progress. Progress is the base's estimate, measured at least twice, rising
more than `threshold` above where the last progress left it: under 3%
measurement noise some trials of neutral moves measure above the threshold
and are kept, so a search that waits for an empty candidate list never
stops, and one that counts rejections in a row stops early (a kept neutral
move does not count as progress here, since the base measured again falls
back). A held search re-opens when something it observes moves beyond its
noise (`change.ChangeMonitor` on the output rate, each stage's cost per
element, the consumer's pace, the usable CPUs and the memory in use; see
`held_signals`), not on a timer; and it starts afresh when the knobs or the
CPU budget change.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Sequence

from intune_tf import records
from intune_tf.tuning import change
from intune_tf.tuning import mdp
from intune_tf.tuning import policies

if TYPE_CHECKING:
  from intune_tf.options import IntuneOptions
  from intune_tf.records import Observation

# Defaults of the measured search (see `MeasuredSearch`). Threshold and
# samples were chosen by the simulator's score on a tuning set apart from
# `intune simulate`'s (60 pipelines of `evaluation_pipelines(seed=99)`):
# thresholds 0.01, 0.02, 0.04 and 1 or 2 steps per measurement; 0.02 and 1
# scored best for all three policies, or within 0.01 of the best median.
THRESHOLD = 0.02
SAMPLES = 1
# A measurement waits for at least this many output elements (a rate counted
# over fewer is mostly quantization noise); the agent policy uses it too.
MIN_ELEMENTS = 16
# Trials without progress after which the search settles at its base
# (module docstring).
PATIENCE = 16
# Measurements of the base averaged into its estimate (the newest weigh
# more once there are this many).
BASE_WINDOW = 4
# Totals of the proportional jumps (`JumpClimbPolicy`, intune-jump), in CPU
# budgets, in the order tried: chosen on the tuning set apart from
# `intune simulate`'s (60 pipelines of `evaluation_pipelines(seed=99)`).
JUMP_FRACTIONS = (1.0, 0.75, 1.25, 0.5, 1.5)
# Relative gains are scaled by this in the measured evidence and in the
# ranker's targets (a 1% gain is 0.1 Q units).
GAIN_SCALE = 10.0


@dataclasses.dataclass
class _Trial:
  """A change on trial: what it set, what restores the base, its label."""
  values: dict[str, float]
  revert: dict[str, float]
  label: str


class MeasuredSearch(policies.Policy):
  """Accept/revert on measured throughput (module docstring); subclasses
  propose the changes (`propose`) and hear what became of them
  (`accepted`, `rejected`).

  Args:
    options: the session's options.
    threshold: relative rise of the measured rate over the base's that
      keeps a change. Default 0.02.
    samples: tuning steps per measurement. Default 1.
    min_elements: output elements a measurement waits for (up to 6 steps
      more), so a rate of few large batches is not quantization noise.
      Default 16.
    patience: trials without progress (module docstring) after which the
      search settles (None: only when no candidate is left). Default
      `PATIENCE`.
    reopen: whether a settled search re-opens when an observed quantity
      moves beyond its noise (`held_signals`). Default True.
  """

  def __init__(self, options: "IntuneOptions", threshold: float = THRESHOLD,
               samples: int = SAMPLES, min_elements: float = MIN_ELEMENTS,
               patience: int | None = PATIENCE, reopen: bool = True):
    super().__init__(options)
    self.threshold = threshold
    self.samples = max(1, int(samples))
    self.min_elements = min_elements
    self.patience = patience
    self.reopen = reopen
    self.monitor = change.ChangeMonitor()
    self._context: tuple | None = None
    # The measured rate of the last trial over the base's, minus 1.
    self.last_gain = 0.0
    # The streams whose move re-opened the search last (for the log).
    self.moved: list[str] = []
    self._reset(None)

  def _reset(self, context: tuple | None) -> None:
    self._context = context
    self._steps = self._elements = self._seconds = 0.0
    self._base: float | None = None
    self._base_n = 0
    self._trial: _Trial | None = None
    self._converged = False
    # The base estimate at the last progress, and trials since.
    self._progress: float | None = None
    self._stalled = 0
    self.monitor.reset()
    self.restart_search()

  # --- for subclasses ---------------------------------------------------
  def restart_search(self) -> None:
    """Forgets the candidates tried (a new search from the base)."""

  def propose(self, obs: "Observation") -> tuple[str, dict[str, float]] | None:
    """The next change to try from the base `obs`: (label, knob values),
    or None when none is left (converged)."""
    raise NotImplementedError

  def accepted(self, obs: "Observation", label: str) -> None:
    """The change `label` raised the rate and is the new base (by
    `last_gain`)."""

  def rejected(self, obs: "Observation", label: str) -> None:
    """The change `label` did not raise the rate and was reverted."""

  def reopened(self, obs: "Observation") -> None:
    """A settled search re-opens because `self.moved` moved: by default as
    if the context had changed (`_reset`: the candidates, and what
    subclasses keep per context, are forgotten)."""
    self._reset(self._context)

  # --- the step ---------------------------------------------------------
  @property
  def base_rate(self) -> float | None:
    """The estimate of the base configuration's rate (None before it was
    measured)."""
    return self._base

  @property
  def converged(self) -> bool:
    return self._converged

  @property
  def on_trial(self) -> bool:
    """Whether a change is in force, waiting for its measurement."""
    return self._trial is not None

  def _measure(self, obs: "Observation") -> float | None:
    if (self._trial is None and self._elements <= 0 and
        obs.output_rate * obs.interval_s <= 0):
      # The base's window starts at the first step that returns something:
      # before it (a pipeline still filling its buffers) there is no rate,
      # and a base of 0 would keep any trial. A trial's window counts every
      # step: a change that stops the pipeline measures 0 and is reverted.
      return None
    self._steps += 1
    self._elements += obs.output_rate * obs.interval_s
    self._seconds += obs.interval_s
    if self._steps < self.samples or (
        self._elements < self.min_elements and self._steps < self.samples + 6):
      return None
    rate = self._elements / max(self._seconds, 1e-9)
    self._steps = self._elements = self._seconds = 0.0
    return rate

  def _credit_base(self, rate: float) -> None:
    n = min(self._base_n, BASE_WINDOW - 1)
    self._base = rate if self._base is None else (
        (self._base * n + rate) / (n + 1))
    self._base_n += 1
    if self._base_n >= 2:
      if self._progress is None:
        self._progress = self._base  # the start, not progress
      elif self._base > self._progress * (1 + self.threshold):
        self._progress, self._stalled = self._base, 0

  def step(self, obs: "Observation") -> dict[str, float]:
    context = (tuple(k.name for k in obs.knobs), obs.cpu_budget)
    if context != self._context:
      self._reset(context)
    if not obs.knobs:
      return {}
    rate = self._measure(obs)
    if rate is None:
      return {}
    note = ""
    if self._trial is not None:
      trial, self._trial = self._trial, None
      self.last_gain = rate / self._base - 1 if self._base else 0.0
      self._stalled += 1
      if rate > self._base * (1 + self.threshold):
        self._base, self._base_n = rate, 1
        self.accepted(obs, trial.label)
        self.last_decision = records.Decision(
            int(self._steps), f"keep {trial.label}", rate=rate)
      else:
        self.rejected(obs, trial.label)
        self.last_decision = records.Decision(
            int(self._steps), f"revert {trial.label}", rate=rate)
        return dict(trial.revert)
    else:
      if self._converged and self.reopen:
        self.moved = self.monitor.update(held_signals(obs, rate))
        if self.moved:
          self.reopened(obs)
          note = f"re-open: {', '.join(self.moved)} moved; "
      self._credit_base(rate)
      if self._converged:
        self.last_decision = records.Decision(
            int(self._steps), "hold", rate=rate)
        return {}
    proposal = None
    if self.patience is None or self._stalled < self.patience:
      proposal = self.propose(obs)
    if proposal is None:
      self._converged = True
      self.monitor.reset()
      self.last_decision = records.Decision(
          int(self._steps), f"{note}converged", rate=rate)
      return {}
    label, values = proposal
    current = {k.name: k.value for k in obs.knobs}
    self._trial = _Trial(values, {n: current[n] for n in values}, label)
    self.last_decision = records.Decision(
        int(self._steps), f"{note}try {label}", rate=rate)
    return dict(values)


def held_signals(obs: "Observation", rate: float) -> dict[str, float | None]:
  """What a settled search watches (`change.ChangeMonitor` streams): the
  log of the measured `rate`, of each stage's cost per output element
  (`records.stage_cost`), of the consumer's step time and of the usable
  CPUs, and the share of memory in use (`mdp.memory_fraction`); None for
  what is not measured."""

  def log(x: float | None) -> float | None:
    return math.log(x) if x is not None and x > 0 else None

  out: dict[str, float | None] = {
      "rate": log(rate), "usable CPUs": log(obs.usable_cpus),
      "consumer": log(obs.model_step_s),
      "memory": mdp.memory_fraction(obs)}
  for st in obs.stages:
    out[f"cost {st.name}"] = log(records.stage_cost(
        st.cpu_per_element_s, st.rate, obs.output_rate))
  return out


def _move_label(knob: "records.Knob", move: int) -> str:
  return f"{knob.name} {move:+d}"


def _moved(obs: "Observation", values: dict[str, float]) -> "Observation":
  """`obs` with `values` in place of its knobs' values."""
  knobs = tuple(dataclasses.replace(k, value=float(values[k.name]))
                if k.name in values else k for k in obs.knobs)
  return dataclasses.replace(obs, knobs=knobs)


def stage_utilizations(obs: "Observation") -> dict[str, float]:
  """`records.stage_utilization` of every stage that has a knob, at its
  parallelism knob's value (1 thread without one); 0 for a stage without
  statistics."""
  threads = {k.stage: k.value for k in obs.knobs if k.kind == "parallelism"}
  busy = {}
  for k in obs.knobs:
    st = obs.stage(k.stage)
    busy[k.stage] = (records.stage_utilization(
        st.cpu_per_element_s, st.rate, threads.get(k.stage)) if st else 0.0)
  return busy


class ClimbPolicy(MeasuredSearch):
  """A bottleneck-first hill climber with measured accept/revert.

  Candidates, in order, from the base configuration (only the moves
  `mdp.action_mask` allows; each tried once per base):

  1. for each stage from the busiest down (`stage_utilizations`: output
     rate x CPU-seconds per element / threads; ties: the costlier stage):
     its parallelism +5, +1, or, when the thread limit (`mdp.cpu_limit`)
     forbids them, the same number of threads moved from the least busy
     stage that can give them (-5 there, +5 here; then -1, +1); then its
     buffer +5, +1;
  2. for each stage from the least busy up: its parallelism -5, -1 (fewer
     threads, less contention), its buffer -5, -1.

  A kept change makes a new base and the list starts again from its top
  (the busiest stage may have changed).

  Args: as `MeasuredSearch` (defaults: threshold 0.02, 1 step per
  measurement).
  """

  def restart_search(self) -> None:
    self._tried: set[str] = set()

  def accepted(self, obs, label):
    self._tried = set()

  def candidates(self, obs: "Observation") -> list[tuple[str,
                                                         dict[str, float]]]:
    """Every candidate change from `obs`, in the order they are tried."""
    busy = stage_utilizations(obs)
    costs = mdp.stage_costs(obs)
    order = sorted(busy, key=lambda s: (-busy[s], -costs.get(s, 0.0), s))
    mask = mdp.action_mask(obs)
    index = {k.name: i for i, k in enumerate(obs.knobs)}
    by_stage: dict[str, dict[str, records.Knob]] = {}
    for k in obs.knobs:
      by_stage.setdefault(k.stage, {})[k.kind] = k

    def single(knob, move):
      if mask[mdp.action_of(index[knob.name], move)]:
        return [(_move_label(knob, move), {knob.name: knob.value + move})]
      return []

    parallel = [k for k in obs.knobs if k.kind == "parallelism"]
    out = []
    for stage in order:
      knob = by_stage[stage].get("parallelism")
      if knob is not None:
        for move in (5, 1):
          ups = single(knob, move)
          if not ups and knob.value + move <= mdp.knob_bounds(
              knob, obs.cpu_budget, len(parallel))[1]:
            ups = self._transfers(obs, knob, move, order[::-1], by_stage,
                                  mask, index)
          out += ups
      knob = by_stage[stage].get("buffer_size")
      if knob is not None:
        out += single(knob, 5) + single(knob, 1)
    for stage in order[::-1]:
      for kind in ("parallelism", "buffer_size"):
        knob = by_stage[stage].get(kind)
        if knob is not None:
          out += single(knob, -5) + single(knob, -1)
    return out

  def _transfers(self, obs, knob, move, donors, by_stage, mask, index):
    """`move` threads from the first donor stage that can give them (its
    -move allowed by `mask`, the mask of `obs`; `index`: knob name ->
    position) to `knob`, if the mask then allows +move."""
    for stage in donors:
      donor = by_stage[stage].get("parallelism")
      if donor is None or donor.name == knob.name:
        continue
      if not mask[mdp.action_of(index[donor.name], -move)]:
        continue
      after = _moved(obs, {donor.name: donor.value - move})
      if mdp.action_mask(after)[mdp.action_of(index[knob.name], move)]:
        return [(f"{donor.name} {-move:+d}, {knob.name} {move:+d}",
                 {donor.name: donor.value - move,
                  knob.name: knob.value + move})]
    return []

  def propose(self, obs):
    for label, values in self.candidates(obs):
      if label not in self._tried:
        self._tried.add(label)
        return label, values
    return None


class CoordinatePolicy(MeasuredSearch):
  """A coordinate climber with measured accept/revert.

  Goes over the knobs in their order (input first), trying on each +step
  then -step (moves `mdp.action_mask` forbids are skipped); a kept move is
  tried again in the same direction, a reverted one gives way to the other
  direction, then to the next knob. A pass over all knobs without a kept
  move lowers the step from 5 to 1; a pass at 1 without one converges.

  Args: as `MeasuredSearch` (defaults: threshold 0.02, 1 step per
  measurement).
  """

  STEPS = (5, 1)

  def restart_search(self) -> None:
    self._knob = 0
    self._direction = 0          # index into (+1, -1)
    self._size = 0               # index into STEPS
    self._since_kept = 0         # knobs passed since the last kept move

  def accepted(self, obs, label):
    self._since_kept = 0

  def rejected(self, obs, label):
    self._advance(len(obs.knobs))

  def _advance(self, n: int) -> None:
    """The next (knob, direction); a finished pass shrinks the step."""
    self._direction += 1
    if self._direction < 2:
      return
    self._direction = 0
    self._knob += 1
    self._since_kept += 1
    if self._knob >= n:
      self._knob = 0
    if self._since_kept >= n:
      self._since_kept = 0
      self._size += 1

  def propose(self, obs):
    n = len(obs.knobs)
    mask = mdp.action_mask(obs)
    for _ in range(2 * n + 1):
      if self._size >= len(self.STEPS):
        return None
      knob = obs.knobs[self._knob]
      move = self.STEPS[self._size] * (1, -1)[self._direction]
      if mask[mdp.action_of(self._knob, move)]:
        return _move_label(knob, move), {knob.name: knob.value + move}
      self._advance(n)
    return None


class PlumberPolicy(MeasuredSearch):
  """Plumber-style allocation with the thread total searched.

  Each parallel stage gets threads in proportion to its measured cost
  (CPU-seconds per output element, `records.stage_cost`, smoothed over
  measurements of the base), for a total T of threads
  (`policies.proportional_allocation`, each stage within
  `mdp.proposal_bounds`). The buffers share the RAM budget evenly, each at most
  `mdp.MAX_BUFFER` elements. The first change tried is that allocation at
  T = the CPU budget; then T is searched with accept/revert on the measured
  rate: T + s, and while kept, further up; else T - s, and while kept,
  further down; then s is halved, down to 1 (s starts at a quarter of the
  CPU budget, at least 1). T ranges from the fewest threads the stages may
  hold to `mdp.cpu_limit`, the agent's limit.

  Args: as `MeasuredSearch` (defaults: threshold 0.02, 1 step per
  measurement).
  """

  SMOOTHING = 0.5

  def restart_search(self) -> None:
    self._cost: dict[str, float] = {}
    self._total: int | None = None
    self._step = 0
    self._direction = 1
    self._tried_other = False
    self._pending: int | None = None

  def allocation(self, obs: "Observation", total: int) -> dict[str, float]:
    """Knob values for `total` threads at the smoothed costs."""
    parallel = [k for k in obs.knobs if k.kind == "parallelism"]
    buffers = [k for k in obs.knobs if k.kind == "buffer_size"]
    bounds = [mdp.proposal_bounds(k, obs.cpu_budget) for k in parallel]
    costs = [self._cost.get(k.stage, 0.0) for k in parallel]
    if any(c <= 0 for c in costs):
      costs = [0.0] * len(parallel)
    shares = policies.proportional_allocation(costs, total,
                                              [hi for _, hi in bounds])
    values = {k.name: float(min(max(p, lo), hi))
              for k, p, (lo, hi) in zip(parallel, shares, bounds)}
    bpe = obs.bytes_per_element
    for k in buffers:
      lo, hi = mdp.proposal_bounds(k, obs.cpu_budget)
      n = policies.buffer_elements(obs.ram_budget / len(buffers),
                                   bpe.get(k.stage, 0.0), int(hi))
      values[k.name] = float(min(max(n, lo), hi))
    return values

  def _limits(self, obs: "Observation") -> tuple[int, int]:
    parallel = [k for k in obs.knobs if k.kind == "parallelism"]
    low = int(sum(mdp.proposal_bounds(k, obs.cpu_budget)[0]
                  for k in parallel))
    return low, mdp.cpu_limit(len(parallel), obs.cpu_budget)

  def _measure_costs(self, obs: "Observation") -> None:
    for st in obs.stages:
      cost = records.stage_cost(st.cpu_per_element_s, st.rate,
                                obs.output_rate)
      if cost <= 0:
        continue
      old = self._cost.get(st.name)
      self._cost[st.name] = cost if old is None else (
          self.SMOOTHING * cost + (1 - self.SMOOTHING) * old)

  def accepted(self, obs, label):
    self._total = self._pending

  def rejected(self, obs, label):
    if self._total is None:
      # The proportional start lost to the configuration in force: search
      # T from the threads in force.
      self._total = int(sum(k.value for k in obs.knobs
                            if k.kind == "parallelism"))
      return
    if not self._tried_other:
      self._direction, self._tried_other = -self._direction, True
    else:
      self._step //= 2
      self._direction, self._tried_other = 1, False

  def propose(self, obs):
    self._measure_costs(obs)
    low, high = self._limits(obs)
    current = {k.name: k.value for k in obs.knobs}
    if self._total is None:
      self._step = max(1, obs.cpu_budget // 4)
      self._pending = max(low, min(high, obs.cpu_budget))
      values = self.allocation(obs, self._pending)
      if any(current[n] != v for n, v in values.items()):
        return f"proportional at {self._pending} threads", values
      self._total = self._pending
    while self._step >= 1:
      total = self._total + self._direction * self._step
      if low <= total <= high:
        values = self.allocation(obs, total)
        if any(current[n] != v for n, v in values.items()):
          self._pending = total
          return f"proportional at {total} threads", values
      self.rejected(obs, "")
    return None


def fit_threads(obs: "Observation",
                values: dict[str, float]) -> dict[str, float]:
  """Parallelism `values` (knob name -> threads) rounded and made to fit
  a whole configuration's limits: each within `mdp.proposal_bounds`, then
  the largest taken down one thread at a time until the total is within
  `mdp.cpu_limit`. Knobs of `obs` missing from `values` keep their value,
  made to fit the same way."""
  parallel = [k for k in obs.knobs if k.kind == "parallelism"]
  limit = mdp.cpu_limit(len(parallel), obs.cpu_budget)
  bounds = {k.name: mdp.proposal_bounds(k, obs.cpu_budget) for k in parallel}
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
  (`mdp.stage_costs`, `policies.proportional_allocation`) at a total of
  round(f x the CPU budget), made to fit (`fit_threads`). Each as (label,
  the knob values it changes); jumps that change nothing and repeats are
  left out; [] without parallel knobs or measured costs."""
  parallel = [k for k in obs.knobs if k.kind == "parallelism"]
  costs = mdp.stage_costs(obs)
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


def measured_evidence(obs: "Observation", values: dict[str, float],
                      evidence: dict[str, tuple[float, float]]) -> float:
  """The sum, over the knobs `values` changes, of `evidence[knob]`'s entry
  for the direction of the change: (raised, lowered), each the relative
  gain last measured for a trial that moved the knob that way, times
  GAIN_SCALE and clipped to +-1 (`JumpClimbPolicy` keeps them); 0 for a
  knob without evidence."""
  total = 0.0
  current = {k.name: k.value for k in obs.knobs}
  for name, value in values.items():
    if name in evidence and value != current[name]:
      total += evidence[name][0 if value > current[name] else 1]
  return total


def best_first(scored: list[tuple[str, dict[str, float], float]]
               ) -> list[tuple[str, dict[str, float], float]]:
  """(label, values, score) candidates from the highest score down; equal
  scores keep their order."""
  return sorted(scored, key=lambda candidate: -candidate[2])


class JumpClimbPolicy(ClimbPolicy):
  """Proportional jumps, then climb's moves ranked by the search's own
  measurements; no learning.

  First, whole-configuration jumps (`proportional_jumps`): threads in
  proportion to each stage's measured cost at a total of f x the CPU
  budget, for each f of `jumps` in turn, each kept only when it measures
  better than the configuration in force; made again when the CPU budget
  or the knobs change, or when a settled search re-opens. Then
  `ClimbPolicy`'s candidates, each scored by `measured_evidence`: the gain
  measured at an earlier base for the last trial that moved the same knobs
  the same way (0 untried), tried from the highest score down (ties in
  climb's order); a rejected candidate is not tried again at the same
  base. The state says what each stage costs, not how the rate answers a
  move (a stage whose cost varies gains from threads beyond its share, one
  of constant cost does not): the evidence is what the trials showed. It is
  forgotten when the knobs or the CPU budget change, or when a settled
  search re-opens. Subclasses score the candidates otherwise (`ranked`).

  It is `ClimbPolicy` with its own order: `candidates` are climb's.

  Args:
    options: the session's options.
    jumps: totals (in CPU budgets) of the proportional jumps, in order.
      Default `JUMP_FRACTIONS`.
    **kwargs: `MeasuredSearch`'s (threshold, samples, min_elements,
      patience, reopen).
  """

  def __init__(self, options: "IntuneOptions",
               jumps: Sequence[float] = JUMP_FRACTIONS, **kwargs):
    self.jumps = tuple(jumps)
    super().__init__(options, **kwargs)

  def _reset(self, context: tuple | None) -> None:
    # Jumps are made once per context (knobs, CPU budget) and again when a
    # settled search re-opens (`reopened`): a cost or a co-tenant that
    # moved calls for a new proportional allocation.
    self._next_jump = 0
    # Knob name -> (raised, lowered) measured gains (`measured_evidence`).
    self.evidence: dict[str, tuple[float, float]] = {}
    self._moves: dict[str, int] = {}
    super()._reset(context)

  def restart_search(self) -> None:
    self._tried: set[str] = set()

  def accepted(self, obs, label):
    self._record()
    self._tried = set()

  def rejected(self, obs, label):
    self._record()

  def _record(self) -> None:
    """The last trial's measured gain as evidence on the knobs it moved
    (jumps move many knobs at once and leave none)."""
    gain = max(-1.0, min(1.0, self.last_gain * GAIN_SCALE))
    for name, sign in self._moves.items():
      raised, lowered = self.evidence.get(name, (0.0, 0.0))
      self.evidence[name] = (gain, lowered) if sign > 0 else (raised, gain)
    self._moves = {}

  def ranked(self, obs: "Observation"
             ) -> list[tuple[str, dict[str, float], float]]:
    """Every candidate from `obs` with its score, in the order tried."""
    return best_first([
        (label, values, measured_evidence(obs, values, self.evidence))
        for label, values in self.candidates(obs)])

  def worth_trying(self, score: float) -> bool:
    """Whether a candidate of this score is tried at all. Default: every
    one."""
    del score
    return True

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
    current = {k.name: k.value for k in obs.knobs}
    for label, values, score in self.ranked(obs):
      if self.worth_trying(score) and label not in self._tried:
        self._tried.add(label)
        self._moves = {n: 1 if v > current[n] else -1
                       for n, v in values.items() if v != current[n]}
        return label, values
    return None
