"""`IntuneCallback`: InTune in Keras `model.fit`.

    model.fit(intune_tf.keras.tune(ds), epochs=3,
              callbacks=[intune_tf.keras.IntuneCallback()])

The callback attaches to the tuning session of the dataset that `fit`
iterates, reports the model's step time to the observation (the paper's
model-latency factor), can drive one tuning step every N batches instead of
the background thread, and adds `intune/...` entries to the logs (so they
show in `History`, the progress bar and TensorBoard).
"""

from __future__ import annotations

import re
import time
from typing import Any

from absl import logging
import keras
import tensorflow as tf

import intune_tf
from intune_tf import observation as observation_lib
from intune_tf import tuner as tuner_lib
from intune_tf.options import IntuneOptions


def tune(dataset: tf.data.Dataset, **fields: Any) -> tf.data.Dataset:
  """Returns `dataset` with `experimental_intune` on (fields of
  `IntuneOptions`, defaults otherwise)."""
  options = tf.data.Options()
  options.experimental_intune = IntuneOptions(**fields) if fields else True
  return dataset.with_options(options)


def _short(name: str) -> str:
  """'ParallelMapV2(id:5)/parallelism' -> 'ParallelMapV2_5_parallelism'."""
  return re.sub(r"\(id:(\d+)\)/", r"_\1_", name)


def rows_per_element(stats) -> float | None:
  """Rows in one output element: the first batching stage's input elements
  per output element (None when the pipeline does not batch)."""
  by_name = {s.name: s for s in stats}
  for s in stats:
    if re.match(r"(Parallel)?Batch|MapAndBatch|PaddedBatch", s.name) and (
        s.elements and s.inputs and s.inputs[0] in by_name):
      return by_name[s.inputs[0]].elements / s.elements
  return None


class IntuneCallback(keras.callbacks.Callback):
  """Connects `model.fit` to the InTune session of its training dataset.

  Args:
    drive_every: run one tuning step every this many training batches, in
      the training loop, instead of on the background thread. Default None:
      the background thread tunes at `IntuneOptions.period_s`.
    log_dir: also write the InTune scalars as TensorBoard summaries here.
      Default None.
    log_every: add InTune entries to the batch logs every this many batches
      (they are always added to the epoch logs). Default 50.
  """

  def __init__(self, drive_every: int | None = None, log_dir: str | None = None,
               log_every: int = 50):
    super().__init__()
    if drive_every is not None and (not isinstance(drive_every, int) or
                                    drive_every < 1):
      raise ValueError(f"drive_every must be a positive int or None, got "
                       f"{drive_every!r}.")
    self.drive_every = drive_every
    self.log_dir = log_dir
    self.log_every = max(1, int(log_every))
    self._reset()

  def _reset(self) -> None:
    self.session: intune_tf.Session | None = None
    self._known: set[int] = set()
    self._batch = 0
    self._batch_start = None
    self._warned = False
    self._writer = None
    self._last = None  # (time, elements)
    self._latest: dict[str, float] | None = None
    self._knob_values: dict[str, float] = {}

  # --- attaching -----------------------------------------------------------
  def on_train_begin(self, logs=None):
    if self.session is not None and self.drive_every:
      tuner_lib.global_tuner().release(self.session.id)
    self._reset()
    self._known = {s.id for s in intune_tf.sessions()}
    if self.log_dir:
      try:
        import tensorboard  # pylint: disable=g-import-not-at-top,unused-import
      except ImportError:
        raise ImportError("IntuneCallback(log_dir=...) writes TensorBoard "
                          "scalars and needs the tensorboard package: pip "
                          "install tensorboard.") from None
      self._writer = tf.summary.create_file_writer(self.log_dir)

  def on_epoch_begin(self, epoch, logs=None):
    # A new epoch creates a new iterator, so a new session.
    if self.session is not None and not self.session.alive:
      if self.drive_every:
        tuner_lib.global_tuner().release(self.session.id)
      self.session = None

  def _attach(self) -> None:
    if self.session is not None:
      return
    new = [s for s in intune_tf.sessions() if s.id not in self._known]
    if not new:
      if not self._warned:
        logging.warning(
            "IntuneCallback: the data model.fit iterates is not tuned by "
            "InTune (no dataset with tf.data.Options().experimental_intune; "
            "numpy arrays and generators are not). Wrap the dataset with "
            "intune_tf.keras.tune(dataset). Training goes on untuned.")
        self._warned = True
      return
    self.session = new[-1]
    self._known.update(s.id for s in new)
    if self.drive_every:
      tuner_lib.global_tuner().drive(self.session.id)

  # --- per batch -----------------------------------------------------------
  def on_train_batch_begin(self, batch, logs=None):
    self._batch_start = time.perf_counter()

  def on_train_batch_end(self, batch, logs=None):
    if self._batch_start is not None:
      observation_lib.report_step_time(time.perf_counter() - self._batch_start)
    self._batch += 1
    self._attach()
    if self.session is None:
      return
    try:
      if self.drive_every and self._batch % self.drive_every == 0:
        tuner_lib.global_tuner().step_session(self.session.id)
      if self._batch % self.log_every == 0 or self._latest is None:
        self._latest = self._metrics()
        if logs is not None:
          logs.update(self._latest)
    except intune_tf.SessionGoneError:
      self.session = None

  def on_epoch_end(self, epoch, logs=None):
    # The figures seen while the epoch ran: at its end the exhausted input
    # stages have already left the pipeline's model.
    metrics = self._latest
    if metrics is None:
      return
    if logs is not None:
      logs.update(metrics)
    if self._writer is not None:
      with self._writer.as_default():
        for key, value in metrics.items():
          tf.summary.scalar(key, value, step=epoch)
      self._writer.flush()

  def on_train_end(self, logs=None):
    if self.session is not None and self.drive_every:
      tuner_lib.global_tuner().release(self.session.id)
    if self._writer is not None:
      self._writer.close()

  def _metrics(self) -> dict[str, float]:
    counters = self.session.counters()
    stats = self.session.stats()
    now = time.monotonic()
    elements = counters["elements"]
    rate = 0.0
    if self._last is not None and now > self._last[0]:
      rate = (elements - self._last[1]) / (now - self._last[0])
    self._last = (now, elements)
    rows = rows_per_element(stats) or 1.0
    metrics = {"intune/rows_per_s": rate * rows,
               "intune/buffered_bytes": float(counters["buffered_bytes"])}
    # Stages leave the model when their input is exhausted (near the end of
    # an epoch): report the last value seen of every knob of the epoch.
    for knob in self.session.knobs():
      self._knob_values[f"intune/{_short(knob.name)}"] = knob.value
    metrics.update(self._knob_values)
    return metrics
