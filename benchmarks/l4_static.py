"""Static configurations of Criteo L4 (batch 4096) against AUTOTUNE.

Runs AUTOTUNE and fixed configurations set through the InTune root (policy
"fixed"), interleaved, `repeats` times: 3 s warm-up, then `seconds` measured
with a plain `next()` loop. Each fixed configuration runs twice: with the
per-element datasets of the interleave recorded in the model, as TF's
AUTOTUNE records them (`inner_stats=True`), and without (the default).
Prints rows/s and process CPU time per row (which other load on the machine
barely changes) per run, then per variant the median rows/s, the median of
the per-repeat ratios to AUTOTUNE, and the median CPU per row.
The configurations are (batch, interleave, parse map, features map threads /
prefetch elements): AUTOTUNE's own choice on this machine 1-1-2-2/4, and 2
threads everywhere with a prefetch of 4.
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
CONFIGS = {"1-1-2-2/4": (1, 1, 2, 2, 4), "2-2-2-2/4": (2, 2, 2, 2, 4)}
VARIANTS = {"autotune": None}
for _name, _values in CONFIGS.items():
  VARIANTS[f"fixed {_name}, inner stats"] = (_values, True)
  VARIANTS[f"fixed {_name}"] = (_values, False)


def measure(scenario, variant, seconds: float) -> tuple[float, float]:
  """(rows/s, process CPU-seconds per row) of one run."""
  ds = scenario.make(None)
  if variant is not None:
    values, inner_stats = variant
    options = tf.data.Options()
    options.experimental_intune = intune_tf.IntuneOptions(
        policy="fixed", config=dict(zip(_KNOBS, map(float, values))),
        inner_stats=inner_stats, warm_start=False)
    ds = ds.with_options(options)
  it = iter(ds)
  start = time.monotonic()
  while time.monotonic() - start < 3.0:
    next(it)
  elements, start, cpu = 0, time.monotonic(), time.process_time()
  while time.monotonic() - start < seconds:
    next(it)
    elements += 1
  rows = elements * scenario.rows_per_element
  return (rows / (time.monotonic() - start),
          (time.process_time() - cpu) / rows)


def main(seconds: float = 8.0, repeats: int = 4):
  scenario = scenarios.get("criteo-l4-b4096")
  rates = {name: [] for name in VARIANTS}
  cpu = {name: [] for name in VARIANTS}
  for repeat in range(repeats):
    for name, variant in VARIANTS.items():
      rate, per_row = measure(scenario, variant, seconds)
      rates[name].append(rate)
      cpu[name].append(per_row)
      print(f"repeat {repeat + 1} {name}: {rate:,.0f} rows/s, "
            f"{per_row * 1e6:.2f} us CPU/row", flush=True)
  base = np.array(rates["autotune"])
  print("\n| configuration | rows/s (median) | vs autotune (median of paired "
        "ratios) | CPU per row (median) |\n|---|---|---|---|")
  for name in VARIANTS:
    paired = float(np.median(np.array(rates[name]) / base))
    print(f"| {name} | {np.median(rates[name]):,.0f} | {paired:.2f}x | "
          f"{np.median(cpu[name]) * 1e6:.2f} us |")


if __name__ == "__main__":
  main(*(float(a) if i == 0 else int(a) for i, a in enumerate(sys.argv[1:])))
