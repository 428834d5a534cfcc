"""What a one-epoch job pays for a cache that holds its epoch: one epoch of
the image pipeline of `cache_image.py`, read without a model, each run in a
fresh process (so no run reuses memory another freed), interleaved:

- `off`: `intune_tf.tune(..., cache=False)`;
- `intune cache`: `intune_tf.tune(..., cache=True)`;
- `hand .cache()`: AUTOTUNE with TF's `.cache()` right after the decode.

Prints, per variant, the medians of wall seconds, user and system CPU
seconds, minor page faults (`getrusage`) and peak RSS (`VmHWM`), and each
one's median ratio to `off`, paired within a repeat.

Run: `python benchmarks/cache_pages.py [--images 2000] [--repeats 5]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from intune_tf import arguments

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ("off", "intune cache", "hand .cache()")
FIGURES = ("wall", "user", "sys", "minflt", "peak_rss_mb")

# One epoch in this process; prints one JSON line of its figures.
CHILD = r"""
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
import tensorflow as tf
import intune_tf
import cache_image
folder, variant = sys.argv[2], sys.argv[3]
paths = sorted(os.path.join(folder, p) for p in os.listdir(folder))
ds = cache_image.pipeline(paths, [0] * len(paths), 224, 64,
                          hand_cache=variant == "hand .cache()")
if variant != "hand .cache()":
  ds = intune_tf.tune(ds, cache=variant == "intune cache")
for _ in tf.data.Dataset.range(3).map(lambda x: x + 1):  # TF's first-use costs
  pass
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
for _ in ds:
  pass
t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
# VmHWM, not ru_maxrss: the latter keeps the parent's peak across exec.
with open("/proc/self/status") as f:
  hwm_kb = next(int(l.split()[1]) for l in f if l.startswith("VmHWM:"))
print(json.dumps({"wall": t1 - t0, "user": r1.ru_utime - r0.ru_utime,
                  "sys": r1.ru_stime - r0.ru_stime,
                  "minflt": r1.ru_minflt - r0.ru_minflt,
                  "peak_rss_mb": hwm_kb / 1024}))
"""


def _one(folder: str, variant: str) -> dict:
  done = subprocess.run([sys.executable, "-c", CHILD, HERE, folder, variant],
                        capture_output=True, text=True, check=False)
  lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
  if done.returncode or not lines:
    raise SystemExit(f"cache_pages.py: the {variant!r} run failed:\n"
                     f"{done.stderr[-2000:]}")
  return json.loads(lines[-1])


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--images", type=arguments.positive_int, default=2000,
                      help="JPEG files of 320x320 (default 2,000).")
  parser.add_argument("--repeats", type=arguments.positive_int, default=5,
                      help="Interleaved repeats (default 5).")
  args = parser.parse_args(argv)
  # Deferred: cache_image imports TensorFlow, which only the children need
  # beyond writing the files.
  from intune_tf.bench import workloads  # noqa: PLC0415
  folder = tempfile.mkdtemp(prefix="intune-pages-")
  jpegs, _ = workloads.jpeg_images(count=args.images, size=320)
  for i, jpeg in enumerate(jpegs):
    with open(os.path.join(folder, f"{i:06d}.jpg"), "wb") as f:
      f.write(jpeg)
  runs = {v: [] for v in VARIANTS}
  for repeat in range(args.repeats):
    order = VARIANTS[repeat % 3:] + VARIANTS[:repeat % 3]
    for variant in order:
      runs[variant].append(_one(folder, variant))
      print(f"  repeat {repeat + 1}/{args.repeats} {variant}: "
            f"{runs[variant][-1]}", flush=True)
  print(f"\none epoch of {args.images:,} JPEGs, a fresh process per run, "
        f"{args.repeats} interleaved repeats (medians; x: paired ratio to "
        "off):\n")
  print("| variant | " + " | ".join(FIGURES) + " |")
  print("|---" * (len(FIGURES) + 1) + "|")
  for variant in VARIANTS:
    cells = []
    for k in FIGURES:
      value = statistics.median(r[k] for r in runs[variant])
      ratio = statistics.median(a[k] / b[k] for a, b in
                                zip(runs[variant], runs["off"]))
      shown = f"{value:,.0f}" if k in ("minflt", "peak_rss_mb") else (
          f"{value:.2f}")
      cells.append(f"{shown} ({ratio:.2f}x)")
    print(f"| {variant} | " + " | ".join(cells) + " |")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
