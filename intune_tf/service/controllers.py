"""Sizing a tf.data service worker pool from what the trainer measures.

Every control period a controller reads a `PoolReading` and returns a
`Decision`: the size it wants and why. Scalers carry it out; the simulator
(`intune_tf.sim.cluster`) scores the controllers at cluster scale.
`CONTROLLERS` names them; docs/service-design.md describes each.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import statistics
from typing import Any, Callable, Sequence

# Cachew's thresholds (Graur et al., USENIX ATC'22): one more worker while the
# batch time improves by more than 7%, one fewer while it worsens by less than
# 3%; a stable pool is probed again after 20 rounds if the batch time grows
# 1.5x.
CACHEW_GROW_GAIN = 0.07
CACHEW_SHRINK_LOSS = 0.03
CACHEW_STABLE_ROUNDS = 20
CACHEW_REPROBE_GROWTH = 1.5
# Wait share at which a trainer that gets no rows at all is stalled, not
# short of workers (`IntuneController._stall`).
STALL_WAIT = 0.95
# A pace that moved by more than this share since the last reading: the
# period's rates are not learned from, and a ceiling or floor expires.
PACE_MOVED = 0.25
# A pace that moved by more than this share under a change: the measurement
# says nothing about the change.
CHANGE_PACE_MOVED = 0.1
# TensorFlow's AutoScaler: rates further than this many standard deviations
# from the mean are replaced by the median; the estimate may grow the pool by
# at most this factor and this many workers at once.
TF_OUTLIER_SIGMAS = 1.0
TF_MAX_GROWTH_FACTOR = 4
TF_MAX_GROWTH_WORKERS = 500


def integer(value: Any) -> int | None:
  """`value` as an int when it is an integer (numpy's too, not a bool);
  else None."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    return None
  return int(value)


def check_bounds(min_workers: int, max_workers: int) -> tuple[int, int]:
  """(min_workers, max_workers) as ints; raises ValueError unless
  1 <= min_workers <= max_workers (integers, numpy's too)."""
  for name, value in (("MIN", min_workers), ("MAX", max_workers)):
    if integer(value) is None:
      raise ValueError(f"the pool's {name} must be an integer, got "
                       f"{value!r}.")
    if value < 1:
      raise ValueError(f"the pool's {name} must be at least 1 worker, got "
                       f"{value}.")
  if min_workers > max_workers:
    raise ValueError(f"the pool's MIN ({min_workers}) is above its MAX "
                     f"({max_workers}).")
  return int(min_workers), int(max_workers)


class PoolBounds:
  """A pool's `min_workers` and `max_workers`, checked (`check_bounds`):
  the base of controllers and scalers."""

  def __init__(self, min_workers: int, max_workers: int):
    self.min_workers, self.max_workers = check_bounds(min_workers,
                                                      max_workers)


def moved(now: float, before: float, share: float) -> bool:
  """Whether a pace moved from `before` to `now` by more than `share` of
  `before`: moved(130, 100, 0.25) is True, moved(120, 100, 0.25) False."""
  return abs(now - before) > share * before


def clamp(size: int, min_workers: int, max_workers: int) -> int:
  """`size` within [min_workers, max_workers]. clamp(0, 1, 4) = 1."""
  return max(min_workers, min(max_workers, size))


def replace_outliers(values: Sequence[float],
                     sigmas: float = TF_OUTLIER_SIGMAS) -> list[float]:
  """TensorFlow AutoScaler's outlier rule: a value further than `sigmas`
  (default 1) sample standard deviations from the mean becomes the median
  (the upper one of an even count, as TensorFlow takes it).

  replace_outliers([1, 2, 3, 10]): mean 4, sd 4.08; 10 is outside [-0.08,
  8.08] and becomes sorted[2] = 3: [1, 2, 3, 3].
  """
  values = [float(v) for v in values]
  if len(values) <= 1:
    return values
  mean = sum(values) / len(values)
  sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
  median = sorted(values)[len(values) // 2]
  return [v if abs(v - mean) <= sd * sigmas else median for v in values]


def tf_formula_estimate(consumer_rates: Sequence[float],
                        worker_rates: Sequence[float]) -> int | None:
  """TensorFlow AutoScaler's estimate of the workers needed: ceil(sum of the
  consumers' target rates / mean worker rate), each after
  `replace_outliers`, and at least 1. None without a rate of each kind.

  tf_formula_estimate([1000], [300, 300, 290]) = ceil(1000 / 296.7) = 4.
  """
  if not consumer_rates or not worker_rates:
    return None
  demand = sum(replace_outliers(consumer_rates))
  mean = sum(replace_outliers(worker_rates)) / len(worker_rates)
  if mean <= 0:
    return None
  return max(1, math.ceil(demand / mean - 1e-9))


def cap_growth(estimate: int, current: int,
               factor: int = TF_MAX_GROWTH_FACTOR,
               step: int = TF_MAX_GROWTH_WORKERS) -> int:
  """`estimate` capped at min(factor x current, current + step) (default
  4 and 500) as TensorFlow caps its metric, when above a `current` pool of
  at least 1; shrinking is not capped.

  cap_growth(100, 15) = 60; cap_growth(2000, 300) = 800 (300 + 500 < 1200).
  """
  if estimate <= current or current < 1:
    return estimate
  return min(estimate, current * factor, current + step)


def workers_needed(demand: float, per_worker: float,
                   headroom: float = 0.0) -> int:
  """Workers whose capacity covers `demand` with `headroom` (default 0):
  ceil(demand (1 + headroom) / per_worker), at least 1.

  workers_needed(1000, 300, 0.1) = ceil(1100 / 300) = 4.
  """
  if per_worker <= 0:
    raise ValueError(f"per-worker capacity must be positive, got "
                     f"{per_worker}.")
  return max(1, math.ceil(demand * (1 + headroom) / per_worker - 1e-9))


@dataclasses.dataclass(frozen=True)
class PoolReading:
  """What the trainer and the workers measured over one control period.

  Attributes:
    time_s: when the period ended, seconds (any origin).
    workers: workers up and serving.
    starting: workers asked for and not yet serving. Default 0.
    wait_share: share of the trainer's wall time spent waiting for input,
      0..1. Default 0.
    consumer_rate: the consumer's pace: rows/s the trainer would take if
      input never made it wait (rows per step / compute time per step).
      Default 0 (unknown).
    worker_rates: rows/s each serving worker produced, as its tuner reports.
      Default none.
    worker_capacities: rows/s each serving worker could produce unblocked,
      as its tuner estimates them. Default none.
  """
  time_s: float
  workers: int
  starting: int = 0
  wait_share: float = 0.0
  consumer_rate: float = 0.0
  worker_rates: tuple[float, ...] = ()
  worker_capacities: tuple[float, ...] = ()

  @property
  def delivered_rate(self) -> float:
    """Rows/s the trainer got: consumer_rate x (1 - wait_share)."""
    return self.consumer_rate * (1.0 - self.wait_share)

  @property
  def asked(self) -> int:
    """Workers serving or starting."""
    return self.workers + self.starting


@dataclasses.dataclass(frozen=True)
class Decision:
  """A controller's answer: the pool size it wants and why.

  Attributes:
    size: workers the pool should have (serving and starting).
    reason: why, in a sentence for the logs.
    change: whether `size` differs from the pool asked for. Default False.
  """
  size: int
  reason: str
  change: bool = False


class PoolController(PoolBounds):
  """A controller: `decide(reading)` once per control period; its
  arguments are `PoolBounds`'."""

  def decide(self, reading: PoolReading) -> Decision:
    raise NotImplementedError

  def rejected(self, decision: Decision) -> None:
    """The scaler could not carry out `decision`: the pool is as it was.
    Default: nothing to undo."""
    del decision

  def _to(self, reading: PoolReading, size: int, reason: str) -> Decision:
    size = clamp(int(size), self.min_workers, self.max_workers)
    return Decision(size, reason, size != reading.asked)

  def _hold(self, reading: PoolReading, reason: str) -> Decision:
    return self._to(reading, reading.asked, reason)


class TfFormulaController(PoolController):
  """TensorFlow's AutoScaler estimate, applied every period as if it
  scaled, on the workers' capacities when reported, else their rows/s."""

  def decide(self, reading: PoolReading) -> Decision:
    rates = reading.worker_capacities or reading.worker_rates
    estimate = tf_formula_estimate([reading.consumer_rate] if
                                   reading.consumer_rate > 0 else [], rates)
    if estimate is None:
      return self._hold(reading, "no worker or consumer rate reported yet")
    size = cap_growth(estimate, max(1, reading.workers))
    return self._to(reading, size, f"TF estimate {estimate} (ceil of "
                    f"{reading.consumer_rate:.0f} rows/s over the mean "
                    "worker rate)")


class CachewController(PoolController):
  """Cachew's hill climb on the trainer's batch time (1 / delivered
  rows/s; docs/service-design.md), in rounds when no worker is starting. A
  stable pool is probed again after `CACHEW_STABLE_ROUNDS` if the batch time
  grew 1.5x, or the wait share did (above 5%: our stand-in for Cachew's
  queue signal)."""

  def __init__(self, min_workers: int, max_workers: int):
    super().__init__(min_workers, max_workers)
    self.mode = "up"  # then "down", then "stable"
    self.previous: float | None = None  # batch time before the last move
    self.last_move = 0
    self.stable_rounds = 0
    self.reference: tuple[float, float] | None = None  # (batch time, wait)

  def decide(self, reading: PoolReading) -> Decision:
    if reading.starting:
      return self._hold(reading, "waiting for workers to start")
    delivered = reading.delivered_rate
    if delivered <= 0:
      return self._hold(reading, "no rows delivered yet")
    t = 1.0 / delivered
    n = reading.workers
    if self.mode == "stable":
      self.stable_rounds += 1
      ref_t, ref_wait = self.reference
      grew = t >= CACHEW_REPROBE_GROWTH * ref_t or (
          reading.wait_share > 0.05 and
          reading.wait_share >= CACHEW_REPROBE_GROWTH * ref_wait)
      if self.stable_rounds < CACHEW_STABLE_ROUNDS or not grew:
        return self._hold(reading, "stable")
      self.mode, self.previous, self.last_move = "up", None, 0
    if self.mode == "up":
      if self.last_move == 0 or t < self.previous * (1 - CACHEW_GROW_GAIN):
        if n >= self.max_workers:
          return self._settle(reading, t, "at MAX")
        reason = ("batch time improved > 7%: +1" if self.last_move else
                  "probing: +1")
        self.previous, self.last_move = t, +1
        return self._to(reading, n + 1, reason)
      # The last +1 did not pay: take it back, then try removing.
      self.mode, self.previous, self.last_move = "down", None, 0
      return self._to(reading, n - 1, "+1 improved the batch time <= 7%: "
                      "taken back")
    if self.last_move == 0 or t <= self.previous * (1 + CACHEW_SHRINK_LOSS):
      if n <= self.min_workers:
        return self._settle(reading, t, "at MIN")
      reason = ("-1 cost the batch time < 3%: -1" if self.last_move else
                "probing: -1")
      self.previous, self.last_move = t, -1
      return self._to(reading, n - 1, reason)
    return self._settle(reading, t, "-1 cost the batch time >= 3%: taken "
                        "back", n + 1)

  def rejected(self, decision: Decision) -> None:
    """The move did not happen: the climb starts over from this size."""
    del decision
    self.previous, self.last_move = None, 0

  def _settle(self, reading: PoolReading, t: float, reason: str,
              size: int | None = None) -> Decision:
    self.mode, self.stable_rounds = "stable", 0
    self.reference = (t, reading.wait_share)
    return self._to(reading, reading.workers if size is None else size,
                    reason)


@dataclasses.dataclass
class _Pending:
  """A change waiting for its confirmation by measurement: the sizes, and
  the reading and the model when it was asked for."""
  before: int
  after: int
  delivered: float
  wait_share: float
  per_worker: float
  demand: float
  # The wait of a first judged period that looked like no gain: the growth
  # is measured once more and judged on the better of the two periods.
  doubted_wait: float | None = None


@dataclasses.dataclass(eq=False)
class IntuneController(PoolController):
  """InTune's pool controller: a model proposes the size, measurement
  confirms each change (docs/service-design.md). `min_workers` and
  `max_workers` are `PoolController`'s.

  Args:
    min_interval_s: seconds between a change taking effect (its workers up)
      and the next change. Default 30.
    grow_wait: wait share above which the trainer is input-bound. Default
      0.03.
    shrink_wait: wait share below which a smaller pool is considered.
      Default 0.01.
    headroom: capacity kept above the consumer's demand. Default 0.05.
    confirm_share: the share of its predicted gain a growth must deliver
      (the better of two periods), and of one more worker the shortfall
      must use for it to be added. Default 0.5.
    shrink_patience: calm rounds in a row before a shrink. Default 3.
    limit_ttl_s: seconds a ceiling or floor holds (or until the pace moves
      by `PACE_MOVED`). Default 600.
    first_rows_s: seconds after a growth took effect that its judgement
      waits for every serving worker's first rows. Default 20.
    grow_patience: rounds in a row the trainer must wait while the model
      says the pool suffices before one more worker is measured. Default 2.
    tolerate_wait: wait share borne rather than adding a worker used less
      than `confirm_share`. Default 0.05.
    cpu_cap: called at each decision, the most workers the pool's CPUs can
      run; never below MIN. Default None: MAX.
  """

  min_workers: int
  max_workers: int
  min_interval_s: float = 30.0
  grow_wait: float = 0.03
  shrink_wait: float = 0.01
  headroom: float = 0.05
  confirm_share: float = 0.5
  shrink_patience: int = 3
  limit_ttl_s: float = 600.0
  first_rows_s: float = 20.0
  grow_patience: int = 2
  tolerate_wait: float = 0.05
  cpu_cap: Callable[[], int] | None = None

  def __post_init__(self) -> None:
    super().__init__(self.min_workers, self.max_workers)
    self.per_worker: float | None = None  # the model: rows/s of a worker
    self.pending: _Pending | None = None
    self.settled_at: float | None = None  # when the last change took effect
    self.calm: list[int] = []  # the proposals of the last calm rounds
    # Learned limits, as (size, pace when learned, time learned).
    self.ceiling: tuple[int, float, float] | None = None
    self.floor: tuple[int, float, float] | None = None
    self._waited = 0  # rounds in a row waited while the model said enough
    self._last_pace: float | None = None
    self._asked_at: float | None = None  # when the last change was asked
    # The size before the pool last shrank, until it is that size again.
    self._shrunk_from: int | None = None
    self._awaited_rows = False  # a growth's judgement waited for rows

  def _learn(self, reading: PoolReading) -> None:
    """Updates the per-worker capacity estimate."""
    n = reading.workers
    if n < 1:
      return
    if reading.worker_capacities:
      sample = statistics.median(reading.worker_capacities)
    else:
      produced = (sum(reading.worker_rates) if reading.worker_rates else
                  reading.delivered_rate)
      sample = produced / n
      if reading.wait_share < self.grow_wait:
        # Not saturated: the workers could do at least this much.
        if self.per_worker is None or sample > self.per_worker:
          self.per_worker = sample
        return
    if sample <= 0:
      return
    self.per_worker = (sample if self.per_worker is None else
                       0.5 * self.per_worker + 0.5 * sample)

  def proposal(self, demand: float) -> int | None:
    """Workers the model proposes for `demand` rows/s (None: no estimate
    yet), within MIN/MAX and any live ceiling and floor."""
    if self.per_worker is None or self.per_worker <= 0 or demand <= 0:
      return None
    return self._limit(workers_needed(demand, self.per_worker,
                                      self.headroom))

  def _limit(self, size: int) -> int:
    if self.cpu_cap is not None:
      size = min(size, self.cpu_cap())
    if self.ceiling is not None:
      size = min(size, self.ceiling[0])
    if self.floor is not None:
      size = max(size, self.floor[0])
    return clamp(size, self.min_workers, self.max_workers)

  def decide(self, reading: PoolReading) -> Decision:
    if reading.starting:
      return self._hold(reading, f"waiting for {reading.starting} worker(s) "
                        "to start")
    if self._asked_at is not None:
      # The last change is in effect from this period on; the next period
      # is the first measured wholly with it.
      self._asked_at = None
      self.settled_at = reading.time_s
      if self.pending is not None:
        return self._hold(reading, "measuring the change")
    stalled = self._stall(reading)
    if stalled is not None:
      return stalled
    for which in ("ceiling", "floor"):  # expire the learned limits
      limit = getattr(self, which)
      if limit is not None and (
          moved(reading.consumer_rate, limit[1], PACE_MOVED) or
          reading.time_s - limit[2] > self.limit_ttl_s):
        setattr(self, which, None)
    if self.pending is not None:
      judged = self._await_first_rows(reading) or self._confirm(reading)
      if judged is not None:
        return judged
      self.settled_at = None  # the pace moved: decide afresh, now
    last, self._last_pace = self._last_pace, reading.consumer_rate
    if last is None or not moved(reading.consumer_rate, last, PACE_MOVED):
      # A period in which the pace moved straddles two paces: its rates
      # measure neither (a worker that served the slow pace for half of it
      # reads as half as fast).
      self._learn(reading)
    if (self.settled_at is not None and
        reading.time_s - self.settled_at < self.min_interval_s):
      return self._hold(reading, "minimum interval since the last change")
    want = self.proposal(reading.consumer_rate)
    if reading.wait_share > self.grow_wait:
      self.calm = []
      return self._grow(reading, want)
    self._waited = 0
    if reading.wait_share < self.shrink_wait and want is not None:
      self.calm = (self.calm + [want])[-self.shrink_patience:]
      target = max(self.calm)
      if len(self.calm) >= self.shrink_patience and target < reading.workers:
        self.calm = []
        return self._change(reading, target, f"no wait for "
                            f"{self.shrink_patience} rounds: "
                            f"{reading.consumer_rate:.0f} rows/s need "
                            f"{target} at {self.per_worker:.0f} per worker")
      return self._hold(reading, "calm")
    self.calm = []
    return self._hold(reading, "within the band")

  def _grow(self, reading: PoolReading, want: int | None) -> Decision:
    """`decide` for a trainer that waits: one more worker, or the model's
    size, when the model, the CPUs and the shortfall allow it."""
    n, waits = reading.workers, f"trainer waits {reading.wait_share:.0%}"
    if want is not None and want <= n and n < self.max_workers:
      self._waited += 1
      if self._waited < self.grow_patience:
        return self._hold(reading, f"{waits} but {n} suffice at "
                          f"{self.per_worker:.0f} rows/s per worker: "
                          "measuring again")
    self._waited = 0
    if want is None or want <= n:
      want = self._limit(n + 1)  # the model says enough; measure one more
    if want <= n:
      cpus = self.cpu_cap() if self.cpu_cap is not None else None
      limit = (f"the {cpus} CPUs its workers can use"
               if cpus is not None and n >= cpus else "its limit")
      return self._hold(reading, f"{waits} but the pool is at {limit} ({n})")
    short = self._shortfall(reading)
    if short < self.confirm_share and reading.wait_share <= self.tolerate_wait:
      return self._hold(reading, f"{waits}: one more worker would be used "
                        f"{short:.0%} (borne up to a "
                        f"{self.tolerate_wait:.0%} wait)")
    return self._change(reading, want, f"{waits}: "
                        f"{reading.consumer_rate:.0f} rows/s asked, "
                        f"{self.per_worker or 0:.0f} per worker")

  def _shortfall(self, reading: PoolReading) -> float:
    """How much of one more worker the larger of the model's and the
    measured shortfall would use (inf without a per-worker rate)."""
    if not self.per_worker:
      return math.inf
    demand = reading.consumer_rate
    return max(demand - reading.workers * self.per_worker,
               demand - reading.delivered_rate) / self.per_worker

  def rejected(self, decision: Decision) -> None:
    """The change did not happen: nothing to wait for or confirm; the next
    reading decides afresh (and may ask again)."""
    del decision
    self.pending = None
    self._asked_at = None

  def _await_first_rows(self, reading: PoolReading) -> Decision | None:
    """Holds the judgement of a growth until every serving worker reports
    rows, then for one period more, for at most `first_rows_s`: a growth
    judged before its workers deliver looks like one that gave nothing.
    None: judge now."""
    p = self.pending
    if (p.after <= p.before or not reading.worker_rates or
        self.settled_at is None or
        reading.time_s - self.settled_at >= self.first_rows_s):
      return None
    if (len(reading.worker_rates) < reading.workers or
        min(reading.worker_rates) <= 0):
      self._awaited_rows = True
      return self._hold(reading, "waiting for the new workers' first rows")
    if self._awaited_rows:
      self._awaited_rows = False
      return self._hold(reading, "measuring the change")
    return None

  def _change(self, reading: PoolReading, size: int,
              reason: str) -> Decision:
    self._awaited_rows = False
    self.pending = _Pending(reading.workers, size, reading.delivered_rate,
                            reading.wait_share, self.per_worker or 0.0,
                            reading.consumer_rate)
    return self._ask(reading, size, reason)

  def _ask(self, reading: PoolReading, size: int, reason: str) -> Decision:
    decision = self._to(reading, size, reason)
    self._asked_at = reading.time_s
    if decision.size < reading.asked:
      self._shrunk_from = max(self._shrunk_from or 0, reading.asked)
    elif self._shrunk_from is not None and decision.size >= self._shrunk_from:
      self._shrunk_from = None
    return decision

  def _stall(self, reading: PoolReading) -> Decision | None:
    """The stall rule: a trainer that waits and gets no rows at all since
    the pool shrank waits for the worker taken out (an epoch that lost a
    worker ends only once its address serves again: docs/service.md). Back
    to the size before the shrink at once, whatever the ceiling or the
    minimum interval. None: not stalled, or no shrink to undo."""
    if (self._shrunk_from is None or reading.workers >= self._shrunk_from
        or reading.wait_share < STALL_WAIT or reading.delivered_rate > 0):
      return None
    back = self._shrunk_from
    self.pending = self.ceiling = None
    self.calm = []
    return self._ask(reading, back, f"trainer gets nothing since the pool "
                     f"shrank to {reading.workers}: back to {back} (an epoch "
                     "that lost a worker ends once its address serves again)")

  def _confirm(self, reading: PoolReading) -> Decision | None:
    """The first period wholly after a change took effect (for a growth that
    fell short there, the second too): keep the change or take it back.
    None: the pace moved over `CHANGE_PACE_MOVED` under the change."""
    p, self.pending = self.pending, None
    if moved(reading.consumer_rate, p.demand, CHANGE_PACE_MOVED):
      return None
    if p.after > p.before and p.wait_share > self.grow_wait:
      added = p.after - p.before
      predicted = min(added * p.per_worker, p.demand - p.delivered)
      wait = reading.wait_share
      if p.doubted_wait is not None:
        wait = min(wait, p.doubted_wait)
      # The gain is the wait the growth removed, at the pace it was asked
      # for: a pace that reads a few % higher is no gain.
      gain = (p.wait_share - wait) * p.demand
      short = predicted > 0 and gain < self.confirm_share * predicted
      gave = (f"{p.before} -> {p.after} gave +{gain:.0f} rows/s of "
              f"+{predicted:.0f} predicted (wait {p.wait_share:.1%} -> "
              f"{wait:.1%})")
      if short and p.doubted_wait is None:
        p.doubted_wait = reading.wait_share
        self.pending = p
        return self._hold(reading, f"{gave}: measuring once more")
      self._learn(reading)
      if not short:
        return self._hold(reading, f"{p.before} -> {p.after} confirmed: "
                          f"+{gain:.0f} rows/s")
      # The new workers delivered too little of what they should: the pool
      # is not what limits the trainer. Each added worker is kept only if it
      # delivered `confirm_share` of its part of the prediction.
      kept = math.floor(max(0.0, gain) * added / predicted +
                        1 - self.confirm_share + 1e-9)
      keep = clamp(p.before + min(kept, added), self.min_workers,
                   self.max_workers)
      self.ceiling = (keep, reading.consumer_rate, reading.time_s)
      if keep < reading.workers:
        return self._ask(reading, keep, f"{gave}: back to {keep} (ceiling)")
      return self._hold(reading, f"ceiling at {keep}")
    if p.after < p.before and reading.wait_share > self.grow_wait:
      self.floor = (p.before, reading.consumer_rate, reading.time_s)
      return self._ask(reading, p.before, f"{p.before} -> {p.after}: trainer "
                       f"waits {reading.wait_share:.0%}; back to {p.before} "
                       "(floor)")
    self._learn(reading)
    return self._hold(reading, f"{p.before} -> {p.after} confirmed")


CONTROLLERS = {
    "intune": IntuneController,
    "tf-formula": TfFormulaController,
    "cachew": CachewController,
}


def check_name(name: str) -> None:
  """Raises ValueError naming the known controllers if `name` is not one."""
  if name not in CONTROLLERS:
    raise ValueError(f"unknown pool controller {name!r}; known: "
                     f"{', '.join(CONTROLLERS)}.")


def make_controller(name: str, min_workers: int, max_workers: int,
                    **kwargs) -> PoolController:
  """The controller called `name` (`CONTROLLERS`) for a pool of MIN..MAX
  workers; `kwargs` (`IntuneController`'s settings) go to it.

  Raises:
    ValueError: an unknown name, or bad bounds (`check_bounds`).
  """
  check_name(name)
  return CONTROLLERS[name](min_workers, max_workers, **kwargs)
