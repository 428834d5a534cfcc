"""The tuning MDP: actions, their mask, the state's features, the reward.

numpy only: the DQN (`intune_tf.agent.dqn`), the searches
(`intune_tf.tuning.search`) and the simulator's training loop
(`intune_tf.sim.pretrain`) all move in it.

State. The paper's factors (pipeline latency, free CPUs, free memory, model
latency, DRAM bandwidth, CPU speed), computed per knob: every knob gets a row
of `NUM_FEATURES` features, named by `FEATURE_NAMES` (its kind and value,
its stage's share of the pipeline's CPU time, how busy the stage is, the gap
to a proportional share, buffer fill and bytes) followed by the
pipeline-wide factors.

Actions. Per knob: -5, -1, +1, +5 (`MOVES`: threads for parallelism knobs,
elements for buffer knobs: our prefetch knobs count elements, not MB), plus
one shared no-op: 4n + 1 actions for n knobs (`MOVES_PER_KNOB` = 4). Flat
index `MOVES_PER_KNOB * k + j` for knob k and move `MOVES[j]`, and
`MOVES_PER_KNOB * n` for the no-op.

Reward. `reward()`: throughput relative to the work ceiling, times a memory
factor that is 1 up to `MEMORY_SAFE` of memory in use and falls linearly to 0
at 100% (the paper's shape).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from intune_tf import records

if TYPE_CHECKING:
  from intune_tf.records import Knob
  from intune_tf.records import Observation

# Knob moves of the action space, in knob units.
MOVES = (-5, -1, 1, 5)
# Flat actions per knob (the no-op is one more, shared by all knobs).
MOVES_PER_KNOB = len(MOVES)
# The agent never takes a buffer below one element: a prefetch of 0 does not
# overlap the pipeline with its consumer at all, a loss the simulator's
# jitter model does not price (measured live: Criteo L4 spent half a
# benchmark at 0). A buffer already below it may still grow.
MIN_BUFFER = 1
# A parallel stage starts with min(CPUs, MIN_THREADS) threads, and a
# whole-configuration proposal (a proportional jump, the learned allocation,
# plumber's split) never gives it fewer: a tf.data thread blocked on its
# input or output costs no CPU, and a stage with one thread has nothing in
# flight while it hands an element over (Criteo L4 on 2 CPUs: 35,840 rows/s
# with one thread per stage, 54,272 with two; the proportional split prices
# every thread, idle or not). Below that only a local move goes, one
# measured thread at a time, and only where the stages cannot all hold
# MIN_THREADS on the CPUs (`thread_floor`).
MIN_THREADS = 2
# A move takes a parallel stage below `start_threads` only when the stage's
# measured utilization (`records.stage_utilization`) at the new thread count
# is at most this: a stage whose one thread would be busy half the time or
# more holds up the stages that wait on it (Criteo L4 on 2 CPUs, parse at 1
# thread: 15% slower than at 2), a cheap one does not (features at 1: the
# same rate within the measurements' spread).
LONE_BUSY = 0.5
# Largest buffer the agent sets, elements.
MAX_BUFFER = 64
# Memory-use fraction above which the reward starts to fall.
MEMORY_SAFE = 0.9
# The CPU clock (MHz) and DRAM bandwidth (GB/s) the state gives the network:
# the machine of the simulator, which models neither, so the shipped
# networks learned nothing from them. The observation still reports the
# host's values; the state holds these so that a live host (44 GB/s here)
# does not feed the network inputs it never saw in training.
SIM_CPU_MHZ = 2500.0
SIM_DRAM_GBPS = 10.0
# The state's columns, in order: per knob (0-8), then pipeline-wide (9-17).
FEATURE_NAMES = (
    "is_parallelism",      # 1 for a parallelism knob
    "is_buffer",           # 1 for a buffer knob
    "value",               # threads / CPU budget, or elements / MAX_BUFFER
    "log_value",           # log1p(value) / log1p(128)
    "cost_share",          # its stage's share of the pipeline's CPU time
    "gap_or_fill",         # threads: gap to a proportional share; buffer: fill
    "busy",                # its stage's utilization, capped at 2
    "is_bottleneck",       # 1 for the busiest stage
    "buffer_bytes",        # its buffer's bytes / RAM budget, capped at 2
    "free_threads",        # (cpu_limit - threads) / CPU budget
    "threads",             # threads / CPU budget
    "buffered",            # buffered bytes / RAM budget, capped at 2
    "host_memory_in_use",  # share of the host's memory in use
    "model_latency",       # model step time x output rate, capped at 2
    "log_cpus",            # log2(CPU budget) / 7
    "of_ceiling",          # output rate / work ceiling, capped at 2
    "cpu_mhz",             # SIM_CPU_MHZ / 5000
    "dram_gbps",           # SIM_DRAM_GBPS / 50
)
NUM_FEATURES = len(FEATURE_NAMES)
_COLUMN = {name: i for i, name in enumerate(FEATURE_NAMES)}


# --- reward ------------------------------------------------------------------
def memory_factor(memory_fraction: float) -> float:
  """1 up to `MEMORY_SAFE` (0.9) of memory in use, then linearly to 0 at 1.0.

  memory_factor(0.95) == 0.5: (1 - 0.95) / (1 - 0.9).
  """
  if memory_fraction <= MEMORY_SAFE:
    return 1.0
  return max(0.0, (1.0 - memory_fraction) / (1.0 - MEMORY_SAFE))


def reward(rate: float, reference_rate: float, memory_fraction: float) -> float:
  """The agent's reward for a step.

  Args:
    rate: output elements/s measured over the step.
    reference_rate: the work ceiling estimate (usable CPUs / CPU-seconds per
      output element), so rewards compare across pipelines; <= 0 gives 0.
    memory_fraction: memory in use / memory available to the job.

  Returns:
    min(rate / reference_rate, 2) * memory_factor(memory_fraction).
  """
  if reference_rate <= 0:
    return 0.0
  return min(rate / reference_rate, 2.0) * memory_factor(memory_fraction)


# --- actions -----------------------------------------------------------------
def cpu_limit(parallel_knobs: int, cpu_budget: int) -> int:
  """Most threads all parallel stages together may hold: 2 (C + n - 1),
  twice the C CPUs plus each stage's first thread, since tf.data's threads
  also wait on their inputs and outputs (Criteo L4, 4 parallel stages, runs
  fastest with 2 threads on every stage: 8 threads on 2 cores)."""
  return 2 * (int(cpu_budget) + max(int(parallel_knobs), 1) - 1)


def start_threads(cpu_budget: int) -> int:
  """Threads a parallel stage starts with, the fewest a whole-configuration
  proposal gives it, and what it is raised to when the CPU budget grows:
  min(C, MIN_THREADS), at least 1. start_threads(1) = 1, start_threads(8) =
  2."""
  return max(1, min(int(cpu_budget), MIN_THREADS))


def thread_floor(cpu_budget: int, parallel_knobs: int) -> int:
  """Fewest threads the agent's moves leave a parallel stage.

  `start_threads` when all `parallel_knobs` stages fit on the C CPUs at it
  (n x start <= C); else 1: there the start already holds more threads
  than CPUs, every thread a cheap stage keeps is one the costly stages
  contend with, and only a measured move shows which way it goes
  (`action_mask` also asks `may_go_below_start`).
  thread_floor(8, 4) = 2 (4 x 2 <= 8); thread_floor(2, 3) = 1 (3 x 2 > 2);
  thread_floor(1, 1) = 1.
  """
  start = start_threads(cpu_budget)
  return start if max(int(parallel_knobs), 1) * start <= cpu_budget else 1


def may_go_below_start(obs: "Observation", knob: "Knob",
                       threads: float) -> bool:
  """Whether a move may give the parallelism `knob` of `obs` `threads`
  threads, below `start_threads`: its stage's measured utilization at that
  count (`records.stage_utilization`) is at most `LONE_BUSY`; False before
  the stage was measured.

  2 ms per element at 100 elements/s on 1 thread: 0.2, it may; at 300
  elements/s: 0.6, it may not.
  """
  st = obs.stage(knob.stage)
  if st is None or st.rate <= 0 or st.cpu_per_element_s <= 0:
    return False
  return records.stage_utilization(st.cpu_per_element_s, st.rate,
                                   threads) <= LONE_BUSY


def knob_bounds(knob: "Knob", cpu_budget: int,
                parallel_knobs: int) -> tuple[float, float]:
  """`(lowest, highest)` value the agent's moves may give `knob`, one of
  `parallel_knobs` parallelism knobs.

  A parallelism: from `thread_floor` to `cpu_budget` threads; a buffer:
  from `MIN_BUFFER` to `MAX_BUFFER` elements; both within the knob's own
  range. Totals (`cpu_limit`, the RAM budget) are limits on top.
  """
  if knob.kind == "parallelism":
    return (max(knob.min, thread_floor(cpu_budget, parallel_knobs)),
            min(knob.max, cpu_budget))
  return max(knob.min, MIN_BUFFER), min(knob.max, MAX_BUFFER)


def proposal_bounds(knob: "Knob", cpu_budget: int) -> tuple[float, float]:
  """`(lowest, highest)` value a whole-configuration proposal may give
  `knob`: `knob_bounds` with `start_threads` as a parallelism's floor."""
  if knob.kind == "parallelism":
    return (max(knob.min, start_threads(cpu_budget)),
            min(knob.max, cpu_budget))
  return max(knob.min, MIN_BUFFER), min(knob.max, MAX_BUFFER)


def committed_bytes(obs: "Observation",
                    values: dict[str, float] | None = None) -> float:
  """Bytes the buffers may hold: buffer size times element size, over all
  buffer knobs (an unknown element size counts as 0 bytes), with `values`
  (knob name -> value) in place of the values in force."""
  values = values or {}
  bpe = obs.bytes_per_element
  return sum(max(values.get(k.name, k.value), 0) * bpe.get(k.stage, 0.0)
             for k in obs.knobs if k.kind == "buffer_size")


def action_mask(obs: "Observation") -> np.ndarray:
  """Valid flat actions (bool, length 4n + 1) for the knobs of `obs`.

  A move is valid when the new value stays within `knob_bounds` (a buffer
  at least `MIN_BUFFER`, a parallelism at least `thread_floor` and at most
  `cpu_budget`), a move that takes a parallelism below `start_threads` finds
  its stage cheap enough (`may_go_below_start`), a move that adds threads
  keeps all parallel stages together at most `cpu_limit`, and a move that
  grows a buffer keeps `committed_bytes` within the RAM budget. The no-op
  is always valid.
  """
  knobs = obs.knobs
  parallel = [k for k in knobs if k.kind == "parallelism"]
  threads = sum(k.value for k in parallel)
  limit = cpu_limit(len(parallel), obs.cpu_budget)
  start = start_threads(obs.cpu_budget)
  bpe = obs.bytes_per_element
  committed = committed_bytes(obs)
  mask = np.zeros(MOVES_PER_KNOB * len(knobs) + 1, dtype=bool)
  for i, k in enumerate(knobs):
    lo, hi = knob_bounds(k, obs.cpu_budget, len(parallel))
    for j, move in enumerate(MOVES):
      new = k.value + move
      if new < lo:
        continue
      if k.kind == "parallelism":
        ok = new <= hi and (move < 0 or threads + move <= limit) and (
            move > 0 or new >= start or may_go_below_start(obs, k, new))
      else:
        ok = (new <= hi and
              (move < 0 or committed + move * bpe.get(k.stage, 0.0)
               <= obs.ram_budget))
      mask[MOVES_PER_KNOB * i + j] = ok
  mask[-1] = True
  return mask


def action_of(knob_index: int, move: int) -> int:
  """The flat action that moves knob `knob_index` by `move` (in `MOVES`)."""
  return MOVES_PER_KNOB * knob_index + MOVES.index(move)


def apply_action(obs: "Observation", action: int) -> dict[str, float]:
  """The knob values an action sets ({} for the no-op)."""
  knobs = obs.knobs
  if action >= MOVES_PER_KNOB * len(knobs):
    return {}
  k = knobs[action // MOVES_PER_KNOB]
  return {k.name: float(k.value + MOVES[action % MOVES_PER_KNOB])}


def describe_action(obs: "Observation", action: int) -> str:
  if action >= MOVES_PER_KNOB * len(obs.knobs):
    return "no-op"
  move = MOVES[action % MOVES_PER_KNOB]
  return f"{obs.knobs[action // MOVES_PER_KNOB].name} {move:+d}"


# --- state -------------------------------------------------------------------
def stage_costs(obs: "Observation") -> dict[str, float]:
  """CPU-seconds each stage spends per output element (`records.stage_cost`;
  {} before the pipeline returned anything)."""
  if obs.output_rate <= 0:
    return {}
  return {st.name: records.stage_cost(st.cpu_per_element_s, st.rate,
                                      obs.output_rate)
          for st in obs.stages}


def reference_rate(obs: "Observation") -> float:
  """The work-ceiling estimate: usable CPUs / CPU-seconds per output element
  summed over stages (0 before anything was measured)."""
  total = sum(stage_costs(obs).values())
  return obs.usable_cpus / total if total > 0 else 0.0


def memory_fraction(obs: "Observation") -> float:
  """Memory in use: the larger of the host's share in use and the buffered
  bytes' share of the RAM budget (so the budget counts as the job's limit)."""
  host = 1.0 - obs.free_memory / obs.total_memory if obs.total_memory else 0.0
  budget = obs.buffered_bytes / obs.ram_budget if obs.ram_budget else 0.0
  return max(host, budget)


def features(obs: "Observation") -> np.ndarray:
  """The state: one row of `NUM_FEATURES` per knob, shape [n, NUM_FEATURES]."""
  knobs = obs.knobs
  out = np.zeros((len(knobs), NUM_FEATURES), dtype=np.float32)
  if not knobs:
    return out
  costs = stage_costs(obs)
  total_cost = sum(costs.values())
  cpus = max(1, obs.cpu_budget)
  parallel = [k for k in knobs if k.kind == "parallelism"]
  threads = sum(k.value for k in parallel)
  limit = cpu_limit(len(parallel), cpus)
  par_by_stage = {k.stage: max(k.value, 1.0) for k in parallel}
  knob_cost = sum(costs.get(k.stage, 0.0) for k in parallel)
  # Each knob's stage's utilization (`records.stage_utilization`) at its
  # parallelism knob's value, capped at 2; 0 until the pipeline returns.
  busy = {}
  for k in knobs:
    st = obs.stage(k.stage)
    busy[k.stage] = (min(2.0, records.stage_utilization(
        st.cpu_per_element_s, st.rate, par_by_stage.get(k.stage, 1.0)))
                     if costs and st is not None else 0.0)
  bottleneck = max(busy, key=busy.get) if busy else None
  ref = obs.usable_cpus / total_cost if total_cost > 0 else 0.0
  bpe = obs.bytes_per_element
  ram = max(1.0, float(obs.ram_budget))
  globals_ = [
      (limit - threads) / cpus,
      threads / cpus,
      min(2.0, obs.buffered_bytes / ram),
      1.0 - obs.free_memory / obs.total_memory if obs.total_memory else 0.0,
      min(2.0, (obs.model_step_s or 0.0) * obs.output_rate),
      math.log2(cpus) / 7.0,
      min(2.0, obs.output_rate / ref) if ref > 0 else 0.0,
      SIM_CPU_MHZ / 5000.0,
      SIM_DRAM_GBPS / 50.0,
  ]
  out[:, _COLUMN["free_threads"]:] = globals_
  for i, k in enumerate(knobs):
    cost = costs.get(k.stage, 0.0)
    share = cost / total_cost if total_cost > 0 else 0.0
    st = obs.stage(k.stage)
    row = out[i]
    if k.kind == "parallelism":
      ideal = cpus * (cost / knob_cost if knob_cost > 0 else 1 / len(parallel))
      row[_COLUMN["is_parallelism"]] = 1.0
      row[_COLUMN["value"]] = k.value / cpus
      row[_COLUMN["gap_or_fill"]] = (ideal - k.value) / max(1.0, ideal,
                                                          k.value)
    else:
      row[_COLUMN["is_buffer"]] = 1.0
      row[_COLUMN["value"]] = k.value / MAX_BUFFER
      row[_COLUMN["gap_or_fill"]] = st.buffer_fill if st else 0.0
    row[_COLUMN["log_value"]] = math.log1p(max(k.value, 0.0)) / math.log1p(128)
    row[_COLUMN["cost_share"]] = share
    row[_COLUMN["busy"]] = busy.get(k.stage, 0.0)
    row[_COLUMN["is_bottleneck"]] = 1.0 if k.stage == bottleneck else 0.0
    row[_COLUMN["buffer_bytes"]] = min(
        2.0, max(k.value, 0) * bpe.get(k.stage, 0.0) / ram)
  return out


