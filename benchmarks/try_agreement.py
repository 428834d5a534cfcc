"""`intune try` against `benchmarks/cache.py --pipeline` on one pipeline.

Both measure AUTOTUNE, InTune with `cache=False` and InTune at its defaults
on the same pipeline (`--pipeline FILE.py:FUNCTION`, else a deterministic
map costing about a millisecond an element, before a shuffle): `intune try`
runs each variant in a fresh process, `cache.py` all of them in this one.
Prints each tool's speed-ups over AUTOTUNE (median of paired ratios, least
and most) and whether the two ranges overlap.

Run: `python benchmarks/try_agreement.py [--repeats 3] [--epochs 3]`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from intune_tf import arguments

HERE = os.path.dirname(os.path.abspath(__file__))
PIPELINE = '''
import tensorflow as tf

def heavy(x):
  v = tf.cast(tf.range(20000), tf.float32) * tf.cast(x, tf.float32)
  for _ in range(4):
    v = tf.math.cumsum(tf.sin(v)) / 20000.0
  return v[:8]

def make():
  return (tf.data.Dataset.range(400)
          .map(heavy, num_parallel_calls=tf.data.AUTOTUNE)
          .shuffle(100).batch(8).prefetch(tf.data.AUTOTUNE))
'''
# (intune try's variant, cache.py's variant) measuring the same thing.
PAIRS = (("intune", "intune cache"), ("intune-no-cache", "intune"))


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--pipeline", default=None,
                      help="FILE.py:FUNCTION (default: the built-in one).")
  parser.add_argument("--repeats", type=arguments.positive_int, default=3,
                      help="Interleaved repeats of each tool (default 3).")
  parser.add_argument("--epochs", type=arguments.positive_int, default=3,
                      help="Epochs per run (default 3).")
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory(prefix="intune-try-agreement-") as tmp:
    target = args.pipeline
    if target is None:
      path = os.path.join(tmp, "pipeline.py")
      with open(path, "w") as f:
        f.write(PIPELINE)
      target = path + ":make"
    ours, theirs = (os.path.join(tmp, n) for n in ("try.json", "cache.json"))
    common = ["--repeats", str(args.repeats), "--epochs", str(args.epochs)]
    subprocess.run([sys.executable, "-m", "intune_tf", "try", target,
                    "--json", ours, *common], check=True)
    subprocess.run([sys.executable, os.path.join(HERE, "cache.py"),
                    "--pipeline", target, "--json", theirs, *common],
                   check=True)
    with open(ours) as f:
      tried = json.load(f)
    with open(theirs) as f:
      benched = json.load(f)
  print(f"\n{target}, {args.epochs} epochs, {args.repeats} repeats each\n")
  print("| variant | intune try (fresh processes) | cache.py (one process) "
        "| ranges overlap |")
  print("|---|---|---|---|")
  for mine, other in PAIRS:
    lo, hi = tried["spread"][mine]
    b_lo, b_hi = benched["spread"][other]
    overlap = "yes" if lo <= b_hi and b_lo <= hi else "no"
    print(f"| {mine} | {tried['speedup'][mine]:.2f}x ({lo:.2f}-{hi:.2f}) | "
          f"{benched['speedup'][other]:.2f}x ({b_lo:.2f}-{b_hi:.2f}) | "
          f"{overlap} |")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
