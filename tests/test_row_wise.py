"""Whether the maps of a `shuffle -> batch -> maps` chain are row-wise
(`FindRowWiseChain` and `ProveRowWise`, rewrites/row_wise.cc), as the cache's
reason tells it: through `intune_tf.rewrites.cache_point` on the graphs of
real pipelines, and through a tuned iterator's `TuningSession.cache()`."""

from typing import Callable

import _tuned
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

import intune_tf
from intune_tf import rewrites

AUTOTUNE = tf.data.AUTOTUNE
ROWS = 24
BATCH = 5  # 24 rows: 4 batches of 5 and a last one of 4


def _graph(ds) -> graph_pb2.GraphDef:
  return graph_pb2.GraphDef.FromString(tf.raw_ops.DatasetToGraphV2(
      input_dataset=ds._variant_tensor,  # noqa: SLF001
      external_state_policy=1, strip_device_assignment=True).numpy())


def _nodes(graph_def, *ops):
  return [n.name for n in graph_def.node if n.op in ops]


_MAP_OPS = ("MapDataset", "ParallelMapDataset", "ParallelMapDatasetV2")


def _above(graph_def, name, count):
  """The `count` nodes that read `name` one after the other, from it up."""
  found = []
  for _ in range(count):
    (name,) = [n.name for n in graph_def.node
               if n.input and n.input[0].split(":")[0] == name]
    found.append(name)
  return found


def _examples(tmp_path):
  path = str(tmp_path / "examples.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    for i in range(ROWS):
      writer.write(tf.train.Example(features=tf.train.Features(feature={
          "a": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
          "b": tf.train.Feature(float_list=tf.train.FloatList(
              value=[i / 2, i / 4])),
          "tags": tf.train.Feature(bytes_list=tf.train.BytesList(
              value=[b"t"] * (i % 3))),
      })).SerializeToString())
  return path


def _lines(tmp_path):
  path = str(tmp_path / "rows.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    for i in range(ROWS):
      writer.write(f"{i},{i / 2},word{i % 4}".encode())
  return path


def _records(source, tmp_path):
  """The rows of a source: TFRecord files, or tensors in memory."""
  if source == "examples":
    return tf.data.TFRecordDataset(_examples(tmp_path))
  if source == "lines":
    return tf.data.TFRecordDataset(_lines(tmp_path))
  if source == "ints":
    return tf.data.Dataset.from_tensor_slices(tf.range(ROWS, dtype=tf.int64))
  if source == "vectors":
    return tf.data.Dataset.from_tensor_slices(
        tf.reshape(tf.range(ROWS * 3, dtype=tf.float32), [ROWS, 3]))
  if source == "words":
    return tf.data.Dataset.from_tensor_slices(
        tf.constant([f"word{i % 7}" for i in range(ROWS)]))
  raise ValueError(source)


def _chain(source, tmp_path, *maps, parallel=False):
  ds = _records(source, tmp_path).shuffle(8, seed=1).batch(BATCH)
  for f in maps:
    ds = ds.map(f, num_parallel_calls=AUTOTUNE if parallel else None)
  return ds.prefetch(2)


_DENSE = {"a": tf.io.FixedLenFeature([], tf.int64),
          "b": tf.io.FixedLenFeature([2], tf.float32)}


@tf.function
def _scaled(x):
  return x * 3.0


def _table():
  return tf.lookup.StaticHashTable(
      tf.lookup.KeyValueTensorInitializer(
          tf.constant([f"word{i}" for i in range(4)]),
          tf.range(4, dtype=tf.int64)), -1)


def _asserted(condition: Callable[[tf.Tensor], tf.Tensor]
              ) -> Callable[[tf.Tensor], tf.Tensor]:
  """f: its batch as it is, once `tf.debugging.Assert(condition(batch))`
  holds; the message says which row fails `x >= 0` (a cond, as
  criteo.reader.Parser makes it)."""

  def f(x: tf.Tensor) -> tf.Tensor:
    bad = x < 0
    message = tf.cond(
        tf.reduce_any(bad),
        lambda: tf.strings.format("row {} is negative", tf.argmax(
            tf.cast(bad, tf.int32), output_type=tf.int32)),
        lambda: tf.constant(""))
    check = tf.debugging.Assert(condition(x), [message])
    with tf.control_dependencies([check]):
      return tf.identity(x)

  return f


# (name, source, the map's function): each row-wise, with the op it shows.
ROW_WISE = [
    ("ParseExampleV2", "examples", lambda s: tf.io.parse_example(s, _DENSE)),
    ("DecodeCSV", "lines",
     lambda s: tf.io.decode_csv(s, [[0], [0.0], [""]])),
    ("unary math", "ints",
     lambda x: tf.math.log1p(tf.abs(tf.cast(x, tf.float32)))),
    ("binary math with a scalar", "ints", lambda x: x * 2 + 1),
    ("binary math of two row tensors", "ints", lambda x: x * x - x),
    # [B, 3] against [3] and [1, 3]: broadcast within each row.
    ("broadcast against a vector", "vectors",
     lambda x: x * tf.constant([1.0, 2.0, 3.0])),
    ("broadcast against one row", "vectors",
     lambda x: x - tf.constant([[1.0, 2.0, 3.0]])),
    ("Cast", "ints", lambda x: tf.cast(x, tf.float32)),
    ("StringToHashBucketFast", "words",
     lambda s: tf.strings.to_hash_bucket_fast(s, 10)),
    ("StringToHashBucketStrong", "words",
     lambda s: tf.strings.to_hash_bucket_strong(s, 10, [1, 2])),
    ("OneHot on the last axis", "ints", lambda x: tf.one_hot(x % 4, 4)),
    ("Identity", "ints", tf.identity),
    ("a reduction over a row's own axis", "vectors",
     lambda x: tf.reduce_sum(x, axis=1)),
    ("ExpandDims after the batch axis", "ints",
     lambda x: tf.expand_dims(x, -1)),
    ("a column", "vectors", lambda x: x[:, 1]),
    ("stack and concat after the batch axis", "vectors",
     lambda x: tf.concat([tf.stack([x, x], axis=1)[:, 0], x], axis=1)),
    ("SelectV2", "ints", lambda x: tf.where(x > 3, x, tf.zeros_like(x))),
    ("a nested function", "vectors", _scaled),
    ("an assert that every row passes", "ints",
     _asserted(lambda x: tf.reduce_all(x >= 0))),
    ("an assert that no row fails", "vectors",
     _asserted(lambda x: tf.logical_not(tf.reduce_any(x < 0)))),
    ("a split padded to a fixed width", "lines",
     lambda s: tf.strings.split(s, ",").to_tensor("", shape=[None, 2])),
    ("a split's row lengths", "lines",
     lambda s: tf.strings.split(s, "1").row_lengths()),
    ("a gather from a fixed table", "ints",
     lambda x: tf.gather(tf.constant([10, 20, 30], tf.int64), x % 3)),
    ("a gather within each row", "vectors",
     lambda x: tf.gather(x, [2, 0], axis=1)),
    ("DecodePaddedRaw", "words",
     lambda s: tf.io.decode_raw(s, tf.uint8, fixed_length=5)),
    ("Substr", "words", lambda s: tf.strings.substr(s, 3, 2)),
    ("features after the parse", "examples",
     lambda s: tf.one_hot(tf.io.parse_example(s, _DENSE)["a"] % 3, 3)),
]


@pytest.mark.parametrize("name,source,f", ROW_WISE,
                         ids=[r[0] for r in ROW_WISE])
def test_a_row_wise_map_above_a_shuffle_is_told(name, source, f, tmp_path):
  del name
  graph_def = _graph(_chain(source, tmp_path, f))
  (shuffle,) = _nodes(graph_def, "ShuffleDatasetV3", "ShuffleDatasetV2",
                      "ShuffleDataset")
  (batch,) = _nodes(graph_def, "BatchDatasetV2")
  (map_node,) = _nodes(graph_def, *_MAP_OPS)
  reason = rewrites.cache_point(graph_def).reason
  assert (f"; the map after shuffle {shuffle} and batch {batch} is row-wise "
          f"({map_node}): a candidate for a row store") in reason, reason


def test_a_lookup_of_an_immutable_table_is_row_wise(tmp_path):
  table = _table()
  reason = rewrites.cache_point(_graph(
      _chain("words", tmp_path, table.lookup))).reason
  assert "is row-wise" in reason, reason


def test_a_chain_of_row_wise_maps_is_told_whole(tmp_path):
  graph_def = _graph(_chain(
      "examples", tmp_path, lambda s: tf.io.parse_example(s, _DENSE),
      lambda d: tf.cast(d["a"], tf.float32) + d["b"][:, 0],
      tf.math.sqrt, parallel=True))
  (batch,) = _nodes(graph_def, "BatchDatasetV2")
  maps = _above(graph_def, batch, 3)
  assert {n.op for n in graph_def.node if n.name in maps} == {
      "ParallelMapDatasetV2"}
  (shuffle,) = [n for n in graph_def.node if n.op.startswith("Shuffle")]
  point = rewrites.cache_point(graph_def)
  # The cache stays below the shuffle, on the records read.
  assert point.node == shuffle.input[0].split(":")[0]
  assert "the maps after shuffle" in point.reason
  assert f"are row-wise ({', '.join(maps)})" in point.reason, point.reason


def _variable_read():
  variable = tf.Variable(2, dtype=tf.int64)
  return lambda x: x * variable


def _mutable_lookup():
  table = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, -1)
  return table.lookup


# (name, source, the map's function, the op the proof names, why).
REFUSED = [
    ("boolean_mask", "ints", lambda x: tf.boolean_mask(x, x > 3), "Where",
     "a mask"),
    ("reduce_sum over the batch", "vectors",
     lambda x: tf.reduce_sum(x, axis=0), "Sum",
     "reduces over the batch axis"),
    ("a sparse output", "examples",
     lambda s: tf.io.parse_example(
         s, {**_DENSE, "tags": tf.io.VarLenFeature(tf.string)}),
     "ParseExampleV2", "gives a sparse output"),
    ("a variable read", "ints", _variable_read(), "ReadVariableOp",
     "reads a variable"),
    ("a random op", "vectors",
     lambda x: x + tf.random.uniform(tf.shape(x)), "RandomUniform",
     "is random"),
    ("a stateless random op", "ints",
     lambda x: x + tf.random.stateless_uniform(
         [], seed=[1, 2], maxval=5, dtype=tf.int64), "StatelessRandom",
     "is random"),
    ("a lookup of a mutable table", "words", _mutable_lookup(),
     "LookupTableFindV2", "a table that can change (MutableHashTableV2)"),
    ("the batch's size", "ints",
     lambda x: x + tf.shape(x, out_type=tf.int64)[0], "Shape",
     "reads the batch's size"),
    ("a broadcast across the batch", "vectors",
     lambda x: x + tf.ones([BATCH, 3]), "AddV2", "broadcasts a tensor"),
    ("OneHot on the batch axis", "ints",
     lambda x: tf.one_hot(x % 4, 4, axis=0), "OneHot",
     "before the batch axis"),
    ("a gather across the rows", "ints", lambda x: tf.gather(x, [0, 0]),
     "GatherV2", "gathers by index"),
    ("an output without rows", "ints", lambda x: (x, tf.constant(1)),
     "Const", "without a row per input row"),
    ("a cond", "ints",
     lambda x: tf.cond(tf.reduce_all(x > 100), lambda: x, lambda: x + 1),
     "StatelessIf", "runs functions whose outputs are not followed"),
    ("a stateful cond", "ints",
     lambda x: tf.cond(tf.reduce_all(x > 100), lambda: x,
                       lambda: x + tf.random.uniform([], 0, 2, tf.int64)),
     "If", "runs functions not followed"),
    ("an assert on the batch", "ints",
     _asserted(lambda x: tf.reduce_any(x > 3)),
     "Assert", "asserts a condition on the batch"),
    # Its row splits are the row lengths' running sum, across the rows.
    ("a split kept ragged", "lines", lambda s: tf.strings.split(s, ","),
     "Cumsum", "is not known to be row-wise"),
    ("a split padded to the longest row", "lines",
     lambda s: tf.strings.split(s, ",").to_tensor(""),
     "RaggedTensorToTensor", "without a row per input row"),
    ("a variable-length dense feature", "examples",
     lambda s: tf.io.parse_example(s, {"tags": tf.io.FixedLenSequenceFeature(
         [], tf.string, allow_missing=True)}),
     "ParseExampleV2", "pads a variable-length feature"),
]


@pytest.mark.parametrize("name,source,f,op,why", REFUSED,
                         ids=[r[0] for r in REFUSED])
def test_a_map_that_is_not_row_wise_is_told_with_its_op(name, source, f, op,
                                                        why, tmp_path):
  del name
  graph_def = _graph(_chain(source, tmp_path, f))
  (map_node,) = _nodes(graph_def, *_MAP_OPS)
  reason = rewrites.cache_point(graph_def).reason
  assert f"; the map {map_node} (MapDataset) after shuffle " in reason, reason
  assert " is not row-wise: " in reason, reason
  assert "row store" not in reason
  told = reason.split(" is not row-wise: ", 1)[1]
  # "<node> (<op>) in <function> <why>": the node's op, by name.
  assert f"({op}" in told.split(")")[0] + ")", told
  assert why in told, told


def test_the_first_refused_map_is_told_with_the_row_wise_ones_below_it(
    tmp_path):
  graph_def = _graph(_chain("ints", tmp_path, lambda x: x + 1,
                            lambda x: tf.reduce_max(x, axis=0)))
  (batch,) = _nodes(graph_def, "BatchDatasetV2")
  first, second = _above(graph_def, batch, 2)
  reason = rewrites.cache_point(graph_def).reason
  assert (f"the map {second} (MapDataset) after shuffle") in reason, reason
  assert f"is not row-wise ({first} below it is): " in reason, reason
  assert "(Max) " in reason and "reduces over the batch axis" in reason


def _unordered(ds, deterministic):
  options = tf.data.Options()
  options.deterministic = deterministic
  return ds.with_options(options)


@pytest.mark.parametrize("make,why", [
    (lambda ds: ds.map(lambda x: x * 2, num_parallel_calls=2,
                       deterministic=False),
     "has deterministic=False"),
    (lambda ds: _unordered(ds.map(lambda x: x * 2, num_parallel_calls=2),
                           False),
     "follows options.deterministic=False"),
    (lambda ds: _unordered(ds.map(lambda x: x * 2, num_parallel_calls=2),
                           True), None),
])
def test_a_parallel_map_that_gives_up_its_order_is_refused(make, why,
                                                           tmp_path):
  ds = make(_records("ints", tmp_path).shuffle(8, seed=1).batch(BATCH))
  reason = rewrites.cache_point(_graph(ds)).reason
  if why is None:
    assert "is row-wise" in reason, reason
  else:
    assert "is not row-wise" in reason, reason
    assert f"(ParallelMapDatasetV2) {why}: its batches may come in another " \
        "order" in reason, reason


# Pipelines with no `shuffle -> batch -> maps` chain: nothing is said.
NO_CHAIN = [
    ("no shuffle", lambda: tf.data.Dataset.range(ROWS).batch(BATCH).map(
        lambda x: x * 2)),
    ("the map before the batch", lambda: tf.data.Dataset.range(ROWS).shuffle(
        8).map(lambda x: x * 2).batch(BATCH)),
    ("no map after the batch", lambda: tf.data.Dataset.range(ROWS).shuffle(
        8).batch(BATCH).prefetch(1)),
    ("a filter between", lambda: tf.data.Dataset.range(ROWS).shuffle(8)
     .batch(BATCH).filter(lambda x: tf.size(x) > 2).map(lambda x: x * 2)),
]


@pytest.mark.parametrize("name,make", NO_CHAIN, ids=[c[0] for c in NO_CHAIN])
def test_no_chain_no_word(name, make):
  del name
  reason = rewrites.cache_point(_graph(make())).reason
  assert "row-wise" not in reason, reason


def test_the_passes_carry_what_the_point_says(tmp_path):
  graph_def = _graph(_chain("ints", tmp_path, lambda x: x + 1))
  result = rewrites.run_passes(graph_def)
  assert result.cache_reason == rewrites.cache_point(graph_def).reason
  assert "is row-wise" in result.cache_reason


def _session_reason(ds) -> tuple:
  cache = _tuned.cache_after_first_element(ds)
  return cache["state"], cache["reason"]


@pytest.mark.parametrize("source,make,state,told", [
    ("examples", lambda: lambda s: tf.io.parse_example(s, _DENSE),
     intune_tf.CacheState.PLACED, "is row-wise"),
    ("examples",
     lambda: lambda s: tf.boolean_mask(s, tf.strings.length(s) > 30),
     intune_tf.CacheState.PLACED, "(Where)"),
    # The root's graph holds a captured table as a placeholder: its kind
    # is not known there, and the lookup is refused.
    ("words", lambda: _table().lookup, intune_tf.CacheState.DECLINED,
     "(LookupTableFindV2)"),
])
def test_a_tuned_iterator_tells_the_chain(source, make, state, told,
                                          tmp_path):
  found, reason = _session_reason(_chain(source, tmp_path, make()))
  assert found is state, reason
  assert told in reason, reason
  if "Lookup" in told:
    assert reason.endswith("looks up a table not known to be immutable")
