"""Throughput of a whole `model.fit`: InTune (option + callback) vs AUTOTUNE.

The tiny DLRM (XLA-compiled, no metric, so the input pipeline dominates)
trains on the Criteo pipeline for a fixed number of steps, once with TF's
AUTOTUNE and once with `experimental_intune` and `IntuneCallback`,
interleaved (A B A B ...). Examples/s is counted over the whole `fit` call
(iterator creation, ramp-up and tuning included); the model is built and
traced once before. Also process CPU-seconds per example, which other load
on the machine affects less. Warm-start files go to a fresh temporary
directory: the first InTune fit starts cold, later ones start from what the
previous fit saved, as a user's repeated job would.

Run: `python benchmarks/fit_throughput.py [--repeats 5] [--steps 100]
[--level 4] [--batch-size 4096] [--policy NAME]`.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time

import tensorflow as tf

import intune_tf
from intune_tf import arguments
from intune_tf import host
from intune_tf.bench import demo
import intune_tf.keras as intune_keras


def _fit(model, ds, steps: int, callbacks) -> tuple[float, float]:
  """(seconds, process CPU-seconds) of one whole `model.fit`."""
  gc.collect()
  cpu0, start = time.process_time(), time.perf_counter()
  model.fit(ds, epochs=1, steps_per_epoch=steps, verbose=0, shuffle=False,
            callbacks=callbacks)
  return time.perf_counter() - start, time.process_time() - cpu0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=arguments.positive_int, default=5,
                      help="Interleaved fits per variant (default 5).")
  parser.add_argument("--steps", type=arguments.positive_int, default=100,
                      help="Training steps per fit (default 100).")
  parser.add_argument("--level",
                      type=arguments.int_in(3, 5, "Criteo pipeline level"),
                      default=4,
                      help="Criteo pipeline level, 3-5 (default 4).")
  parser.add_argument("--batch-size", type=arguments.positive_int, default=4096,
                      help="Rows per batch (default 4096).")
  parser.add_argument("--policy", default=None,
                      help="InTune policy (default: IntuneOptions' default).")
  args = parser.parse_args(argv)
  os.environ["INTUNE_WARMSTART_DIR"] = tempfile.mkdtemp(prefix="intune-ws-")

  files, data = demo.demo_files()
  plain = demo.criteo_dataset(files, args.level, args.batch_size)
  # The tuning alone: benchmarks/cache*.py measure the cache.
  options = (intune_tf.IntuneOptions(policy=args.policy, cache=False)
             if args.policy else intune_tf.IntuneOptions(cache=False))
  tuned = intune_tf.tune(plain, options)
  policy = options.policy
  model = demo.tiny_dlrm()
  # Build and trace the model once, outside the measured fits.
  model.fit(plain, epochs=1, steps_per_epoch=5, verbose=0, shuffle=False)

  examples = args.steps * args.batch_size
  rates = {"autotune": [], "intune": []}
  cpu = {"autotune": [], "intune": []}
  for repeat in range(args.repeats):
    for name in ("autotune", "intune"):  # interleaved: A B A B ...
      if name == "intune":
        seconds, cpu_s = _fit(model, tuned, args.steps,
                              [intune_keras.IntuneCallback()])
      else:
        seconds, cpu_s = _fit(model, plain, args.steps, [])
      rates[name].append(examples / seconds)
      cpu[name].append(cpu_s / examples)
      print(f"repeat {repeat + 1}/{args.repeats} {name}: "
            f"{examples / seconds:,.0f} examples/s ({seconds:.1f} s)",
            flush=True)

  print()
  print(f"model.fit of the tiny DLRM, Criteo L{args.level}, batch "
        f"{args.batch_size}, {args.steps} steps per fit, {args.repeats} "
        f"interleaved repeats; {data}; {host.usable_cpus()} CPUs, TF "
        f"{tf.__version__}, InTune policy {policy!r}")
  print()
  print("| variant | examples/s (median) | min | max | process CPU per "
        "example |")
  print("|---|---|---|---|---|")
  labels = {"autotune": "AUTOTUNE",
            "intune": f"InTune ({policy}) + IntuneCallback"}
  for name, values in rates.items():
    print(f"| {labels[name]} | {statistics.median(values):,.0f} | "
          f"{min(values):,.0f} | {max(values):,.0f} | "
          f"{statistics.median(cpu[name]) * 1e6:.1f} us |")
  paired = [b / a for a, b in zip(rates["autotune"], rates["intune"])]
  print()
  of_medians = (statistics.median(rates["intune"]) /
                statistics.median(rates["autotune"]))
  print(f"intune / autotune: ratio of medians {of_medians:.3f}, "
        f"median of paired ratios {statistics.median(paired):.3f} "
        f"(min {min(paired):.3f}, max {max(paired):.3f})")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
