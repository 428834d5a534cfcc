"""`intune demo`: a pipeline's knobs and throughput moving live.

Builds a two-UDF pipeline (no data to download), iterates it under InTune and
moves its knobs through a few configurations while it runs, printing the
throughput of each and the knob values in force.
"""

from __future__ import annotations

import time

import tensorflow as tf
from tqdm import tqdm

import intune_tf
from intune_tf import host
from intune_tf import policies

_ROWS_PER_BATCH = 256


def busy_udf(size: int, rounds: int = 3):
  """A map function costing CPU in proportion to `size * rounds` (stateless
  random numbers, `rounds` of sin and cumsum), returning its input."""
  def udf(x):
    v = tf.random.stateless_uniform([size], seed=tf.stack([x, x + 1]))
    for _ in range(rounds):
      v = tf.math.cumsum(tf.sin(v))
    return x + tf.cast(tf.reduce_sum(v) * 0.0, tf.int64)
  return udf


def pipeline(size: int = 6000) -> tf.data.Dataset:
  """range -> parse (AUTOTUNE) -> batch -> features (AUTOTUNE) -> prefetch."""
  ds = tf.data.Dataset.range(10**12)
  ds = ds.map(busy_udf(size), num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(_ROWS_PER_BATCH)
  ds = ds.map(lambda b: b * 2 + 1, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.prefetch(tf.data.AUTOTUNE)
  options = tf.data.Options()
  options.threading.max_intra_op_parallelism = 1
  options.experimental_intune = intune_tf.IntuneOptions(policy="manual",
                                                        name="demo")
  return ds.with_options(options)


def _measure(iterator, seconds: float) -> float:
  n, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    next(iterator)
    n += 1
  return n * _ROWS_PER_BATCH / (time.perf_counter() - start)


def _short(name: str) -> str:
  stage, _, kind = name.rpartition("/")
  return f"{stage.split('(')[0]}{stage[stage.find('('):]}.{kind}"


def run(seconds_per_phase: float = 4.0) -> list[tuple[str, float, dict]]:
  """Runs the demo; returns (phase, rows/s, knob values) per phase."""
  it = iter(pipeline())
  next(it)
  session = intune_tf.sessions()[-1]
  knobs = session.knobs()
  parallel = [k for k in knobs if k.kind == "parallelism"]
  buffers = [k for k in knobs if k.kind == "buffer_size"]
  cpus = host.usable_cpus()
  even = dict(zip([k.name for k in parallel],
                  policies.even_split(cpus, len(parallel))))
  phases = [
      ("unoptimized: 1 thread per stage, no buffers",
       {**{k.name: 1 for k in parallel}, **{k.name: 0 for k in buffers}}),
      (f"even split of {cpus} CPUs", even),
      ("all CPUs to the first UDF",
       {parallel[0].name: parallel[0].max,
        **{k.name: 1 for k in parallel[1:]}}),
      ("back to unoptimized",
       {**{k.name: 1 for k in parallel}, **{k.name: 0 for k in buffers}}),
  ]
  results = []
  for label, config in tqdm(phases, desc="demo phases", unit="phase"):
    session.set({name: float(min(max(value, k.min), k.max))
                 for k in session.knobs() for name, value in config.items()
                 if k.name == name})
    _measure(it, 0.5)  # settle
    rows = _measure(it, seconds_per_phase)
    results.append((label, rows, {k.name: k.value for k in session.knobs()}))
  return results


def main(args=None) -> int:
  seconds = getattr(args, "seconds", 4.0)
  print(f"InTune demo: a tf.data pipeline tuned live on {host.usable_cpus()} "
        "CPUs (TF " + tf.__version__ + ")")
  results = run(seconds)
  base = results[0][1]
  names = list(results[0][2])  # pipeline order, input first
  print()
  print("| phase | rows/s | vs unoptimized | " +
        " | ".join(_short(n) for n in names) + " |")
  print("|---" * (3 + len(names)) + "|")
  for label, rows, values in results:
    print(f"| {label} | {rows:,.0f} | {rows / base:.2f}x | " +
          " | ".join(f"{values.get(n, float('nan')):g}" for n in names) + " |")
  return 0


def add_parser(subparsers) -> None:
  p = subparsers.add_parser("demo", help="Show a pipeline tuned live.")
  p.add_argument("--seconds", type=float, default=4.0,
                 help="Seconds measured per phase (default 4).")
  p.set_defaults(func=main)
