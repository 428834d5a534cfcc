"""User module of the example pipeline: the Criteo input pipeline and the
Trainer's `run_fn`.

`input_fn` is what `IntuneTuner` tunes and what `run_fn` trains on: both
build the pipeline the same way, from `intune_tf.tfx.read_records`, so the
tuned configuration finds its stages again in the Trainer.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from intune_tf import criteo
from intune_tf import tfx as intune_tfx
import intune_tf.keras

BATCH_SIZE = 256
NUM_DENSE = 13
NUM_SPARSE = 26
NUM_BUCKETS = 1000
HISTORY_FILE = "intune_history.json"

_SPEC = {
    "label": tf.io.FixedLenFeature([], tf.float32),
    "dense": tf.io.FixedLenFeature([NUM_DENSE], tf.float32),
    "sparse": tf.io.FixedLenFeature([NUM_SPARSE], tf.int64),
}


def _parse(serialized: tf.Tensor):
  parsed = tf.io.parse_example(serialized, _SPEC)
  return {"dense": parsed["dense"], "sparse": parsed["sparse"]}, parsed["label"]


def _transform(features, label):
  # The usual online feature work: signed log of the counts, hashing of the
  # categorical ids (missing, -1, to its own bucket).
  dense = tf.sign(features["dense"]) * tf.math.log1p(tf.abs(features["dense"]))
  sparse = tf.where(features["sparse"] < 0,
                    tf.constant(NUM_BUCKETS - 1, tf.int64),
                    tf.math.floormod(features["sparse"], NUM_BUCKETS - 1))
  return {"dense": dense, "sparse": sparse}, label


def input_fn(records: tf.data.Dataset, batch_size: int) -> tf.data.Dataset:
  """Serialized `tf.train.Example`s -> `({"dense", "sparse"}, label)` batches.

  Args:
    records: the split's serialized examples (`intune_tf.tfx.read_records`).
    batch_size: rows per batch.

  Returns:
    The batches; the parallel stages and the prefetch are left on
    `tf.data.AUTOTUNE`, so InTune tunes them.
  """
  ds = records.shuffle(4 * batch_size, seed=0)
  ds = ds.batch(batch_size, drop_remainder=True)
  ds = ds.map(_parse, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.map(_transform, num_parallel_calls=tf.data.AUTOTUNE)
  return ds.prefetch(tf.data.AUTOTUNE)


def run_fn(fn_args) -> None:
  """Trains a tiny DLRM on the tuned input pipeline.

  Args:
    fn_args: the Trainer's `FnArgs`; `custom_config` may set "batch_size"
      and "epochs" (defaults 256 and 1).
  """
  config = fn_args.custom_config or {}
  batch_size = int(config.get("batch_size", BATCH_SIZE))
  epochs = int(config.get("epochs", 1))
  train = input_fn(intune_tfx.read_records(fn_args.train_files, repeat=True),
                   batch_size)
  # Starts every training iterator at the IntuneTuner's configuration.
  train = intune_tfx.apply_tuned_config(train, fn_args)
  evaluation = input_fn(intune_tfx.read_records(fn_args.eval_files,
                                                repeat=True), batch_size)
  model = criteo.dlrm(criteo.DLRMConfig(
      num_buckets=NUM_BUCKETS, embedding_dim=4, bottom_mlp=(8,), top_mlp=(8,),
      log_dense=False))
  history = model.fit(
      train, epochs=epochs,
      steps_per_epoch=max(1, fn_args.train_steps // epochs),
      validation_data=evaluation, validation_steps=fn_args.eval_steps,
      # drive_every: a tuning step in the training loop every 10 batches, so
      # the tuned values are in force (and logged) even when the whole run
      # lasts less than one period of the background tuner.
      callbacks=[intune_tf.keras.IntuneCallback(log_every=10, drive_every=10)],
      verbose=2)
  tf.io.gfile.makedirs(fn_args.model_run_dir)
  with tf.io.gfile.GFile(os.path.join(fn_args.model_run_dir, HISTORY_FILE),
                         "w") as f:
    f.write(json.dumps({k: [float(x) for x in v]
                        for k, v in history.history.items()}, indent=1))
  model.export(fn_args.serving_model_dir, verbose=False)
