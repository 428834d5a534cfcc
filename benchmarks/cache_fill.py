"""The filling epoch: epoch 1 with `IntuneOptions(cache=True)` against
`cache=False`, pipeline only (no model), interleaved in one process.

Each run reads its own hard link of one TFRecord file (60,000
`tf.train.Example` rows: 13 floats, 26 ids, a label), so that its cache key is
new and its cache starts empty. Pipelines (`--kinds`), where InTune caches:

- `map_batch`: read, `parse_single_example` map, batch 256: after the batch;
- `batch_map`: read, batch 256, `parse_example` map: after the map;
- `row_shuffle`: read, parse map, reshuffled shuffle, batch: one element per
  row, after the map.

Prints, per pipeline and epoch, the wall and process CPU seconds (medians)
and the median of the on/off ratios paired within a repeat.

Run: `python benchmarks/cache_fill.py [--reps 9] [--epochs 1]
[--kinds map_batch,batch_map,row_shuffle] [--policy manual]`.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time

import numpy as np
import tensorflow as tf

import intune_tf
from intune_tf import arguments

AUTOTUNE = tf.data.AUTOTUNE
ROWS = 60_000
SPEC = {"dense": tf.io.FixedLenFeature([13], tf.float32),
        "ids": tf.io.FixedLenFeature([26], tf.int64),
        "label": tf.io.FixedLenFeature([], tf.int64)}


def _write(path: str, rows: int) -> None:
  rng = np.random.default_rng(0)
  with tf.io.TFRecordWriter(path) as writer:
    for i in range(rows):
      feature = {
          "dense": tf.train.Feature(float_list=tf.train.FloatList(
              value=rng.random(13).tolist())),
          "ids": tf.train.Feature(int64_list=tf.train.Int64List(
              value=rng.integers(0, 1 << 20, 26).tolist())),
          "label": tf.train.Feature(int64_list=tf.train.Int64List(
              value=[i % 2])),
      }
      writer.write(tf.train.Example(features=tf.train.Features(
          feature=feature)).SerializeToString())


def _features(f):
  features = {"dense": tf.math.log1p(f["dense"]), "ids": f["ids"] % 1000}
  return features, f["label"]


def _build(kind: str, path: str) -> tf.data.Dataset:
  ds = tf.data.TFRecordDataset(path)
  if kind == "map_batch":
    ds = ds.map(lambda r: _features(tf.io.parse_single_example(r, SPEC)),
                num_parallel_calls=AUTOTUNE).batch(256)
  elif kind == "batch_map":
    ds = ds.batch(256).map(lambda r: _features(tf.io.parse_example(r, SPEC)),
                           num_parallel_calls=AUTOTUNE)
  elif kind == "row_shuffle":
    ds = ds.map(lambda r: _features(tf.io.parse_single_example(r, SPEC)),
                num_parallel_calls=AUTOTUNE).shuffle(2048).batch(256)
  else:
    raise ValueError(kind)
  return ds.prefetch(AUTOTUNE)


def _epoch(ds) -> tuple[float, float]:
  start, cpu = time.perf_counter(), time.process_time()
  for _ in ds:
    pass
  return time.perf_counter() - start, time.process_time() - cpu


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--kinds", default="map_batch,batch_map,row_shuffle")
  parser.add_argument("--reps", type=arguments.positive_int, default=9)
  parser.add_argument("--epochs", type=arguments.positive_int, default=1)
  parser.add_argument("--policy", default=None,
                      help="InTune policy (default: IntuneOptions' default).")
  args = parser.parse_args(argv)
  kinds = args.kinds.split(",")
  extra = {"policy": args.policy} if args.policy else {}
  work = tempfile.mkdtemp(prefix="cache-fill-")
  source = os.path.join(work, "rows.tfrecord")
  _write(source, ROWS)
  runs = 0

  def tuned(kind: str, cache: bool, path: str):
    return intune_tf.tune(_build(kind, path), cache=cache, warm_start=False,
                          **extra)

  # Warm-up: functions traced, threads started.
  for kind in kinds:
    for cache in (False, True):
      runs += 1
      path = os.path.join(work, f"run-{runs}.tfrecord")
      os.link(source, path)
      _epoch(tuned(kind, cache, path))
  gc.collect()
  results = {}
  for rep in range(args.reps):
    for kind in kinds:
      for cache in ((False, True) if rep % 2 == 0 else (True, False)):
        runs += 1
        path = os.path.join(work, f"run-{runs}.tfrecord")
        os.link(source, path)  # its own key: an empty cache
        ds = tuned(kind, cache, path)
        times = [_epoch(ds) for _ in range(args.epochs)]
        del ds
        gc.collect()
        results.setdefault((kind, cache), []).append(times)
  for kind in kinds:
    on, off = results[(kind, True)], results[(kind, False)]
    for e in range(args.epochs):
      for k, what in ((0, "wall"), (1, "CPU")):
        ratios = [a[e][k] / b[e][k] for a, b in zip(on, off)]
        print(f"{kind} epoch {e + 1} {what}: on "
              f"{statistics.median(r[e][k] for r in on):.3f} s, off "
              f"{statistics.median(r[e][k] for r in off):.3f} s, on/off "
              f"median of paired ratios {statistics.median(ratios):.3f} "
              f"[{' '.join(f'{x:.2f}' for x in ratios)}]", flush=True)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
