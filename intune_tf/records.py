"""The plain data types of InTune and the names they carry: knob and stage
names (`parse_stage`, `parse_knob`), `Knob`, `StageStats`, `Observation`,
`Decision`, `CacheState`.

A leaf: no TensorFlow and no other intune_tf module, so the simulator and
pretraining use them without loading TensorFlow.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
from typing import Collection, Sequence

# The kinds of knob: threads of a parallel stage, elements of a buffer.
KINDS = ("parallelism", "buffer_size")


# --- Knob and stage names ---------------------------------------------------
#
# The kernel names a stage by its place in the pipeline (the format is defined
# in intune_tf/cc/kernels/stage_names.h), so that a name survives the
# re-creation of the stage (every epoch of a `repeat`, a new or restored
# iterator, each element of an interleave): the model's node names from the
# pipeline's output down to the stage, joined by ".". A node with several
# inputs is followed by the index of the one the path takes, "[i]"; an
# interleave-like node (interleave, flat_map, group_by_window) by "[*]" when
# the path goes into the datasets it makes per input element (all of them are
# one stage and share its knobs), by nothing for its own input. A knob is
# "<stage>/<parameter>":
#
#   "Prefetch.ParallelMapV2/parallelism"
#   "Zip[1].ParallelMapV2/parallelism"
#   "ParallelInterleaveV4[*].ParallelMapV2/parallelism"
#
# Node ids ("ParallelMapV2(id:3)") are for display only: `Knob.display`,
# `StageStats.display`. Names in the format before this one,
# "<Stage>(id:<n>)/<parameter>" (configurations and traces saved by earlier
# versions), still parse: their depth is the node id (ids grew from the output
# to the input). Everything that reads a knob or stage name goes through
# `parse_stage` / `parse_knob` below.

_STEP_RE = re.compile(r"([A-Za-z0-9_]+)(?:\[(\d+|\*)\])?\Z")
_LEGACY_RE = re.compile(r"([A-Za-z0-9_]+)\(id:(\d+)\)\Z")
# The input label of the per-element datasets of an interleave-like node.
EACH = "*"


@dataclasses.dataclass(frozen=True)
class StageName:
  """A parsed stage name.

  Attributes:
    text: the name.
    steps: `(node name, input)` from the pipeline's output down to the stage;
      `input` is "" (the node's only or own input, and for the stage
      itself), a decimal index, or "*" (the per-element datasets of an
      interleave-like node).
    legacy_id: the node id of a name in the earlier "<Stage>(id:<n>)"
      format, else None.
  """
  text: str
  steps: tuple[tuple[str, str], ...]
  legacy_id: int | None = None

  @property
  def op(self) -> str:
    """The stage's own node name (its dataset type), e.g. "ParallelMapV2"."""
    return self.steps[-1][0]

  @property
  def depth(self) -> int:
    """Larger is nearer the input: the number of steps (the node id for an
    earlier-format name)."""
    return self.legacy_id if self.legacy_id is not None else len(self.steps)

  @property
  def per_element(self) -> bool:
    """Whether the stage is inside the datasets an interleave-like stage
    makes per input element (each live instance shares the knobs)."""
    return any(inp == EACH for _, inp in self.steps)

  def encloses(self, other: "StageName") -> bool:
    """Whether `other` feeds this stage, directly or through other stages.

    For earlier-format names: whether `other` has the larger node id.
    """
    if self.legacy_id is not None or other.legacy_id is not None:
      return (self.legacy_id or 0) < (other.legacy_id or 0)
    n = len(self.steps)
    return (len(other.steps) > n and other.steps[:n - 1] == self.steps[:-1]
            and other.steps[n - 1][0] == self.op)


@functools.lru_cache(maxsize=4096)
def parse_stage(text: str) -> StageName:
  """Parses a stage name (see above). Raises ValueError if it is not one."""
  legacy = _LEGACY_RE.match(text)
  if legacy:
    return StageName(text, ((legacy[1], ""),), int(legacy[2]))
  steps = []
  parts = text.split(".")
  for i, part in enumerate(parts):
    match = _STEP_RE.match(part)
    if not match or (i == len(parts) - 1 and match[2] is not None):
      raise ValueError(f"Not a stage name: {text!r} (expected node names "
                       "joined by '.', e.g. 'Prefetch.ParallelMapV2').")
    steps.append((match[1], match[2] or ""))
  return StageName(text, tuple(steps))


def split_knob(name: str) -> tuple[str, str]:
  """`(stage name, parameter)` of a knob name "<stage>/<parameter>", as
  text, without checking them (`parse_knob` does)."""
  stage, _, parameter = name.rpartition("/")
  return stage, parameter


def parse_knob(name: str) -> tuple[StageName, str]:
  """`(stage, parameter)` of a knob name "<stage>/<parameter>". Raises
  ValueError if it is not one."""
  stage, parameter = split_knob(name)
  if "/" not in name or not re.fullmatch(r"[A-Za-z_]+", parameter):
    raise ValueError(f"Not a knob name: {name!r} (expected "
                     "'<stage>/<parameter>', e.g. "
                     "'Prefetch.ParallelMapV2/parallelism').")
  return parse_stage(stage), parameter


def is_knob_name(name: str) -> bool:
  try:
    parse_knob(name)
  except ValueError:
    return False
  return True


def input_first(name: str) -> tuple[int, str]:
  """Sort key of knob or stage names: from the input end to the output (the
  deepest first), then by name."""
  stage = split_knob(name)[0] if "/" in name else name
  try:
    return (-parse_stage(stage).depth, name)
  except ValueError:
    return (0, name)


def log_key(name: str) -> str:
  """A knob or stage name with only characters that summary and log names
  accept everywhere ([A-Za-z0-9_./-]): "[i]" becomes "-i", "[*]" "-each".

  Example: 'ParallelInterleaveV4[*].ParallelMapV2/parallelism' ->
  'ParallelInterleaveV4-each.ParallelMapV2/parallelism'.
  """
  name = name.replace("[*]", "-each")
  name = re.sub(r"\[(\d+)\]", r"-\1", name)
  return re.sub(r"\(id:(\d+)\)", r"-\1", name)


@dataclasses.dataclass(frozen=True)
class Knob:
  """A tunable parameter of one pipeline stage.

  Attributes:
    name: the knob's place in the pipeline, "<stage>/<parameter>", for
      example "Prefetch.ParallelMapV2/parallelism" (see "Knob and stage
      names" above): the same across epochs, iterators and instances of the
      stage. `parse_knob` reads it.
    kind: "parallelism" (threads of a parallel stage) or "buffer_size"
      (elements a prefetch may hold).
    value: the value in force (on the first instance of the stage, when an
      interleave runs several).
    min: smallest allowed value (that every instance accepts).
    max: largest allowed value (that every instance accepts).
    display: the model nodes of the live instances, for display only:
      "ParallelMapV2(id:3)", comma-separated when there are several. Ids
      change whenever a stage is re-created. Empty when idle.
    idle: its stage does not run now (it is below InTune's cache while the
      cache serves the epoch): `value` is the one it comes back at, `set`
      on it is applied when it runs again, and the tuner leaves it alone.
      Default False.
  """
  name: str
  kind: str
  value: float
  min: float
  max: float
  display: str = ""
  idle: bool = False

  @property
  def stage(self) -> str:
    """The knob's stage name (`parse_stage` reads it)."""
    return split_knob(self.name)[0]


@dataclasses.dataclass(frozen=True)
class StageStats:
  """Cumulative statistics of one stage, from the pipeline's model.

  Attributes:
    name: stage name as in knob names, e.g. "Prefetch.ParallelMapV2" (the
      instances of a stage inside an interleave share it).
    elements: elements produced so far.
    processing_time_ns: CPU-side time spent producing them (summed over
      threads), nanoseconds.
    buffered_bytes: bytes held in the stage's buffer now.
    buffered_elements: elements held in the stage's buffer now.
    bytes_produced: bytes produced so far.
    bytes_consumed: bytes consumed so far.
    parameters: current parameter values, by parameter name.
    inputs: names of the stages that feed this one.
    display: the model node, "ParallelMapV2(id:3)", for display only.
  """
  name: str
  elements: int
  processing_time_ns: int
  buffered_bytes: int
  buffered_elements: int
  bytes_produced: int
  bytes_consumed: int
  parameters: dict[str, float]
  inputs: tuple[str, ...]
  display: str = ""

  @property
  def time_per_element_ns(self) -> float:
    return self.processing_time_ns / self.elements if self.elements else 0.0


@dataclasses.dataclass(frozen=True)
class StageObservation:
  name: str
  rate: float
  cpu_per_element_s: float
  parallelism: float | None
  buffer_size: float | None
  buffer_fill: float
  bytes_per_element: float
  bytes_produced_per_s: float
  buffered_bytes: int
  time_share: float


def stage_cost(cpu_per_element_s: float, rate: float,
               output_rate: float) -> float:
  """CPU-seconds a stage spends per element of the pipeline's output.

  `cpu_per_element_s * rate / output_rate`: the stage's CPU-seconds per
  element of its own, times its elements per output element (a stage before
  a batch of B rows makes B of its elements per output element). The
  policies (proportional allocation), the agent's state and the simulator's
  calibration all read a stage's cost from here.

  Args:
    cpu_per_element_s: the stage's CPU-seconds per element it produces.
    rate: elements per second the stage produces.
    output_rate: elements per second the pipeline returns.

  Returns:
    The cost; 0 when `output_rate` is not positive (nothing measured yet).

  Example: 2 ms per element at 400 elements/s, the pipeline returning
  100/s: 0.002 * 400 / 100 = 0.008 s per output element.
  """
  if output_rate <= 0:
    return 0.0
  return cpu_per_element_s * rate / output_rate


def stage_utilization(cpu_per_element_s: float, rate: float,
                      threads: float | None) -> float:
  """How busy a stage's threads are: the CPUs it keeps busy over its threads.

  `cpu_per_element_s * rate / threads`, the same as the pipeline's output
  rate times `stage_cost` over the threads. 1 means its threads are
  saturated; the stage with the highest value is the bottleneck (the one
  whose extra thread can raise throughput). `intune inspect` shows it as
  `utilization`; the agent's state (`mdp.features`) and the `climb` policy
  call it "busy" (the agent's feature caps it at 2 and counts a stage as 0
  while the pipeline has returned nothing).

  Args:
    cpu_per_element_s: the stage's CPU-seconds per element it produces.
    rate: elements per second the stage produces.
    threads: the stage's parallelism; None (a stage without that knob) or
      below 1 counts as 1.

  Returns:
    The utilization, 0 or more (above 1 when the stage's threads run
    longer than the wall time, e.g. when it has more threads than its
    parallelism says).

  Example: 2 ms per element at 1,500 elements/s on 4 threads:
  0.002 * 1500 / 4 = 0.75.
  """
  return cpu_per_element_s * rate / max(threads or 1.0, 1.0)


def unlowerable_bytes(stages: Sequence[StageObservation],
                      bounded: Collection[str] = ()) -> dict[str, int]:
  """Bytes held by stages the budget guard cannot lower: those without a
  parallelism or buffer knob (a shuffle or in-memory cache buffer, a buffer
  of fixed size), other than the `bounded` ones. The guard subtracts them
  from the RAM budget.

  Args:
    stages: the stages of an observation.
    bounded: names of the stages whose records the guard bounds although
      they have no knob: the bounded interleaves, which it lowers through
      per-input limits (`session.bounded_stage_names`). Default: none.

  Returns:
    `{stage name: buffered bytes}` of each such stage holding any, summed
    over the instances of a stage.

  Example: stages Shuffle (no knob, 64 MB), Prefetch (buffer knob, 8 MB),
  Cache (no knob, 0 bytes), Interleave (no knob, 20 MB, bounded):
  {"Shuffle": 64 MB}.
  """
  held: dict[str, int] = {}
  for s in stages:
    if (s.parallelism is None and s.buffer_size is None and
        s.buffered_bytes > 0 and s.name not in bounded):
      held[s.name] = held.get(s.name, 0) + int(s.buffered_bytes)
  return held


@dataclasses.dataclass(frozen=True)
class Observation:
  """A tuning step's view of one pipeline and its host (see module doc)."""
  time: float
  interval_s: float
  knobs: tuple[Knob, ...]
  stages: tuple[StageObservation, ...]
  output_rate: float
  output_latency_s: float
  consumer_wait_s: float
  usable_cpus: int
  cpu_budget: int
  free_memory: int
  total_memory: int
  ram_budget: int
  buffered_bytes: int
  cpu_mhz: float
  dram_gbps: float
  model_step_s: float | None
  # Stages whose records the guard bounds without a knob (bounded
  # interleaves); `unlowerable_bytes` leaves them out.
  bounded_stages: tuple[str, ...] = ()

  @property
  def bytes_per_element(self) -> dict[str, float]:
    """`{stage name: bytes per element}` (a new dict at every call)."""
    return dict(self._bytes_per_element)

  @functools.cached_property
  def _bytes_per_element(self) -> dict[str, float]:
    return {s.name: s.bytes_per_element for s in self.stages}

  @functools.cached_property
  def _stage_index(self) -> dict[str, StageObservation]:
    """Stages by name, the first of each name (as `stage` returns)."""
    return {s.name: s for s in reversed(self.stages)}

  def stage(self, name: str) -> StageObservation | None:
    """The first stage named `name`, or None."""
    return self._stage_index.get(name)

  @property
  def unlowerable_bytes(self) -> dict[str, int]:
    """`unlowerable_bytes(self.stages, self.bounded_stages)`, computed once
    per observation (the tuner and the status file both read it; a new dict
    at every call)."""
    return dict(self._unlowerable_bytes)

  @functools.cached_property
  def _unlowerable_bytes(self) -> dict[str, int]:
    return unlowerable_bytes(self.stages, self.bounded_stages)

  def to_json(self) -> dict:
    """A JSON-serializable dict (for traces)."""
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Decision:
  """What a policy did at one tuning step, for the decision log and
  `intune inspect` (`Policy.last_decision`).

  Attributes:
    step: The policy's own step count (0 for its start).
    action: What it did, e.g. "start", "warm-start", "hold",
      "revert-to-best", "no-op", or a move such as
      "Prefetch.ParallelMapV2/parallelism +1".
    rate: The output rate (elements/s) the step measured; None if none.
    reward: The reward of the previous action; None if none.
    loss: The loss of a gradient step taken at this step; None if none.
    seconds: How long the step took; None if not timed.
  """
  step: int
  action: str
  rate: float | None = None
  reward: float | None = None
  loss: float | None = None
  seconds: float | None = None

  def fields(self) -> dict[str, int | float | str]:
    """The fields that are set (None left out), for a JSON line."""
    return {k: v for k, v in dataclasses.asdict(self).items()
            if v is not None}


class CacheState(str, enum.Enum):
  """What became of InTune's cache for a session's pipeline: the `state` of
  `TuningSession.cache()`, and of the `cache` that the status file and the
  decision log hold (there as its value, e.g. "placed").

  The kernel decides it in one place (intune_tf/cc/cache_decision.h): where
  the graph rewrite puts the cache, or why it puts none, then, while the
  pipeline runs, why the cache gives up (too little room for an epoch, files
  too costly to check, elements whose bytes it cannot count). The tuner's
  log, the status file, the decision log, `intune inspect` and the Keras
  logs all read it from `TuningSession.cache()`.

  Attributes:
    OFF: The `cache` option is off.
    PLACED: A cache holds the elements of the node `point`; `reason` says
      why there (what above it changes between epochs).
    DECLINED: No cache; `reason` says why. `point` is where the cache was
      placed before it gave up, or "" when no place was found.
  """
  OFF = "off"
  PLACED = "placed"
  DECLINED = "declined"

  def __str__(self) -> str:
    return self.value
