"""One structured observation of a tuned pipeline per tuning step.

These are the InTune paper's factors, each with its source and unit:

| field | unit | source |
|---|---|---|
| `stages[i].rate` | elements/s | tf.data model: `num_elements` delta over the step |
| `stages[i].cpu_per_element_s` | CPU-seconds per element | model: `processing_time` delta / `num_elements` delta (self time, summed over the stage's threads) |
| `stages[i].parallelism`, `.buffer_size` | threads, elements | the stage's knobs (None when it has none) |
| `stages[i].buffer_fill` | 0..1 | model: `buffered_elements` / `buffer_size` |
| `stages[i].bytes_per_element` | bytes | model: `buffered_bytes / buffered_elements`, else `bytes_produced / num_elements` |
| `stages[i].bytes_produced_per_s`, `.buffered_bytes` | bytes/s, bytes | model |
| `stages[i].time_share` | 0..1 | the stage's share of all stages' processing time in the step |
| `bounded_stages` | | stages whose records the budget guard bounds though they have no knob (bounded interleaves: `session.bounded_stage_names`, from the model, read again when the stage names change) |
| `stages[i].name` | | the stage name (`intune_tf.records.parse_stage`); the live instances of a stage inside an interleave are added up into one stage |
| `output_rate` | elements/s | root op: elements returned in the step |
| `output_latency_s` | s/element | root op: time inside `GetNext` per element in the step |
| `consumer_wait_s` | s/element | root op: gap between `GetNext` calls (the consumer's own time) |
| `usable_cpus` | CPUs | affinity, re-read every step, and cgroup quota, re-read at most every `host.CGROUP_LIMITS_REFRESH_S` (1 s) (`intune_tf.host`) |
| `cpu_budget` | CPUs | `IntuneOptions.cpu_budget` capped by `usable_cpus`; when it is None and `host_share` is on, this process's share of the host (`intune_tf.arbiter`) |
| `free_memory`, `total_memory` | bytes | /proc/meminfo `MemAvailable`, `MemTotal` (psutil where there is none), re-read every step, capped by the cgroup memory limit (re-read at most every `host.CGROUP_LIMITS_REFRESH_S`) |
| `ram_budget`, `buffered_bytes` | bytes | root op |
| `cpu_mhz` | MHz | psutil `cpu_freq()`, else /proc/cpuinfo, re-read every 10 s; 0 if unknown |
| `dram_gbps` | GB/s | an 8 MB numpy copy, measured once per process |
| `model_step_s` | s | `report_step_time()` from a training loop; None if none reports |
"""

from __future__ import annotations

import functools
import math
import re
import threading
import time
from typing import Mapping

import numpy as np
import psutil

from intune_tf import arbiter
from intune_tf import host
from intune_tf.ops import session as session_lib
from intune_tf.records import Knob
from intune_tf.records import Observation
from intune_tf.records import StageObservation

_step_time = {"value": None}
_step_lock = threading.Lock()


def host_cpu_budget(options, usable_cpus: int,
                    share: arbiter.Share | None) -> int:
  """A session's CPU budget now: `options.resolved_cpu_budget(usable_cpus)`,
  and, when its `cpu_budget` is None and it shares the host (`host_share`,
  with a `share` of the host arbiter), at most that share's CPUs (at least
  1).

  Examples: usable 2, share 1 CPU -> 1; usable 2, cpu_budget 2 (set by the
  user), share 1 -> 2; usable 2, no share -> 2.
  """
  budget = options.resolved_cpu_budget(usable_cpus)
  if share is not None and options.host_share and options.cpu_budget is None:
    budget = max(1, min(budget, share.cpus))
  return budget


def report_step_time(seconds: float) -> None:
  """Reports the training loop's step time (the paper's model latency)."""
  with _step_lock:
    _step_time["value"] = float(seconds)


def model_step_time() -> float | None:
  with _step_lock:
    return _step_time["value"]


@functools.cache
def dram_bandwidth_gbps(megabytes: int = 8, repeats: int = 3) -> float:
  """Copy bandwidth of memory in GB/s, measured once per process.

  Args:
    megabytes: size of the block copied; the process holds it twice for the
      copy's few milliseconds. Default 8: past a core's L2, and a small
      transient (64 MB gave every tuned process a 128 MB peak of RSS). The
      state the policies see does not read it (`mdp.features`); it is
      reported in the observation.
    repeats: copies timed; the fastest counts. Default 3.
  """
  src = np.ones(megabytes << 17, dtype=np.float64)  # megabytes MB
  dst = np.empty_like(src)
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    np.copyto(dst, src)
    best = min(best, time.perf_counter() - start)
  return 2 * src.nbytes / best / 1e9  # read + write


# The CPU clock is re-read at most this often (reading it parses
# /proc/cpuinfo, a tenth of a millisecond the tuning step need not pay).
CPU_MHZ_REFRESH_S = 10.0
_mhz_cache = {"value": 0.0, "time": -math.inf}


def cpu_mhz() -> float:
  """The CPU clock in MHz (0 when the machine does not say), read at most
  every `CPU_MHZ_REFRESH_S` seconds."""
  now = time.monotonic()
  if now - _mhz_cache["time"] >= CPU_MHZ_REFRESH_S:
    _mhz_cache.update(value=_read_cpu_mhz(), time=now)
  return _mhz_cache["value"]


def _read_cpu_mhz() -> float:
  try:
    freq = psutil.cpu_freq()
    if freq and freq.current:
      return float(freq.current)
  except (NotImplementedError, FileNotFoundError):
    pass
  try:
    with open("/proc/cpuinfo") as f:
      match = re.search(r"cpu MHz\s*:\s*([\d.]+)", f.read())
    return float(match.group(1)) if match else 0.0
  except OSError:
    return 0.0


class ObservationBuilder:
  """Turns successive snapshots of one session into per-step observations.

  Rates are differences between snapshots, row by row of the model's nodes
  (matched by node id: a node created since the last snapshot counts from
  0). The instances of one stage inside an interleave (one name, several
  nodes) are then added up into one stage of the observation.
  """

  def __init__(self, session: session_lib.TuningSession):
    self.session = session
    self._last_ids: tuple[int, ...] = ()
    self._last_array: np.ndarray | None = None
    self._last_counters: dict[str, int] | None = None
    self._last_time: float | None = None
    self._groups: tuple[tuple[str, ...], tuple, np.ndarray | None] = (
        (), (), None)
    # (row names, the bounded interleaves among them): see `_bounded`.
    self._bounded_of: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())

  def _previous(self, ids: tuple[int, ...], shape) -> np.ndarray:
    """The last snapshot's rows for node `ids` (zeros for new nodes)."""
    if self._last_array is None:
      return np.zeros(shape, np.int64)
    if ids == self._last_ids:
      return self._last_array
    rows = dict(zip(self._last_ids, range(len(self._last_ids))))
    index = np.fromiter((rows.get(n, -1) for n in ids), np.intp, len(ids))
    padded = np.concatenate([self._last_array,
                             np.zeros((1, shape[1]), np.int64)])
    return padded[index]

  def _grouping(self, names: tuple[str, ...]):
    """(stage names, each row's stage index or None when every row is its
    own stage), cached for the last tuple of row names."""
    if names != self._groups[0]:
      first = {}
      index = [first.setdefault(n, len(first)) for n in names]
      self._groups = (names, tuple(first),
                      None if len(first) == len(names)
                      else np.asarray(index, np.intp))
    return self._groups[1], self._groups[2]

  def _bounded(self, names: tuple[str, ...]) -> tuple[str, ...]:
    """The bounded interleaves among the stage `names`
    (`session.bounded_stage_names`), read from the model once per tuple of
    row names: which stages are bounded is fixed by the graph, and a new
    instance of a stage keeps its name."""
    if names != self._bounded_of[0]:
      bounded = session_lib.bounded_stage_names(self.session.model_proto())
      self._bounded_of = (names, tuple(sorted(bounded.intersection(names))))
    return self._bounded_of[1]

  def observe(self) -> Observation:
    """Reads the session and the host; rates are over the time since the
    previous call (or since the iterator started, the first time)."""
    now = time.monotonic()
    snap = self.session._snapshot()  # noqa: SLF001
    knobs, row_names, table, counters = (snap.knobs, snap.stage_names,
                                         snap.stage_stats, snap.counters)
    if self._last_time is None:
      interval = max(1e-6, time.time() - counters["created_us"] / 1e6)
    else:
      interval = max(1e-6, now - self._last_time)
    parallelism, buffer_size = {}, {}
    for k in knobs:
      (parallelism if k.kind == "parallelism" else buffer_size)[k.stage] = (
          k.value)
    col = session_lib.STAGE_COLUMN
    ncol = session_lib.NODE_ID_COLUMN  # the statistics come before it
    stats = table[:, :ncol]
    ids = tuple(table[:, ncol].tolist())
    delta = np.maximum(stats - self._previous(ids, stats.shape), 0)
    names, group = self._grouping(row_names)
    if group is not None:  # instances of one stage: add them up
      summed = np.zeros((2, len(names), ncol), np.int64)
      np.add.at(summed[0], group, delta)
      np.add.at(summed[1], group, stats)
      delta, stats_now = summed
    else:
      stats_now = stats
    elements = delta[:, col["elements"]]
    ptime = delta[:, col["processing_time_ns"]]
    produced = delta[:, col["bytes_produced"]]
    total_time = float(ptime.sum()) or 1.0
    per_element = np.zeros((2, len(names)))
    cpu_per_element = np.divide(ptime / 1e9, elements, out=per_element[0],
                                where=elements > 0)
    produced_now = stats_now[:, col["bytes_produced"]]
    elements_now = stats_now[:, col["elements"]]
    buffered_now = stats_now[:, col["buffered_bytes"]]
    held_now = stats_now[:, col["buffered_elements"]]
    # Bytes per element: of what is buffered, else of what was produced.
    bpe = np.divide(produced_now, elements_now, out=per_element[1],
                    where=elements_now > 0)
    np.divide(buffered_now, held_now, out=bpe, where=held_now > 0)
    rates = elements / interval
    produced_rates = produced / interval
    shares = ptime / total_time
    stages = tuple([
        StageObservation(name, rate, cpe, threads, size,
                         min(1.0, held / size) if size else 0.0, b,
                         produced_rate, buffered, share)
        for (name, threads, size, rate, cpe, held, b, produced_rate, buffered,
             share) in zip(names, map(parallelism.get, names),
                           map(buffer_size.get, names), rates.tolist(),
                           cpu_per_element.tolist(), held_now.tolist(),
                           bpe.tolist(), produced_rates.tolist(),
                           buffered_now.tolist(), shares.tolist())])
    last = self._last_counters or {k: 0 for k in counters}
    d_elements = counters["elements"] - last["elements"]
    d_gaps = counters["gap_count"] - last["gap_count"]
    self._last_ids, self._last_array = ids, stats
    self._last_counters = counters
    self._last_time = now
    options = self.session.options
    usable_cpus = host.usable_cpus()
    total_memory, available_memory = host.memory()
    return Observation(
        time=time.time(), interval_s=interval, knobs=knobs,
        stages=stages, output_rate=d_elements / interval,
        output_latency_s=((counters["get_next_time_us"] -
                           last["get_next_time_us"]) / 1e6 / d_elements
                          if d_elements else 0.0),
        consumer_wait_s=((counters["gap_time_us"] - last["gap_time_us"]) /
                         1e6 / d_gaps if d_gaps else 0.0),
        usable_cpus=usable_cpus,
        cpu_budget=host_cpu_budget(options, usable_cpus,
                                   arbiter.current_share()),
        free_memory=available_memory, total_memory=total_memory,
        ram_budget=counters["ram_budget"],
        buffered_bytes=counters["buffered_bytes"], cpu_mhz=cpu_mhz(),
        dram_gbps=dram_bandwidth_gbps(), model_step_s=model_step_time(),
        bounded_stages=self._bounded(names))


class LiveEnv:
  """A live tuning session as a `intune_tf.tuning.env.TuningEnv`: its knobs
  and `set` are the session's, its observations an `ObservationBuilder`'s."""

  def __init__(self, session: session_lib.TuningSession):
    self.session = session
    self._observations = ObservationBuilder(session)

  def knobs(self) -> list[Knob]:
    return self.session.knobs()

  def observe(self) -> Observation:
    return self._observations.observe()

  def set(self, values: Mapping[str, float]) -> dict[str, float]:
    return self.session.set(values)
