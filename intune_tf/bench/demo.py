"""`intune demo`: the tiny DLRM trained with `model.fit`, AUTOTUNE vs InTune.

    intune demo                      # about 5 minutes on 2 cores
    intune demo --minutes 0.3        # a quick look
    intune demo --policy even --out out/demo

Uses the real Criteo sample when `../shared/data/criteo` (or
`$INTUNE_CRITEO_DATA`) holds one, else generates a small synthetic set once
(cached). Builds the Criteo preprocessing pipeline (level 4: read, shuffle,
batch, parse, features, prefetch), measures each stage's single-threaded
cost with the benchmark harness, then trains one tiny DLRM with `model.fit`
alternately under TF's AUTOTUNE and under InTune (A B A B ...), each run
for the same time. Prints a side-by-side table and what InTune's cache held
and saved, and writes a PNG of throughput and knob values over time (knobs
that never moved named, not drawn: `<out>/demo.png`) and the figures
(`<out>/demo.json`).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import statistics
import sys
import time
from typing import Mapping, Sequence

import keras
import psutil
import tensorflow as tf
from tqdm import tqdm

import intune_tf
from intune_tf import arguments
from intune_tf import host
from intune_tf import keras as intune_keras
from intune_tf import records
from intune_tf.bench import harness
from intune_tf.bench import meter as meter_lib
from intune_tf.bench import scenarios
from intune_tf.criteo import files as files_lib
from intune_tf.criteo import models
from intune_tf.criteo import pipelines
from intune_tf.live import registry

AUTOTUNE = "autotune"
INTUNE = "intune"
WINDOW_S = 1.0
DEFAULT_MINUTES = 3.0
DEFAULT_REPEATS = 4
MB = 1 << 20
_MAX_STEPS = 10**9  # steps_per_epoch of a run; runs end on time


def busy_udf(size: int, rounds: int = 3):
  """A map function costing CPU in proportion to `size * rounds` (stateless
  random numbers, `rounds` of sin and cumsum), returning its input."""
  def udf(x):
    v = tf.random.stateless_uniform([size], seed=tf.stack([x, x + 1]))
    for _ in range(rounds):
      v = tf.math.cumsum(tf.sin(v))
    return x + tf.cast(tf.reduce_sum(v) * 0.0, tf.int64)
  return udf


# --- data, pipeline, model ----------------------------------------------------

def demo_files(rows: int = 200_000) -> tuple[list[str], str]:
  """The real Criteo sample when present, else a cached synthetic set.

  Args:
    rows: rows of the synthetic set (default 200,000, ~50 MB, generated once
      into `~/.cache/intune_tf/criteo`).

  Returns:
    (files, a one-line description of the data).
  """
  real = files_lib.real_sample_files()
  if real:
    return real, (f"real Criteo sample: {len(real)} file(s) in "
                  f"{files_lib.real_data_dir()}")
  with tqdm(total=1, desc="synthetic Criteo set (generated once, cached)",
            unit="set") as bar:
    generated = files_lib.default_files(rows)
    bar.update()
  return generated, (f"synthetic Criteo set: {rows:,} rows, {len(generated)} "
                     "files")


def criteo_dataset(files: Sequence[str], level: int, batch_size: int,
                   parallelism: dict[str, int] | None = None
                   ) -> tf.data.Dataset:
  """The Criteo level-`level` pipeline over `files`, repeated forever."""
  return pipelines.pipeline(level, list(files), batch_size=batch_size,
                            parallelism=parallelism, repeat=True, seed=0)


def tiny_dlrm() -> keras.Model:
  """The tiny DLRM on the pipeline's features, compiled for speed.

  Adam and binary cross-entropy, no metric, XLA-compiled: on 2 cores this
  makes a 4096-row step ~4x cheaper than Keras' default (not compiled here),
  so that the input pipeline, not the model, bounds `model.fit`.
  """
  keras.utils.set_random_seed(0)
  model = models.dlrm(models.DLRMConfig(
      num_buckets=1000, embedding_dim=4, bottom_mlp=(8,), top_mlp=(8,),
      log_dense=False), compile=False)  # the pipeline already log-transforms
  model.compile(optimizer=keras.optimizers.Adam(1e-3),
                loss=keras.losses.BinaryCrossentropy(), jit_compile=True)
  return model


def measure_ceiling(files: Sequence[str], level: int, batch_size: int,
                    seconds: float = 2.0) -> tuple[float, dict[str, float]]:
  """The pipeline's work ceiling, measured by the benchmark harness.

  Each stage's single-threaded CPU cost comes from the prefix pipelines
  L1..L`level`; ceiling = usable CPUs / their sum (see
  `harness.Harness.measure_work_estimate`). It is the input pipeline's ceiling:
  `model.fit` also spends CPU on the model, on the same cores.

  Returns:
    (ceiling rows/s, {stage: CPU seconds per row}).
  """
  stage_names = {1: "read+batch", 2: "shuffle", 3: "parse", 4: "features",
                 5: "heavy"}

  def prefix(k):
    one_thread = {s: 1 for s in pipelines.STAGES[k]
                  if s in pipelines.TUNABLE_STAGES}
    return lambda: criteo_dataset(files, k, batch_size, one_thread)

  scenario = scenarios.Scenario(
      "demo", f"Criteo L{level}, batch {batch_size}",
      lambda parallelism=None: criteo_dataset(files, level, batch_size,
                                              parallelism),
      batch_size,
      prefixes=tuple((stage_names[k], prefix(k)) for k in range(1, level + 1)))
  h = harness.Harness(seconds=0.0, warmup=0.0)
  try:
    ceiling = h.measure_work_estimate(scenario, seconds=seconds)
  finally:
    h.close()
  return ceiling, h.stage_costs["demo"]


def knob_labels(names: Sequence[str], level: int) -> dict[str, str]:
  """Readable labels of a Criteo pipeline's knobs, by stage.

  Example: 'Prefetch.ParallelMapV2.ParallelMapV2/parallelism' -> 'parse
  threads' at level 4. Knobs are matched to stages by op type in pipeline
  order (input first, `session.input_first`); any knob left over keeps its
  name (`keras.short_name`).
  """
  maps = [s for s in pipelines.STAGES[level] if s in ("parse", "features",
                                                       "heavy")]
  ops = {}
  for name in names:
    try:
      ops[name] = records.parse_knob(name)[0].op
    except ValueError:
      ops[name] = ""
  labels = {}
  map_knobs = sorted([n for n in names if ops[n].startswith("ParallelMap")],
                     key=records.input_first)
  for name, stage in zip(map_knobs, maps):
    labels[name] = f"{stage} threads"
  for name in names:
    if name in labels:
      continue
    kind = records.split_knob(name)[1]
    what = "threads" if kind == "parallelism" else "buffer"
    if "Interleave" in ops[name]:
      labels[name] = f"read {what}"
    elif ops[name].startswith("ParallelBatch"):
      labels[name] = f"batch {what}"
    elif ops[name].startswith("Prefetch"):
      labels[name] = f"prefetch {what}"
    else:
      labels[name] = intune_keras.short_name(name)
  return labels


# --- one run ------------------------------------------------------------------

@dataclasses.dataclass
class DemoRun:
  """One timed `model.fit` under one tuner.

  Attributes:
    tuner: "autotune" or "intune".
    repeat: 0-based repeat index.
    start: seconds since the first run started (the plot's time axis).
    rows_per_s: rows trained per second after the warm-up.
    steps: training steps in the whole run.
    windows: (seconds since the first run, rows/s) per `WINDOW_S`.
    knobs: (seconds since the first run, {knob: value}) at every tuning step
      (InTune only: AUTOTUNE's choices are not visible).
    knob_changes: knob values the tuner changed during the run.
    peak_buffered_bytes: InTune's own count of bytes in the pipeline's
      buffers (peak); None under AUTOTUNE, which does not expose it.
    rss_growth_bytes: peak resident memory of the whole process during the
      run minus that at its start (sampled every 20 ms).
    cache: InTune's `TuningSession.cache()` at the run's last window
      (where it cached, why there, bytes held, the share of elements served
      from it, the input seconds it saved); {} under AUTOTUNE.
    stopped: seconds since the first run when the run asked `fit` to stop.
    returned: seconds since the first run when `fit` returned (the gap is
      fit's wind-down, the iterator's teardown included).
  """
  tuner: str
  repeat: int
  start: float = 0.0
  rows_per_s: float = 0.0
  steps: int = 0
  windows: list = dataclasses.field(default_factory=list)
  knobs: list = dataclasses.field(default_factory=list)
  knob_changes: int = 0
  peak_buffered_bytes: int | None = None
  rss_growth_bytes: int = 0
  cache: dict = dataclasses.field(default_factory=dict)
  stopped: float = 0.0
  returned: float = 0.0


class _Meter(keras.callbacks.Callback):
  """Counts rows per window, stops `fit` after `warmup + seconds`."""

  def __init__(self, run: DemoRun, rows_per_step: int, warmup: float,
               seconds: float, origin: float, bar: tqdm,
               intune: intune_keras.IntuneCallback | None):
    super().__init__()
    self.run, self.rows_per_step = run, rows_per_step
    self.warmup, self.seconds, self.origin = warmup, seconds, origin
    self.bar, self.intune = bar, intune
    self._meter: meter_lib.Meter | None = None

  def on_train_begin(self, logs=None):
    self._meter = meter_lib.Meter(self.seconds, self.warmup,
                                  window_s=WINDOW_S)
    self.run.start = self._meter.start - self.origin

  def on_train_batch_end(self, batch, logs=None):
    meter = self._meter
    self.run.steps += 1
    window = meter.count(self.rows_per_step)
    if window is not None:
      at, rate = window
      self.run.windows.append((round(meter.start + at - self.origin, 3), rate))
      if self.intune is not None and self.intune.session is not None:
        try:
          peak = self.intune.session.counters()["peak_buffered_bytes"]
          self.run.peak_buffered_bytes = max(self.run.peak_buffered_bytes or 0,
                                             peak)
          self.run.cache = self.intune.session.cache()
        except intune_tf.SessionGoneError:
          pass
      self.bar.update(min(at, self.warmup + self.seconds) - self.bar.n)
    if not meter.running():
      self.model.stop_training = True
      self.run.stopped = time.monotonic() - self.origin
      self.run.rows_per_s = meter.rows_per_s


def _fit(model: keras.Model, ds: tf.data.Dataset, run: DemoRun,
         batch_size: int, warmup: float, seconds: float, origin: float,
         position: int) -> DemoRun:
  """One timed `model.fit` of `ds` (with the option on for InTune runs)."""
  tuned = run.tuner == INTUNE
  callbacks, intune_cb, events = [], None, []
  if tuned:
    intune_cb = intune_keras.IntuneCallback()
    callbacks.append(intune_cb)
  label = f"{run.tuner} #{run.repeat + 1}"
  listener = None
  if tuned:
    def listener(session, obs, applied):
      values = {k.name: k.value for k in obs.knobs}
      values.update(applied)
      events.append((time.monotonic() - origin, session.id, values,
                     len(applied)))
    intune_tf.global_tuner().add_listener(listener)
  with tqdm(total=round(warmup + seconds, 1), desc=f"  {label:<12}",
            unit="s", position=position, leave=False,
            disable=not sys.stderr.isatty(),
            bar_format="{desc} {bar} {n:.0f}/{total:.0f} s") as bar:
    callbacks.append(_Meter(run, batch_size, warmup, seconds, origin, bar,
                            intune_cb))
    try:
      process = psutil.Process()
      with meter_lib.PeakSampler(lambda: process.memory_info().rss,
                                 period_s=0.02) as rss:
        model.fit(ds, epochs=1, steps_per_epoch=_MAX_STEPS, verbose=0,
                  shuffle=False, callbacks=callbacks)
      run.rss_growth_bytes = rss.peak - rss.start
      run.returned = time.monotonic() - origin
    finally:
      if listener is not None:
        intune_tf.global_tuner().remove_listener(listener)
  if intune_cb is not None:
    ours = {p.session for p in intune_cb.trace}
    for t, session_id, values, changed in events:
      if session_id in ours:
        run.knobs.append((round(t, 3), values))
        run.knob_changes += changed
  gc.collect()
  return run


# --- the whole demo ----------------------------------------------------------

@dataclasses.dataclass
class DemoResult:
  """What `run` measured. `runs` are in the order they ran."""
  data: str
  level: int
  batch_size: int
  policy: str
  ceiling_rows_per_s: float
  stage_seconds_per_row: dict
  warmup: float
  seconds: float
  runs: list[DemoRun]

  def by_tuner(self, tuner: str) -> list[DemoRun]:
    return [r for r in self.runs if r.tuner == tuner]

  def summary(self) -> dict[str, dict]:
    """Per tuner: median/min/max rows/s, vs autotune, peaks; InTune's cache
    (that of its last run)."""
    out = {}
    base = statistics.median(r.rows_per_s for r in self.by_tuner(AUTOTUNE))
    for tuner in (AUTOTUNE, INTUNE):
      runs = self.by_tuner(tuner)
      rates = [r.rows_per_s for r in runs]
      med = statistics.median(rates)
      buffered = [r.peak_buffered_bytes for r in runs
                  if r.peak_buffered_bytes is not None]
      out[tuner] = {
          "rows_per_s": med, "min": min(rates), "max": max(rates),
          "vs_autotune": med / base if base else None,
          "peak_buffered_bytes": max(buffered) if buffered else None,
          "peak_rss_growth_bytes": max(r.rss_growth_bytes for r in runs),
          "knob_changes": sum(r.knob_changes for r in runs),
          "repeats": len(runs)}
    pairs = [b.rows_per_s / a.rows_per_s for a, b in
             zip(self.by_tuner(AUTOTUNE), self.by_tuner(INTUNE))
             if a.rows_per_s > 0]
    out[INTUNE]["median_paired_ratio"] = (statistics.median(pairs)
                                          if pairs else None)
    caches = [r.cache for r in self.by_tuner(INTUNE) if r.cache]
    out[INTUNE]["cache"] = caches[-1] if caches else {}
    return out


def check_arguments(minutes: float, repeats: int, level: int,
                    policy: str | None) -> None:
  """Raises ValueError naming the first bad argument of `run`."""
  if not minutes > 0:
    raise ValueError(f"minutes must be > 0, got {minutes!r}.")
  if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
    raise ValueError(f"repeats must be a positive int, got {repeats!r}.")
  if level not in (3, 4, 5):
    raise ValueError(f"level must be 3, 4 or 5 (the levels that parse rows "
                     f"into model features), got {level!r}.")
  if policy:
    registry.check_name(policy)


def keras_problem() -> str | None:
  """Why the demo cannot train in this process, or None.

  The demo trains with Keras 3 (its optimizer, loss and callbacks), while
  the DLRM is built on `tf.keras` (`criteo.models`): where `tf.keras` is the
  legacy tf_keras (TF_USE_LEGACY_KERAS set, as tensorflow_transform sets it
  on import), the two do not mix.
  """
  if models.keras.Model is keras.Model:
    return None
  return ("it trains with Keras 3, but tf.keras is the legacy tf_keras in "
          "this process (TF_USE_LEGACY_KERAS="
          f"{os.environ.get('TF_USE_LEGACY_KERAS', '')!r}). Run it where "
          "TF_USE_LEGACY_KERAS is unset, e.g. `env -u TF_USE_LEGACY_KERAS "
          "intune demo`.")


def run(minutes: float = DEFAULT_MINUTES, *, repeats: int = DEFAULT_REPEATS,
        policy: str | None = None, level: int = 4, batch_size: int = 4096,
        rows: int = 200_000, ceiling_seconds: float = 2.0) -> DemoResult:
  """Runs the demo.

  Args:
    minutes: total time of the timed runs (both tuners, all repeats),
      default 3 (setup, the ceiling, a warm-up fit per tuner and the
      teardown of each run add ~2 min on a loaded 2-core machine).
    repeats: runs per tuner, interleaved (default 4).
    policy: InTune policy (default None: `IntuneOptions`' default).
    level: Criteo pipeline level 1..5 (default 4).
    batch_size: rows per batch (default 4096).
    rows: rows of the synthetic set when there is no real sample (default
      200,000).
    ceiling_seconds: seconds measured per prefix pipeline for the ceiling
      (default 2).

  Returns:
    The measurements.

  Raises:
    ValueError: a bad argument (the message says which).
  """
  check_arguments(minutes, repeats, level, policy)
  options = (intune_tf.IntuneOptions(policy=policy, name="demo") if policy
             else intune_tf.IntuneOptions(name="demo"))
  per_run = minutes * 60.0 / (2 * repeats)
  warmup = min(5.0, 0.25 * per_run)
  seconds = per_run - warmup

  files, data = demo_files(rows)
  with tqdm(total=1, desc=f"stage costs of Criteo L{level} (harness)",
            unit="pipeline") as bar:
    ceiling, costs = measure_ceiling(files, level, batch_size,
                                     ceiling_seconds)
    bar.update()
  plain = criteo_dataset(files, level, batch_size)
  tuned = intune_tf.tune(plain, options)
  model = tiny_dlrm()
  # One short fit per tuner first: the model is built and traced, and
  # InTune's one-off costs (kernel library, agent) stay out of its first
  # measured run, its memory growth included.
  with tqdm(total=2, desc="warm-up fits (build and trace the model)",
            unit="fit") as bar:
    for tuner, ds in ((AUTOTUNE, plain), (INTUNE, tuned)):
      _fit(model, ds, DemoRun(tuner, -1), batch_size,
           0.0, min(3.0, per_run), time.monotonic(), position=1)
      bar.update()

  result = DemoResult(data=data, level=level, batch_size=batch_size,
                      policy=options.policy, ceiling_rows_per_s=ceiling,
                      stage_seconds_per_row=costs, warmup=warmup,
                      seconds=seconds, runs=[])
  origin = time.monotonic()
  schedule = [(tuner, r) for r in range(repeats) for tuner in (AUTOTUNE,
                                                               INTUNE)]
  with tqdm(schedule, desc="interleaved runs", unit="run") as bar:
    for tuner, repeat in bar:
      bar.set_postfix_str(f"{tuner} #{repeat + 1}")
      ds = tuned if tuner == INTUNE else plain
      result.runs.append(_fit(model, ds, DemoRun(tuner, repeat), batch_size,
                              warmup, seconds, origin, position=1))
  return result


# --- reports -----------------------------------------------------------------

def table(result: DemoResult) -> str:
  """The side-by-side Markdown table."""
  s = result.summary()
  lines = [
      "| tuner | rows/s (median) | min | max | vs autotune | "
      "peak buffered MB (InTune's count) | peak process RSS growth MB |",
      "|---|---|---|---|---|---|---|"]
  for tuner in (AUTOTUNE, INTUNE):
    p = s[tuner]
    name = "autotune" if tuner == AUTOTUNE else f"intune ({result.policy})"
    buffered = ("n/a (not exposed)" if p["peak_buffered_bytes"] is None
                else f"{p['peak_buffered_bytes'] / MB:,.1f}")
    lines.append(
        f"| {name} | {p['rows_per_s']:,.0f} | {p['min']:,.0f} | "
        f"{p['max']:,.0f} | {p['vs_autotune']:.2f}x | {buffered} | "
        f"{p['peak_rss_growth_bytes'] / MB:,.1f} |")
  return "\n".join(lines)


def cache_line(cache: Mapping) -> str:
  """What InTune's cache held and saved, in one line (its last run's)."""
  if cache.get("state") != records.CacheState.PLACED:
    why = cache.get("reason") or "no reading"
    return f"InTune's cache: none ({why})"
  return (f"InTune's cache: after {cache['point']}, held "
          f"{cache['bytes'] / MB:,.1f} MB, served {cache['served']:.0%} of "
          f"the elements read there, saved {cache['saved_s']:.1f} s of "
          f"input work ({cache['reason']})")


def constant_knobs(runs: Sequence[DemoRun]) -> dict[str, float]:
  """{knob: value} of the knobs that kept one value in every run given.

  constant_knobs of runs whose knobs were [(0, {"a": 2, "b": 1}),
  (1, {"a": 2, "b": 3})] = {"a": 2}.
  """
  values: dict[str, set] = {}
  for r in runs:
    for _, knobs in r.knobs:
      for name, value in knobs.items():
        values.setdefault(name, set()).add(value)
  return {n: next(iter(v)) for n, v in values.items() if len(v) == 1}


def plot(result: DemoResult, path: str) -> str:
  """Throughput (both tuners) and InTune's knob values over time, one PNG."""
  # Deferred: optional, from the [bench] extra.
  import matplotlib  # noqa: PLC0415
  matplotlib.use("Agg")
  # Deferred: as above (after use("Agg")).
  from matplotlib import pyplot as plt  # noqa: PLC0415
  colors = {AUTOTUNE: "tab:gray", INTUNE: "tab:blue"}
  fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True,
                                    gridspec_kw={"height_ratios": [3, 2]})
  seen = set()
  for r in result.runs:
    if r.windows:
      t, v = zip(*r.windows)
      label = None if r.tuner in seen else (
          "autotune" if r.tuner == AUTOTUNE else f"intune ({result.policy})")
      seen.add(r.tuner)
      top.plot(t, v, color=colors[r.tuner], label=label, linewidth=1.2)
    top.axvspan(r.start, r.start + result.warmup, color="#eeeeee", zorder=0)
    top.hlines(r.rows_per_s, r.start + result.warmup,
               r.start + result.warmup + result.seconds,
               color=colors[r.tuner], linestyle="--", linewidth=1.0)
  top.set(ylabel="rows/s trained", ylim=(0, None),
          title=f"model.fit, tiny DLRM, Criteo L{result.level}, batch "
          f"{result.batch_size}: AUTOTUNE vs InTune, interleaved\n(grey: "
          "warm-up, not measured; dashed: mean of the measured part)\n"
          + cache_line(result.summary()[INTUNE]["cache"]).split(" (")[0])
  top.legend(loc="lower right", fontsize=8)
  every = sorted({k for r in result.runs for _, values in r.knobs
                  for k in values})
  labels = knob_labels(every, result.level)
  # Knobs that never moved are named in the title, not drawn on each other.
  fixed = constant_knobs(result.by_tuner(INTUNE))
  names = [n for n in every if n not in fixed]
  cmap = plt.get_cmap("tab10")
  for i, name in enumerate(names):
    for j, r in enumerate(result.by_tuner(INTUNE)):
      pts = [(t, values[name]) for t, values in r.knobs if name in values]
      if not pts:
        continue
      pts.append((r.start + result.warmup + result.seconds, pts[-1][1]))
      t, v = zip(*pts)
      bottom.step(t, v, where="post", color=cmap(i % 10),
                  label=labels[name] if j == 0 else None)
  for r in result.by_tuner(AUTOTUNE):
    bottom.axvspan(r.start, r.start + result.warmup + result.seconds,
                   color="#f2f2f2", zorder=0)
  unchanged = ", ".join(f"{labels[n]} {v:g}" for n, v in sorted(
      fixed.items(), key=lambda item: labels[item[0]]))
  bottom.set(xlabel="seconds", ylabel="InTune knob value",
             title="InTune's knobs at each tuning step (grey: AUTOTUNE "
             "runs; TF does not expose AUTOTUNE's choices)" +
             (f"\nunchanged in every run: {unchanged}" if unchanged else ""))
  if names:
    bottom.legend(loc="upper left", fontsize=8, ncol=min(5, len(names)))
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return path


def main(args) -> int:
  """`intune demo`: runs, prints the table, writes the PNG and JSON."""
  try:
    check_arguments(args.minutes, args.repeats, args.level, args.policy)
  except ValueError as e:
    print(f"intune demo: {e}")
    return 2
  problem = keras_problem()
  if problem:
    print(f"intune demo: {problem}")
    return 2
  print(f"InTune demo: model.fit of a tiny DLRM on the Criteo L{args.level} "
        f"pipeline, AUTOTUNE vs InTune, interleaved; {host.usable_cpus()} "
        f"CPUs, TF {tf.__version__}, ~{args.minutes:g} min of runs.")
  result = run(args.minutes, repeats=args.repeats, policy=args.policy,
               level=args.level, batch_size=args.batch_size, rows=args.rows,
               ceiling_seconds=args.ceiling_seconds)
  s = result.summary()
  print()
  print(f"data: {result.data}")
  print("single-threaded stage costs, us/row: " + ", ".join(
            f"{k} {v * 1e6:.2f}" for k, v in
            result.stage_seconds_per_row.items()))
  teardown = statistics.median(r.returned - r.stopped for r in result.runs)
  print(f"{len(result.runs) // 2} interleaved runs per tuner, "
        f"{result.warmup:.1f} s warm-up + {result.seconds:.1f} s measured "
        f"each (median {teardown:.1f} s from stop to fit's return)")
  print()
  print(table(result))
  print(cache_line(s[INTUNE]["cache"]))
  print()
  paired = s[INTUNE]["median_paired_ratio"]
  print(f"InTune changed {s[INTUNE]['knob_changes']} knob values; median of "
        "paired ratios (intune/autotune, run i against run i): " +
        (f"{paired:.2f}" if paired else "-"))
  print("Peak buffered MB is InTune's own count of the pipeline's buffers; "
        "AUTOTUNE does not expose one, so the last column (whole process, "
        "model included) is the comparable one.")
  os.makedirs(args.out, exist_ok=True)
  png = plot(result, os.path.join(args.out, "demo.png"))
  with open(os.path.join(args.out, "demo.json"), "w") as f:
    json.dump({"summary": s, **dataclasses.asdict(result)}, f, indent=1,
              default=float)
  print(f"plot: {png}")
  print(f"figures: {os.path.join(args.out, 'demo.json')}")
  return 0


def add_parser(subparsers, helps: Mapping[str, str]) -> None:
  p = subparsers.add_parser(
      "demo", help=helps["demo"])
  p.add_argument("--minutes", type=arguments.positive_float,
                 default=DEFAULT_MINUTES,
                 help="Total minutes of timed runs, both tuners (default "
                 f"{DEFAULT_MINUTES:g}; setup adds ~1 min). 0.3 is a quick "
                 "look.")
  p.add_argument("--repeats", type=arguments.positive_int,
                 default=DEFAULT_REPEATS,
                 help=f"Runs per tuner, interleaved (default "
                 f"{DEFAULT_REPEATS}).")
  p.add_argument("--policy", default=None,
                 help="InTune policy (default: IntuneOptions' default).")
  p.add_argument("--level", type=int, choices=(3, 4, 5), default=4,
                 help="Criteo pipeline level, 3-5 (default 4).")
  p.add_argument("--batch-size", type=arguments.positive_int, default=4096,
                 help="Rows per batch (default 4096).")
  p.add_argument("--rows", type=arguments.positive_int, default=200_000,
                 help="Rows of the synthetic set when there is no real "
                 "sample (default 200,000).")
  p.add_argument("--ceiling-seconds", type=arguments.duration,
                 default=2.0,
                 help="Seconds per prefix pipeline when measuring the "
                 "ceiling (default 2).")
  p.add_argument("--out", type=arguments.output_folder,
                 default=os.path.join("out", "demo"),
                 help="Directory of demo.png and demo.json (default "
                 "out/demo).")
  p.set_defaults(func=main)
