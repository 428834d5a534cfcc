"""Overhead of the option under a fixed configuration.

The same pipeline with fixed parallelism and buffers, read with and without
`experimental_intune` (policy "manual", no inserted prefetch, so the stages
are identical), interleaved, medians of repeats.
Run: `python benchmarks/overhead.py [repeats] [seconds]`.
"""

import sys
import time

import tensorflow as tf

from _common import busy_udf, calibrate, median, rate, single_threaded_ops
from _common import with_intune


def pipeline(size):
  ds = tf.data.Dataset.range(10**9).map(busy_udf(size), num_parallel_calls=2)
  ds = ds.batch(32).map(lambda x: x * 2, num_parallel_calls=1).prefetch(2)
  return single_threaded_ops(ds)


def main(repeats: int = 7, seconds: float = 3.0):
  size = calibrate(0.05)  # ~50 us per element: per-element overhead shows
  variants = {
      "plain": pipeline(size),
      "intune": with_intune(pipeline(size), policy="manual",
                            insert_prefetch=False),
  }
  results = {name: [] for name in variants}
  cpu = {name: [] for name in variants}
  for _ in range(repeats):
    for name, ds in variants.items():  # interleaved: A B A B ...
      it = iter(ds)
      rate(it, 0.5)  # warm-up
      cpu0 = time.process_time()
      rows_per_s = rate(it, seconds) * 32
      # Process CPU-seconds per row: robust to other load on the machine.
      cpu[name].append((time.process_time() - cpu0) / (rows_per_s * seconds))
      results[name].append(rows_per_s)
      del it
  print(f"fixed configuration, {repeats} interleaved repeats of {seconds:.0f} "
        "s, rows/s")
  print("| variant | median | min | max |")
  print("|---|---|---|---|")
  for name, values in results.items():
    print(f"| {name} | {median(values):.0f} | {min(values):.0f} | "
          f"{max(values):.0f} |")
  print(f"CPU-seconds per row (process time): plain "
        f"{median(cpu['plain']) * 1e6:.2f} us, intune "
        f"{median(cpu['intune']) * 1e6:.2f} us: intune costs "
        f"{(median(cpu['intune']) / median(cpu['plain']) - 1) * 100:+.1f}% CPU "
        "per row")
  ratios = [b / a for a, b in zip(results["plain"], results["intune"])]
  print(f"intune / plain: median of paired ratios {median(ratios):.3f} "
        f"(min {min(ratios):.3f}, max {max(ratios):.3f}); ratio of medians "
        f"{median(results['intune']) / median(results['plain']):.3f}")


if __name__ == "__main__":
  main(*(float(a) if i else int(a) for i, a in enumerate(sys.argv[1:])))
