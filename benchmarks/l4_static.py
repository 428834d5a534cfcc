"""Criteo L4 (batch 4096): what each of InTune's pipeline changes is worth.

Runs AUTOTUNE, a fixed configuration set through the InTune root (policy
"fixed") and the shipped agent (policy "intune", cold start), interleaved,
`repeats` times: 3 s warm-up, then `seconds` measured with a plain `next()`
loop. The fixed configuration runs three ways: as TF would run it (the
interleave's per-element datasets recorded in the model,
`inner_stats=True`, and TF's 3-result interleave buffers,
`interleave_buffer=None`), with the bookkeeping dropped, and with both
changes (the defaults); the agent runs with and without the deeper
interleave buffers.
Prints per run rows/s, process CPU time per row (which other load on the
machine barely changes) and context switches per row (all the process's
threads, from /proc), then per variant the median rows/s, the median of the
per-repeat ratios to AUTOTUNE, and the medians of the other two.
The fixed configuration is 2 threads for batch, interleave, parse map and
features map, and a prefetch of 4.
Run: `python benchmarks/l4_static.py [seconds] [repeats]`.
"""

import glob
import sys
import time

import numpy as np

import intune_tf
from intune_tf.bench import meter as meter_lib
from intune_tf.bench import scenarios

_FEATURES = "Prefetch.ParallelMapV2"
_PARSE = f"{_FEATURES}.ParallelMapV2"
_BATCH = f"{_PARSE}.ParallelBatch"
_FIXED = {f"{_BATCH}/parallelism": 2.0,
          f"{_BATCH}.Shuffle.ParallelInterleaveV4/parallelism": 2.0,
          f"{_PARSE}/parallelism": 2.0,
          f"{_FEATURES}/parallelism": 2.0,
          "Prefetch/buffer_size": 4.0}
_TF_BUFFERS = {"interleave_buffer": None}
_FIXED_POLICY = {"policy": "fixed", "config": _FIXED}
# Variant name -> IntuneOptions fields (None: plain AUTOTUNE).
VARIANTS = {
    "autotune": None,
    "fixed 2-2-2-2/4, inner stats, TF's interleave buffers": {
        **_FIXED_POLICY, "inner_stats": True, **_TF_BUFFERS},
    "fixed 2-2-2-2/4, TF's interleave buffers": {**_FIXED_POLICY,
                                                 **_TF_BUFFERS},
    "fixed 2-2-2-2/4": _FIXED_POLICY,
    "intune, TF's interleave buffers": _TF_BUFFERS,
    "intune": {},
}


def context_switches() -> int:
  """Voluntary and involuntary context switches of all this process's
  threads so far."""
  total = 0
  for path in glob.glob("/proc/self/task/*/status"):
    try:
      with open(path) as f:
        total += sum(int(line.split()[1]) for line in f
                     if "ctxt_switches" in line)
    except OSError:  # The thread ended meanwhile.
      pass
  return total


def measure(scenario, fields, seconds: float) -> tuple[float, float, float]:
  """(rows/s, process CPU-seconds per row, context switches per row)."""
  ds = scenario.make(None)
  if fields is not None:
    ds = intune_tf.tune(ds, warm_start=False, cache=False, **fields)
  it = iter(ds)
  meter_lib.pull(it, 3.0)
  cpu, switches = time.process_time(), context_switches()
  meter = meter_lib.pull(it, seconds,
                         rows_of=lambda _: scenario.rows_per_element)
  rows = meter.counts * scenario.rows_per_element
  return (meter.rows_per_s, (time.process_time() - cpu) / rows,
          (context_switches() - switches) / rows)


def main(seconds: float = 8.0, repeats: int = 4):
  scenario = scenarios.get("criteo-l4-b4096")
  results = {name: [] for name in VARIANTS}
  for repeat in range(repeats):
    for name, fields in VARIANTS.items():
      rate, per_row, switches = measure(scenario, fields, seconds)
      results[name].append((rate, per_row, switches))
      print(f"repeat {repeat + 1} {name}: {rate:,.0f} rows/s, "
            f"{per_row * 1e6:.2f} us CPU/row, {switches:.3f} switches/row",
            flush=True)
  base = np.array([r[0] for r in results["autotune"]])
  print("\n| variant | rows/s (median) | vs autotune (median of paired "
        "ratios) | CPU per row (median) | context switches per row "
        "(median) |\n|---|---|---|---|---|")
  for name, runs in results.items():
    rates, cpu, switches = np.array(runs).T
    print(f"| {name} | {np.median(rates):,.0f} | "
          f"{np.median(rates / base):.2f}x | {np.median(cpu) * 1e6:.2f} us | "
          f"{np.median(switches):.2f} |")


if __name__ == "__main__":
  main(*(float(a) if i == 0 else int(a) for i, a in enumerate(sys.argv[1:])))
