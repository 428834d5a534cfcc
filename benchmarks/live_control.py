"""Live control: a ~1 ms UDF stage set from parallelism 1 to 2.

Prints the throughput before the call, in 100 ms slices after it, and the
ratio over the first second. Run: `python benchmarks/live_control.py`.
"""

import time

from _common import busy_udf
from _common import calibrate
from _common import rate
from _common import single_threaded_ops
from _common import with_intune
import tensorflow as tf

import intune_tf


def main(repeats: int = 3) -> None:
  size = calibrate(1.0)
  ds = tf.data.Dataset.range(10**9).map(busy_udf(size),
                                        num_parallel_calls=tf.data.AUTOTUNE)
  ds = with_intune(single_threaded_ops(ds), policy="manual")
  print(f"UDF calibrated to ~1 ms of CPU per element (size {size}); "
        f"{len(__import__('os').sched_getaffinity(0))} usable CPUs")
  print("| repeat | p=1 rows/s | p=2 rows/s (first 1 s after the call) | ratio "
        "| first 100 ms slice >= 1.5x at |")
  print("|---|---|---|---|---|")
  for r in range(repeats):
    it = iter(ds)
    next(it)
    session = intune_tf.session_of(it)
    knob = [k for k in session.knobs() if k.kind == "parallelism"][0]
    session.set({knob.name: 1})
    rate(it, 1.0)  # settle
    before = rate(it, 2.0)
    t0 = time.perf_counter()
    session.set({knob.name: 2})
    slices = [rate(it, 0.1) for _ in range(10)]
    after = sum(slices) / len(slices)
    reached = next((f"{(i + 1) * 100} ms" for i, s in enumerate(slices)
                    if s >= 1.5 * before), "never")
    print(f"| {r + 1} | {before:.0f} | {after:.0f} | {after / before:.2f}x "
          f"| {reached} |")
    del it, session, t0


if __name__ == "__main__":
  main()
