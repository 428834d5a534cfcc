"""A pipeline whose map over batches is not row-wise, for `cache.py
--pipeline benchmarks/masked_map.py:pipeline`: TFRecord rows (made once
under the system's temporary folder) shuffled, batched and parsed by a map
that keeps the rows whose label is 1 (`tf.boolean_mask`). InTune's cache
holds the records read; the map runs every epoch, and the cache's reason
names the op that stops the row store."""

import os
import tempfile

import numpy as np
import tensorflow as tf

ROWS = 100_000
_FEATURES = {"label": tf.io.FixedLenFeature([], tf.int64),
             "x": tf.io.FixedLenFeature([16], tf.float32)}


def _files() -> list[str]:
  folder = os.path.join(tempfile.gettempdir(), "intune-masked-map")
  paths = [os.path.join(folder, f"part-{i}.tfrecord") for i in range(4)]
  if all(os.path.exists(p) for p in paths):
    return paths
  os.makedirs(folder, exist_ok=True)
  rng = np.random.default_rng(0)
  for path in paths:
    with tf.io.TFRecordWriter(path + ".tmp") as writer:
      for _ in range(ROWS // len(paths)):
        writer.write(tf.train.Example(features=tf.train.Features(feature={
            "label": tf.train.Feature(int64_list=tf.train.Int64List(
                value=[int(rng.integers(2))])),
            "x": tf.train.Feature(float_list=tf.train.FloatList(
                value=rng.random(16).tolist()))})).SerializeToString())
    os.replace(path + ".tmp", path)
  return paths


def _parse_and_mask(serialized):
  parsed = tf.io.parse_example(serialized, _FEATURES)
  keep = tf.equal(parsed["label"], 1)
  x = tf.math.log1p(tf.abs(parsed["x"])) * tf.sin(parsed["x"])
  return tf.boolean_mask(x, keep), tf.boolean_mask(parsed["label"], keep)


def pipeline() -> tf.data.Dataset:
  """`interleave(TFRecordDataset) -> shuffle -> batch(1024) ->
  map(parse, boolean_mask) -> prefetch`, every parallel stage on
  AUTOTUNE."""
  auto = tf.data.AUTOTUNE
  return (tf.data.Dataset.from_tensor_slices(_files())
          .interleave(tf.data.TFRecordDataset, cycle_length=2,
                      num_parallel_calls=auto)
          .shuffle(8192, seed=0).batch(1024, num_parallel_calls=auto)
          .map(_parse_and_mask, num_parallel_calls=auto).prefetch(auto))
