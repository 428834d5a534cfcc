"""Overhead of the option under a fixed configuration.

The same pipeline with fixed parallelism and buffers, read with and without
`experimental_intune` (policy "manual", no inserted prefetch, so the stages
are identical), interleaved, medians of repeats. Throughput and CPU per row
carry this machine's noise; the CPU of the option's own threads, as a share
of the process's, is a direct reading of what the option adds beside the
root op's per-element bookkeeping.
Run: `python benchmarks/overhead.py [repeats] [seconds]`.
"""

import os
import sys
import threading
import time

from _common import busy_udf
from _common import calibrate
from _common import median
from _common import rate
from _common import single_threaded_ops
from _common import with_intune
import psutil
import tensorflow as tf


def pipeline(size):
  ds = tf.data.Dataset.range(10**9).map(busy_udf(size), num_parallel_calls=2)
  ds = ds.batch(32).map(lambda x: x * 2, num_parallel_calls=1).prefetch(2)
  return single_threaded_ops(ds)


def option_threads_cpu() -> float:
  """CPU-seconds used so far by the option's own threads: the tuner and
  status threads (Python, by name) and the budget guard (C++, by its OS
  thread name)."""
  ids = {t.native_id for t in threading.enumerate()
         if t.name.startswith("intune")}
  for task in os.listdir("/proc/self/task"):
    try:
      with open(f"/proc/self/task/{task}/comm") as f:
        if f.read().startswith("intune"):
          ids.add(int(task))
    except OSError:
      pass  # the thread ended
  return sum(t.user_time + t.system_time for t in psutil.Process().threads()
             if t.id in ids)


def main(repeats: int = 7, seconds: float = 3.0):
  size = calibrate(0.05)  # ~50 us per element: per-element overhead shows
  variants = {
      "plain": pipeline(size),
      "intune": with_intune(pipeline(size), policy="manual",
                            insert_prefetch=False),
  }
  results = {name: [] for name in variants}
  cpu = {name: [] for name in variants}
  own_cpu, intune_cpu = 0.0, 0.0
  for _ in range(repeats):
    for name, ds in variants.items():  # interleaved: A B A B ...
      it = iter(ds)
      rate(it, 0.5)  # warm-up
      cpu0, own0 = time.process_time(), option_threads_cpu()
      rows_per_s = rate(it, seconds) * 32
      # Process CPU-seconds per row: robust to other load on the machine.
      cpu[name].append((time.process_time() - cpu0) / (rows_per_s * seconds))
      if name == "intune":
        own_cpu += option_threads_cpu() - own0
        intune_cpu += time.process_time() - cpu0
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
  print(f"the option's own threads (tuner, status, budget guard) used "
        f"{own_cpu:.2f} of {intune_cpu:.1f} CPU-seconds of the intune runs: "
        f"{own_cpu / intune_cpu:.2%} (OS per-thread times, 10 ms ticks)")
  ratios = [b / a for a, b in zip(results["plain"], results["intune"])]
  print(f"intune / plain: median of paired ratios {median(ratios):.3f} "
        f"(min {min(ratios):.3f}, max {max(ratios):.3f}); ratio of medians "
        f"{median(results['intune']) / median(results['plain']):.3f}")


if __name__ == "__main__":
  main(*(float(a) if i else int(a) for i, a in enumerate(sys.argv[1:])))
