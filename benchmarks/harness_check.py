"""The harness costs nothing that matters: its `autotune` run against a plain
`for` loop over the same pipeline, interleaved, medians of repeats.
Run: `python benchmarks/harness_check.py [scenario] [repeats] [seconds]`.
"""

import statistics
import sys

from intune_tf.bench import harness
from intune_tf.bench import meter as meter_lib
from intune_tf.bench import scenarios


def plain_loop(scenario, warmup, seconds):
  return meter_lib.pull(iter(scenario.make(None)), seconds, warmup,
                        lambda _: scenario.rows_per_element).rows_per_s


def main(name=scenarios.DEFAULT, repeats=5, seconds=10.0, warmup=3.0):
  scenario = scenarios.get(name)
  h = harness.Harness(seconds=seconds, warmup=warmup)
  loop, bench = [], []
  for _ in range(int(repeats)):
    loop.append(plain_loop(scenario, warmup, seconds))
    bench.append(h.run(scenario, "autotune", 0).rows_per_s)
  ratios = [b / a for a, b in zip(loop, bench)]
  print(f"{name}, {repeats} interleaved repeats of {seconds:.0f} s after "
        f"{warmup:.0f} s warm-up, rows/s")
  print("| measurement | median | min | max |")
  print("|---|---|---|---|")
  for label, values in (("plain for loop", loop), ("harness autotune", bench)):
    print(f"| {label} | {statistics.median(values):,.0f} | {min(values):,.0f} "
          f"| {max(values):,.0f} |")
  print(f"harness / plain: ratio of medians "
        f"{statistics.median(bench) / statistics.median(loop):.3f}, median of "
        f"paired ratios {statistics.median(ratios):.3f}")


if __name__ == "__main__":
  main(*(sys.argv[1:2]), *(float(a) for a in sys.argv[2:]))
