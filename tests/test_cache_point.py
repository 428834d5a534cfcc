"""Where a pipeline stops changing between epochs (`FindCachePoint`,
rewrites/cache_point.cc, through `intune_tf.rewrites.cache_point`), on the
graphs of real datasets, each point found by hand."""

import _tuned
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

import intune_tf
from intune_tf import rewrites
from intune_tf.ops import loader as _kernels

AUTOTUNE = tf.data.AUTOTUNE


def _graph(ds) -> graph_pb2.GraphDef:
  return graph_pb2.GraphDef.FromString(tf.raw_ops.DatasetToGraphV2(
      input_dataset=ds._variant_tensor,  # noqa: SLF001
      external_state_policy=1, strip_device_assignment=True).numpy())


def _op(graph_def, name):
  (node,) = [n for n in graph_def.node if n.name == name]
  return node.op


def _point(ds):
  graph_def = _graph(ds)
  point = rewrites.cache_point(graph_def)
  return (_op(graph_def, point.node) if point.node else None), point.reason


def _twice(x):
  return x * 2


def _noise(x):
  return tf.cast(x, tf.float32) + tf.random.uniform([], seed=1)


def _stateless_noise(x):
  return tf.cast(x, tf.float32) + tf.random.stateless_uniform([], seed=[1, 2])


def _py(x):
  return tf.py_function(lambda v: v, [x], tf.int64)


@tf.function
def _inner_noise(x):
  return tf.cast(x, tf.float32) + tf.random.normal([])


@tf.function
def _inner_twice(x):
  return x * 2


_VARIABLE = tf.Variable(3, dtype=tf.int64)


def _reads_variable(x):
  return x + _VARIABLE


def _records(tmp_path, n_files=2):
  files = []
  for i in range(n_files):
    path = str(tmp_path / f"part-{i}.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
      for j in range(5):
        writer.write(f"{i}-{j}".encode())
    files.append(path)
  return files


# (a dataset, the op of its cache point, what ends the pure part).
POINTS = [
    # Pure to the output: the cache goes right above the last stage that
    # works, below the prefetch.
    (lambda: tf.data.Dataset.range(10).map(_twice).prefetch(2),
     "MapDataset", "the whole pipeline"),
    (lambda: tf.data.Dataset.range(10).map(_twice).filter(
        lambda x: x > 4).batch(3).prefetch(AUTOTUNE),
     "BatchDatasetV2", "the whole pipeline"),
    # A shuffle that reshuffles each epoch ends it, seeded or not.
    (lambda: tf.data.Dataset.range(10).map(
        _twice, num_parallel_calls=2).shuffle(5, seed=1).batch(2),
     "ParallelMapDatasetV2", "reshuffles each epoch"),
    (lambda: tf.data.Dataset.range(10).map(_twice).shuffle(
        5, seed=1, reshuffle_each_iteration=False).batch(2),
     "MapDataset", "seed of its own"),
    # Random ops in a map, seeded, stateless, or in a called function.
    (lambda: tf.data.Dataset.range(10).map(_twice).map(_noise),
     "MapDataset", "is random"),
    (lambda: tf.data.Dataset.range(10).map(_twice).map(_stateless_noise),
     "MapDataset", "is random"),
    (lambda: tf.data.Dataset.range(10).map(_twice).map(_inner_noise),
     "MapDataset", "is random"),
    # A pure function called from a map is pure.
    (lambda: tf.data.Dataset.range(10).map(_inner_twice).shuffle(3),
     "MapDataset", "reshuffles"),
    # py_function and stateful ops.
    (lambda: tf.data.Dataset.range(10).map(_twice).map(_py),
     "MapDataset", "py_function"),
    (lambda: tf.data.Dataset.range(10).map(_twice).map(_reads_variable),
     "MapDataset", "is stateful"),
    # A repeat: the cache goes below it.
    (lambda: tf.data.Dataset.range(10).map(_twice).repeat(3),
     "MapDataset", "repeats"),
    # A zip with a random branch: its first input is kept.
    (lambda: tf.data.Dataset.zip((
        tf.data.Dataset.range(10).map(_twice),
        tf.data.Dataset.range(10).map(_noise))),
     "MapDataset", "is random"),
]


@pytest.mark.parametrize("make,op,stop", POINTS)
def test_the_point_is_the_last_stage_that_repeats(make, op, stop):
  found, reason = _point(make())
  assert found == op
  assert stop in reason


def test_the_point_is_exactly_the_node_below_a_random_map():
  ds = tf.data.Dataset.range(10).map(_twice).map(_noise)
  graph_def = _graph(ds)
  point = rewrites.cache_point(graph_def)
  (random_map,) = [n for n in graph_def.node
                   if n.op == "MapDataset" and point.node in n.input[0]]
  assert random_map.name != point.node
  assert random_map.name in point.reason


def test_a_repeat_inside_an_interleaved_function_is_pure(tmp_path):
  # As Criteo's reader tags each file's lines with the file's index: the
  # cache holds the read (it found nothing to save when a repeat in a
  # function stopped it as one in the pipeline does).
  files = _records(tmp_path)

  def tagged(index, path):
    return tf.data.Dataset.zip((tf.data.TFRecordDataset(path),
                                tf.data.Dataset.from_tensors(index).repeat()))

  ds = (tf.data.Dataset.from_tensor_slices((tf.range(2), files))
        .interleave(tagged, cycle_length=2, num_parallel_calls=AUTOTUNE)
        .shuffle(10, seed=3).batch(4))
  found, reason = _point(ds)
  assert found == "ParallelInterleaveDatasetV4"
  assert "reshuffles each epoch" in reason


def test_interleaved_files_are_cached_after_the_parse(tmp_path):
  files = _records(tmp_path)
  ds = (tf.data.Dataset.from_tensor_slices(files)
        .interleave(tf.data.TFRecordDataset, cycle_length=2,
                    num_parallel_calls=AUTOTUNE)
        .map(tf.strings.length, num_parallel_calls=AUTOTUNE)
        .shuffle(10, seed=3).batch(4).prefetch(AUTOTUNE))
  assert _point(ds)[0] == "ParallelMapDatasetV2"


def _map_calls(graph_def, node_name):
  """The ops of the function that the map `node_name` applies."""
  (node,) = [n for n in graph_def.node if n.name == node_name]
  (fn,) = [f for f in graph_def.library.function
           if f.signature.name == node.attr["f"].func.name]
  return {n.op for n in fn.node_def}


def test_images_are_cached_after_the_decode_and_before_the_random_crop(
    tmp_path):
  paths = []
  for i in range(3):
    paths.append(str(tmp_path / f"{i}.jpg"))
    tf.io.write_file(paths[-1], tf.io.encode_jpeg(
        tf.fill([12, 12, 3], tf.constant(i * 40, tf.uint8))))
  ds = (tf.data.Dataset.from_tensor_slices(paths)
        .map(lambda p: tf.io.decode_jpeg(tf.io.read_file(p), channels=3),
             num_parallel_calls=AUTOTUNE)
        .map(lambda image: tf.image.random_flip_left_right(
            tf.image.random_crop(image, [8, 8, 3])),
             num_parallel_calls=AUTOTUNE)
        .batch(2).prefetch(AUTOTUNE))
  graph_def = _graph(ds)
  point = rewrites.cache_point(graph_def)
  assert {"ReadFile", "DecodeJpeg"} <= _map_calls(graph_def, point.node)
  (crop,) = [n for n in graph_def.node if n.input[:1] == [point.node]]
  assert "RandomUniformInt" in _map_calls(graph_def, crop.name)
  assert f"above it: {crop.name} " in point.reason


# (a dataset with no cache point, why).
NO_POINTS = [
    # The user's own cache stays the only one.
    (lambda: tf.data.Dataset.range(10).map(_twice).cache().repeat(2),
     "its own cache"),
    (lambda: tf.data.Dataset.range(10).map(_twice).cache().map(_noise),
     "its own cache"),
    # Nothing but an in-memory source below the first random stage.
    (lambda: tf.data.Dataset.range(10).map(_noise).batch(2),
     "nothing to save"),
    (lambda: tf.data.Dataset.from_tensor_slices(np.arange(4)).prefetch(1),
     "nothing to save"),
    # Only a range below the reshuffled shuffle.
    (lambda: tf.data.Dataset.range(10).shuffle(10).map(_twice),
     "nothing to save below RangeDataset"),
    # A random source: no epoch repeats the last.
    (lambda: tf.data.Dataset.random(seed=1).take(10).map(_twice),
     "nothing repeats each epoch"),
]


@pytest.mark.parametrize("make,reason", NO_POINTS)
def test_no_point(make, reason):
  found, why = _point(make())
  assert found is None
  assert reason in why


def test_a_cycle_of_inputs_has_no_point():
  # Two shuffles that read each other: the walk down from the output would
  # go round them for ever.
  graph_def = graph_pb2.GraphDef()
  for name, op, source in [("a", "ShuffleDataset", "b"),
                           ("b", "ShuffleDataset", "a"),
                           ("dataset", "_Retval", "a")]:
    graph_def.node.add(name=name, op=op, input=[source])
  point = rewrites.cache_point(graph_def)
  assert point.node == ""
  assert "make a cycle at a" in point.reason


@pytest.mark.parametrize("graph_def,message", [
    (b"\xff\xff\xff", "not a GraphDef"),
    ([b"", b""], "must be a scalar"),
])
def test_the_op_checks_its_input(graph_def, message):
  with pytest.raises(tf.errors.InvalidArgumentError, match=message):
    _kernels.ops().intune_cache_point(graph_def=graph_def)


def _global_shuffle():
  """TF's global_shuffle (public or not), None before TF 2.17."""
  public = getattr(tf.data.experimental, "global_shuffle", None)
  if public is not None:
    return public
  try:
    from tensorflow.python.data.experimental.ops import global_shuffle_op  # noqa: PLC0415
  except ImportError:
    return None
  return getattr(global_shuffle_op, "_global_shuffle", None)


@pytest.mark.skipif(_global_shuffle() is None,
                    reason="global_shuffle needs TF >= 2.17")
def test_no_point_under_a_global_shuffle():
  # It reads its input by index, which the cache does not serve.
  ds = _global_shuffle()(tf.data.Dataset.range(10).map(_twice).prefetch(1),
                         seed=4).batch(2)
  found, why = _point(ds)
  assert found is None
  assert "global shuffle" in why


def test_no_point_under_an_assert_prev():
  # It checks the ops of the stages below it when its iterator is made: a
  # cache among them would fail the check.
  from tensorflow.python.data.experimental.ops import testing  # noqa: PLC0415
  ds = tf.data.Dataset.range(10).map(
      _twice, num_parallel_calls=2, deterministic=True).apply(
          testing.assert_prev([("ParallelMapDataset", {})]))
  found, why = _point(ds)
  assert found is None
  assert "assert_prev" in why
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(cache=True)
  assert [int(x) for x in ds.with_options(options)] == list(range(0, 20, 2))


def _unordered_options(ds, deterministic):
  options = tf.data.Options()
  options.deterministic = deterministic
  return ds.with_options(options)


def _interleaved(**kwargs):
  return tf.data.Dataset.range(4).interleave(
      lambda i: tf.data.Dataset.range(5).map(_twice), cycle_length=2,
      num_parallel_calls=2, **kwargs)


@pytest.mark.parametrize("make,unordered", [
    (lambda: _interleaved(deterministic=False).map(_twice),
     "deterministic=False"),
    (lambda: _unordered_options(_interleaved().map(_twice), False),
     "follows options.deterministic=False"),
    (lambda: tf.data.Dataset.range(10).map(
        _twice, num_parallel_calls=2, deterministic=False).batch(2),
     "deterministic=False"),
    # Inside a function that a stage calls.
    (lambda: tf.data.Dataset.range(2).flat_map(
        lambda _: _interleaved(deterministic=False)).map(_twice),
     "deterministic=False"),
    # A fixed order: the stage's own setting wins over the options'.
    (lambda: _unordered_options(
        _interleaved(deterministic=True).map(_twice), False), None),
    (lambda: _unordered_options(_interleaved().map(_twice), True), None),
    (lambda: _interleaved().map(_twice), None),
])
def test_an_order_not_fixed_below_the_point_is_told(make, unordered):
  found, reason = _point(make())
  assert found is not None, reason
  if unordered is None:
    assert "only whole epochs are served" not in reason
  else:
    assert "only whole epochs are served" in reason
    assert unordered in reason


def _production_point(ds):
  cache = _tuned.cache_after_first_element(ds)
  return cache["state"], cache["point"], cache["reason"]


@pytest.mark.parametrize("make,op,stop", POINTS)
def test_the_root_finds_what_ends_the_pure_part(make, op, stop):
  del op  # TF's static rewrites change the ops (map_and_batch_fusion, ...)
  state, point, reason = _production_point(make())
  assert state is intune_tf.CacheState.PLACED and point, reason
  assert stop in reason


@pytest.mark.parametrize("make,reason", NO_POINTS)
def test_the_root_finds_no_point(make, reason):
  state, point, why = _production_point(make())
  assert state is intune_tf.CacheState.DECLINED and not point
  assert reason in why
