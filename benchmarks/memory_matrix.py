"""The RAM budget across pipeline shapes: what the guard counts and holds.

For each case below, a pipeline of large elements is read for `--seconds`
by a training-like consumer (a 2 ms step per element, as if waiting for an
accelerator, and a 0.3 s pause after every 400 MB, as for a checkpoint),
once with InTune under a 64 MB budget and a greedy policy (`manual`, every
buffer knob asked for 64 elements and every parallelism knob for its
maximum right after the first element: the guard alone holds the budget),
and once as
plain tf.data AUTOTUNE (the option off: no budget). Each run is a fresh
Python process, so its resident set starts clean; the two variants are
interleaved, `--repeats` times.

Printed per case (medians over repeats unless said): the most bytes the
guard counted in any repeat (`TuningSession.counters()["peak_buffered_bytes"]`,
summed over the sessions: taken where a bounded interleave admits a record,
and by the guard's 5 ms rounds) against the budget (per session, so twice
it for two iterators), whether a guard round counted more than the budget
(`guard_over_budget`), the peak growth of the process's resident
set over its size before the first iterator (sampled every 5 ms) under
InTune and under AUTOTUNE, the share of the consumer's time spent waiting
for input under each, and the MB/s the consumer got (bytes over the whole
run, steps and pauses included) under each, with the median of paired
ratios: the bar is that no case starves, InTune at least 0.8x. The last
column is the paired ratio of the MB/s while reading (time inside
`next()` only): how fast buffered elements drain in a burst, which the
budget bounds by design.

Cases: `prefetch`; `parallel map`; `shuffle` (8 elements) before a
prefetch; `cache` (16 elements, 128 MB, in memory) then `repeat`;
`interleave, inner shuffle` (4 inputs, each a map and a `shuffle(4)`);
`interleave_buffer 256` (a parallel interleave of 256 KB serialized
records with `interleave_buffer=256`); `two iterators` (the prefetch
pipeline read through two live iterators at once: a set `ram_budget` is per
session); `element > budget` (128 MB elements).

`--hog N` runs N busy-loop processes beside the whole benchmark, so that
the guard's thread and the pipeline's compete for the CPU.

Run: `python benchmarks/memory_matrix.py [--repeats 3] [--seconds 6]
[--hog 2]`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from intune_tf import arguments

MB = 1 << 20
BUDGET = 64 * MB
ELEMENT = 8 * MB
RECORD = 256 * 1024
BURST_BYTES = 400 * MB
PAUSE_S = 0.3
DEFAULT_STEP_MS = 2.0
GREEDY_BUFFER = 64
CASES = ("prefetch", "parallel map", "shuffle", "cache",
         "interleave, inner shuffle", "interleave_buffer 256", "two iterators",
         "element > budget")
VARIANTS = ("intune", "autotune")


def _pipeline(case: str):
  """(dataset, element bytes, IntuneOptions fields beyond the budget)."""
  import tensorflow as tf  # noqa: PLC0415
  autotune = tf.data.AUTOTUNE

  def fill(size: int):
    return lambda i: tf.fill([size // 4], tf.cast(i, tf.float32))

  endless = tf.data.Dataset.range(10**9)
  if case in ("prefetch", "two iterators"):
    return endless.map(fill(ELEMENT)).prefetch(autotune), ELEMENT, {}
  if case == "parallel map":
    return endless.map(fill(ELEMENT), num_parallel_calls=autotune), ELEMENT, {}
  if case == "shuffle":
    return (endless.map(fill(ELEMENT)).shuffle(8, seed=1).prefetch(autotune),
            ELEMENT, {})
  if case == "cache":
    return (tf.data.Dataset.range(16).map(fill(ELEMENT)).cache().repeat()
            .prefetch(autotune), ELEMENT, {})
  if case == "interleave, inner shuffle":
    return tf.data.Dataset.range(4).interleave(
        lambda i: endless.map(fill(ELEMENT)).shuffle(4, seed=1),
        cycle_length=4, num_parallel_calls=autotune).prefetch(autotune), \
        ELEMENT, {}
  if case == "interleave_buffer 256":
    record = lambda i: tf.io.serialize_tensor(fill(RECORD)(i))
    return tf.data.Dataset.range(8).interleave(
        lambda i: endless.map(record), cycle_length=4,
        num_parallel_calls=autotune).prefetch(autotune), RECORD, {
            "interleave_buffer": 256}
  if case == "element > budget":
    return endless.map(fill(2 * BUDGET)).prefetch(autotune), 2 * BUDGET, {}
  raise ValueError(f"unknown case {case!r}; valid: {CASES}")


def _rss() -> int:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _greedy(session) -> None:
  """Asks for every buffer knob at 64 elements and every parallelism knob at
  its maximum: only the guard keeps the budget."""
  values = {}
  for knob in session.knobs():
    if knob.kind == "buffer_size":
      values[knob.name] = min(knob.max, GREEDY_BUFFER)
    elif knob.kind == "parallelism":
      values[knob.name] = knob.max
  if values:
    session.set(values)


def child(case: str, variant: str, seconds: float, step_s: float) -> dict:
  """One run in this process; the figures as a dict."""
  import intune_tf  # noqa: PLC0415
  ds, element, fields = _pipeline(case)
  ds = intune_tf.tune(
      ds, intune_tf.IntuneOptions(ram_budget=BUDGET, policy="manual",
                                  warm_start=False, **fields)
      if variant == "intune" else False)
  base = _rss()
  peak, stop = [base], threading.Event()

  def sample():
    while not stop.is_set():
      peak[0] = max(peak[0], _rss())
      time.sleep(0.005)

  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  iterators = [iter(ds) for _ in range(2 if case == "two iterators" else 1)]
  for it in iterators:
    next(it)
  if variant == "intune":
    for it in iterators:
      _greedy(intune_tf.session_of(it))
  burst = max(1, BURST_BYTES // element)
  n, waiting = 0, 0.0
  began = time.monotonic()
  end = began + seconds
  while time.monotonic() < end:
    for _ in range(burst):
      start = time.monotonic()
      next(iterators[n % len(iterators)])
      waiting += time.monotonic() - start
      n += 1
      if step_s:
        time.sleep(step_s)
    time.sleep(PAUSE_S)
  elapsed = time.monotonic() - began
  stop.set()
  sampler.join()
  result = {"mb_per_s": n * element / MB / elapsed,
            "read_mb_per_s": n * element / MB / waiting,
            "waiting": waiting / elapsed, "rss_growth": peak[0] - base}
  if variant == "intune":
    counters = [intune_tf.session_of(it).counters() for it in iterators]
    result["guard_peak"] = sum(c["peak_buffered_bytes"] for c in counters)
    result["over_budget"] = sum(c["guard_over_budget"] for c in counters)
  return result


def _run_child(case: str, variant: str, seconds: float, step_s: float,
               cwd: str) -> dict:
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  out = subprocess.run(
      [sys.executable, os.path.abspath(__file__), "--child", case, variant,
       str(seconds), str(step_s)], capture_output=True, text=True, check=False,
      cwd=cwd, env=env, timeout=600)
  if out.returncode != 0:
    raise RuntimeError(f"{case} / {variant} failed ({out.returncode}):\n"
                       f"{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def _start_hogs(n: int) -> list[subprocess.Popen]:
  """N processes that each keep a CPU busy until terminated."""
  return [subprocess.Popen([sys.executable, "-c", "while True: pass"])
          for _ in range(n)]


def _step_ms(text: str) -> float:
  """The --step-ms flag: finite milliseconds, 0 or more."""
  value = float(text)
  if not (math.isfinite(value) and value >= 0):
    raise ValueError(f"{text!r} is not a step; pass finite milliseconds, 0 "
                     "or more.")
  return value


def main(repeats: int, seconds: float, step_ms: float, hogs: int) -> None:
  runs = {(c, v): [] for c in CASES for v in VARIANTS}
  busy = _start_hogs(hogs)
  try:
    with tempfile.TemporaryDirectory() as cwd:
      for _ in range(repeats):
        for case in CASES:
          for variant in VARIANTS:
            runs[case, variant].append(
                _run_child(case, variant, seconds, step_ms / 1e3, cwd))
  finally:
    for hog in busy:
      hog.terminate()
      hog.wait()
  med = lambda case, variant, key: statistics.median(
      r[key] for r in runs[case, variant])
  print(f"Budget {BUDGET // MB} MB, greedy policy; {repeats} interleaved "
        f"repeats of {seconds:g} s, medians; consumer: a {step_ms:g} ms "
        f"step per element, a {PAUSE_S} s pause every {BURST_BYTES // MB} "
        f"MB; {hogs} busy-loop processes beside it")
  print("| case | guard peak MB, most of runs | budget MB | over budget | "
        "RSS growth MB, InTune | RSS growth MB, AUTOTUNE | waiting, InTune | "
        "waiting, AUTOTUNE | MB/s, InTune | MB/s, AUTOTUNE | "
        "InTune / AUTOTUNE | while reading: InTune / AUTOTUNE |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|")
  paired = lambda case, key: statistics.median(
      i[key] / a[key]
      for i, a in zip(runs[case, "intune"], runs[case, "autotune"]))
  for case in CASES:
    over = sum(r["over_budget"] > 0 for r in runs[case, "intune"])
    most = max(r["guard_peak"] for r in runs[case, "intune"])
    sessions = 2 if case == "two iterators" else 1
    print(f"| {case} | {most / MB:.1f} | {sessions * BUDGET // MB} | "
          f"{over} of {repeats} runs | "
          f"{med(case, 'intune', 'rss_growth') / MB:.0f} | "
          f"{med(case, 'autotune', 'rss_growth') / MB:.0f} | "
          f"{med(case, 'intune', 'waiting'):.0%} | "
          f"{med(case, 'autotune', 'waiting'):.0%} | "
          f"{med(case, 'intune', 'mb_per_s'):.0f} | "
          f"{med(case, 'autotune', 'mb_per_s'):.0f} | "
          f"{paired(case, 'mb_per_s'):.2f}x | "
          f"{paired(case, 'read_mb_per_s'):.2f}x |")


if __name__ == "__main__":
  if len(sys.argv) > 1 and sys.argv[1] == "--child":
    print(json.dumps(child(sys.argv[2], sys.argv[3], float(sys.argv[4]),
                           float(sys.argv[5]))))
  else:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=arguments.positive_int, default=3)
    parser.add_argument("--seconds", type=arguments.duration, default=6.0)
    parser.add_argument("--hog", type=arguments.non_negative_int, default=0,
                        help="busy-loop processes to run beside the "
                        "benchmark (default 0)")
    parser.add_argument("--step-ms", type=arguments.parsed_by(_step_ms, "step"),
                        default=DEFAULT_STEP_MS,
                        help="the consumer's step per element, ms (0: it "
                        "reads each burst at once)")
    args = parser.parse_args()
    main(args.repeats, args.seconds, args.step_ms, args.hog)
