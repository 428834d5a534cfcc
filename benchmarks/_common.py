"""Pipelines and timing shared by the benchmark scripts."""

from __future__ import annotations

import statistics
import time

import tensorflow as tf

import intune_tf
from intune_tf.bench import demo
from intune_tf.bench import meter as meter_lib

AUTOTUNE = tf.data.AUTOTUNE


def busy_udf(size: int):
  """A map function whose CPU cost grows with `size` (see `calibrate`)."""
  return demo.busy_udf(size, rounds=4)


def single_threaded_ops(ds: tf.data.Dataset) -> tf.data.Dataset:
  """Keeps each UDF on one thread, so parallelism is the stage's knob."""
  options = tf.data.Options()
  options.threading.max_intra_op_parallelism = 1
  return ds.with_options(options)


def calibrate(target_ms: float = 1.0) -> int:
  """The busy_udf size whose single-threaded cost is about `target_ms`."""
  size = 4096
  fn = tf.function(busy_udf(size))
  for _ in range(3):
    fn(tf.constant(1, tf.int64))
  n = 200
  start = time.thread_time()
  for i in range(n):
    fn(tf.constant(i, tf.int64))
  per_ms = (time.thread_time() - start) * 1e3 / n
  return max(256, int(size * target_ms / max(per_ms, 1e-3)))


def with_intune(ds: tf.data.Dataset, **fields) -> tf.data.Dataset:
  """`ds` under InTune, the cache off unless `fields` turn it on: these
  benchmarks measure the tuning; benchmarks/cache*.py measure the cache."""
  fields.setdefault("cache", False)
  return intune_tf.tune(ds, **fields)


def rate(iterator, seconds: float) -> float:
  """Elements per second pulled from `iterator` during `seconds`."""
  return meter_lib.pull(iterator, seconds).rows_per_s


def median(values) -> float:
  return statistics.median(values)
