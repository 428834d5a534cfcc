"""How fast InTune reaches its steady throughput, cold and warm.

Runs the Criteo L4 (batch 4096) scenario under policy "intune" with an empty
warm-start directory (cold), then again with the state the cold run saved
(warm), `repeats` times, alternating. Throughput is read in 0.5 s windows;
steady state is the median of the last third of the run; convergence time is
the first time the 2 s rolling mean (four windows) reaches 95% of it, so 2 s
is the earliest it can report.
Run: `python benchmarks/convergence.py [repeats] [seconds] [trace.json]`; the
optional JSON gets every run's windows and knob values.
"""

import json
import os
import sys
import tempfile

import numpy as np

from intune_tf.bench import harness as harness_lib
from intune_tf.bench import scenarios


def convergence_s(windows, fraction=0.95):
  """Seconds until the rolling mean first reaches `fraction` of steady."""
  times = np.array([t for t, _ in windows])
  rates = np.array([r for _, r in windows])
  steady = float(np.median(rates[-len(rates) // 3:]))
  rolling = np.convolve(rates, np.ones(4) / 4, mode="valid")
  for i, value in enumerate(rolling):
    if value >= fraction * steady:
      return float(times[i + 3]), steady
  return float("inf"), steady


def main(repeats: int = 3, seconds: float = 90.0, trace: str | None = None):
  scenario = scenarios.get("criteo-l4-b4096")
  results = {"cold": [], "warm": []}
  traces = []
  for r in range(int(repeats)):
    with tempfile.TemporaryDirectory() as warm_dir:
      os.environ["INTUNE_WARMSTART_DIR"] = warm_dir
      for mode in ("cold", "warm"):
        h = harness_lib.Harness(seconds=seconds, warmup=0.0,
                                warm_start=True)
        run = h.run(scenario, "intune", r)
        t, steady = convergence_s(run.windows)
        results[mode].append(t)
        traces.append({"repeat": r, "mode": mode, "seconds_to_95": t,
                       "steady": steady, "windows": run.windows,
                       "knobs": run.knobs})
        print(f"repeat {r} {mode}: 95% of steady ({steady:,.0f} rows/s) "
              f"after {t:.1f} s; saved: {sorted(os.listdir(warm_dir))}",
              flush=True)
  for mode, ts in results.items():
    print(f"{mode}: median {np.median(ts):.1f} s (min {min(ts):.1f}, "
          f"max {max(ts):.1f}) over {len(ts)} runs")
  if trace:
    with open(trace, "w") as f:
      json.dump(traces, f)


if __name__ == "__main__":
  main(*[float(a) for a in sys.argv[1:3]], *sys.argv[3:4])
