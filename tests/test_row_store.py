"""The row store's ops (intune_tf/cc/kernels/row_store.h), used from Python
in a pipeline written by hand: `enumerate -> shuffle -> batch -> map(f')`,
where f'(pos, x) gathers a batch whose rows are all stored and else computes
f as written and stores its rows. Its elements are those of plain
`shuffle -> batch -> map(f)` with the same seeds, epoch after epoch."""

import json
import os
import re
import subprocess
import sys
from typing import Any, Callable
import uuid

import numpy as np
import pytest
import tensorflow as tf

from intune_tf.ops import loader

ROWS = 320  # 10 chunks of the store (kRowChunk = 32 positions)
EPOCHS = 3
SEED = 7
SHUFFLE_BUFFER = 16
FEATURES = {
    "x": tf.io.FixedLenFeature([3], tf.float32),
    "i": tf.io.FixedLenFeature([], tf.int64),
    "s": tf.io.FixedLenFeature([], tf.string),
}


def _example(i: int, malformed: bool = False) -> bytes:
  """Row `i` as a serialized tf.train.Example; a malformed row's `x` has 2
  values where the parse expects 3."""
  x = [float(i), i + 0.5] if malformed else [float(i), i + 0.5, -float(i)]
  feature = {
      "x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
      "i": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
      "s": tf.train.Feature(bytes_list=tf.train.BytesList(
          value=[b"row-%d-" % i + b"z" * (i % 5)])),
  }
  return tf.train.Example(features=tf.train.Features(
      feature=feature)).SerializeToString()


def _rows(malformed: int | None = None) -> list[bytes]:
  return [_example(i, malformed=i == malformed) for i in range(ROWS)]


def _source(rows: list[bytes], kind: str, folder: str) -> tf.data.Dataset:
  """The rows as tensors, or read from 2 TFRecord files under `folder`."""
  if kind == "tensors":
    return tf.data.Dataset.from_tensor_slices(rows)
  paths = []
  for part in range(2):
    path = f"{folder}/rows-{part}.tfrecord"
    with tf.io.TFRecordWriter(path) as writer:
      for row in rows[part * ROWS // 2:(part + 1) * ROWS // 2]:
        writer.write(row)
    paths.append(path)
  return tf.data.TFRecordDataset(paths)


def _parse(counter: tf.Variable) -> Callable[[tf.Tensor], dict]:
  """f: a row-wise map over a batch of serialized Examples (a parse, a cast,
  a string hash), counting its calls in `counter`."""

  def f(serialized: tf.Tensor) -> dict:
    with tf.control_dependencies([counter.assign_add(1)]):
      parsed = tf.io.parse_example(serialized, FEATURES)
    return {
        "x": parsed["x"] * 2.0,
        "i": tf.cast(parsed["i"], tf.int32),
        "h": tf.strings.to_hash_bucket_fast(parsed["s"], 1000),
        "s": parsed["s"],
    }

  return f


def _row_stored(f: Callable, key: str, spec: Any) -> Callable:
  """f'(pos, x): the rows stored under `key` when every position of the
  batch is stored, else f(x) as written, its rows stored. `spec` is the
  element spec of the batched map's output."""
  flat_spec = tf.nest.flatten(spec)
  dtypes = [s.dtype for s in flat_spec]
  shapes = [s.shape[1:] for s in flat_spec]
  ops = loader.ops()

  def wrapped(positions: tf.Tensor, x: tf.Tensor) -> Any:

    def gather() -> list[tf.Tensor]:
      return ops.intune_row_store_gather(positions, key=key, T=dtypes,
                                         shapes=shapes)

    def compute() -> list[tf.Tensor]:
      return ops.intune_row_store_put(positions, tf.nest.flatten(f(x)),
                                      key=key)

    stored = ops.intune_row_store_has(positions, key=key)
    return tf.nest.pack_sequence_as(spec, tf.cond(stored, gather, compute))

  return wrapped


def _pipelines(source: tf.data.Dataset, batch: int, key: str,
               positions: str = "enumerate") -> tuple[
                   tf.data.Dataset, tf.data.Dataset, tf.Variable, tf.Variable]:
  """Plain `shuffle -> batch -> map(f)`, and the same with positions and
  f', with their call counters.

  Args:
    source: the serialized Examples.
    batch: the batch size.
    key: the row store's key.
    positions: "enumerate" (default) pairs each row with its position by
      `source.enumerate()`, "zip" by zipping a range with `source`.
  """
  plain_calls = tf.Variable(0, dtype=tf.int64)
  stored_calls = tf.Variable(0, dtype=tf.int64)

  def shuffled(ds: tf.data.Dataset) -> tf.data.Dataset:
    return ds.shuffle(SHUFFLE_BUFFER, seed=SEED,
                      reshuffle_each_iteration=True).batch(batch)

  plain = shuffled(source).map(_parse(plain_calls))
  spec = plain.element_spec
  if positions == "enumerate":
    positioned = source.enumerate()
  else:
    positioned = tf.data.Dataset.zip((tf.data.Dataset.range(ROWS), source))
  stored = shuffled(positioned).map(
      _row_stored(_parse(stored_calls), key, spec))
  return plain, stored, plain_calls, stored_calls


def _normalized(message: str) -> str:
  """An error's message without the names of the functions and nodes that
  raised it (the wrapped map's differ from the plain one's)."""
  message = re.sub(r"\{\{function_node [^}]*\}\}", "", message)
  message = re.sub(r"\[\[[^\]]*\]\]", "", message)
  message = re.sub(r"\[Op:[^\]]*\]", "", message)
  message = re.sub(r"(\w+Dataset):\d+", r"\1", message)
  return " ".join(message.split())


def _epoch(ds: tf.data.Dataset) -> list[Any]:
  """Every element of one epoch as numpy, an error in an element's place as
  (its class, its normalized message); reading goes on after an error."""
  out = []
  it = iter(ds)
  while True:
    try:
      element = next(it)
    except StopIteration:
      return out
    except tf.errors.OpError as e:
      out.append((type(e).__name__, _normalized(e.message)))
      continue
    out.append({k: v.numpy().tolist() for k, v in element.items()})


def _epochs(ds: tf.data.Dataset, calls: tf.Variable) -> tuple[list, list]:
  """EPOCHS epochs of `ds`, each a new iterator (as `model.fit` makes), and
  the calls of its map in each."""
  epochs, counts = [], []
  for _ in range(EPOCHS):
    before = int(calls.numpy())
    epochs.append(_epoch(ds))
    counts.append(int(calls.numpy()) - before)
  return epochs, counts


def _key() -> str:
  return f"test-{uuid.uuid4().hex}"


@pytest.mark.parametrize("kind,positions", [("tensors", "enumerate"),
                                            ("tfrecord", "enumerate"),
                                            ("tensors", "zip")])
@pytest.mark.parametrize("batch", [4, 7])
def test_stored_rows_give_plain_elements_and_skip_the_map(kind, positions,
                                                          batch, tmp_path):
  plain, stored, plain_calls, stored_calls = _pipelines(
      _source(_rows(), kind, str(tmp_path)), batch, _key(), positions)
  expected, plain_counts = _epochs(plain, plain_calls)
  got, counts = _epochs(stored, stored_calls)
  batches = -(-ROWS // batch)
  assert plain_counts == [batches] * EPOCHS
  # The shuffle reorders the rows every epoch: the check compares orders.
  assert expected[0] != expected[1]
  assert got == expected
  assert counts == [batches] + [0] * (EPOCHS - 1)


@pytest.mark.parametrize("malformed", [0, 17, ROWS - 1])
def test_a_malformed_row_raises_where_plain_raises_every_epoch(malformed):
  plain, stored, plain_calls, stored_calls = _pipelines(
      _source(_rows(malformed), "tensors", ""), 4, _key())
  expected, _ = _epochs(plain, plain_calls)
  got, counts = _epochs(stored, stored_calls)
  errors = [[e for e in epoch if isinstance(e, tuple)] for epoch in expected]
  assert [len(e) for e in errors] == [1] * EPOCHS
  assert errors[0][0][0] == "InvalidArgumentError"
  assert got == expected
  # Epoch 1 stored no row of the batch that raised: from epoch 2 on only the
  # batches holding the malformed row or one of those rows are computed.
  assert counts[0] == ROWS // 4
  assert 1 <= counts[2] <= counts[1] <= 4, counts


# Under a process budget, in a fresh process. The positions come from a
# zipped range: `enumerate()` makes its counter from a variant, which makes an
# iterator start the tuner, whose thread resolves the process's budget again
# every second.
#
# "limit": a budget that holds `fraction` of the rows from the start (a
# probe store first holds every row, to measure their bytes). "shrink": the
# budget falls to `fraction` of what the store holds after epoch 1.
BUDGET_SCRIPT = '''
import json, sys
sys.path.insert(0, sys.argv[1])
import test_row_store as t
from intune_tf.ops import session as session_lib
mode, fraction = sys.argv[2], float(sys.argv[3])
def pipelines(key):
  return t._pipelines(t._source(t._rows(), "tensors", ""), 4, key, "zip")
def held():
  return session_lib.process_caches()["bytes"]
if mode == "limit":
  _, probe, _, probe_calls = pipelines("probe")
  t._epochs(probe, probe_calls)
  total = held()
  budget = total + int(fraction * total)
  session_lib.set_default_ram_budget(budget)
  plain, stored, plain_calls, stored_calls = pipelines("budget")
  expected, _ = t._epochs(plain, plain_calls)
  got, counts = t._epochs(stored, stored_calls)
  kept = held() - total
else:
  plain, stored, plain_calls, stored_calls = pipelines("shrink")
  expected = [t._epoch(plain)]
  got = [t._epoch(stored)]
  total = held()
  budget = max(1, int(fraction * total))
  session_lib.set_default_ram_budget(budget)
  kept = held()
  counts = []
  for _ in range(t.EPOCHS - 1):
    before = int(stored_calls.numpy())
    got.append(t._epoch(stored))
    counts.append(int(stored_calls.numpy()) - before)
    expected.append(t._epoch(plain))
print(json.dumps({"same": got == expected, "counts": counts, "total": total,
                  "budget": session_lib.process_caches()["budget"] == budget,
                  "held": kept}))
'''


def _budget_run(mode: str, fraction: float, folder: str) -> tuple[dict, str]:
  """BUDGET_SCRIPT's result, and its log."""
  script = f"{folder}/budget.py"
  with open(script, "w") as f:
    f.write(BUDGET_SCRIPT)
  done = subprocess.run(
      [sys.executable, script, os.path.dirname(__file__), mode, str(fraction)],
      capture_output=True, text=True, timeout=300, check=False, cwd=folder,
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"})
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert result["same"], result
  assert result["budget"] and result["total"] > 0, result
  assert result["held"] <= fraction * result["total"], result
  return result, done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [0.0, 0.9])
def test_rows_without_room_are_computed(fraction, tmp_path):
  result, log = _budget_run("limit", fraction, str(tmp_path))
  batches = ROWS // 4
  if fraction == 0:
    assert result["held"] == 0, result
    assert result["counts"] == [batches] * EPOCHS, result
  else:
    # About 9 of the 10 chunks held: the rows missing touch a few batches,
    # not all.
    assert result["held"] > 0.8 * result["total"], result
    assert all(0 < n < batches for n in result["counts"][1:]), result
  assert "stores no more" in log


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [0.0, 0.5])
def test_a_store_shrinks_when_the_budget_falls(fraction, tmp_path):
  # Epoch 1 stores every row; the budget then falls to `fraction` of them:
  # the store gives back rows (the highest positions first) and the rows
  # dropped are computed in the epochs after.
  result, _ = _budget_run("shrink", fraction, str(tmp_path))
  batches = ROWS // 4
  if fraction == 0:
    assert result["held"] == 0, result
    assert result["counts"] == [batches] * (EPOCHS - 1), result
  else:
    assert result["held"] > 0.3 * result["total"], result
    assert all(0 < n for n in result["counts"]), result


def _ops() -> Any:
  return loader.ops()


@pytest.mark.parametrize("positions,stored", [
    ([0, 1, 2], True),
    ([2, 0], True),
    ([0, 3], False),
    ([], False),
])
def test_has_says_whether_every_position_is_stored(positions, stored):
  key = _key()
  rows = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
  passed = _ops().intune_row_store_put(tf.constant([0, 1, 2], tf.int64),
                                       [rows], key=key)
  np.testing.assert_array_equal(passed[0].numpy(), rows.numpy())
  has = _ops().intune_row_store_has(tf.constant(positions, tf.int64), key=key)
  assert bool(has.numpy()) is stored


def test_a_position_stored_is_left_and_gathered_in_order():
  key = _key()
  put = _ops().intune_row_store_put
  put(tf.constant([5, 9], tf.int64),
      [tf.constant([[1], [2]]), tf.constant([b"a", b"bb"])], key=key)
  put(tf.constant([9, 4], tf.int64),
      [tf.constant([[7], [3]]), tf.constant([b"x", b"ccc"])], key=key)
  numbers, strings = _ops().intune_row_store_gather(
      tf.constant([4, 9, 5, 9], tf.int64), key=key, T=[tf.int32, tf.string],
      shapes=[[1], []])
  assert numbers.numpy().tolist() == [[3], [2], [1], [2]]
  assert strings.numpy().tolist() == [b"ccc", b"bb", b"a", b"bb"]


@pytest.mark.parametrize("stored", [False, True])
def test_gather_of_a_missing_position_is_invalid(stored):
  key = _key()
  if stored:
    _ops().intune_row_store_put(tf.constant([0], tf.int64),
                                [tf.constant([[1.0, 2.0]])], key=key)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="holds no row" if stored else "holds no rows"):
    _ops().intune_row_store_gather(tf.constant([0, 3], tf.int64), key=key,
                                   T=[tf.float32], shapes=[[2]])


@pytest.mark.parametrize("call,match", [
    (lambda ops, key: ops.intune_row_store_has(
        tf.constant(0, tf.int64), key=key), "positions must be a vector"),
    (lambda ops, key: ops.intune_row_store_put(
        tf.constant([[0]], tf.int64), [tf.constant([1.0])], key=key),
     "positions must be a vector"),
    (lambda ops, key: ops.intune_row_store_put(
        tf.constant([0, 1], tf.int64), [tf.constant([1.0])], key=key),
     r"rows\[0\] must have 2 rows"),
    (lambda ops, key: ops.intune_row_store_put(
        tf.constant([0], tf.int64), [tf.constant(1.0)], key=key),
     r"rows\[0\] must have 1 rows"),
    (lambda ops, key: ops.intune_row_store_gather(
        tf.constant(0, tf.int64), key=key, T=[tf.float32], shapes=[[]]),
     "positions must be a vector"),
    (lambda ops, key: ops.intune_row_store_put(
        tf.constant([0], tf.int64),
        [tf.raw_ops.TensorListReserve(element_shape=tf.constant([], tf.int32),
                                      num_elements=1,
                                      element_dtype=tf.float32)[None]],
        key=key),
     "dense tensors only"),
])
def test_inputs_of_the_wrong_shape_or_dtype_are_invalid(call, match):
  with pytest.raises(tf.errors.InvalidArgumentError, match=match):
    call(_ops(), _key())


def test_a_store_keeps_the_dtypes_it_was_made_with():
  key = _key()
  _ops().intune_row_store_put(tf.constant([0], tf.int64),
                              [tf.constant([1.0])], key=key)
  with pytest.raises(tf.errors.InvalidArgumentError, match="holds rows of"):
    _ops().intune_row_store_put(tf.constant([1], tf.int64),
                                [tf.constant([1])], key=key)
  with pytest.raises(tf.errors.InvalidArgumentError, match="holds rows of"):
    _ops().intune_row_store_gather(tf.constant([0], tf.int64), key=key,
                                   T=[tf.int32], shapes=[[]])
