"""`IntuneOptions`: what `tf.data.Options().experimental_intune` takes."""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from typing import Any, Mapping

from intune_tf import host
from intune_tf import option_fields as fields

# Share of the memory available when the iterator starts that the pipeline's
# buffers may hold when `ram_budget` is None (TF's own autotuner uses 0.5).
DEFAULT_RAM_SHARE = 0.5
# The options' limits and defaults, declared with their fields.
DEFAULT_PERIOD_S = fields.DEFAULT_PERIOD_S
DEFAULT_INTERLEAVE_BUFFER = fields.DEFAULT_INTERLEAVE_BUFFER
MAX_INTERLEAVE_BUFFER = fields.MAX_INTERLEAVE_BUFFER
MAX_CPUS = fields.MAX_CPUS
MIN_PERIOD_S = fields.MIN_PERIOD_S
MAX_HOST_WEIGHT = fields.MAX_HOST_WEIGHT
# `max_cpus` may name at most this many times the machine's logical CPUs: a
# job is never given more CPUs than its machine has, and a VM may gain a few
# (hot-plugged CPUs), but each CPU named costs a pool thread and its stack
# (8192 on 2 CPUs: 8,207 threads, +711 MB, 48 s to release the iterator).
MAX_CPUS_PER_MACHINE_CPU = 4


@dataclasses.dataclass(frozen=True)
class IntuneOptions:
  """How InTune tunes a dataset. Pass it as `options.experimental_intune`.

  `options.experimental_intune = True` is the same as `IntuneOptions()`.

  Attributes:
    cpu_budget: CPUs the pipeline may keep busy. Default None: the CPUs the
      process may use, re-read at every tuning step (affinity and cgroup
      quota), so CPUs that arrive or leave mid-job are used; with
      `host_share`, at most this process's share of the host's CPUs.
    ram_budget: bytes the pipeline's buffers and its policy's memory may
      hold. Default None: a share of half of the memory the process's
      sessions could use (available RAM, capped by the process's cgroup,
      plus what they hold), resolved where the iterator is made (a tf.data
      service worker budgets from its own memory) and re-read every second.
      The budget guard inside the pipeline enforces it whatever the policy
      does. With `host_share`,
      the default is this process's share of the host's pool instead.
    policy: name of the tuning policy. Default "intune": a measured search
      (a learned allocation, then a proportional jump, first; each change
      kept only if faster) whose moves a pretrained Q-network ranks; it
      settles when it stops finding
      gains and re-opens when an observed quantity moves beyond its noise
      (docs/agent.md). "intune-dqn": the DQN agent acting alone, fine-tuned
      online, with a no-regression guard. Others: "even" (usable CPUs split
      evenly over the parallel stages), "analytic" (CPUs in proportion to
      each stage's CPU cost), "climb",
      "coordinate", "plumber" (searches that keep a change only when the
      measured throughput rose, `intune_tf.tuning.search`), "unoptimized",
      "fixed" (applies `config`), "manual" (changes nothing: set knobs
      yourself with `TuningSession.set`), or one registered with
      `intune_tf.register_policy`. The name is checked when the option is
      set on a dataset (`with_options`, `tune`), against the policies
      registered then.
    config: knob values for the "fixed" policy (and the starting point of
      the others), `{knob name: value}` as returned by `TuningSession.config()`.
      Default None.
    period_s: seconds between tuning steps of the background tuner, finite
      and at least MIN_PERIOD_S (0.005). Default 0.5.
    max_cpus: the largest CPU count the job may get, when CPUs may be added
      while it runs: InTune then gives the pipeline a private runner thread
      pool of this size, and every parallelism knob ranges up to it (the
      pool replaces TF's runner, so `options.threading` settings do not
      apply inside it). Default None: TF's own runner; parallelism knobs
      range up to its size, fixed when the iterator is created. At most
      MAX_CPUS_PER_MACHINE_CPU (4) x the machine's logical CPUs, and at
      most MAX_CPUS (8192).
    include_fixed: also make stages with a fixed parallelism or buffer size
      tunable (their value is the starting point). Default False: only
      stages left on `tf.data.AUTOTUNE` are tuned.
    insert_prefetch: add a prefetch (a memory knob) after parallel stages
      that have none. Default False: each added prefetch is one more thread
      hand-off per element, and on the Criteo L4 pipeline (2 CPUs) it cost
      about 25% of throughput at the same parallelism.
    inner_stats: record tf.data's per-element statistics inside the
      datasets that an interleave or flat_map creates per input element, as
      TF's AUTOTUNE does. Default False: those datasets (one element per row
      for a file reader) run without the model, and one node stands for each
      (the `untrack_inner` pass, `rewrites/passes.h`); this saves CPU time
      per row (docs/benchmarks.md, "Where the gain comes from"). Their
      stages are never knobs either way; functions with a prefetch or
      parallel stage are always recorded.
    interleave_buffer: results each input of a parallel interleave buffers
      ahead, when the interleaved elements are records (every component a
      scalar: a text line, a serialized example) and TF's default
      (2 * block_length + 1, which `Dataset.interleave` always uses) is
      smaller (the `raise_interleave_buffers` pass, `rewrites/passes.h`).
      Default 16: with TF's 3, each row read is a thread hand-off; the
      deeper buffer cuts the context switches per row (docs/benchmarks.md,
      "Where the gain comes from"). The guard bounds these buffers by
      the RAM budget (down to one record per input, before any other
      knob), so a raised interleave runs cycle_length workers; an
      interleave given fewer (a fixed num_parallel_calls below its
      cycle_length), or whose per-input datasets are not untracked
      (inner_stats, symbolic checkpoints), keeps TF's buffers. At most
      MAX_INTERLEAVE_BUFFER. None keeps TF's default.
    name: a label for the pipeline, shown in session listings. Default "".
    warm_start: start from the configuration (and fine-tuned agent) saved by
      earlier runs of the same pipeline on the same kind of machine, and save
      them for the next run (`intune_tf.agent.warmstart`). Default True.
    host_share: share one CPU budget and one RAM budget with the other
      InTune processes of this host (`intune_tf.arbiter`): the
      budgets left at None become this process's share of the host. A
      `cpu_budget` or `ram_budget` set by the user is kept as it is.
      Default True; False budgets as if the process were alone.
    host_weight: this pipeline's weight in the host's split (a process
      takes the largest weight of its sessions), finite, in (0,
      MAX_HOST_WEIGHT (1e6)]. Default 1.0.
    cache: keep in memory, across epochs, the elements of the deepest part
      of the pipeline that gives the same elements every epoch (below any
      random op, stateful op, py_function or reshuffled shuffle; see
      `FindCachePoint` in `rewrites/passes.h`), under the RAM budget the
      buffers share, which it gives way to first. Not added to a pipeline
      with a cache of its own, nor under symbolic checkpoints, nor where its
      room is under 1% of an epoch of known size or the input never ends.
      Default True; False for none.
  """

  # The defaults come from the field table (`intune_tf.option_fields`);
  # tests/test_option_fields.py checks that these fields are its rows.
  cpu_budget: int | None = fields.default("cpu_budget")
  ram_budget: int | None = fields.default("ram_budget")
  policy: str = fields.default("policy")
  config: Mapping[str, float] | None = fields.default("config")
  period_s: float = fields.default("period_s")
  max_cpus: int | None = fields.default("max_cpus")
  include_fixed: bool = fields.default("include_fixed")
  insert_prefetch: bool = fields.default("insert_prefetch")
  inner_stats: bool = fields.default("inner_stats")
  interleave_buffer: int | None = fields.default("interleave_buffer")
  name: str = fields.default("name")
  warm_start: bool = fields.default("warm_start")
  host_share: bool = fields.default("host_share")
  host_weight: float = fields.default("host_weight")
  cache: bool = fields.default("cache")

  def __post_init__(self):
    for field in fields.FIELDS:
      if field.kind is not int:
        continue
      value = getattr(self, field.name)
      if value is None:
        continue
      if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"IntuneOptions.{field.name} must be an int or None, "
                        f"got {value!r} ({type(value).__name__}).")
      if value < field.low:
        raise ValueError(f"IntuneOptions.{field.name} must be positive, got "
                         f"{value}. Pass None for {field.none_doc}.")
      if value > field.high:
        raise ValueError(
            f"IntuneOptions.{field.name} is {value}, out of its range "
            f"{field.low}..{field.high}. Pass at most {field.high}, or None "
            f"for {field.none_doc}.")
      # A numpy integer becomes an int: the option travels as JSON.
      object.__setattr__(self, field.name, int(value))
    machine = host.machine_cpus()
    cpus_limit = max_cpus_limit(machine)
    if self.max_cpus is not None and self.max_cpus > cpus_limit:
      raise ValueError(
          f"IntuneOptions.max_cpus is {self.max_cpus}, more than "
          f"{MAX_CPUS_PER_MACHINE_CPU} x the {machine} CPU(s) of "
          f"this machine: its range here is 1..{cpus_limit}. Each CPU named "
          "starts a runner thread. Pass the most CPUs the job may really "
          "get, at most this, or None for TF's own runner.")
    for field in fields.names(bool):
      if not isinstance(getattr(self, field), bool):
        raise TypeError(f"IntuneOptions.{field} must be True or False, got "
                        f"{getattr(self, field)!r}.")
    if not isinstance(self.policy, str):
      raise TypeError(f"IntuneOptions.policy must be a policy name (str), got "
                      f"{self.policy!r}.")
    if (isinstance(self.period_s, bool) or
        not isinstance(self.period_s, numbers.Real) or
        not math.isfinite(self.period_s) or self.period_s <= 0):
      raise ValueError(f"IntuneOptions.period_s must be a positive, finite "
                       f"number of seconds, got {self.period_s!r}. Default "
                       f"{DEFAULT_PERIOD_S}.")
    if self.period_s < MIN_PERIOD_S:
      raise ValueError(
          f"IntuneOptions.period_s is {self.period_s!r} s, below its range "
          f"[{MIN_PERIOD_S}, any finite number of seconds]: the tuner never "
          f"steps more often. Pass at least {MIN_PERIOD_S} (default "
          f"{DEFAULT_PERIOD_S}).")
    if (isinstance(self.host_weight, bool) or
        not isinstance(self.host_weight, numbers.Real) or
        not math.isfinite(self.host_weight) or
        not 0 < self.host_weight <= MAX_HOST_WEIGHT):
      raise ValueError(
          f"IntuneOptions.host_weight is {self.host_weight!r}, out of its "
          f"range (0, {MAX_HOST_WEIGHT:g}]: pass a positive finite weight "
          "(default 1.0; a job of weight 2 gets twice the share of a job of "
          "weight 1).")
    # numpy floats become floats: the option travels as JSON.
    for name in ("period_s", "host_weight"):
      if type(getattr(self, name)) not in (int, float):
        object.__setattr__(self, name, float(getattr(self, name)))
    if not isinstance(self.name, str):
      raise TypeError(f"IntuneOptions.name must be a str (a label for the "
                      f"pipeline), got {self.name!r} "
                      f"({type(self.name).__name__}).")
    if self.config is not None:
      if not isinstance(self.config, Mapping):
        raise TypeError("IntuneOptions.config must be a mapping of knob name "
                        f"to value, got {type(self.config).__name__}.")
      for key, value in self.config.items():
        if not isinstance(key, str) or isinstance(value, bool) or not (
            isinstance(value, numbers.Real)):
          raise TypeError("IntuneOptions.config must map knob names (str) to "
                          f"numbers, got {key!r}: {value!r}.")
        if not isinstance(value, numbers.Integral) and not math.isfinite(
            value):
          raise ValueError(
              f"IntuneOptions.config[{key!r}] is {value!r}: a knob value "
              "must be a finite number within the knob's [min, max] (see "
              "TuningSession.knobs()); values outside it are clamped.")
      object.__setattr__(self, "config", {
          key: value if type(value) in (int, float)
          else int(value) if isinstance(value, numbers.Integral)
          else float(value) for key, value in self.config.items()})
    if self.policy == "fixed" and not self.config:
      raise ValueError('IntuneOptions(policy="fixed") needs a `config` of '
                       "knob values.")

  def resolved_cpu_budget(self, usable_cpus: int | None = None) -> int:
    """The CPU budget now: the given one, capped by the usable CPUs.

    Args:
      usable_cpus: a reading of `host.usable_cpus()` already taken. Default
        None: read it now.
    """
    usable = host.usable_cpus() if usable_cpus is None else usable_cpus
    return usable if self.cpu_budget is None else min(self.cpu_budget, usable)

  def resolved_max_cpus(self) -> int:
    """Size of the private runner pool; 0 keeps TF's runner."""
    return int(self.max_cpus or 0)

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> "IntuneOptions":
    data = json.loads(text)
    if not isinstance(data, dict):
      raise ValueError(f"Not an IntuneOptions JSON object: {text[:80]!r}")
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in known})


def max_cpus_limit(machine_cpus: int) -> int:
  """The largest `max_cpus` on a machine of `machine_cpus` logical CPUs:
  `MAX_CPUS_PER_MACHINE_CPU` times them, at most `MAX_CPUS`.

  Example: 2 CPUs -> min(8192, 4 x 2) = 8.
  """
  return min(MAX_CPUS, MAX_CPUS_PER_MACHINE_CPU * max(1, int(machine_cpus)))


def coerce(value: Any) -> IntuneOptions | None:
  """Turns an `experimental_intune` value into options (None when off)."""
  if value is None or value is False:
    return None
  if value is True:
    return IntuneOptions()
  if isinstance(value, IntuneOptions):
    return value
  raise TypeError("tf.data.Options().experimental_intune takes True, False or "
                  "an intune_tf.IntuneOptions(...), got "
                  f"{value!r} ({type(value).__name__}).")
