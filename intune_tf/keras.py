"""`IntuneCallback`: InTune in Keras `model.fit`.

    model.fit(intune_tf.keras.tune(ds), epochs=3,
              validation_data=val_ds,
              callbacks=[intune_tf.keras.IntuneCallback()])

The callback attaches to the tuning session of the dataset that `fit`
iterates for training (validation datasets are tuned by their own sessions
and not reported), reports the model's step time to the observation (the
paper's model-latency factor), can drive one tuning step every N batches
instead of the background thread, and adds `intune/...` entries to the logs
(so they show in `History`, the progress bar and a `TensorBoard` callback
placed after it). At the end of training it saves the tuned configuration
for the next run (warm start). One instance can serve several `fit` calls.
"""

from __future__ import annotations

import re
import time
from typing import NamedTuple

from absl import logging
import keras
import tensorflow as tf

import intune_tf
from intune_tf import records
from intune_tf.agent import warmstart
from intune_tf.live import observation as observation_lib
from intune_tf.live import tuner as tuner_lib
from intune_tf.service import consumer as service_consumer
from intune_tf.tfdata.hooks import tune  # noqa: F401  intune_tf.keras.tune, as documented

# Seconds between two readings of the session (counters and knobs): each
# reading costs a few TF op calls (~0.5-1.5 ms each on this machine), so
# reading at every batch of a fast model would show in its throughput.
READ_PERIOD_S = 0.25

_NOT_TUNED = (
    "IntuneCallback: the data model.fit iterates for training is not tuned "
    "by InTune: no iterator with tf.data.Options().experimental_intune was "
    "created (numpy arrays, Python generators and datasets without the "
    "option are not tuned). Wrap the dataset with "
    "intune_tf.keras.tune(dataset). Training goes on untuned; no intune/* "
    "metrics are logged.")


def short_name(name: str) -> str:
  """A knob name as a log key part (`intune_tf.records.log_key`): the same
  in every epoch, since knob names are.

  Example: 'Prefetch.ParallelMapV2/parallelism' ->
  'Prefetch.ParallelMapV2/parallelism';
  'ParallelInterleaveV4[*].ParallelMapV2/parallelism' ->
  'ParallelInterleaveV4-each.ParallelMapV2/parallelism'.
  """
  return records.log_key(name)


_short = short_name  # The name used before; kept for callers.


def rows_per_element(stats) -> float | None:
  """Rows in one output element: the first batching stage's input elements
  per output element (None when the pipeline does not batch or the batching
  stage has not produced yet)."""
  by_name = {s.name: s for s in stats}
  for s in stats:
    if re.match(r"(Parallel)?Batch|MapAndBatch|PaddedBatch",
                records.parse_stage(s.name).op) and (
                    s.elements and s.inputs and s.inputs[0] in by_name):
      return by_name[s.inputs[0]].elements / s.elements
  return None


class TracePoint(NamedTuple):
  """One reading of the session during `fit`."""
  seconds: float  # since the start of training
  epoch: int
  session: int  # the session's id
  rows_per_s: float  # since the previous reading of the same session
  knobs: dict[str, float]


class IntuneCallback(keras.callbacks.Callback):
  """Connects `model.fit` to the InTune session of its training dataset.

  Put it before a `keras.callbacks.TensorBoard` callback in `callbacks` so
  that TensorBoard sees the `intune/*` entries.

  Logged entries (batch logs as they are read, epoch logs for the epoch):
    intune/rows_per_s: rows (batch elements times rows per element) the
      pipeline delivered per second; over the epoch in epoch logs.
    intune/buffered_bytes: bytes held in the pipeline's buffers (last
      reading; the mean of the epoch's readings in epoch logs).
    intune/peak_buffered_bytes: the session's peak of buffered bytes.
    intune/<knob>: every knob's value (last reading), by knob name
      (`short_name`), e.g. "intune/Prefetch.ParallelMapV2/parallelism": the
      same keys in every epoch.
    intune/cache_bytes, intune/cache_served, intune/cache_saved_s: while
      InTune's cache is placed (`TuningSession.cache()["state"]` is
      `CacheState.PLACED`), the bytes it holds, the fraction of the epoch's
      elements it served, and the upstream seconds that saved; last
      reading. None of them when it is declined or off.

  Attributes:
    session: the session attached to (None before the first batch, or when
      the data is not tuned).
    trace: one `TracePoint` (seconds since train begin, epoch, session id,
      rows/s, knob values) per reading, over the whole `fit`; reset at
      `on_train_begin`.
    warm_start_path: the file the warm-start state was saved to at the end
      of training, or None.

  Args:
    drive_every: run one tuning step every this many training batches, in
      the training loop, instead of on the background thread. Default None:
      the background thread tunes at `IntuneOptions.period_s`.
    log_dir: also write the InTune scalars as TensorBoard summaries here,
      one point per epoch. Default None.
    log_every: refresh the `intune/*` entries of the batch logs at least
      every this many batches (they are refreshed at most every
      `READ_PERIOD_S` otherwise, and always added to the epoch logs).
      Default 50.
  """

  def __init__(self, drive_every: int | None = None, log_dir: str | None = None,
               log_every: int = 50):
    super().__init__()
    if drive_every is not None and (isinstance(drive_every, bool) or
                                    not isinstance(drive_every, int) or
                                    drive_every < 1):
      raise ValueError(f"drive_every must be a positive int or None, got "
                       f"{drive_every!r}.")
    if isinstance(log_every, bool) or not isinstance(log_every, int) or (
        log_every < 1):
      raise ValueError(f"log_every must be a positive int, got {log_every!r}.")
    self.drive_every = drive_every
    self.log_dir = log_dir
    self.log_every = log_every
    self.trace: list[TracePoint] = []
    self.warm_start_path: str | None = None
    self.session: intune_tf.TuningSession | None = None
    self._writer = None
    self._reset()

  def _reset(self) -> None:
    self.session = None
    self.trace = []
    self.warm_start_path = None
    self._known: set[int] = set()
    self._batch = 0
    self._epoch = 0
    self._batch_start: float | None = None
    self._warned = False
    self._writer = None
    self._train_start = time.monotonic()
    self._rows_per_element: float | None = None
    self._policy = None
    self._last_read = 0.0
    self._last = None  # (time, elements, get_next_us, batch) at last reading
    self._last_knobs: dict[str, float] = {}
    self._latest: dict[str, float] = {}
    self._knob_values: dict[str, float] = {}
    self._best: tuple[float, dict[str, float]] | None = None  # elements/s
    self._best_session: intune_tf.TuningSession | None = None
    self._epoch_reset()

  def _epoch_reset(self) -> None:
    self._epoch_first = None  # (time, rows) at the epoch's first reading
    self._epoch_last = None   # (time, rows) at the last reading that moved
    self._epoch_rows = 0.0    # rows delivered by sessions gone this epoch
    self._epoch_buffered: list[float] = []

  # --- attaching -----------------------------------------------------------
  def on_train_begin(self, logs=None):
    self._release()
    self._reset()
    self._known = {s.id for s in intune_tf.sessions()}
    if self.log_dir:
      try:
        # Deferred: only checks that it is installed, when log_dir is given.
        import tensorboard  # noqa: F401,PLC0415
      except ImportError:
        raise ImportError("IntuneCallback(log_dir=...) writes TensorBoard "
                          "scalars and needs the tensorboard package: pip "
                          "install tensorboard.") from None
      self._writer = tf.summary.create_file_writer(self.log_dir)

  def on_epoch_begin(self, epoch, logs=None):
    # Without steps_per_epoch every epoch creates a new iterator, so a new
    # session; with it, the iterator (and session) lives on.
    if self.session is not None and not self.session.alive:
      self._detach()
    self._epoch = epoch
    self._epoch_reset()

  def on_test_batch_end(self, batch, logs=None):
    if batch == 0:  # The validation iterator exists now: not ours.
      self._known.update(s.id for s in intune_tf.sessions())

  def on_test_end(self, logs=None):
    self._known.update(s.id for s in intune_tf.sessions())

  def _release(self) -> None:
    if self.session is not None and self.drive_every:
      tuner_lib.global_tuner().release(self.session.id)

  def _detach(self) -> None:
    self._release()
    if self._last is not None:
      self._epoch_rows += self._last[1] * (self._rows_per_element or 1.0)
    self.session = None
    self._last = None
    self._rows_per_element = None

  def _attach(self) -> None:
    new = [s for s in intune_tf.sessions() if s.id not in self._known]
    if not new:
      if not self._warned:
        logging.warning(_NOT_TUNED)
        self._warned = True
      return
    self.session = new[-1]
    self._known.update(s.id for s in new)
    self._last = None
    self._rows_per_element = None
    if self.drive_every:
      tuner_lib.global_tuner().drive(self.session.id)

  # --- per batch -----------------------------------------------------------
  def on_train_batch_begin(self, batch, logs=None):
    self._batch_start = time.perf_counter()

  def on_train_batch_end(self, batch, logs=None):
    now = time.monotonic()
    wall = (time.perf_counter() - self._batch_start
            if self._batch_start is not None else None)
    self._batch += 1
    due = (self._last is None or now - self._last_read >= READ_PERIOD_S or
           self._batch % self.log_every == 0)
    if self.session is None and due and not self._warned:
      self._attach()
    if self.session is None:
      if wall is not None:
        observation_lib.report_step_time(wall)
      return
    try:
      if self.drive_every and self._batch % self.drive_every == 0:
        tuner_lib.global_tuner().step_session(self.session.id)
      if due:
        self._read(now)
      elif wall is not None and self._last is None:
        observation_lib.report_step_time(wall)
    except intune_tf.SessionGoneError:
      self._detach()
    if logs is not None and self._latest:
      logs.update(self._latest)

  def _read(self, now: float) -> None:
    """Reads the session: counters, knobs, rows per element; reports the
    model's step time over the interval since the last reading."""
    counters = self.session.counters()
    if self._rows_per_element is None:
      self._rows_per_element = rows_per_element(self.session.stats())
    rows = self._rows_per_element or 1.0
    knobs = {k.name: k.value for k in self.session.knobs()}
    if self._policy is None:
      self._policy = tuner_lib.global_tuner().policy(self.session.id)
    elements, waited_us = counters["elements"], counters["get_next_time_us"]
    rate = 0.0
    if self._last is not None:
      t0, e0, w0, b0 = self._last
      if now > t0:
        rate = (elements - e0) / (now - t0)
      if self._batch > b0:
        # The model's share of a step: wall time minus the time the training
        # loop waited for the input pipeline, per batch.
        model_s = max(0.0, (now - t0) - (waited_us - w0) * 1e-6)
        observation_lib.report_step_time(model_s / (self._batch - b0))
      if rate > 0 and (self._best is None or rate > self._best[0]):
        self._best = (rate, dict(self._last_knobs))
        self._best_session = self.session
    self._last = (now, elements, waited_us, self._batch)
    self._last_knobs = knobs
    self._last_read = now
    # Per-epoch rows: the sessions of one epoch add up.
    total = self._epoch_rows + elements * rows
    if self._epoch_first is None:
      self._epoch_first = (now, total)
    elif self._epoch_last is None or total > self._epoch_last[1]:
      self._epoch_last = (now, total)
    self._epoch_buffered.append(float(counters["buffered_bytes"]))
    for name, value in knobs.items():
      self._knob_values[f"intune/{short_name(name)}"] = value
    self._latest = {"intune/rows_per_s": rate * rows,
                    "intune/buffered_bytes": float(counters["buffered_bytes"]),
                    "intune/peak_buffered_bytes": float(
                        counters["peak_buffered_bytes"]),
                    **self._knob_values}
    if self.session.options.cache:
      cache = self.session.cache()
      if cache["state"] is records.CacheState.PLACED:
        # InTune's cache (`TuningSession.cache`): bytes held, the share of
        # this epoch's elements it served, the upstream seconds that saved.
        self._latest.update({
            "intune/cache_bytes": float(cache["bytes"]),
            "intune/cache_served": cache["served"],
            "intune/cache_saved_s": cache["saved_s"]})
    self.trace.append(TracePoint(now - self._train_start, self._epoch,
                                 self.session.id, rate * rows, knobs))

  def _epoch_metrics(self) -> dict[str, float]:
    metrics = dict(self._latest)
    if self._epoch_first and self._epoch_last and (
        self._epoch_last[0] > self._epoch_first[0]):
      metrics["intune/rows_per_s"] = (
          (self._epoch_last[1] - self._epoch_first[1]) /
          (self._epoch_last[0] - self._epoch_first[0]))
    if self._epoch_buffered:
      metrics["intune/buffered_bytes"] = (sum(self._epoch_buffered) /
                                          len(self._epoch_buffered))
    return metrics

  def on_epoch_end(self, epoch, logs=None):
    # The figures seen while the epoch ran: at its end the exhausted input
    # stages have already left the pipeline's model.
    if not self._latest:
      return
    metrics = self._epoch_metrics()
    if logs is not None:
      logs.update(metrics)
    if self._writer is not None:
      with self._writer.as_default():
        for key, value in metrics.items():
          tf.summary.scalar(key, value, step=epoch)
      self._writer.flush()

  def on_train_end(self, logs=None):
    self._release()
    if self._writer is not None:
      self._writer.close()
      self._writer = None
    self.warm_start_path = self._save_warm_start()

  def _save_warm_start(self) -> str | None:
    """Saves the best configuration seen, and the agent's fine-tuned
    weights, for the next run of this pipeline."""
    if self._best is None:
      return None
    rate, config = self._best
    try:
      return warmstart.save(self._best_session, config, rate,
                            warmstart.fine_tuned_weights(self._policy))
    except (OSError, ValueError, TypeError) as e:
      logging.warning("IntuneCallback: could not save the warm-start state: "
                      "%s", e)
      return None


class PoolCallback(keras.callbacks.Callback):
  """Adds a tf.data service dispatcher's worker pool to the logs at each
  epoch's end: `intune/pool_size`, `intune/pool_serving`, `intune/pool_lost`
  and `intune/pool_changes` (resizes so far), when the dispatcher reports a
  pool (`intune_tf.service.dispatcher_pool`).

      model.fit(ds, callbacks=[intune_tf.keras.PoolCallback("HOST:PORT")])

  Args:
    dispatcher: the dispatcher's HOST:PORT.
    status_dir: the status dir it writes to. Default None: the default one.
  """

  def __init__(self, dispatcher: str, status_dir: str | None = None):
    super().__init__()
    self.dispatcher = dispatcher
    self.status_dir = status_dir

  def on_epoch_end(self, epoch, logs=None):
    del epoch
    info = service_consumer.dispatcher_pool(self.dispatcher, self.status_dir)
    if info is None or logs is None:
      return
    logs["intune/pool_size"] = info.get("size", 0)
    logs["intune/pool_serving"] = info.get("serving", 0)
    logs["intune/pool_lost"] = info.get("lost", 0)
    logs["intune/pool_changes"] = sum(
        1 for d in info.get("decisions", []) if not d.get("error"))
