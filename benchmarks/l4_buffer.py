"""Criteo L4 (batch 4096): does the size of the last prefetch buffer matter?

On 2 CPUs every parallel stage of L4 is bounded to 2 threads
(`mdp.knob_bounds`), so the searches and `intune` differ live only in the
buffer of the last prefetch (plumber sets it to 64 at once; the others move
it by 1 and 5). This holds the threads at 2 and each buffer size fixed
(policy "manual"), interleaved (every second repeat in reverse order),
`repeats` times: 2 s warm-up, then `seconds` measured with a plain `next()`
loop. Prints each run's rows/s and process CPU time per row, then the
median rows/s per size and the median of the per-repeat ratios to the
first size.
Run: `python benchmarks/l4_buffer.py [seconds] [repeats] [sizes]`
(defaults 6, 8, "6,64").
"""

import statistics
import sys
import time

import intune_tf
from intune_tf.bench import meter as meter_lib
from intune_tf.bench import scenarios


def run(scenario: scenarios.Scenario, size: int,
        seconds: float) -> tuple[float, float]:
  """(rows/s, CPU us/row) with the last prefetch buffer held at `size`."""
  it = iter(intune_tf.tune(scenario.make(None),
                           intune_tf.IntuneOptions(policy="manual",
                                                   cache=False)))
  session = intune_tf.session_of(it)
  session.set({k.name: size for k in session.knobs()
               if k.name.endswith("buffer_size")})
  meter_lib.pull(it, 2.0)
  cpu = time.process_time()
  meter = meter_lib.pull(it, seconds,
                         rows_of=lambda _: scenario.rows_per_element)
  per_row = (time.process_time() - cpu) / max(1, meter.rows) * 1e6
  return meter.rows_per_s, per_row


def main(seconds: float = 6.0, repeats: int = 8, sizes: str = "6,64"):
  scenario = scenarios.get("criteo-l4-b4096")
  chosen = [int(s) for s in sizes.split(",")]
  rates: dict[int, list[float]] = {s: [] for s in chosen}
  for i in range(int(repeats)):
    for size in chosen if i % 2 == 0 else chosen[::-1]:
      rows_per_s, per_row = run(scenario, size, seconds)
      rates[size].append(rows_per_s)
      print(f"buffer {size}: {rows_per_s:,.0f} rows/s, {per_row:.2f} us/row",
            flush=True)
  first = rates[chosen[0]]
  for size, values in rates.items():
    ratio = statistics.median(v / f for v, f in zip(values, first))
    print(f"buffer {size}: median {statistics.median(values):,.0f} rows/s "
          f"(min {min(values):,.0f}, max {max(values):,.0f}); median of "
          f"paired ratios to buffer {chosen[0]}: {ratio:.3f}")


if __name__ == "__main__":
  main(*(float(a) for a in sys.argv[1:3]), *sys.argv[3:4])
