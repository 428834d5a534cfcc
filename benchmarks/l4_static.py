"""Static configurations of Criteo L4 (batch 4096) against AUTOTUNE.

Runs AUTOTUNE and three fixed configurations set through the InTune root
(policy "fixed"), interleaved, `repeats` times: 3 s warm-up, then `seconds`
measured with a plain `next()` loop. Prints rows/s per run and the median of
each configuration relative to AUTOTUNE's median. The configurations are
(batch, interleave, parse map, features map threads / prefetch elements):
AUTOTUNE's own choice 1-1-2-2/4, and 2 threads everywhere with a prefetch of
2 and of 4.
Run: `python benchmarks/l4_static.py [seconds] [repeats]`.
"""

import sys
import time

import numpy as np
import tensorflow as tf

import intune_tf
from intune_tf import scenarios

_KNOBS = ("ParallelBatch(id:4)/parallelism",
          "ParallelInterleaveV4(id:6)/parallelism",
          "ParallelMapV2(id:3)/parallelism",
          "ParallelMapV2(id:2)/parallelism",
          "Prefetch(id:1)/buffer_size")
VARIANTS = {
    "autotune": None,
    "fixed 1-1-2-2/4": (1, 1, 2, 2, 4),
    "fixed 2-2-2-2/2": (2, 2, 2, 2, 2),
    "fixed 2-2-2-2/4": (2, 2, 2, 2, 4),
}


def rows_per_s(scenario, values, seconds: float) -> float:
  ds = scenario.make(None)
  if values is not None:
    options = tf.data.Options()
    options.experimental_intune = intune_tf.IntuneOptions(
        policy="fixed", config=dict(zip(_KNOBS, map(float, values))),
        warm_start=False)
    ds = ds.with_options(options)
  it = iter(ds)
  start = time.monotonic()
  while time.monotonic() - start < 3.0:
    next(it)
  elements, start = 0, time.monotonic()
  while time.monotonic() - start < seconds:
    next(it)
    elements += 1
  return elements * scenario.rows_per_element / (time.monotonic() - start)


def main(seconds: float = 8.0, repeats: int = 4):
  scenario = scenarios.get("criteo-l4-b4096")
  results = {name: [] for name in VARIANTS}
  for repeat in range(repeats):
    for name, values in VARIANTS.items():
      rate = rows_per_s(scenario, values, seconds)
      results[name].append(rate)
      print(f"repeat {repeat + 1} {name}: {rate:,.0f} rows/s", flush=True)
  base = float(np.median(results["autotune"]))
  print("\n| configuration | rows/s (median) | vs autotune |\n|---|---|---|")
  for name, rates in results.items():
    med = float(np.median(rates))
    print(f"| {name} | {med:,.0f} | {med / base:.2f}x |")


if __name__ == "__main__":
  main(*(float(a) if i == 0 else int(a) for i, a in enumerate(sys.argv[1:])))
