"""Pipelines and ways of iterating them for `test_conformance.py`.

Every pipeline is a builder that returns a fresh dataset. A run turns what a
way of iterating sees into plain Python values (`Element`), epoch by epoch,
so that a run with `experimental_intune` off and one with it on compare with
`==`, whatever the iteration (eager, inside a `tf.function`, Keras `fit`, a
device copy, tf.data service).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import pathlib
from typing import Any, Callable, Sequence

import keras
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2

import intune_tf

AUTOTUNE = tf.data.AUTOTUNE

# One tensor of an element: (dtype name, shape, values as nested lists).
Component = tuple[str, tuple[int, ...], Any]
# One element: its components, `tf.nest.flatten(..., expand_composites=True)`
# order (a ragged tensor is its flat values and row splits, a sparse tensor
# its indices, values and dense shape).
Element = tuple[Component, ...]
Epoch = list[Element]

# How two runs are compared: element by element, as multisets of elements
# (the user asked for non-determinism, or nothing fixes the order), or as
# multisets of scalar values (non-determinism that also changes how values
# are grouped into elements, e.g. a non-deterministic map before a batch).
ORDERED, MULTISET, LEAVES = "ordered", "multiset", "leaves"


# ---------------------------------------------------------------------------
# Turning elements into plain values.


def _component(dtype: tf.DType, array: np.ndarray) -> Component:
  return (dtype.name, tuple(int(d) for d in array.shape), array.tolist())


def canonical(element: Any) -> Element:
  """The plain-value form of an element seen in eager mode.

  Args:
    element: a (nested) structure of tensors, ragged and sparse tensors.

  Returns:
    One (dtype, shape, values) triple per component.
  """
  return tuple(_component(c.dtype, np.asarray(c))
               for c in tf.nest.flatten(element, expand_composites=True))


def _serialized(element: Any) -> tf.Tensor:
  """Inside a graph: the element as a vector of serialized TensorProtos."""
  return tf.stack([tf.io.serialize_tensor(c) for c in
                   tf.nest.flatten(element, expand_composites=True)])


def _from_serialized(rows: np.ndarray) -> Epoch:
  """Inverse of `_serialized` for a [elements, components] array."""
  epoch = []
  for row in rows:
    element = []
    for blob in row:
      proto = tensor_pb2.TensorProto.FromString(blob)
      element.append(_component(tf.as_dtype(proto.dtype),
                                tf.make_ndarray(proto)))
    epoch.append(tuple(element))
  return epoch


def _leaves(epoch: Epoch) -> collections.Counter:
  out: collections.Counter = collections.Counter()
  for element in epoch:
    for dtype, _, values in element:
      for leaf in np.asarray(values, dtype=object).ravel().tolist():
        out[(dtype, repr(leaf))] += 1
  return out


def _short(value: Any, limit: int = 160) -> str:
  text = repr(value)
  return text if len(text) <= limit else text[:limit] + "..."


def assert_same(plain: Sequence[Epoch], tuned: Sequence[Epoch], compare: str,
                what: str = "") -> None:
  """Asserts that two runs saw the same data, epoch by epoch.

  Args:
    plain: the epochs seen with the option off.
    tuned: the epochs seen with the option on.
    compare: `ORDERED`, `MULTISET` or `LEAVES`.
    what: prefix of the failure message.

  Raises:
    AssertionError: with the first difference.
  """
  assert len(tuned) == len(plain), (
      f"{what}: {len(tuned)} epochs with InTune, {len(plain)} without")
  for n, (p, t) in enumerate(zip(plain, tuned)):
    where = f"{what}: epoch {n}"
    if compare == ORDERED:
      if p == t:
        continue
      first = next((i for i, (a, b) in enumerate(zip(p, t)) if a != b),
                   min(len(p), len(t)))
      raise AssertionError(
          f"{where}: {len(t)} elements with InTune vs {len(p)} without; "
          f"first difference at element {first}: without "
          f"{_short(p[first] if first < len(p) else 'nothing')}, with "
          f"{_short(t[first] if first < len(t) else 'nothing')}")
    if compare == MULTISET:
      a = collections.Counter(map(repr, p))
      b = collections.Counter(map(repr, t))
    else:
      a, b = _leaves(p), _leaves(t)
    if a != b:
      raise AssertionError(
          f"{where}: different {compare} ({sum(b.values())} with InTune vs "
          f"{sum(a.values())} without); only without: "
          f"{_short(list((a - b).elements())[:5])}; only with: "
          f"{_short(list((b - a).elements())[:5])}")


# ---------------------------------------------------------------------------
# Options.


def with_intune(dataset: tf.data.Dataset,
                value: bool | intune_tf.IntuneOptions = True,
                symbolic_checkpoint: bool = False) -> tf.data.Dataset:
  """`dataset` with `experimental_intune = value` (and optionally symbolic
  checkpointing) set through `tf.data.Options`."""
  options = tf.data.Options()
  options.experimental_intune = value
  if symbolic_checkpoint:
    options.experimental_symbolic_checkpoint = True
  return dataset.with_options(options)


def with_tf_options(dataset: tf.data.Dataset, **settings: Any
                    ) -> tf.data.Dataset:
  """`dataset` with tf.data options set by dotted path with `__` for `.`,
  e.g. `threading__private_threadpool_size=2`."""
  options = tf.data.Options()
  for path, value in settings.items():
    *parents, leaf = path.split("__")
    target = options
    for parent in parents:
      target = getattr(target, parent)
    setattr(target, leaf, value)
  return dataset.with_options(options)


# ---------------------------------------------------------------------------
# Was the run tuned?


def _newest_session_id() -> int:
  return max((s.id for s in intune_tf.sessions()), default=-1)


class SessionProbe:
  """Records whether a tuning session newer than the probe exists.

  Called while the first element of a run is in hand, it tells whether that
  run's iterator is under an InTune root (sessions live as long as their
  iterator).
  """

  def __init__(self):
    self._start = _newest_session_id()
    self.calls = 0
    self.tuned = False

  def __call__(self) -> None:
    self.calls += 1
    if any(s.id > self._start for s in intune_tf.sessions()):
      self.tuned = True


# ---------------------------------------------------------------------------
# Ways of iterating. Each returns the epochs seen.


def eager_epochs(dataset: tf.data.Dataset, epochs: int,
                 probe: SessionProbe) -> list[Epoch]:
  """Eager iteration: even epochs with `for`, odd ones with `iter`/`next`."""
  result = []
  for epoch in range(epochs):
    items: Epoch = []
    if epoch % 2 == 0:
      for element in dataset:
        if not items and epoch == 0:
          probe()
        items.append(canonical(element))
    else:
      iterator = iter(dataset)
      while True:
        try:
          element = next(iterator)
        except StopIteration:
          break
        items.append(canonical(element))
    result.append(items)
  return result


def _move_knobs(session: intune_tf.TuningSession, turn: int) -> None:
  """Sets every knob of `session` to a value picked by `turn`: parallelism
  cycles through min, max and the middle; buffers through 1, 2 and 5 (or
  min, min + 1, min + 4 when min > 1; within range). Buffers lowered to 0
  are `test_buffer_lowered_to_zero_keeps_order`'s."""
  values = {}
  for knob in session.knobs():
    lo, hi = int(knob.min), int(knob.max)
    if knob.kind == "parallelism":
      choices = (lo, hi, (lo + hi) // 2)
    else:
      lo = max(lo, 1)
      choices = (lo, min(lo + 1, hi), min(lo + 4, hi))
    values[knob.name] = choices[turn % 3]
  if values:
    session.set(values)


def knob_moving_epochs(dataset: tf.data.Dataset, epochs: int,
                       probe: SessionProbe, every: int = 3) -> list[Epoch]:
  """Eager iteration that moves every knob of the run's session (when it
  has one) every `every` elements, through `TuningSession.set`."""
  result = []
  for _ in range(epochs):
    start = _newest_session_id()
    items: Epoch = []
    session = None
    for n, element in enumerate(dataset):
      items.append(canonical(element))
      if n == 0:
        probe()
        mine = [s for s in intune_tf.sessions() if s.id > start]
        session = mine[-1] if mine else None
      if session is not None and n % every == 0:
        try:
          _move_knobs(session, n // every)
        except intune_tf.SessionGoneError:
          session = None
    result.append(items)
  return result


def _probed_step(i: tf.Tensor, probe: SessionProbe) -> tf.Tensor:
  """`i + 1`, calling `probe` (a py_function) when `i` is 0."""

  def call_probe(value):
    probe()
    return value

  def probed():
    out = tf.py_function(call_probe, [i], tf.int32)
    out.set_shape([])
    return out

  return tf.cond(tf.equal(i, 0), probed, lambda: i) + 1


def _graph_loop(dataset: tf.data.Dataset, probe: SessionProbe,
                style: str = "for") -> tf.Tensor:
  """The body of the tf.functions: iterates `dataset`, collects every
  element serialized, and calls `probe` at the first.

  Args:
    dataset: the dataset.
    probe: called while the first element is in hand.
    style: "for" (`for element in dataset`, AutoGraph), "iter" (`for element
      in iter(dataset)`, AutoGraph over an iterator) or "reduce"
      (`dataset.reduce`).

  Returns:
    A [elements, components] string tensor.
  """
  collected = tf.TensorArray(tf.string, size=0, dynamic_size=True)
  i = tf.constant(0)
  if style == "reduce":
    def step(state, element):
      n, out = state
      return _probed_step(n, probe), out.write(n, _serialized(element))

    _, collected = dataset.reduce((i, collected), step)
    return collected.stack()
  for element in (iter(dataset) if style == "iter" else dataset):
    collected = collected.write(i, _serialized(element))
    i = _probed_step(i, probe)
  return collected.stack()


def captured_function_epochs(dataset: tf.data.Dataset, epochs: int,
                             probe: SessionProbe,
                             style: str = "for") -> list[Epoch]:
  """A tf.function that closes over `dataset` and iterates it (see
  `_graph_loop` for `style`); one call per epoch."""

  @tf.function
  def run():
    return _graph_loop(dataset, probe, style)

  return [_from_serialized(run().numpy()) for _ in range(epochs)]


def argument_function_epochs(dataset: tf.data.Dataset, epochs: int,
                             probe: SessionProbe,
                             style: str = "for") -> list[Epoch]:
  """A tf.function that takes `dataset` as its argument; one call per epoch.

  The function is new for every run: datasets with and without the option
  have the same `DatasetSpec`, so one function would be traced once.
  """
  run = tf.function(lambda ds: _graph_loop(ds, probe, style))
  return [_from_serialized(run(dataset).numpy()) for _ in range(epochs)]


class _Recorder(keras.Model):
  """A model whose train step only records the batches it is given."""

  def __init__(self, probe: SessionProbe):
    super().__init__()
    self.epochs: list[Epoch] = []
    self._probe = probe

  def call(self, inputs):
    return inputs

  def train_step(self, data):
    if not any(self.epochs):
      self._probe()
    self.epochs[-1].append(canonical(data))
    return {"batches": tf.constant(float(len(self.epochs[-1])))}


def keras_epochs(dataset: tf.data.Dataset, epochs: int, probe: SessionProbe,
                 steps_per_epoch: int | None = None) -> list[Epoch]:
  """Keras `model.fit` (run eagerly) with a model that records its input."""
  model = _Recorder(probe)
  model.compile(run_eagerly=True)
  new_epoch = keras.callbacks.LambdaCallback(
      on_epoch_begin=lambda epoch, logs: model.epochs.append([]))
  model.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch,
            callbacks=[new_epoch], shuffle=False, verbose=0)
  return model.epochs


DEVICE_TRANSFORMS: dict[str, Callable[[], Callable]] = {
    "prefetch_to_device": lambda: tf.data.experimental.prefetch_to_device(
        "/cpu:0"),
    "copy_to_device": lambda: tf.data.experimental.copy_to_device("/cpu:0"),
}


def service_epochs(dataset: tf.data.Dataset, target: str, epochs: int,
                   probe: SessionProbe) -> list[Epoch]:
  """tf.data service, `parallel_epochs`: one job per epoch."""
  distributed = dataset.apply(tf.data.experimental.service.distribute(
      processing_mode="parallel_epochs", service=target))
  return eager_epochs(distributed, epochs, probe)


# ---------------------------------------------------------------------------
# Input files.


class Files:
  """Input files of the reader pipelines, written on first use into a test's
  temporary directory."""

  def __init__(self, root: pathlib.Path):
    self.root = pathlib.Path(root)
    self._tfrecords: list[str] | None = None
    self._text: list[str] | None = None
    self._fresh = itertools.count()

  def tfrecords(self) -> list[str]:
    """Three TFRecord files of 17 `tf.train.Example`s each (`id`, `name`)."""
    if self._tfrecords is None:
      self._tfrecords = []
      for f in range(3):
        path = str(self.root / f"examples-{f}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
          for i in range(17):
            n = 100 * f + i
            example = tf.train.Example(features=tf.train.Features(feature={
                "id": tf.train.Feature(
                    int64_list=tf.train.Int64List(value=[n])),
                "name": tf.train.Feature(bytes_list=tf.train.BytesList(
                    value=[f"row {n}".encode()])),
            }))
            writer.write(example.SerializeToString())
        self._tfrecords.append(path)
    return self._tfrecords

  def text(self) -> list[str]:
    """Three text files of 15 lines each, "file <f> line <i> value <n>"."""
    if self._text is None:
      self._text = []
      for f in range(3):
        path = self.root / f"lines-{f}.txt"
        path.write_text("".join(f"file {f} line {i} value {7 * i + f}\n"
                                for i in range(15)))
        self._text.append(str(path))
    return self._text

  def fresh(self, stem: str) -> str:
    """A path not used before (e.g. for a file cache)."""
    return str(self.root / f"{stem}-{next(self._fresh)}")


# ---------------------------------------------------------------------------
# The pipelines.


@dataclasses.dataclass(frozen=True)
class Pipeline:
  """One conformance pipeline.

  Attributes:
    name: test id.
    build: returns a fresh dataset, without the option.
    compare: `ORDERED`, `MULTISET` or `LEAVES`.
    keras: also run it through Keras `fit` (dense elements only).
    device: also run it through `prefetch_to_device` / `copy_to_device`.
    service: also run it through tf.data service.
  """
  name: str
  build: Callable[[Files], tf.data.Dataset]
  compare: str = ORDERED
  keras: bool = False
  device: bool = False
  service: bool = False


def _r(*args: int) -> tf.data.Dataset:
  return tf.data.Dataset.range(*args)


def _f(x: tf.Tensor) -> tf.Tensor:
  return x * 3 + 1


def _py_times(factor: int) -> Callable[[tf.Tensor], tf.Tensor]:
  def fn(x):
    out = tf.py_function(lambda v: v * factor, [x], tf.int64)
    out.set_shape([])
    return out
  return fn


def _np_times(factor: int) -> Callable[[tf.Tensor], tf.Tensor]:
  def fn(x):
    out = tf.numpy_function(lambda v: np.int64(v * factor), [x], tf.int64)
    out.set_shape([])
    return out
  return fn


_FEATURES = {"id": tf.io.FixedLenFeature([], tf.int64),
             "name": tf.io.FixedLenFeature([], tf.string)}


def _squares() -> Any:
  return (i * i for i in range(25))


def _pipelines() -> list[Pipeline]:
  p = Pipeline
  s = tf.strings.as_string
  return [
      # map
      p("map", lambda fs: _r(60).map(_f)),
      p("parallel_map", lambda fs: _r(60).map(_f, num_parallel_calls=AUTOTUNE),
        device=True, service=True),
      p("parallel_map_fixed", lambda fs: _r(60).map(_f, num_parallel_calls=3)),
      p("parallel_map_nondeterministic", lambda fs: _r(60).map(
          _f, num_parallel_calls=AUTOTUNE, deterministic=False), MULTISET),
      p("map_dict", lambda fs: _r(30).map(
          lambda x: {"id": x, "name": s(x),
                     "pair": (x * 2, tf.cast(x, tf.float32) / 4)},
          num_parallel_calls=AUTOTUNE)),
      p("map_and_batch", lambda fs: _r(50).map(
          lambda x: tf.fill([3], x), num_parallel_calls=AUTOTUNE).batch(
              8, drop_remainder=True), keras=True, device=True, service=True),
      p("stateless_random_map", lambda fs: _r(20).map(
          lambda x: tf.random.stateless_uniform([2], seed=tf.stack([x, 1])),
          num_parallel_calls=AUTOTUNE)),
      p("py_function_map", lambda fs: _r(20).map(
          _py_times(7), num_parallel_calls=AUTOTUNE)),
      p("numpy_function_map", lambda fs: _r(20).map(
          _np_times(5), num_parallel_calls=AUTOTUNE)),
      # interleave, flat_map
      p("interleave", lambda fs: _r(4).interleave(
          lambda x: _r(x * 10, x * 10 + 7).map(lambda y: y * 2),
          cycle_length=2, block_length=2)),
      p("parallel_interleave", lambda fs: _r(4).interleave(
          lambda x: _r(x * 10, x * 10 + 7).map(lambda y: y * 2),
          cycle_length=2, block_length=2, num_parallel_calls=AUTOTUNE),
        service=True),
      p("parallel_interleave_autotune_cycle", lambda fs: _r(6).interleave(
          lambda x: _r(x * 10, x * 10 + 5).map(_f, num_parallel_calls=2),
          cycle_length=AUTOTUNE, num_parallel_calls=AUTOTUNE)),
      p("parallel_interleave_nondeterministic", lambda fs: _r(4).interleave(
          lambda x: _r(x * 10, x * 10 + 7).map(lambda y: y * 2),
          cycle_length=3, num_parallel_calls=AUTOTUNE, deterministic=False),
        MULTISET),
      p("flat_map", lambda fs: _r(6).flat_map(
          lambda x: _r(x).map(lambda y: x * 100 + y))),
      # batching
      p("batch", lambda fs: _r(50).map(_f).batch(8), keras=True, device=True),
      p("batch_drop_remainder", lambda fs: _r(50).map(
          lambda x: tf.cast(x, tf.float32)).batch(8, drop_remainder=True),
        keras=True),
      p("parallel_batch", lambda fs: _r(50).batch(
          7, num_parallel_calls=AUTOTUNE), keras=True, service=True),
      p("padded_batch", lambda fs: _r(13).map(
          lambda x: tf.range(x % 6)).padded_batch(4), keras=True),
      p("padded_batch_values", lambda fs: _r(13).map(
          lambda x: (tf.fill([x % 4], x), s(x))).padded_batch(
              3, padded_shapes=([5], []), padding_values=(
                  tf.constant(-1, tf.int64), tf.constant("?")))),
      p("unbatch", lambda fs: _r(30).batch(7).map(lambda b: b * 2).unbatch()),
      p("ragged_batch", lambda fs: _r(13).map(
          lambda x: tf.range(x % 5)).ragged_batch(4)),
      p("sparse_batch", lambda fs: _r(10).map(
          lambda x: tf.SparseTensor([[x % 4]], [x], [4])).batch(3)),
      # filter
      p("filter", lambda fs: _r(100).filter(lambda x: x % 3 == 0)),
      p("parallel_map_filter", lambda fs: _r(100).map(
          _f, num_parallel_calls=AUTOTUNE).filter(lambda x: x % 2 == 0)),
      # shuffle
      p("shuffle_seeded", lambda fs: _r(40).shuffle(16, seed=7)),
      p("shuffle_seeded_no_reshuffle", lambda fs: _r(40).shuffle(
          16, seed=7, reshuffle_each_iteration=False)),
      p("shuffle_unseeded", lambda fs: _r(40).shuffle(16), MULTISET),
      p("shuffle_seeded_batch", lambda fs: _r(64).map(
          lambda x: tf.cast(x, tf.float32)).shuffle(64, seed=3).batch(8),
        keras=True, device=True),
      # combining
      p("zip", lambda fs: tf.data.Dataset.zip(
          (_r(30), _r(30).map(s), _r(100, 130))), keras=True),
      p("nested_structure", lambda fs: tf.data.Dataset.zip(
          (_r(10), (_r(10).map(s), {"f": _r(10).map(
              lambda x: tf.cast(x, tf.float64))})))),
      p("concatenate", lambda fs: _r(10).concatenate(_r(20, 25).map(_f))),
      p("choose_from_datasets", lambda fs: tf.data.Dataset.choose_from_datasets(
          [_r(10), _r(100, 110), _r(200, 210).map(_f)],
          _r(30).map(lambda x: x % 3))),
      p("sample_from_datasets_seeded",
        lambda fs: tf.data.Dataset.sample_from_datasets(
            [_r(0, 20), _r(100, 120)], weights=[0.3, 0.7], seed=11)),
      # cache, repeat, take/skip, shard, prefetch
      p("cache_memory", lambda fs: _r(30).map(
          _f, num_parallel_calls=AUTOTUNE).cache()),
      p("cache_file", lambda fs: _r(30).map(_f).cache(fs.fresh("cache"))),
      p("cache_after_seeded_random", lambda fs: _r(20).map(
          lambda x: x + tf.random.uniform([], maxval=1000, dtype=tf.int64,
                                          seed=3)).cache()),
      p("repeat", lambda fs: _r(7).map(_f).repeat(3)),
      p("take_skip", lambda fs: _r(100).skip(13).take(20)),
      p("shard", lambda fs: _r(50).shard(3, 1)),
      p("prefetch", lambda fs: _r(40).map(_f).prefetch(AUTOTUNE),
        device=True),
      p("parallel_map_prefetch_fixed", lambda fs: _r(40).map(
          _f, num_parallel_calls=AUTOTUNE).prefetch(2)),
      # windows, scan, grouping
      p("window", lambda fs: _r(20).window(5, shift=2, drop_remainder=True)
        .flat_map(lambda w: w.batch(5))),
      p("scan", lambda fs: _r(20).scan(
          tf.constant(0, tf.int64), lambda state, x: (state + x, state * 2))),
      p("group_by_window", lambda fs: _r(40).group_by_window(
          key_func=lambda x: x % 3, reduce_func=lambda k, w: w.batch(4),
          window_size=4)),
      p("bucket_by_sequence_length", lambda fs: _r(30).map(
          lambda x: tf.range(x % 7)).bucket_by_sequence_length(
              element_length_func=lambda t: tf.shape(t)[0],
              bucket_boundaries=[3, 5], bucket_batch_sizes=[4, 3, 2])),
      p("unique", lambda fs: _r(40).map(lambda x: x % 7).unique()),
      # sources
      p("from_generator_signature", lambda fs: tf.data.Dataset.from_generator(
          _squares, output_signature=tf.TensorSpec([], tf.int64)).map(
              _f, num_parallel_calls=AUTOTUNE)),
      p("from_generator_types", lambda fs: tf.data.Dataset.from_generator(
          _squares, output_types=tf.int64)),
      p("from_generator_types_shapes", lambda fs:
        tf.data.Dataset.from_generator(_squares, output_types=tf.int64,
                                       output_shapes=tf.TensorShape([]))),
      p("tfrecord", lambda fs: tf.data.TFRecordDataset(fs.tfrecords()).map(
          lambda r: tf.io.parse_single_example(r, _FEATURES))),
      p("tfrecord_parallel_interleave", lambda fs:
        tf.data.Dataset.from_tensor_slices(fs.tfrecords()).interleave(
            tf.data.TFRecordDataset, cycle_length=2,
            num_parallel_calls=AUTOTUNE).batch(6).map(
                lambda r: tf.io.parse_example(r, _FEATURES)["id"]),
        keras=True, service=True),
      p("textline", lambda fs: tf.data.TextLineDataset(fs.text()).map(
          lambda line: tf.strings.to_number(
              tf.strings.split(line)[-1], tf.int64))),
      p("textline_parallel_reads", lambda fs: tf.data.TextLineDataset(
          fs.text(), num_parallel_reads=2)),
      p("textline_interleave_nondeterministic", lambda fs:
        tf.data.Dataset.from_tensor_slices(fs.text()).interleave(
            tf.data.TextLineDataset, cycle_length=3,
            num_parallel_calls=AUTOTUNE, deterministic=False), MULTISET),
      p("enumerate", lambda fs: _r(20).map(s).enumerate(start=5)),
      p("strings", lambda fs: _r(20).map(
          lambda x: tf.strings.join(["item-", s(x)])).map(tf.strings.upper)),
      p("ragged_elements", lambda fs: _r(10).map(
          lambda x: tf.RaggedTensor.from_row_lengths(tf.range(2 * x), [x, x]))),
      p("sparse_elements", lambda fs: _r(10).map(
          lambda x: tf.SparseTensor([[x % 4]], [x], [4]))),
      p("random_dataset_seeded", lambda fs: tf.data.Dataset.random(
          seed=42).take(20)),
      p("counter", lambda fs: tf.data.Dataset.counter(start=3).take(15)),
      p("ignore_errors", lambda fs: _r(12).map(
          lambda x: tf.debugging.check_numerics(
              1.0 / tf.cast(x - 5, tf.float32), "division by zero")
      ).ignore_errors()),
      # tf.data options
      p("option_deterministic_false", lambda fs: with_tf_options(
          _r(60).map(_f, num_parallel_calls=AUTOTUNE).batch(6),
          deterministic=False), LEAVES),
      p("option_map_parallelization", lambda fs: with_tf_options(
          _r(60).map(_f).batch(5),
          experimental_optimization__map_parallelization=True)),
      p("option_private_threadpool", lambda fs: with_tf_options(
          _r(60).map(_f, num_parallel_calls=AUTOTUNE),
          threading__private_threadpool_size=2)),
      p("option_max_intra_op_parallelism", lambda fs: with_tf_options(
          _r(60).map(_f, num_parallel_calls=AUTOTUNE).batch(4),
          threading__max_intra_op_parallelism=1)),
      p("option_autotune_disabled", lambda fs: with_tf_options(
          _r(60).map(_f, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE),
          autotune__enabled=False)),
      p("option_no_default_optimizations", lambda fs: with_tf_options(
          _r(60).map(_f).map(lambda x: x - 1).batch(4),
          experimental_optimization__apply_default_optimizations=False)),
  ]


PIPELINES: dict[str, Pipeline] = {p.name: p for p in _pipelines()}

# Pipelines that InTune's optional rewrites (inserted prefetches, knobs on
# fixed stages, per-element statistics inside interleaves) change.
REWRITTEN = (
    "parallel_map", "parallel_map_fixed", "parallel_map_nondeterministic",
    "map_and_batch", "py_function_map", "interleave", "parallel_interleave",
    "parallel_interleave_autotune_cycle",
    "parallel_interleave_nondeterministic", "flat_map", "parallel_batch",
    "parallel_map_filter", "cache_memory", "prefetch",
    "parallel_map_prefetch_fixed", "window", "group_by_window",
    "from_generator_signature", "tfrecord_parallel_interleave",
    "textline_parallel_reads", "textline_interleave_nondeterministic",
    "option_deterministic_false", "option_private_threadpool",
    "option_autotune_disabled",
)
