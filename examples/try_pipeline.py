"""A pipeline to run `intune try` on: `intune try
examples/try_pipeline.py:make_dataset`.

Text rows are parsed and turned into features (deterministic: the same
every epoch), then shuffled, then given random noise, then batched. InTune's
cache holds the parsed features, below the shuffle, so epochs 2 and later
skip the parse.
"""

import tensorflow as tf

ROWS = 5_000
FIELDS = 16


def _line(i):
  """A text row of FIELDS comma-separated numbers made from `i`."""
  values = tf.strings.as_string(
      (tf.range(FIELDS, dtype=tf.int64) * 7919 + i) % 1000)
  return tf.strings.reduce_join(values, separator=",")


def _features(line):
  """Parses a row and derives features from it (costs CPU, deterministic)."""
  fields = tf.io.decode_csv(line, [[0.0]] * FIELDS)
  x = tf.stack(fields)
  for _ in range(4):
    x = tf.math.log1p(tf.abs(tf.sin(x) * 100.0))
  return x


def make_dataset() -> tf.data.Dataset:
  return (tf.data.Dataset.range(ROWS)
          .map(_line, num_parallel_calls=tf.data.AUTOTUNE)
          .map(_features, num_parallel_calls=tf.data.AUTOTUNE)
          .shuffle(1_000)
          .map(lambda x: x + tf.random.normal([FIELDS], stddev=0.01))
          .batch(256)
          .prefetch(tf.data.AUTOTUNE))
