"""A tf.data service job at cluster scale: a pool of 1-512 workers.

`intune simulate --service --workers N --seed S` scores the pool controllers
of `intune_tf.service.controllers` on it: `intune`, `tf-formula`, `cachew`, and
`fixed-best` (the best constant pool in hindsight), and `intune-standby`:
InTune's controller with `standby_count(N)` warm workers kept ready.

The model, one second per step (`ClusterScenario`):

- Worker slot i serves `capacities[i]` rows/s once up. Slots are started in
  order and stopped from the top; a started worker is up after a start-up
  delay drawn per start (log-normal around the scenario's median), and is
  paid for from the moment it is asked for.
- The pool delivers min(sum of the serving workers' capacities x a common
  noise factor, `ceiling`) rows/s: `ceiling` is what the trainer's host can
  take in (network, gRPC, decompression), however many workers serve it.
- The consumer runs phases, each a number of rows at a pace (rows/s it would
  take if input never made it wait), with per-step jitter. A client buffer of
  `buffer_s` seconds at the first phase's pace absorbs short dips. In a step
  the trainer takes what the buffer and the pool give, up to its pace; the
  rest of the step it waits. The run ends when every phase's rows are
  consumed.

Scores: `stall_fraction` (the trainer's waiting time / the run's time),
`stall_starting` (the share of that waiting spent while asked-for workers
were starting), `worker_hours` (workers asked for, serving or starting,
integrated over the run), `standby_hours` (warm standbys kept, likewise),
`changes` (pool resizes), `run_time_s`.

A standby (`workers.LocalWorkers(standby=...)`, live) is a worker that has
started and loaded but serves nothing: a growth that takes one has that
worker up `WARM_START_S` later instead of after a start-up delay, and its
replacement starts `workers.DEFAULT_STANDBY_DELAY_S` after and is warm one
start-up delay later. Standbys are kept while the pool is below MAX and
paid for all that time (on a cluster a warm pod costs what a serving one
does).

Calibration: the mean per-worker rate is the median one-worker rate measured
by `benchmarks/service.py` (3,263 rows/s, docs/service-design.md), its
spread across workers (5%) that of the five repeats (2,921-3,462 rows/s);
5% of slots are stragglers at half speed, and the start-up delays (median
30-90 s per scenario) are assumptions for a cluster scheduler that starts a
container which imports TensorFlow (one worker process here takes 10-60 s to
register, docs/service.md). Only the ratios matter: rows/s scale out.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Callable

import numpy as np

from intune_tf.service import controllers
from intune_tf.service import workers

# Rows/s of one InTune-tuned worker of the busy-UDF pipeline, median of 5
# repeats on this machine (docs/service.md, `benchmarks/service.py`).
WORKER_RATE = 3263.0
# Spread of the worker rates, from the same repeats (2,921-3,462 rows/s).
WORKER_CV = 0.05
STRAGGLER_SHARE = 0.05
STRAGGLER_SPEED = 0.5
CONTROLLERS = ("intune", "tf-formula", "cachew", "fixed-best",
               "intune-standby")
# A warm standby's start once taken (live: it registers 0.05 s after it is
# handed its port; a cluster's pod is already scheduled and loaded).
WARM_START_S = 1.0
# Two-sided 95% Student t quantiles by degrees of freedom (paired CIs over
# few seeds).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447,
        7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


@dataclasses.dataclass(frozen=True)
class ClusterScenario:
  """One simulated job (module docstring).

  Attributes:
    capacities: rows/s of each worker slot; its length is the pool's MAX.
    startup_s: start-up delays, [slot, k] for the k-th start of that slot.
    phases: (rows, pace rows/s) of each consumer phase, in order.
    ceiling: rows/s the trainer's host can take in.
    initial: workers serving at the start. Default 1.
    min_workers: the pool's MIN. Default 1.
    buffer_s: the client's buffer, seconds at the first phase's pace.
      Default 2.
    noise: relative standard deviation of the pool's rate per step and of
      each measurement. Default 0.03.
    jitter: relative standard deviation of the consumer's pace per step.
      Default 0.05.
    period_s: seconds between a controller's decisions. Default 10.
    seed: seed of the per-step noise. Default 0.
  """
  capacities: tuple[float, ...]
  startup_s: np.ndarray
  phases: tuple[tuple[float, float], ...]
  ceiling: float
  initial: int = 1
  min_workers: int = 1
  buffer_s: float = 2.0
  noise: float = 0.03
  jitter: float = 0.05
  period_s: float = 10.0
  seed: int = 0

  @property
  def max_workers(self) -> int:
    return len(self.capacities)

  def ideal_time_s(self) -> float:
    """The run's time if the trainer never waited."""
    return sum(rows / pace for rows, pace in self.phases)


def scenario(workers: int, seed: int, phase_s: float = 900.0
             ) -> ClusterScenario:
  """The scored job for a pool of at most `workers` (seeded).

  The consumer runs fast, slow (a step 4x longer), then fast again, each
  phase the same number of rows (`phase_s` seconds of the fast pace, default
  900). The fast pace needs 50-80% of the pool's MAX at the mean worker
  rate; the host's intake ceiling is 0.9-1.5x the fast pace (below 1: the
  fast phases are bound by the host whatever the pool); start-up delays have
  a median of 30-90 s; the pool starts at MAX / 8.

  Raises:
    ValueError: `workers` outside 1..512.
  """
  if not 1 <= workers <= 512:
    raise ValueError(f"--workers must be in 1..512, got {workers}.")
  rng = np.random.default_rng([seed, workers])
  caps = WORKER_RATE * rng.lognormal(0.0, WORKER_CV, workers)
  caps[rng.random(workers) < STRAGGLER_SHARE] *= STRAGGLER_SPEED
  fast = float(rng.uniform(0.5, 0.8)) * workers * WORKER_RATE
  rows = fast * phase_s
  median_start = float(rng.uniform(30.0, 90.0))
  startup = median_start * rng.lognormal(0.0, 0.3, (workers, 64))
  return ClusterScenario(
      capacities=tuple(float(c) for c in caps), startup_s=startup,
      phases=((rows, fast), (rows, fast / 4), (rows, fast)),
      ceiling=fast * float(rng.uniform(0.9, 1.5)),
      initial=max(1, workers // 8), seed=seed)


@dataclasses.dataclass
class RunResult:
  """What one controller (or fixed pool) did on a scenario."""
  stall_fraction: float
  stall_starting: float  # share of the waiting while workers were starting
  worker_hours: float
  changes: int
  run_time_s: float
  finished: bool
  sizes: list[tuple[float, int]]  # (time, workers asked) at each change
  reasons: list[str]
  standby_hours: float = 0.0

  def summary(self) -> dict:
    return {"stall_fraction": self.stall_fraction,
            "stall_starting": self.stall_starting,
            "worker_hours": self.worker_hours,
            "standby_hours": self.standby_hours, "changes": self.changes,
            "run_time_s": self.run_time_s, "finished": self.finished}


def _draws(sc: ClusterScenario, steps: int) -> tuple[np.ndarray, np.ndarray]:
  """Common random numbers: the pool's noise and the consumer's jitter per
  step, the same for every controller."""
  rng = np.random.default_rng([sc.seed, 7])
  return (np.exp(rng.normal(0.0, sc.noise, steps)),
          np.exp(rng.normal(0.0, sc.jitter, steps)))


def standby_count(workers: int) -> int:
  """The warm standbys `intune-standby` keeps for a pool of MAX `workers`:
  one per 16 (at least 1). standby_count(64) = 4; standby_count(8) = 1."""
  return max(1, workers // 16)


def run(sc: ClusterScenario,
        decide: Callable[[controllers.PoolReading],
                         controllers.Decision] | None,
        max_time_factor: float = 6.0, standby: int = 0) -> RunResult:
  """Runs the job under a controller's `decide` (None: the initial pool
  stays).

  Args:
    sc: the job.
    decide: the controller's decision function, called every `period_s`.
    max_time_factor: the run stops unfinished after this many times its
      ideal time. Default 6.
    standby: warm standbys kept while the pool is below MAX, all warm at
      the start (module docstring). Default 0.
  """
  caps = np.asarray(sc.capacities)
  n_max = len(caps)
  steps = int(math.ceil(sc.ideal_time_s() * max_time_factor))
  noise, jitter = _draws(sc, steps)
  meas = np.random.default_rng([sc.seed, 11])
  ready_at = np.full(n_max, np.inf)
  ready_at[:sc.initial] = 0.0
  starts = np.zeros(n_max, int)
  warm_at = np.zeros(standby)  # when each standby is (or was) warm
  standby_s = 0.0
  asked = sc.initial
  buffer_rows = sc.buffer_s * sc.phases[0][1]
  buf = 0.0
  bounds = np.cumsum([rows for rows, _ in sc.phases])
  total = float(bounds[-1])
  done = 0.0
  wait = worker_s = starting_wait = 0.0
  p_wait = p_rows = p_pace = 0.0
  changes = 0
  sizes, reasons = [(0.0, asked)], []
  t = 0
  for t in range(steps):
    if done >= total:
      break
    phase = int(np.searchsorted(bounds, done, side="right"))
    pace = sc.phases[min(phase, len(sc.phases) - 1)][1] * jitter[t]
    serving = ready_at[:asked] <= t
    supply = min(float(caps[:asked][serving].sum()) * noise[t], sc.ceiling)
    avail = buf + supply
    if avail >= pace:
      got, buf = pace, min(buffer_rows, avail - pace)
    else:
      got, buf = avail, 0.0
    step_wait = 1.0 - got / pace
    done += got
    wait += step_wait
    if not serving.all():
      starting_wait += step_wait
    worker_s += asked
    if asked < n_max:
      standby_s += standby
    p_wait += step_wait
    p_rows += got
    p_pace += pace
    if decide is None or (t + 1) % int(sc.period_s) != 0:
      continue
    now = t + 1.0
    serving = np.flatnonzero(ready_at[:asked] <= now)
    period = sc.period_s
    n_serving = len(serving)
    err = lambda size: np.exp(meas.normal(0.0, sc.noise, size))
    share = caps[serving] / max(caps[serving].sum(), 1e-9)
    reading = controllers.PoolReading(
        time_s=now, workers=n_serving, starting=asked - n_serving,
        wait_share=p_wait / period,
        consumer_rate=float(p_pace / period * err(1)[0]),
        worker_rates=tuple((p_rows / period * share * err(n_serving))
                           .tolist()),
        worker_capacities=tuple((caps[serving] * err(n_serving)).tolist()))
    p_wait = p_rows = p_pace = 0.0
    decision = decide(reading)
    size = controllers.clamp(decision.size, sc.min_workers, n_max)
    if size == asked:
      continue
    changes += 1
    reasons.append(decision.reason)
    if size > asked:
      for i in range(asked, size):
        if not math.isfinite(ready_at[i]) or ready_at[i] > now:
          delay = sc.startup_s[i, starts[i] % sc.startup_s.shape[1]]
          starts[i] += 1
          ready_at[i] = now + delay
          if standby:
            j = int(np.argmin(warm_at))
            warm = max(now, float(warm_at[j])) + WARM_START_S
            if warm < ready_at[i]:
              ready_at[i] = warm
              # Its replacement loads as a cold start would.
              warm_at[j] = now + workers.DEFAULT_STANDBY_DELAY_S + delay
    else:
      ready_at[size:asked] = np.inf
      if asked == n_max:
        # None were kept at MAX: they load again.
        warm_at[:] = now + sc.startup_s[0, 0]
    asked = size
    sizes.append((now, asked))
  run_time = float(t + (1 if done < total else 0))
  return RunResult(stall_fraction=wait / max(run_time, 1.0),
                   stall_starting=starting_wait / max(wait, 1e-9),
                   worker_hours=worker_s / 3600.0, changes=changes,
                   run_time_s=run_time, finished=bool(done >= total),
                   sizes=sizes, reasons=reasons,
                   standby_hours=standby_s / 3600.0)


def fixed_run_times(sc: ClusterScenario) -> np.ndarray:
  """Noise-free run time of every fixed pool 1..MAX: the sum over phases of
  rows / min(pace, min(sum of the pool's capacities, ceiling))."""
  supply = np.minimum(np.cumsum(sc.capacities), sc.ceiling)
  return sum(rows / np.minimum(pace, supply) for rows, pace in sc.phases)


def fixed_best(sc: ClusterScenario, within: float = 0.005,
               candidates: float = 0.03) -> tuple[int, RunResult]:
  """The best constant pool in hindsight: of the sizes whose noise-free run
  time is within `candidates` (default 3%) of the fastest, each is run; the
  fewest workers whose run time is within `within` (default 0.5%) of the
  fastest run wins.

  Returns:
    (size, its RunResult).
  """
  times = fixed_run_times(sc)
  sizes = [n for n in range(max(1, sc.min_workers), sc.max_workers + 1)
           if times[n - 1] <= (1 + candidates) * times.min()]
  results = {}
  for n in sizes:
    results[n] = run(dataclasses.replace(sc, initial=n), None)
  fastest = min(r.run_time_s for r in results.values())
  best = min(n for n, r in results.items()
             if r.run_time_s <= (1 + within) * fastest)
  return best, results[best]


def run_controllers(workers: int, seed: int,
                    names: tuple[str, ...] = CONTROLLERS,
                    phase_s: float = 900.0) -> dict:
  """Every controller of `names` on `scenario(workers, seed, phase_s)`.

  Returns:
    {"workers", "seed", "ceiling_share", "policies": {name: summary}}; the
    fixed-best entry also has "size".
  """
  sc = scenario(workers, seed, phase_s)
  out = {}
  for name in names:
    if name == "fixed-best":
      size, r = fixed_best(sc)
      out[name] = dict(r.summary(), size=size)
      continue
    controller = controllers.make_controller(name.removesuffix("-standby"),
                                      sc.min_workers, sc.max_workers)
    r = run(sc, controller.decide, standby=(
        standby_count(workers) if name.endswith("-standby") else 0))
    out[name] = dict(r.summary(), last_reasons=r.reasons[-3:])
  return {"workers": workers, "seed": seed,
          "ceiling_share": sc.ceiling / sc.phases[0][1], "policies": out}


def paired_t_interval(diffs) -> tuple[float, float, float]:
  """Mean of paired differences and its 95% Student t interval.

  paired_t_interval([1, 2, 3, 4]): mean 2.5, sd sqrt(5/3) = 1.291, se
  0.6455, t(3) = 3.182: (2.5, 0.446, 4.554). One pair: (d, nan, nan).
  """
  d = np.asarray(diffs, float)
  mean = float(d.mean())
  if len(d) < 2:
    return mean, math.nan, math.nan
  half = _T95.get(len(d) - 1, 1.96) * float(d.std(ddof=1)) / math.sqrt(
      len(d))
  return mean, mean - half, mean + half


def compare(workers: int, seeds: list[int],
            names: tuple[str, ...] = CONTROLLERS,
            phase_s: float = 900.0) -> dict:
  """`run_controllers` over `seeds`, with intune's paired differences.

  Returns:
    {"workers", "seeds", "runs": [per seed], "policies": {name: means of
    stall_fraction, worker_hours, changes, run_time_s}, "intune_vs": {other:
    {"stall_fraction": (mean, low, high), "worker_hours_ratio": (mean, low,
    high)}}}: differences intune - other of the stall fraction, and of the
    ratio intune / other of worker-hours minus nothing (a ratio).
  """
  runs = [run_controllers(workers, s, names, phase_s) for s in seeds]
  policies = {}
  for name in names:
    rs = [r["policies"][name] for r in runs]
    policies[name] = {k: float(np.mean([r[k] for r in rs])) for k in (
        "stall_fraction", "stall_starting", "worker_hours", "standby_hours",
        "changes", "run_time_s")}
    if name == "fixed-best":
      policies[name]["sizes"] = [r["size"] for r in rs]
  vs = {}
  if "intune" in names:
    mine = [r["policies"]["intune"] for r in runs]
    for other in names:
      if other == "intune":
        continue
      theirs = [r["policies"][other] for r in runs]
      vs[other] = {
          "stall_fraction": paired_t_interval(
              [a["stall_fraction"] - b["stall_fraction"]
               for a, b in zip(mine, theirs)]),
          "worker_hours_ratio": paired_t_interval(
              [a["worker_hours"] / b["worker_hours"]
               for a, b in zip(mine, theirs)]),
      }
  return {"workers": workers, "seeds": list(seeds), "runs": runs,
          "policies": policies, "intune_vs": vs}


def format_comparison(result: dict) -> str:
  """`compare`'s result as the table `intune simulate --service` prints."""
  lines = [f"{result['workers']} workers at most, seeds {result['seeds']}: "
           "means over seeds; vs intune: intune minus the controller's "
           "stall fraction, and intune / its worker-hours, mean [95% paired "
           "t CI]; starting: share of the stall spent while workers "
           "started.",
           f"{'controller':15}{'stall':>8}{'starting':>9}{'w-hours':>10}"
           f"{'standby-h':>10}{'changes':>9}"
           f"{'time s':>9}{'stall diff [95% CI]':>30}"
           f"{'w-hours ratio [95% CI]':>28}"]
  for name, p in result["policies"].items():
    vs = result["intune_vs"].get(name)
    if vs:
      s, w = vs["stall_fraction"], vs["worker_hours_ratio"]
      stall = f"{s[0]:+.4f} [{s[1]:+.4f}, {s[2]:+.4f}]"
      ratio = f"{w[0]:.3f} [{w[1]:.3f}, {w[2]:.3f}]"
    else:
      stall = ratio = "-"
    lines.append(f"{name:15}{p['stall_fraction']:8.4f}"
                 f"{p['stall_starting']:9.2f}"
                 f"{p['worker_hours']:10.1f}{p['standby_hours']:10.1f}"
                 f"{p['changes']:9.1f}"
                 f"{p['run_time_s']:9.0f}{stall:>30}{ratio:>28}")
  return "\n".join(lines)


def main(args) -> int:
  """`intune simulate --service`: scores, printed and written to --json."""
  seeds = [args.seed + i for i in range(args.seeds)]
  result = compare(args.workers, seeds)
  print(format_comparison(result))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=1)
  return 0
