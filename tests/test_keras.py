"""The Keras callback in real model.fit runs."""

from absl import logging
import keras
import numpy as np
import pytest
import tensorflow as tf

import intune_tf
import intune_tf.keras as intune_keras


def _data(n=2048):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(n, 8)).astype("float32")
  y = (x[:, :4].sum(axis=1) > 0).astype("float32")
  return x, y


def _dataset(x, y):
  ds = tf.data.Dataset.from_tensor_slices((x, y)).map(
      lambda a, b: (a * 1.0, b), num_parallel_calls=tf.data.AUTOTUNE)
  return ds.batch(64).prefetch(tf.data.AUTOTUNE)


def _model():
  model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, "relu"),
                            keras.layers.Dense(1, "sigmoid")])
  model.compile("adam", "binary_crossentropy")
  return model


def test_rows_per_element_from_stats():
  S = intune_tf.StageStats
  stats = [S("Prefetch(id:1)", 10, 0, 0, 0, 0, 0, {}, ("BatchV2(id:2)",)),
           S("BatchV2(id:2)", 10, 0, 0, 0, 0, 0, {}, ("Range(id:3)",)),
           S("Range(id:3)", 640, 0, 0, 0, 0, 0, {}, ())]
  # 640 rows in, 10 batches out: 64 rows per element.
  assert intune_keras.rows_per_element(stats) == 64


@pytest.mark.slow
def test_fit_logs_intune_metrics_and_drives_the_tuner(tmp_path):
  x, y = _data()
  ds = intune_keras.tune(_dataset(x, y), policy="even")
  callback = intune_keras.IntuneCallback(drive_every=1, log_every=5,
                                         log_dir=str(tmp_path / "tb"))
  history = _model().fit(ds, epochs=3, verbose=0, callbacks=[callback])
  keys = set(history.history)
  assert "intune/rows_per_s" in keys and "intune/buffered_bytes" in keys
  knob_keys = [k for k in keys if k.endswith("parallelism")]
  assert knob_keys
  assert all(v > 0 for v in history.history["intune/rows_per_s"][1:])
  # drive_every=1: the even policy set the parallel stage to 1 per CPU share.
  assert history.history[knob_keys[0]][-1] >= 1
  assert list((tmp_path / "tb").iterdir())
  # Reusable: a second fit with the same instance attaches again.
  history = _model().fit(ds, epochs=1, verbose=0, callbacks=[callback])
  assert "intune/rows_per_s" in history.history


def test_numpy_input_warns_and_trains(monkeypatch):
  warnings = []
  monkeypatch.setattr(logging, "warning", lambda *a, **k: warnings.append(a))
  x, y = _data(256)
  history = _model().fit(x, y, epochs=1, verbose=0,
                         callbacks=[intune_keras.IntuneCallback()])
  assert "loss" in history.history
  assert len([w for w in warnings if "not tuned by InTune" in str(w)]) == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_bad_drive_every(bad):
  with pytest.raises(ValueError, match="drive_every"):
    intune_keras.IntuneCallback(drive_every=bad)
