"""`intune bench`: policies side by side on the same pipelines.

Every policy runs on every chosen scenario in ONE process, interleaved
(A B C A B C ...), with repeats. Per policy: median, min and max rows/s after
the warm-up, the ratio to `autotune` and to the best live baseline, the
fraction of the ceiling (`cpu_ceiling`, a bound on every run), the whole
run's rows/s (warm-up included) and its regret against the oracle's
(`regret`), the configuration changes seen (`churn`), the process CPU time
per row, and the peak of buffered bytes.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gc
import itertools
import json
import os
import statistics
import tempfile
import threading
import time
from typing import Mapping, Sequence

from absl import logging
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import model_pb2
from tqdm import tqdm

import intune_tf
from intune_tf import arguments
from intune_tf import host
from intune_tf import records
from intune_tf.bench import meter as meter_lib
from intune_tf.bench import resize as resize_lib
from intune_tf.bench import scenarios as scenarios_lib
from intune_tf.live import registry
from intune_tf.ops import session as session_lib
from intune_tf.tuning import policies

# The option off: tf.data's own AUTOTUNE, with each of its algorithms
# (`tf.data.Options().autotune.autotune_algorithm`; "autotune" leaves TF's
# default).
AUTOTUNE_ALGORITHMS = {
    "autotune": None,
    "autotune-hill-climb": "HILL_CLIMB",
    "autotune-gradient-descent": "GRADIENT_DESCENT",
    "autotune-max-parallelism": "MAX_PARALLELISM",
    "autotune-stage-based": "STAGE_BASED",
}
AUTOTUNE_POLICIES = (*AUTOTUNE_ALGORITHMS, "autotune-restart")
BASELINES = ("unoptimized", "even", *AUTOTUNE_POLICIES, "analytic", "climb",
             "coordinate", "plumber", "jump-climb", "oracle")
DEFAULT_POLICIES = ("unoptimized", "even", "autotune", "autotune-restart",
                    "analytic", "oracle", "intune")
# What a result is compared with besides AUTOTUNE: the best of the tuners
# that run live without learning (not "oracle", an offline search of static
# configurations, nor "unoptimized").
LIVE_BASELINES = tuple(b for b in BASELINES if b not in ("unoptimized",
                                                         "oracle"))
WINDOW_S = 0.5
# Buffered-bytes sampling periods (see `sample_period_s`).
SAMPLE_S = 0.1
MEMORY_SAMPLE_S = 0.01
# Windows averaged when judging recovery after a CPU change (about 2 s).
RECOVERY_SMOOTHING = 4
TUNING_PERIOD_S = 0.25


def valid_policies() -> list[str]:
  extra = [p for p in registry.names()
           if p not in ("fixed", "manual", "oracle") and p not in BASELINES]
  return list(BASELINES) + sorted(extra)


def check_policies(names: Sequence[str]) -> None:
  valid = valid_policies()
  for name in names:
    if name not in valid:
      raise ValueError(f"Unknown policy {name!r}. Valid policies: {valid}.")


def work_estimate_rows_per_s(cpus: float,
                             seconds_per_row: Sequence[float]) -> float:
  """Work estimate: usable CPUs / sum of the stages' single-threaded
  CPU-seconds per row. Not a bound: a tuned pipeline can spend less per row
  than its stages did alone (see `cpu_ceiling`).

  Example: 2 CPUs, stages costing 1.27, 1.86 and 0.50 us/row:
  2 / 3.63e-6 = 550,964 rows/s.
  """
  total = sum(seconds_per_row)
  return cpus / total if total > 0 else float("inf")


def cpu_ceiling(runs: Sequence[tuple[float, float]]) -> float | None:
  """The rows/s that no run of a scenario can exceed: the most CPUs any run
  had / the least process CPU time per row any run spent.

  A run's rate is at most its CPUs / its own CPU time per row (a process
  cannot spend more CPU time than CPUs x seconds), so every run, and every
  median, is at most this; "of ceiling" is at most 1 by construction.

  Args:
    runs: (usable CPUs, process CPU-seconds per row) of each run.

  Returns:
    The ceiling in rows/s; None without a run that measured both.

  Example: (2 CPUs, 10 us/row) and (2 CPUs, 8 us/row) -> 2 / 8e-6 =
  250,000 rows/s.
  """
  measured = [(c, s) for c, s in runs if c > 0 and s > 0]
  if not measured:
    return None
  return max(c for c, _ in measured) / min(s for _, s in measured)


def _phases(events: Sequence[tuple[float, int]]):
  """(start, end, state) of each phase of `phase_events` (end: inf)."""
  for i, (t0, state) in enumerate(events):
    t1 = events[i + 1][0] if i + 1 < len(events) else float("inf")
    yield t0, t1, state


def phase_events(run: "Run") -> list[tuple[float, int]]:
  """The phases of a run as `[(seconds into the run, state), ...]`: the CPU
  counts of a resize schedule, or else the co-tenant processes running
  (0 from the start until the first opens); [] for a run without either.

  Example: co-tenant events (8.0, 2), (16.0, 0) -> (0, 0), (8.0, 2),
  (16.0, 0).
  """
  if run.resize_events:
    return list(run.resize_events)
  if run.cotenant_events:
    return [(0.0, 0)] + list(run.cotenant_events)
  return []


def phase_targets(runs: Sequence["Run"]) -> dict[int, float]:
  """Reference rows/s per phase state (`phase_events`): the median window
  rate of `runs` (the oracle's) over the second half of each phase."""
  rates: dict[int, list[float]] = {}
  for run in runs:
    last = max((t for t, _ in run.windows), default=0.0)
    for t0, t1, state in _phases(phase_events(run)):
      half = t0 + (min(t1, last) - t0) / 2
      rates.setdefault(state, []).extend(
          v for t, v in run.windows if half <= t < t1)
  return {c: statistics.median(v) for c, v in rates.items() if v}


def recovery_seconds(windows: Sequence[tuple[float, float]],
                     events: Sequence[tuple[float, int]],
                     targets: dict[int, float], fraction: float = 0.95,
                     smooth: int = RECOVERY_SMOOTHING) -> list[float | None]:
  """Seconds from each change of phase (`phase_events`: CPUs, or co-tenants
  running) until throughput is back to `fraction` of the new phase's target.

  Throughput is the mean of the last `smooth` windows, all taken after the
  change; the time counted is to the end of the first such run of windows.
  The first event (the schedule's start) is not a change and is skipped.

  Returns:
    One entry per change: seconds, or None if never reached before the next
    change (or the end of the run), or if there is no target for the state.
  """
  out = []
  for t0, t1, state in list(_phases(events))[1:]:
    target = targets.get(state)
    phase = [v for t, v in windows if t0 <= t < t1]
    times = [t for t, _ in windows if t0 <= t < t1]
    found = None
    if target:
      for j in range(smooth - 1, len(phase)):
        if statistics.fmean(phase[j - smooth + 1:j + 1]) >= fraction * target:
          found = times[j] - t0
          break
    out.append(found)
  return out


def churn(knobs: Sequence[tuple[float, dict[str, float]]]) -> int:
  """Configuration changes seen in a run: samples `(time, {knob: value})`
  whose values differ from the sample before on a knob both have.

  Example: {a: 1}, {a: 1}, {a: 2}, {a: 2, b: 1}, {a: 3} -> 2 (the third
  sample, then the fifth; b appearing is not a change).
  """
  changes = 0
  for (_, before), (_, after) in itertools.pairwise(knobs):
    if any(before[k] != v for k, v in after.items() if k in before):
      changes += 1
  return changes


def regret(rows_per_s: float, best_static_rows_per_s: float | None
           ) -> float | None:
  """Fraction of rows lost against the best static configuration over the
  same whole run (warm-up included): 1 - rows_per_s / best. Negative: more
  rows than it. None without a best.

  Example: 90 rows/s against a best static 100 rows/s -> 0.1.
  """
  if not best_static_rows_per_s:
    return None
  return 1.0 - rows_per_s / best_static_rows_per_s


@dataclasses.dataclass
class Run:
  """One run of one policy on one scenario."""
  policy: str
  scenario: str
  repeat: int
  rows_per_s: float = 0.0
  whole_run_rows_per_s: float = 0.0
  cpu_seconds_per_row: float = 0.0  # process CPU time, measured window
  usable_cpus: int = 0  # the most seen during the run
  windows: list = dataclasses.field(default_factory=list)   # (t, rows/s)
  knobs: list = dataclasses.field(default_factory=list)     # (t, {name: v})
  peak_buffered_bytes: int = 0
  resize_events: list = dataclasses.field(default_factory=list)
  # (seconds into the run, co-tenant processes running) as they change.
  cotenant_events: list = dataclasses.field(default_factory=list)


class _OraclePolicy(policies.Policy):
  """The oracle at run time: the best static configuration for the CPUs.

  Args:
    options: the session's options.
    table: `{usable CPUs: {knob name: value}}`, the configurations one
      scenario's oracle search found best; empty (nothing searched) makes a
      policy that changes nothing.
  """

  def __init__(self, options: intune_tf.IntuneOptions,
               table: Mapping[int, Mapping[str, float]]):
    super().__init__(options)
    self.table = {cpus: dict(config) for cpus, config in table.items()}

  def step(self, obs):
    if not self.table:
      return {}
    keys = sorted(self.table)
    usable = [k for k in keys if k <= obs.usable_cpus] or keys[:1]
    config = self.table[usable[-1]]
    return {k.name: min(max(config[k.name], k.min), k.max)
            for k in obs.knobs if k.name in config}


class _Probe:
  """What a run samples from its iterator: buffered bytes and knob values,
  from TF's AUTOTUNE model (`autotune=True`) or from the InTune session."""

  def __init__(self, autotune: bool):
    self.autotune = autotune
    self.iterator = None

  def buffered(self) -> int:
    if self.autotune:
      proto = _autotune_model(self.iterator)
      return (sum(n.buffered_bytes for n in proto.nodes.values())
              if proto else 0)
    return intune_tf.session_of(self.iterator).counters()["buffered_bytes"]

  def knob_values(self) -> dict[str, float]:
    if self.autotune:
      return _autotune_knobs(_autotune_model(self.iterator))
    return {k.name: k.value
            for k in intune_tf.session_of(self.iterator).knobs()}


def _autotune_model(iterator) -> model_pb2.ModelProto | None:
  try:
    return model_pb2.ModelProto.FromString(tf.raw_ops.IteratorGetModelProto(
        iterator=iterator._iterator_resource).numpy())  # noqa: SLF001
  except (tf.errors.OpError, AttributeError):
    return None


def _autotune_knobs(proto) -> dict[str, float]:
  """TF AUTOTUNE's knob values, named as InTune names its knobs (instances
  of one stage inside an interleave: the first one's value)."""
  if proto is None:
    return {}
  names = session_lib.proto_stage_names(proto, root="Root")
  knobs = {}
  for nid, n in proto.nodes.items():
    for p in n.parameters:
      if p.tunable and p.name in records.KINDS and nid in names:
        knobs.setdefault(f"{names[nid]}/{p.name}", p.value)
  return knobs


def sample_period_s(scenario: scenarios_lib.Scenario) -> float:
  """How often a run samples buffered bytes: every `MEMORY_SAMPLE_S` where a
  RAM budget is the point of the scenario, else every `SAMPLE_S` (each
  sample reads the pipeline's model: at 10 ms it cost ~5% of a 2-core
  machine's throughput against a plain loop)."""
  return MEMORY_SAMPLE_S if scenario.ram_budget else SAMPLE_S


def autotune_dataset(scenario: scenarios_lib.Scenario,
                     policy: str) -> tf.data.Dataset:
  """The scenario's pipeline with the option off, under the AUTOTUNE
  variant `policy` (one of `AUTOTUNE_POLICIES`)."""
  ds = scenario.make(None)
  algorithm = AUTOTUNE_ALGORITHMS.get(policy)
  options = tf.data.Options()
  if policy == "autotune-restart":
    options.experimental_external_state_policy = (
        tf.data.experimental.ExternalStatePolicy.IGNORE)
  if algorithm:
    options.autotune.autotune_algorithm = getattr(
        tf.data.experimental.AutotuneAlgorithm, algorithm)
  return ds.with_options(options)


def pass_order(count: int, index: int) -> list[int]:
  """The order of the `index`-th pass (from 0) over `count` items (the
  oracle search's configurations, a repeat's policies): the first in order,
  each later one a permutation seeded by its index, so that the same items
  are not always measured first after a change (of CPUs, of policy) or
  last before the next.

  Example: pass_order(3, 0) = [0, 1, 2]; pass_order(3, 1) is a permutation
  of it, the same on every call.
  """
  if index == 0:
    return list(range(count))
  return [int(j) for j in np.random.default_rng(index).permutation(count)]


class Harness:
  """Runs policies on scenarios and collects `Run`s."""

  def __init__(self, *, seconds: float = 20.0, warmup: float = 5.0,
               cpu_budget: int | None = None, ram_budget: int | None = None,
               trace_path: str | None = None, oracle_seconds: float = 1.5,
               oracle_repeats: int = 1,
               oracle_cpus: Sequence[int] | None = None,
               warm_start: bool = False):
    self.seconds, self.warmup = seconds, warmup
    self.oracle_seconds = oracle_seconds
    self.oracle_repeats = oracle_repeats
    self.oracle_cpus = tuple(oracle_cpus) if oracle_cpus else None
    # Repeats are independent cold starts unless asked otherwise.
    self.warm_start = warm_start
    self.cpu_budget, self.ram_budget = cpu_budget, ram_budget
    self.runs: list[Run] = []
    self.work_estimates: dict[str, float] = {}
    self.stage_costs: dict[str, dict[str, float]] = {}
    self.oracle: dict[str, dict] = {}
    self._trace = open(trace_path, "a") if trace_path else None
    self._trace_context: dict = {}
    self._trace_lock = threading.Lock()
    if cpu_budget is not None and cpu_budget > host.usable_cpus():
      logging.warning("--cpu-budget %d is larger than the %d CPUs this "
                      "process may use; policies are capped at %d.",
                      cpu_budget, host.usable_cpus(), host.usable_cpus())
    if ram_budget is not None and ram_budget > host.total_memory():
      logging.warning("--ram-budget %d bytes is larger than this machine's "
                      "memory (%d bytes): it cannot prevent an OOM.",
                      ram_budget, host.total_memory())
    registry.register("oracle", self._oracle_policy)

  def _oracle_policy(self, options: intune_tf.IntuneOptions) -> _OraclePolicy:
    """The oracle of the scenario `options.name` names (the harness names
    each session after its scenario), with the table that scenario's search
    found (empty before its search)."""
    found = self.oracle.get(options.name)
    return _OraclePolicy(options, found["table"] if found else {})

  def close(self):
    if self._trace:
      self._trace.close()

  # --- tracing -------------------------------------------------------------
  def _on_step(self, session, obs, applied):
    if not self._trace:
      return
    self._write_trace({**self._trace_context, "session": session.id,
                       "observation": obs.to_json(), "applied": applied})

  def _write_trace(self, record: dict) -> None:
    if not self._trace:
      return
    line = json.dumps(record, default=float)
    with self._trace_lock:
      self._trace.write(line + "\n")

  # --- measurements --------------------------------------------------------
  def _options(self, policy: str, scenario: scenarios_lib.Scenario,
               config=None) -> intune_tf.IntuneOptions:
    # The tuning alone: the cache has benchmarks of its own.
    return intune_tf.IntuneOptions(
        policy=policy, config=config, period_s=TUNING_PERIOD_S,
        cpu_budget=self.cpu_budget,
        ram_budget=scenario.ram_budget or self.ram_budget,
        name=scenario.name, warm_start=self.warm_start, cache=False)

  def _tuned(self, scenario, policy, config=None) -> tf.data.Dataset:
    return intune_tf.tune(scenario.make(None),
                          self._options(policy, scenario, config))

  def measure_work_estimate(self, scenario: scenarios_lib.Scenario,
                            seconds: float = 3.0) -> float:
    """The work estimate: usable CPUs / the stages' CPU-seconds per row.

    Each stage's cost is measured single-threaded: the scenario's prefix
    pipelines run one after the other with one thread per stage, each cost
    is the process CPU time per row of a prefix minus that of the previous
    one (without prefixes, the whole pipeline counts as one stage). Costs
    are kept per stage in `self.stage_costs`.
    """
    prefixes = scenario.prefixes or (
        ("pipeline", lambda: scenario.make(None)),)
    costs, previous = {}, 0.0
    for stage, make in prefixes:
      it = iter(make())
      meter_lib.pull(it, 0.5)
      cpu0, n = time.process_time(), meter_lib.pull(it, seconds).counts
      per_row = (time.process_time() - cpu0) / max(
          1, n * scenario.rows_per_element)
      costs[stage] = max(0.0, per_row - previous)
      previous = max(previous, per_row)
      del it
      gc.collect()
    self.stage_costs[scenario.name] = costs
    estimate = work_estimate_rows_per_s(host.usable_cpus(),
                                        list(costs.values()))
    self.work_estimates[scenario.name] = estimate
    return estimate

  def search_oracle(self, scenario: scenarios_lib.Scenario,
                    settle: float = 0.5, measure: float = 1.5,
                    repeats: int = 1,
                    cpu_counts: Sequence[int] | None = None) -> dict:
    """Best static configuration per CPU count.

    A grid over every parallelism in 1..max(CPUs, 2) per parallel stage
    (buffers at 2; on one CPU a second thread can overlap a stage that
    waits), then one coordinate pass over each buffer in {1, 4, 8} from the
    grid's best point. All configurations are measured in one iterator;
    with `repeats`, the grid and the buffer configurations together are
    measured again in further passes, each in its own order
    (`pass_order`), and a configuration's rate is its median: a drift over
    the search then falls on every configuration alike.

    Args:
      scenario: the pipeline.
      settle: seconds run before each measurement (default 0.5).
      measure: seconds each measurement lasts (default 1.5).
      repeats: measurements per configuration (default 1).
      cpu_counts: the CPU counts searched (default: the scenario's resize
        schedule's, or the usable CPUs).
    """
    cpu_counts = sorted(set(cpu_counts or ()) or
                        {n for _, n in scenario.resize} or
                        {host.usable_cpus()})
    cpu_ids = resize_lib.machine_cpu_ids()
    if cpu_counts[-1] > len(cpu_ids):
      raise ValueError(f"cannot search {cpu_counts[-1]} CPUs: this process "
                       f"may use {len(cpu_ids)}.")
    table, tried = {}, 0
    it = iter(self._tuned(scenario, "manual"))
    next(it)
    session = intune_tf.session_of(it)
    knobs = session.knobs()
    par = [k for k in knobs if k.kind == "parallelism"]
    buf = [k for k in knobs if k.kind == "buffer_size"]

    def measure_config(config):
      session.set(config)
      self._trace_context = {"scenario": scenario.name,
                             "policy": "oracle-search", "config": config}
      rate = meter_lib.pull(it, measure, settle,  # noqa: F821  `del it` below
                            lambda _: scenario.rows_per_element).rows_per_s
      self._write_trace({"kind": "measurement", "scenario": scenario.name,
                         "config": config, "cpus": host.usable_cpus(),
                         "rows_per_s": rate,
                         "rows_per_element": scenario.rows_per_element})
      return rate

    def measure_all(configs, rates):
      for config in configs:
        rates[json.dumps(config, sort_keys=True)].append(
            measure_config(config))

    def best(rates):
      return json.loads(max(rates, key=lambda k: statistics.median(rates[k])))

    tuner = intune_tf.global_tuner()
    tuner.add_listener(self._on_step)
    try:
      for cpus in cpu_counts:
        host.set_process_cpus(cpu_ids[:cpus])
        buffers = {k.name: 2.0 for k in buf}
        grid = [{**dict(zip([k.name for k in par], map(float, values))),
                 **buffers}
                for values in itertools.product(
                    *[range(int(k.min), int(min(k.max, max(cpus, 2))) + 1)
                      for k in par])]
        rates: dict[str, list[float]] = collections.defaultdict(list)
        measure_all(grid, rates)
        start = best(rates)
        configs = grid + [{**start, k.name: size} for k in buf
                          for size in (1.0, 4.0, 8.0)]
        measure_all(configs[len(grid):], rates)
        for i in range(1, repeats):
          measure_all([configs[j] for j in pass_order(len(configs), i)],
                      rates)
        tried += len(rates)
        table[cpus] = best(rates)
    finally:
      tuner.remove_listener(self._on_step)
      host.set_process_cpus(cpu_ids)
      del it
      gc.collect()
    self.oracle[scenario.name] = {"table": table, "configurations_tried": tried}
    return table

  def run(self, scenario: scenarios_lib.Scenario, policy: str,
          repeat: int) -> Run:
    """One measured run (warm-up + seconds) of a policy on a scenario."""
    result = Run(policy, scenario.name, repeat)
    ds = self._dataset(scenario, policy)
    schedule = cotenant = None
    total = self.warmup + self.seconds
    if scenario.resize:
      schedule = resize_lib.Schedule([(f * total, n)
                                      for f, n in scenario.resize])
    if scenario.cotenant:
      cotenant = resize_lib.CoTenant([(a * total, b * total, n)
                                      for a, b, n in scenario.cotenant])
    probe = _Probe(autotune=policy in AUTOTUNE_POLICIES)
    self._trace_context = {"scenario": scenario.name, "policy": policy,
                           "repeat": repeat}
    tuner = intune_tf.global_tuner()
    tuner.add_listener(self._on_step)
    try:
      probe.iterator = iter(ds)
      next(probe.iterator)
      if schedule:
        schedule.start()
      if cotenant:
        cotenant.start()
      self._measure(scenario, ds, probe, result,
                    restart=policy == "autotune-restart")
    finally:
      tuner.remove_listener(self._on_step)
      if schedule:
        schedule.stop()
        result.resize_events = schedule.applied
      if cotenant:
        cotenant.stop()
        result.cotenant_events = cotenant.applied
      probe.iterator = None
      gc.collect()
    self.runs.append(result)
    return result

  def _dataset(self, scenario: scenarios_lib.Scenario,
               policy: str) -> tf.data.Dataset:
    if policy in AUTOTUNE_POLICIES:
      return autotune_dataset(scenario, policy)
    if policy == "oracle" and scenario.name not in self.oracle:
      raise ValueError(f"No oracle table for scenario {scenario.name!r}: "
                       "run search_oracle on it before running the "
                       "\"oracle\" policy.")
    return self._tuned(scenario, policy)

  def _measure(self, scenario: scenarios_lib.Scenario, ds: tf.data.Dataset,
               probe: "_Probe", result: Run, restart: bool) -> None:
    """Pulls `probe.iterator` for the warm-up and the measured seconds,
    filling `result`; `restart`: a new iterator (restored from a checkpoint
    of the old) whenever the usable CPUs change."""
    meter = meter_lib.Meter(self.seconds, self.warmup, window_s=WINDOW_S)
    cpus_seen = result.usable_cpus = host.usable_cpus()
    with meter_lib.PeakSampler(probe.buffered,
                               sample_period_s(scenario)) as sampler:
      while meter.running():
        next(probe.iterator)
        window = meter.count(scenario.rows_per_element)
        if scenario.pause_every and meter.counts % scenario.pause_every == 0:
          time.sleep(scenario.pause_s)
        if window is not None:
          at = round(window[0], 3)
          result.windows.append((at, window[1]))
          result.knobs.append((at, probe.knob_values()))
          cpus = host.usable_cpus()
          result.usable_cpus = max(result.usable_cpus, cpus)
          if restart and cpus != cpus_seen:
            cpus_seen = cpus
            probe.iterator = _restart(ds, probe.iterator)
      result.rows_per_s = meter.rows_per_s
      result.whole_run_rows_per_s = meter.whole_run_rows_per_s
      result.cpu_seconds_per_row = meter.cpu_seconds_per_row
    result.peak_buffered_bytes = sampler.peak

  def run_all(self, scenario_names: Sequence[str], policy_names: Sequence[str],
              repeats: int) -> None:
    """Ceiling, oracle search, then the interleaved repeats: the first in
    the order given, each later one in the order `pass_order` gives it, so
    that no policy always runs in the same place (after the same policy)."""
    check_policies(policy_names)
    chosen = [scenarios_lib.get(s) for s in scenario_names]
    total = len(chosen) * (len(policy_names) * repeats + 1 +
                           ("oracle" in policy_names))
    with tqdm(total=total, desc="intune bench", unit="run") as bar:
      for scenario in chosen:
        bar.set_postfix_str(f"{scenario.name}: stage costs")
        self.measure_work_estimate(scenario)
        bar.update()
        if "oracle" in policy_names:
          bar.set_postfix_str(f"{scenario.name}: oracle search")
          self.search_oracle(scenario, measure=self.oracle_seconds,
                             repeats=self.oracle_repeats,
                             cpu_counts=self.oracle_cpus)
          bar.update()
        for repeat in range(repeats):
          for j in pass_order(len(policy_names), repeat):
            policy = policy_names[j]
            bar.set_postfix_str(f"{scenario.name}: {policy} #{repeat + 1}")
            self.run(scenario, policy, repeat)
            bar.update()

  # --- reports -------------------------------------------------------------
  def summary(self) -> dict:
    out = {"machine": {"usable_cpus": host.usable_cpus(),
                       "total_memory": host.total_memory(),
                       "tensorflow": tf.__version__},
           "seconds": self.seconds, "warmup": self.warmup, "scenarios": {}}
    by_scenario: dict[str, dict[str, list[Run]]] = {}
    for run in self.runs:
      by_scenario.setdefault(run.scenario, {}).setdefault(
          run.policy, []).append(run)
    for name, per_policy in by_scenario.items():
      ceiling = cpu_ceiling([(r.usable_cpus, r.cpu_seconds_per_row)
                             for runs in per_policy.values() for r in runs])
      base = per_policy.get("autotune")
      base_median = (statistics.median(r.rows_per_s for r in base)
                     if base else None)
      live = {p: statistics.median(r.rows_per_s for r in runs)
              for p, runs in per_policy.items() if p in LIVE_BASELINES}
      best = max(live, key=live.get) if live else None
      entry = {"ceiling_rows_per_s": ceiling,
               "work_estimate_rows_per_s": self.work_estimates.get(name),
               "policies": {},
               "best_baseline": best,
               "stage_seconds_per_row": self.stage_costs.get(name, {})}
      if name in self.oracle:
        entry["oracle_configurations_tried"] = self.oracle[name][
            "configurations_tried"]
        entry["oracle_table"] = {str(k): v for k, v in
                                 self.oracle[name]["table"].items()}
      scenario = scenarios_lib.all_scenarios().get(name)
      if scenario and scenario.ram_budget:
        entry["ram_budget"] = scenario.ram_budget
      targets = (phase_targets(per_policy["oracle"])
                 if scenario and (scenario.resize or scenario.cotenant)
                 and "oracle" in per_policy else None)
      if targets:
        entry["recovery_targets"] = {str(k): v for k, v in targets.items()}
        entry["recovery_phases"] = ("CPUs" if scenario.resize
                                    else "co-tenant processes")
      oracle = per_policy.get("oracle")
      best_static = (statistics.median(r.whole_run_rows_per_s for r in oracle)
                     if oracle else None)
      for policy, runs in per_policy.items():
        rates = [r.rows_per_s for r in runs]
        med = statistics.median(rates)
        regrets = [regret(r.whole_run_rows_per_s, best_static) for r in runs]
        entry["policies"][policy] = {
            "rows_per_s": med, "min": min(rates), "max": max(rates),
            "repeats": len(rates),
            "vs_autotune": med / base_median if base_median else None,
            "vs_best_baseline": med / live[best] if best else None,
            "of_ceiling": med / ceiling if ceiling else None,
            "peak_buffered_bytes": max(r.peak_buffered_bytes for r in runs),
            "whole_run_rows_per_s": statistics.median(
                r.whole_run_rows_per_s for r in runs),
            "regret": (statistics.median(regrets) if best_static else None),
            "changes": statistics.median(churn(r.knobs) for r in runs),
            "cpu_seconds_per_row": statistics.median(
                r.cpu_seconds_per_row for r in runs),
            "runs": [dataclasses.asdict(r) for r in runs]}
        if targets:
          entry["policies"][policy]["recovery_s"] = [
              recovery_seconds(r.windows, phase_events(r), targets)
              for r in runs]
      out["scenarios"][name] = entry
    return out

  def markdown(self, summary: dict | None = None) -> str:
    summary = summary or self.summary()
    lines = []
    for name, entry in summary["scenarios"].items():
      ceiling = entry["ceiling_rows_per_s"]
      lines.append(f"### {name}: ceiling {ceiling:,.0f} rows/s"
                   if ceiling else f"### {name}")
      if ceiling:
        lines.append("ceiling: the most usable CPUs / the least process CPU "
                     "time per row of any run here (no run can exceed it)")
      if entry.get("work_estimate_rows_per_s"):
        lines.append("work estimate (usable CPUs / single-threaded stage "
                     f"costs): {entry['work_estimate_rows_per_s']:,.0f} "
                     "rows/s")
      if entry.get("stage_seconds_per_row"):
        lines.append("stage CPU cost, single-threaded (us/row): " + ", ".join(
            f"{k} {v * 1e6:.2f}"
            for k, v in entry["stage_seconds_per_row"].items()))
      if "oracle_configurations_tried" in entry:
        lines.append(f"oracle: best of {entry['oracle_configurations_tried']}"
                     " static configurations")
      if "ram_budget" in entry:
        lines.append(f"RAM budget: {entry['ram_budget'] / 2**20:.0f} MB")
      if entry.get("best_baseline"):
        lines.append(f"best baseline (live, no learning): "
                     f"{entry['best_baseline']}")
      lines.append("")
      lines.append("| policy | rows/s (median) | min | max | vs autotune | vs "
                   "best baseline | of ceiling | whole run rows/s | regret "
                   "vs oracle | changes | CPU us/row | peak buffered MB |")
      lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
      ratio = lambda x: f"{x:.2f}x" if x else "-"
      for policy, p in entry["policies"].items():
        of = f"{p['of_ceiling']:.2f}" if p["of_ceiling"] else "-"
        lost = (f"{p['regret']:+.1%}" if p.get("regret") is not None
                else "-")
        lines.append(f"| {policy} | {p['rows_per_s']:,.0f} | {p['min']:,.0f} "
                     f"| {p['max']:,.0f} | {ratio(p['vs_autotune'])} | "
                     f"{ratio(p.get('vs_best_baseline'))} | {of} | "
                     f"{p['whole_run_rows_per_s']:,.0f} | {lost} | "
                     f"{p['changes']:g} | "
                     f"{p['cpu_seconds_per_row'] * 1e6:.2f} | "
                     f"{p['peak_buffered_bytes'] / 2**20:,.1f} |")
      lines.append("")
      if "recovery_targets" in entry:
        unit = entry["recovery_phases"]
        lines.append(f"seconds to 95% of the oracle's rows/s in the phase "
                     f"after each change of {unit} (per repeat; '-' = not "
                     "within the phase); targets: " + ", ".join(
                         f"{c} {unit} {v:,.0f}"
                         for c, v in entry["recovery_targets"].items()))
        lines.append("")
        for policy, p in entry["policies"].items():
          per_run = ["/".join("-" if x is None else f"{x:.1f}" for x in r)
                     for r in p.get("recovery_s", [])]
          lines.append(f"- {policy}: " + ", ".join(per_run))
        lines.append("")
    return "\n".join(lines)

  def plot(self, directory: str) -> list[str]:
    """Throughput over time per policy (resize events marked) and knob values
    over time, one PNG each per scenario (first repeat)."""
    # Deferred: optional, from the [bench] extra.
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    # Deferred: as above (after use("Agg")).
    from matplotlib import pyplot as plt  # noqa: PLC0415
    os.makedirs(directory, exist_ok=True)
    paths = []
    scenario_names = sorted({r.scenario for r in self.runs})
    for name in scenario_names:
      runs = [r for r in self.runs if r.scenario == name and r.repeat == 0]
      fig, ax = plt.subplots(figsize=(10, 5))
      for r in runs:
        if r.windows:
          t, v = zip(*r.windows)
          ax.plot(t, v, label=r.policy)
      events = next((r.resize_events for r in runs if r.resize_events), [])
      for t, n in events:
        ax.axvline(t, color="grey", linestyle="--")
        ax.text(t, ax.get_ylim()[1] * 0.95, f" {n} CPU", color="grey")
      ax.axvline(self.warmup, color="black", linestyle=":", linewidth=0.8)
      ax.set(xlabel="seconds", ylabel="rows/s", title=f"{name}: throughput")
      ax.legend()
      path = os.path.join(directory, f"{name}-throughput.png")
      fig.savefig(path, dpi=90, bbox_inches="tight")
      plt.close(fig)
      paths.append(path)
      fig, axes = plt.subplots(len(runs), 1, figsize=(10, 2.2 * len(runs)),
                               sharex=True, squeeze=False)
      for ax, r in zip(axes[:, 0], runs):
        names = sorted({k for _, values in r.knobs for k in values})
        for knob in names:
          pts = [(t, values[knob]) for t, values in r.knobs if knob in values]
          if pts:
            t, v = zip(*pts)
            ax.step(t, v, where="post", label=knob.replace("/", "\n"))
        ax.set_ylabel(r.policy)
        for t, _ in events:
          ax.axvline(t, color="grey", linestyle="--")
      axes[-1, 0].set_xlabel("seconds")
      handles, labels = axes[0, 0].get_legend_handles_labels()
      if handles:
        fig.legend(handles, labels, loc="upper right", fontsize=7)
      fig.suptitle(f"{name}: knob values")
      path = os.path.join(directory, f"{name}-knobs.png")
      fig.savefig(path, dpi=90, bbox_inches="tight")
      plt.close(fig)
      paths.append(path)
    return paths


def _restart(ds: tf.data.Dataset, iterator):
  """AUTOTUNE-Adaptive: checkpoint the iterator, build a new one, restore.

  Stateful ops (random noise) are saved by ignoring their state. If the
  iterator still cannot be saved, the new one starts over (with a warning):
  the throughput measured is the same.
  """
  fresh = iter(ds)
  try:
    with tempfile.TemporaryDirectory() as tmp:
      path = tf.train.Checkpoint(iterator=iterator).write(
          os.path.join(tmp, "it"))
      tf.train.Checkpoint(iterator=fresh).read(path).expect_partial()
  except (tf.errors.OpError, ValueError) as e:
    logging.log_first_n(logging.WARNING,
                        "autotune-restart: the iterator could not be "
                        "checkpointed (%s); it restarts from scratch.", 1,
                        str(e).splitlines()[0][:200])
  return fresh


def _cpu_counts(text: str) -> tuple[int, ...]:
  """An argparse type: comma-separated CPU counts, each at least 1."""
  try:
    return tuple(sorted({arguments.positive_int(t) for t in text.split(",")}))
  except argparse.ArgumentTypeError as e:
    raise argparse.ArgumentTypeError(
        f"must be comma-separated CPU counts such as 1,2, got {text!r}"
    ) from e


def main(args) -> int:
  """`intune bench`: runs, prints the table, writes JSON and plots."""
  names = [p for p in args.policies.split(",") if p]
  scenario_names = [s for s in args.scenarios.split(",") if s]
  try:
    check_policies(names)
    for s in scenario_names:
      scenarios_lib.get(s)
  except ValueError as e:
    print(f"intune bench: {e}")
    return 2
  harness = Harness(seconds=args.seconds, warmup=args.warmup,
                    cpu_budget=args.cpu_budget, ram_budget=args.ram_budget,
                    trace_path=args.trace, oracle_seconds=args.oracle_seconds,
                    oracle_repeats=args.oracle_repeats,
                    oracle_cpus=args.oracle_cpus,
                    warm_start=args.warm_start)
  interrupted = False
  try:
    harness.run_all(scenario_names, names, args.repeats)
  except KeyboardInterrupt:
    interrupted = True
    print("\nintune bench: interrupted; reporting what was measured.")
  except Exception as e:  # noqa: BLE001
    interrupted = True
    logging.exception("intune bench failed: %s", e)
    print(f"\nintune bench: failed ({type(e).__name__}: {e}); reporting what "
          "was measured.")
  finally:
    harness.close()
  summary = harness.summary()
  summary["interrupted"] = interrupted
  summary["command"] = "intune bench " + " ".join(
      f"--{k.replace('_', '-')}={v}" for k, v in sorted(vars(args).items())
      if k not in ("func", "group") and v is not None)
  print(harness.markdown(summary))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(summary, f, indent=1, default=float)
    print(f"JSON: {args.json}")
  if args.plots and harness.runs:
    for path in harness.plot(args.plots):
      print(f"plot: {path}")
  return 130 if interrupted else 0


def add_parser(subparsers, helps: Mapping[str, str]) -> None:
  p = subparsers.add_parser(
      "bench", help=helps["bench"])
  p.add_argument("--policies", default=",".join(DEFAULT_POLICIES),
                 type=arguments.names_in(valid_policies, "policy"),
                 help="Comma-separated policies (default: the baselines and "
                 "intune)."
                 f" Valid: {', '.join(BASELINES)}, and registered ones.")
  p.add_argument("--scenarios", default=scenarios_lib.DEFAULT,
                 type=arguments.names_in(scenarios_lib.names, "scenario"),
                 help=f"Comma-separated scenarios (default "
                 f"{scenarios_lib.DEFAULT}).")
  p.add_argument("--repeats", type=arguments.positive_int, default=5,
                 help="Interleaved repeats per policy, at least 1 (default "
                 "5).")
  p.add_argument("--seconds", type=arguments.duration, default=20.0,
                 help="Measured seconds per run, after the warm-up, finite "
                 "and above 0 (default 20).")
  p.add_argument("--warmup", type=arguments.optional_duration, default=5.0,
                 help="Warm-up seconds per run, 0 for none (default 5).")
  p.add_argument("--cpu-budget", type=arguments.positive_int, default=None,
                 help="CPU budget of the InTune policies (default: usable).")
  p.add_argument("--ram-budget", type=arguments.positive_int, default=None,
                 help="RAM budget in bytes (default: the scenario's or half "
                 "of the available memory).")
  p.add_argument("--warm-start", action="store_true",
                 help="Let InTune repeats start from the configuration saved "
                 "by earlier repeats (default: every repeat starts cold).")
  p.add_argument("--oracle-seconds", type=arguments.duration, default=1.5,
                 help="Seconds the oracle search measures each configuration "
                 "(longer: less noise, e.g. for calibration traces).")
  p.add_argument("--oracle-repeats", type=arguments.positive_int, default=1,
                 help="Measurements of each configuration in the oracle "
                 "search, in passes over all of them, each pass in its own "
                 "order; it keeps the best median (default 1).")
  p.add_argument("--oracle-cpus", type=_cpu_counts, default=None,
                 help="Comma-separated CPU counts the oracle searches, e.g. "
                 "1,2 (default: the scenario's, or the usable CPUs).")
  p.add_argument("--json", type=arguments.output_file, default=None,
                 help="Write the results here.")
  p.add_argument("--plots", type=arguments.output_folder, default=None,
                 help="Write PNG plots in this folder.")
  p.add_argument("--trace", type=arguments.output_file, default=None,
                 help="Append the observation stream here (JSON lines).")
  p.set_defaults(func=main)
