"""A fast, seeded model of an N-stage tf.data pipeline on C CPUs.

The agent is pretrained here and scored against the optimum; the model is
calibrated against traces that `intune bench --trace` records (see
`intune_tf.sim.calibration`). Units: costs are CPU-seconds per *output* element
(a stage that works on rows before a batch of B rows has its per-row cost
times B), rates are output elements per second, sizes are bytes.

Steady-state throughput of an allocation (parallelism p_i, buffers b_i):

  threads  T   = sum of p_i over tunable stages + 1 per fixed stage
  contention s = 1 + oversubscription * max(0, (T + m) / C - 1)
  cost    c'_i = c_i * s + handoff_s             (handoff only if p_i > C)
  CPUs     A   = C, or with a co-tenant of m busy threads
                 max(C - m, C T / (T + m))       (the OS shares by thread)
  X0          = softmin_k(p_i / c'_i for each i, A / sum_i c'_i,
                          1 / consumer_step_s)
  softmin_k(B) = (sum_j B_j ** -k) ** (-1 / k)   (k = inf: the minimum)
  X           = X0 * prod_i (1 - jitter_loss * v_i * u_i ** (b_i + 1))

where u_i = X0 c'_i / p_i is stage i's busy fraction and v_i = cv_i^2 /
(1 + cv_i^2) its cost variability: a busy, variable stage stalls its
consumer unless a buffer after it absorbs the jitter. The soft minimum
(`SimParams.pipelining` k) models stages that wait on each other: a stage
whose capacity is near the bottleneck's still costs throughput, so threads
beyond its proportional share help (as measured on Criteo L4: 8 threads on 2
cores beat 5). Memory in use is the
buffered bytes (full buffers behind stages faster than the bottleneck, half
full otherwise) plus the elements in flight (p_i per stage) plus a base;
above the memory limit the job dies of OOM (throughput 0, episode over).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np

from intune_tf import records
from intune_tf.tuning.mdp import MAX_BUFFER
from intune_tf.tuning.mdp import SIM_CPU_MHZ
from intune_tf.tuning.mdp import SIM_DRAM_GBPS
from intune_tf.tuning.mdp import cpu_limit

MB = 1 << 20


@dataclasses.dataclass(frozen=True)
class SimParams:
  """Machine-level constants of the model, fitted by calibration.

  Attributes:
    oversubscription: cost growth per unit of threads/CPUs above 1.
      Default 0.15.
    handoff_s: per-element cost of handing work between a stage's threads
      when it has more threads than CPUs (each hand-off then waits for a
      context switch), seconds. Default 0. Fitted on Criteo L3-L5, this
      form ranks held-out configurations better than a cost for every
      stage with two or more threads (docs/benchmarks.md).
    jitter_loss: weight of the variability stall term. Default 0.5.
    pipelining: exponent k of the soft minimum of the throughput bounds
      (module docstring); inf is the hard minimum of a perfectly pipelined
      chain. Default inf.
  """
  oversubscription: float = 0.15
  handoff_s: float = 0.0
  jitter_loss: float = 0.5
  pipelining: float = math.inf


def softmin(bounds: Sequence[float], k: float) -> float:
  """(sum_j b_j ** -k) ** (-1 / k): the minimum for k = inf, below it for a
  finite k. softmin([3, 4], 2) = (1/9 + 1/16) ** -0.5 = 2.4."""
  if math.isinf(k):
    return min(bounds)
  low = min(bounds)
  if low <= 0:
    return 0.0
  # Scaled by the minimum for numerical range: low * (sum (low/b)^k)^(-1/k).
  return low * sum((low / b) ** k for b in bounds) ** (-1.0 / k)


def random_params(rng: np.random.Generator) -> SimParams:
  """Machine constants for one pretraining or evaluation pipeline: cheap or
  costly oversubscription (0-0.3), perfect or imperfect pipelining (k in
  {2, 3, 4, 8, inf}); the calibration on this machine found 0 and 2-4."""
  return SimParams(oversubscription=float(rng.uniform(0.0, 0.3)),
                   pipelining=float(rng.choice([2.0, 3.0, 4.0, 8.0,
                                                math.inf])))


@dataclasses.dataclass(frozen=True)
class SimStage:
  """One stage of a simulated pipeline.

  Attributes:
    name: stage name, a path from the output like the real model's
      ("Stage3.Stage2", `intune_tf.records.parse_stage`).
    cost_s: mean CPU-seconds per output element, single-threaded.
    cv: coefficient of variation of the per-element cost. Default 0.
    tunable: whether the stage has a parallelism knob (else one thread).
      Default True.
    buffer: whether a prefetch buffer knob follows the stage. Default False.
    bytes_per_element: size of one element leaving the stage. Default 1 MB.
  """
  name: str
  cost_s: float
  cv: float = 0.0
  tunable: bool = True
  buffer: bool = False
  bytes_per_element: float = float(MB)


@dataclasses.dataclass(frozen=True)
class SimPipeline:
  """A simulated pipeline and its machine.

  Attributes:
    stages: the stages, input first.
    cpus: usable CPUs at the start.
    memory_limit: bytes at which the job dies of OOM.
    ram_budget: the RAM budget buffers must fit in (masking, guard).
    consumer_step_s: the model's step time per element (0 = infinitely
      fast consumer). Default 0.
    base_memory: bytes in use besides the pipeline. Default 0.
    drift: per-step standard deviation of each stage's log-cost random walk.
      Default 0.
    resize: (step, cpus) events. Default none.
    memory_events: (step, memory_limit) events. Default none.
    noise: relative standard deviation of measured rates. Default 0.03.
    cotenant_events: (step, threads) events: from that step a co-tenant
      keeps that many threads busy on the same CPUs (0: it left). The
      usable CPUs the pipeline observes do not change. Default none.
    cost_events: (step, stage index, factor) events: that stage's cost is
      multiplied by factor (data drift). Default none.
    pressure_events: (step, ram budget) events: memory taken from outside
      the pipeline. The RAM budget becomes that, the memory limit falls by
      as much as the budget did, and the buffers shrink at once to fit it
      (largest first, as the live memory guard does). Default none.
  """
  stages: tuple[SimStage, ...]
  cpus: int
  memory_limit: float
  ram_budget: float
  consumer_step_s: float = 0.0
  base_memory: float = 0.0
  drift: float = 0.0
  resize: tuple[tuple[int, int], ...] = ()
  memory_events: tuple[tuple[int, float], ...] = ()
  noise: float = 0.03
  cotenant_events: tuple[tuple[int, int], ...] = ()
  cost_events: tuple[tuple[int, int, float], ...] = ()
  pressure_events: tuple[tuple[int, float], ...] = ()

  def knob_names(self) -> list[tuple[str, str, int]]:
    """(knob name, kind, stage index), input first."""
    names = []
    for i, st in enumerate(self.stages):
      if st.tunable:
        names.append((f"{st.name}/parallelism", "parallelism", i))
      if st.buffer:
        names.append((f"{st.name}/buffer_size", "buffer_size", i))
    return names


def throughput(stages: Sequence[SimStage], parallelism: Sequence[float],
               buffers: Sequence[float], cpus: float,
               consumer_step_s: float = 0.0,
               params: SimParams = SimParams(),
               costs: Sequence[float] | None = None,
               background: float = 0.0) -> float:
  """Steady-state output elements/s of an allocation (module docstring).

  Args:
    stages: the stages.
    parallelism: threads per stage (fixed stages: 1).
    buffers: buffer elements after each stage (0 = none).
    cpus: usable CPUs.
    consumer_step_s: consumer time per element (0 = none).
    params: model constants.
    costs: per-stage costs overriding `stage.cost_s` (drifted costs).
    background: a co-tenant's busy threads on the same CPUs. Default 0.
  """
  c = [st.cost_s for st in stages] if costs is None else list(costs)
  eff = effective_costs(c, parallelism, cpus, params, background)
  bounds = [p / ce for p, ce in zip(parallelism, eff)] + [
      available_cpus(sum(parallelism), cpus, background) / sum(eff)]
  if consumer_step_s > 0:
    bounds.append(1.0 / consumer_step_s)
  x0 = softmin(bounds, params.pipelining)
  factor = 1.0
  for st, p, ce, b in zip(stages, parallelism, eff, buffers):
    busy = min(1.0, x0 * ce / p)
    variability = st.cv ** 2 / (1 + st.cv ** 2)
    factor *= 1 - params.jitter_loss * variability * busy ** (b + 1)
  return x0 * factor


def throughput_batch(costs: np.ndarray, cv: np.ndarray,
                     parallelism: np.ndarray, buffers: np.ndarray,
                     cpus: np.ndarray, params: SimParams = SimParams()
                     ) -> np.ndarray:
  """`throughput` of many allocations at once, for a calibration's grid.

  The same formula over arrays (tests/test_simulator.py checks that the two
  agree), with no consumer and no co-tenant.

  Args:
    costs: per-stage costs, shape [..., S] (broadcast against the rest).
    cv: per-stage coefficients of variation, shape [S].
    parallelism: threads per stage, shape [..., S].
    buffers: buffer elements after each stage, shape [..., S].
    cpus: usable CPUs, shape [...].
    params: model constants.

  Returns:
    Output elements/s, shape [...].
  """
  par = np.asarray(parallelism, float)
  cpus = np.asarray(cpus, float)[..., None]
  threads = par.sum(-1, keepdims=True)
  contention = 1 + params.oversubscription * np.maximum(
      0.0, threads / cpus - 1)
  eff = (np.asarray(costs, float) * contention +
         np.where(par > cpus, params.handoff_s, 0.0))
  bounds = np.concatenate(
      [par / eff, np.broadcast_to(cpus, eff.shape[:-1] + (1,)) /
       eff.sum(-1, keepdims=True)], axis=-1)
  low = bounds.min(-1)
  if math.isinf(params.pipelining):
    x0 = low
  else:
    k = params.pipelining
    with np.errstate(divide="ignore", invalid="ignore"):
      x0 = low * ((low[..., None] / bounds) ** k).sum(-1) ** (-1.0 / k)
    x0 = np.where(low > 0, x0, 0.0)
  busy = np.minimum(1.0, x0[..., None] * eff / par)
  variability = np.asarray(cv, float) ** 2 / (1 + np.asarray(cv, float) ** 2)
  factor = np.prod(1 - params.jitter_loss * variability *
                   busy ** (np.asarray(buffers, float) + 1), axis=-1)
  return x0 * factor


def available_cpus(threads: float, cpus: float, background: float) -> float:
  """CPUs the pipeline's `threads` get beside a co-tenant's `background`
  busy threads: max(C - m, C T / (T + m)); C without a co-tenant.

  available_cpus(12, 8, 4) = max(4, 8 x 12 / 16) = 6.
  """
  if background <= 0:
    return float(cpus)
  return max(cpus - background, cpus * threads / (threads + background))


def effective_costs(costs: Sequence[float], parallelism: Sequence[float],
                    cpus: float, params: SimParams,
                    background: float = 0.0) -> list[float]:
  """Per-element costs under contention (module docstring), with a
  co-tenant's `background` busy threads (default 0)."""
  threads = sum(parallelism) + background
  contention = 1 + params.oversubscription * max(0.0, threads / cpus - 1)
  return [c * contention + (params.handoff_s if p > cpus else 0.0)
          for c, p in zip(costs, parallelism)]


def memory_in_use(pipeline: SimPipeline, parallelism: Sequence[float],
                  buffers: Sequence[float], rate: float,
                  costs: Sequence[float] | None = None) -> tuple[float, float]:
  """(buffered bytes, total bytes in use) of an allocation at `rate`."""
  c = [st.cost_s for st in pipeline.stages] if costs is None else costs
  buffered, in_flight = 0.0, 0.0
  for st, p, b, ci in zip(pipeline.stages, parallelism, buffers, c):
    fill = 1.0 if p / ci > 1.05 * rate else 0.5
    buffered += b * fill * st.bytes_per_element
    in_flight += p * st.bytes_per_element
  return buffered, buffered + in_flight + pipeline.base_memory



def optimum(pipeline: SimPipeline, cpus: int | None = None,
            params: SimParams = SimParams(),
            ram_budget: float | None = None,
            costs: Sequence[float] | None = None,
            background: float = 0.0
            ) -> tuple[float, list[int], list[int]]:
  """The best static allocation: (throughput, parallelism, buffers).

  For every total thread count T from the minimum to `cpu_limit`, threads
  go one at a time to the stage whose extra thread gains most throughput,
  or, when none gains (a hard minimum bound by the CPUs), to the stage with
  the lowest capacity p_i / c'_i (for the hard minimum this max-min rule is
  optimal for a fixed T, where contention is fixed); then buffer elements
  go one at a time to the stage whose buffer gains most throughput per
  byte, within the RAM budget. The best T wins. `background`: a
  co-tenant's busy threads (default 0).
  """
  cpus = pipeline.cpus if cpus is None else cpus
  ram = pipeline.ram_budget if ram_budget is None else ram_budget
  stages = pipeline.stages
  c = [st.cost_s for st in stages] if costs is None else list(costs)
  n = len(stages)
  tunable = [i for i in range(n) if stages[i].tunable]
  lo = n
  hi = cpu_limit(len(tunable), cpus) + (n - len(tunable))
  consumer = pipeline.consumer_step_s
  # Buffers only raise the rate (busy^(b + 1) falls with b), so the rate at
  # full buffers bounds what a total's buffers can reach: totals are
  # buffered from the highest bound down, until a bound is below the best
  # (the same result as buffering every total, in a fraction of the time).
  full = [MAX_BUFFER if st.buffer else 0 for st in stages]
  allocations = []
  par = [1] * n
  for total in range(lo, hi + 1):
    if total > lo:
      if not tunable:
        break
      eff = effective_costs(c, par, cpus, params, background)
      open_ = [i for i in tunable if par[i] < cpus]
      if not open_:
        break
      now = throughput(stages, par, [0] * n, cpus, pipeline.consumer_step_s,
                       params, c, background)
      gains = {}
      for i in open_:
        par[i] += 1
        gains[i] = throughput(stages, par, [0] * n, cpus,
                              pipeline.consumer_step_s, params, c,
                              background) - now
        par[i] -= 1
      i = max(open_, key=gains.get)
      if gains[i] <= 1e-12 * max(now, 1.0):
        i = min(open_, key=lambda i: par[i] / eff[i])
      par[i] += 1
    bound = throughput(stages, par, full, cpus, consumer, params, c,
                       background)
    allocations.append((bound, total, list(par)))
  best = (-1.0, [1] * n, [0] * n)
  best_total = None
  for bound, total, par in sorted(allocations, key=lambda a: (-a[0], a[1])):
    if bound < best[0] or (bound == best[0] and total > best_total):
      break
    buf = [0] * n
    rate = throughput(stages, par, buf, cpus, pipeline.consumer_step_s,
                      params, c, background)
    while True:
      buffered, _ = memory_in_use(pipeline, par, buf, rate, c)
      choice, gain = None, 1e-9
      for i in range(n):
        if not stages[i].buffer or buf[i] >= MAX_BUFFER:
          continue
        if buffered + stages[i].bytes_per_element > ram:
          continue
        trial = list(buf)
        trial[i] += 1
        g = (throughput(stages, par, trial, cpus, pipeline.consumer_step_s,
                        params, c, background) - rate
             ) / stages[i].bytes_per_element
        if g > gain:
          choice, gain = i, g
      if choice is None:
        break
      buf[choice] += 1
      rate = throughput(stages, par, buf, cpus, pipeline.consumer_step_s,
                        params, c, background)
    if rate > best[0] or (rate == best[0] and total < best_total):
      best, best_total = (rate, list(par), list(buf)), total
  return best


def chain_name(n: int, i: int) -> str:
  """The name of stage `i` (0 = the input) of an `n`-stage chain, as the
  kernel names a real one: the stages from the output down to it,
  "Stage{n-1}.Stage{n-2}...Stage{i}"."""
  return ".".join(f"Stage{j}" for j in range(n - 1, i - 1, -1))


def random_pipeline(rng: np.random.Generator, stages: tuple[int, int] = (3, 8),
                    cpus: tuple[int, int] = (2, 128), events: bool = True
                    ) -> SimPipeline:
  """A randomized pipeline: heavy-tailed (log-normal, sigma 1) stage costs,
  CPUs log-uniform in `cpus`, optional resize and memory events, sometimes a
  slow consumer, sometimes a tight RAM budget."""
  n = int(rng.integers(stages[0], stages[1] + 1))
  c = int(round(math.exp(rng.uniform(math.log(cpus[0]),
                                     math.log(cpus[1] + 0.49)))))
  c = max(cpus[0], min(cpus[1], c))
  base = 1e-3 * float(rng.uniform(0.5, 2.0))
  out = []
  for i in range(n):
    tunable = i == 0 or rng.random() < 0.8
    out.append(SimStage(
        name=chain_name(n, i),
        cost_s=(base * float(rng.lognormal(0.0, 1.0)) *
                (1.0 if tunable else 0.2)),
        cv=float(rng.choice([0.0, 0.3, 1.0, 2.0])),
        tunable=bool(tunable),
        buffer=bool(i == n - 1 or rng.random() < 0.3),
        bytes_per_element=float(rng.choice([0.25, 1, 4, 16])) * MB))
  out = tuple(out)
  work_ceiling = c / sum(st.cost_s for st in out)
  consumer = 0.0
  if rng.random() < 0.2:
    consumer = 1.0 / (work_ceiling * float(rng.uniform(0.3, 1.2)))
  buffer_bytes = sum(st.bytes_per_element for st in out if st.buffer)
  ram_budget = buffer_bytes * float(rng.choice([2, 8, 32]))
  in_flight = sum(st.bytes_per_element for st in out) * c
  memory_limit = (ram_budget + in_flight) * float(rng.uniform(1.5, 3.0))
  resize, memory_events = (), ()
  if events and rng.random() < 0.3:
    step = int(rng.integers(30, 120))
    resize = ((step, max(cpus[0], int(c * rng.choice([0.5, 2.0])))),)
  if events and rng.random() < 0.1:
    memory_events = ((int(rng.integers(30, 120)), memory_limit * 0.6),)
  return SimPipeline(stages=out, cpus=c, memory_limit=memory_limit,
                     ram_budget=ram_budget, consumer_step_s=consumer,
                     drift=float(rng.choice([0.0, 0.0, 0.01])),
                     resize=resize, memory_events=memory_events)


class Simulator:
  """Steps a `SimPipeline` in time, one tuning period per step.

  `observe()` returns the same `intune_tf.records.Observation` the live
  tuner builds, so policies run unchanged on both; `set()` applies knob
  values like `TuningSession.set` (clamped to each knob's range).
  """

  def __init__(self, pipeline: SimPipeline, seed: int = 0,
               params: SimParams = SimParams(), period_s: float = 0.5):
    self.pipeline = pipeline
    self.params = params
    self.period_s = period_s
    self._rng = np.random.default_rng(seed)
    n = len(pipeline.stages)
    self.parallelism = [1] * n
    self.buffers = [0] * n
    self.costs = [st.cost_s for st in pipeline.stages]
    self.cpus = pipeline.cpus
    self.memory_limit = pipeline.memory_limit
    self.ram_budget = pipeline.ram_budget
    self.background = 0.0
    self.step_count = 0
    self.oom = False
    self.rate = 0.0
    self.buffered = 0.0
    self.in_use = 0.0
    self._knobs = pipeline.knob_names()
    self._settle()

  # --- control ---------------------------------------------------------------
  def knobs(self) -> list[records.Knob]:
    result = []
    for name, kind, i in self._knobs:
      if kind == "parallelism":
        result.append(records.Knob(name, kind, float(self.parallelism[i]),
                                       1.0, float(self.cpus)))
      else:
        result.append(records.Knob(name, kind, float(self.buffers[i]),
                                       0.0, float(MAX_BUFFER)))
    return result

  def set(self, values: Mapping[str, float]) -> dict[str, float]:
    """Sets knobs at once, as `TuningSession.set` (the
    `intune_tf.tuning.env.TuningEnv` contract): all, or none if one is
    invalid; values rounded. Returns the values in force afterwards.

    Raises:
      KeyError: a name is not a knob of the pipeline.
      ValueError: a value is not finite or is outside its knob's range.
    """
    knobs = {k.name: k for k in self.knobs()}
    for name, value in values.items():
      if name not in knobs:
        raise KeyError(f"{name!r} is not a knob of this simulated pipeline; "
                       f"its knobs: {sorted(knobs)}.")
      if (isinstance(value, bool) or not isinstance(value, (int, float)) or
          not math.isfinite(value)):
        raise ValueError(f"Value {value!r} for knob {name!r} is not a finite "
                         "number.")
      k = knobs[name]
      if not k.min <= round(value) <= k.max:
        raise ValueError(f"Value {value!r} for knob {name!r} is outside "
                         f"[{k.min:g}, {k.max:g}].")
    applied = {}
    for name, kind, i in self._knobs:
      if name not in values:
        continue
      if kind == "parallelism":
        self.parallelism[i] = int(round(values[name]))
        applied[name] = float(self.parallelism[i])
      else:
        self.buffers[i] = int(round(values[name]))
        applied[name] = float(self.buffers[i])
    self._settle()
    return applied

  def true_rate(self) -> float:
    """Noise-free throughput of the allocation in force (0 after an OOM)."""
    if self.oom:
      return 0.0
    return throughput(self.pipeline.stages, self.parallelism, self.buffers,
                      self.cpus, self.pipeline.consumer_step_s, self.params,
                      self.costs, self.background)

  def optimum(self) -> tuple[float, list[int], list[int]]:
    """The optimum for the CPUs, co-tenant, RAM budget and costs in force
    now."""
    return optimum(self.pipeline, self.cpus, self.params,
                   ram_budget=self.ram_budget, costs=self.costs,
                   background=self.background)

  def state_key(self) -> tuple:
    """What the optimum depends on besides the pipeline: CPUs, co-tenant,
    RAM budget, costs."""
    return (self.cpus, self.background, self.ram_budget, tuple(self.costs))

  def _settle(self) -> None:
    self.rate = self.true_rate()
    self.buffered, self.in_use = memory_in_use(
        self.pipeline, self.parallelism, self.buffers, self.rate, self.costs)
    if self.in_use > self.memory_limit:
      self.oom = True
      self.rate = 0.0

  # --- time ----------------------------------------------------------------
  def advance(self) -> None:
    """One tuning period: events, cost drift, then the new steady state."""
    self.step_count += 1
    for step, cpus in self.pipeline.resize:
      if step == self.step_count:
        self.cpus = cpus
        self.parallelism = [min(p, cpus) for p in self.parallelism]
    for step, limit in self.pipeline.memory_events:
      if step == self.step_count:
        self.memory_limit = limit
    for step, threads in self.pipeline.cotenant_events:
      if step == self.step_count:
        self.background = float(threads)
    for step, stage, factor in self.pipeline.cost_events:
      if step == self.step_count:
        self.costs[stage] *= factor
    for step, budget in self.pipeline.pressure_events:
      if step == self.step_count:
        self.memory_limit -= max(0.0, self.ram_budget - budget)
        self.ram_budget = budget
        self._fit_buffers()
    if self.pipeline.drift:
      self.costs = [
          c * float(math.exp(self._rng.normal(0, self.pipeline.drift)))
          for c in self.costs]
    self._settle()

  def _fit_buffers(self) -> None:
    """Buffers shrunk, largest first, until their bytes fit the RAM
    budget."""
    stages = self.pipeline.stages

    def held():
      return sum(b * st.bytes_per_element
                 for b, st in zip(self.buffers, stages))
    while held() > self.ram_budget:
      i = max(range(len(stages)),
              key=lambda i: self.buffers[i] * stages[i].bytes_per_element)
      if self.buffers[i] <= 0:
        break
      self.buffers[i] -= 1

  def observe(self) -> records.Observation:
    """The observation a live tuner would read now (rates with noise)."""
    p = self.pipeline
    noise = 1.0 + self.params_noise()
    rate = max(0.0, self.rate * noise)
    eff = effective_costs(self.costs, self.parallelism, self.cpus, self.params,
                          self.background)
    total = sum(eff) or 1.0
    knob_by_stage = {}
    for name, kind, i in self._knobs:
      knob_by_stage.setdefault(i, {})[kind] = name
    stages = []
    for i, st in enumerate(p.stages):
      kinds = knob_by_stage.get(i, {})
      buf = float(self.buffers[i]) if "buffer_size" in kinds else None
      fill = (1.0 if self.parallelism[i] / eff[i] > 1.05 * self.rate else 0.5)
      stages.append(records.StageObservation(
          name=st.name, rate=rate,
          cpu_per_element_s=eff[i] * (1 + self.params_noise()),
          parallelism=(float(self.parallelism[i]) if "parallelism" in kinds
                       else None),
          buffer_size=buf, buffer_fill=fill if buf else 0.0,
          bytes_per_element=st.bytes_per_element,
          bytes_produced_per_s=rate * st.bytes_per_element,
          buffered_bytes=int((buf or 0) * fill * st.bytes_per_element),
          time_share=eff[i] / total))
    latency = 1.0 / self.rate if self.rate > 0 else 0.0
    consumer = p.consumer_step_s
    return records.Observation(
        time=self.step_count * self.period_s, interval_s=self.period_s,
        knobs=tuple(self.knobs()), stages=tuple(stages), output_rate=rate,
        output_latency_s=latency, consumer_wait_s=consumer,
        usable_cpus=self.cpus, cpu_budget=self.cpus,
        free_memory=int(max(0.0, self.memory_limit - self.in_use)),
        total_memory=int(self.memory_limit),
        ram_budget=int(self.ram_budget), buffered_bytes=int(self.buffered),
        cpu_mhz=SIM_CPU_MHZ, dram_gbps=SIM_DRAM_GBPS,
        model_step_s=consumer if consumer > 0 else None)

  def params_noise(self) -> float:
    if not self.pipeline.noise:
      return 0.0
    return float(self._rng.normal(0.0, self.pipeline.noise))
