"""The rewrite pass insert_row_store (rewrites/insert_row_store.cc), through
tuned iterators as users run them: a pipeline `files -> [InTune cache] ->
shuffle -> batch -> maps`, each epoch a new iterator of the same dataset (as
`model.fit` makes), against the same pipeline without InTune (same seeds).
Its elements and errors are plain TF's, element for element, every epoch;
where the maps are row-wise the row store serves the batches from the second
epoch on, and where they are not the pipeline is left as it is."""

import os
import pathlib
import pickle
import re
import subprocess
import sys
from typing import Any, Callable

import numpy as np
import pytest
import tensorflow as tf
import test_row_store
import test_row_wise

import intune_tf

ROWS = 24
BATCH = 5  # 24 rows: 4 batches of 5 and a last one of 4
BATCHES = -(-ROWS // BATCH)
EPOCHS = 3
SEED = 1
BUFFER = 8
KEPT = "a row store keeps the rows of "


def _write(path: str, records: list[bytes]) -> None:
  with tf.io.TFRecordWriter(path) as writer:
    for record in records:
      writer.write(record)


def _source(kind: str, folder: str) -> tf.data.Dataset:
  """The rows of `kind` (test_row_wise's sources), read from a TFRecord file
  under `folder`: InTune caches only what is read from files, so the rows
  held in memory there are written and decoded here, below the shuffle."""
  if kind in ("examples", "lines"):
    return test_row_wise._records(kind, pathlib.Path(folder))  # noqa: SLF001
  path = os.path.join(folder, f"{kind}.tfrecord")
  if kind == "ints":
    _write(path, [np.int64(i).tobytes() for i in range(ROWS)])
    return tf.data.TFRecordDataset(path).map(
        lambda r: tf.reshape(tf.io.decode_raw(r, tf.int64), []))
  if kind == "vectors":
    _write(path, [np.arange(3 * i, 3 * i + 3, dtype=np.float32).tobytes()
                  for i in range(ROWS)])
    return tf.data.TFRecordDataset(path).map(
        lambda r: tf.reshape(tf.io.decode_raw(r, tf.float32), [3]))
  if kind == "words":
    _write(path, [f"word{i % 7}".encode() for i in range(ROWS)])
    return tf.data.TFRecordDataset(path)
  raise ValueError(kind)


def _pipeline(kind: str, folder: str, *maps: Callable, seed: int | None = SEED,
              drop_remainder: bool = False, parallel: bool = False,
              prefetch_between: bool = False) -> tf.data.Dataset:
  """`source -> shuffle -> batch -> maps -> prefetch`.

  Args:
    kind: the source (`_source`).
    folder: where its files go.
    *maps: the maps' functions, in turn.
    seed: the shuffle's seed; None draws it from TF's global seed, which is
      set first, so that two pipelines made in turn shuffle alike. Default
      SEED.
    drop_remainder: the batch's. Default False.
    parallel: the maps run with num_parallel_calls=AUTOTUNE. Default False.
    prefetch_between: a prefetch between the batch and the first map.
      Default False.
  """
  tf.random.set_seed(11)
  ds = _source(kind, folder).shuffle(BUFFER, seed=seed,
                                     reshuffle_each_iteration=True)
  ds = ds.batch(BATCH, drop_remainder=drop_remainder)
  if prefetch_between:
    ds = ds.prefetch(1)
  for f in maps:
    ds = ds.map(f, num_parallel_calls=tf.data.AUTOTUNE if parallel else None)
  return ds.prefetch(2)


def _tuned(ds: tf.data.Dataset) -> tf.data.Dataset:
  """`ds` tuned by the manual policy (knobs left as written), no warm
  start, the cache on."""
  return intune_tf.tune(ds, policy="manual", warm_start=False, cache=True)


def _numpy(element: Any) -> Any:
  """`element` as Python lists (a sparse tensor as its indices, values and
  dense shape)."""
  def listed(t: Any) -> Any:
    if isinstance(t, tf.SparseTensor):
      return [t.indices.numpy().tolist(), t.values.numpy().tolist(),
              t.dense_shape.numpy().tolist()]
    return t.numpy().tolist()

  return tf.nest.map_structure(listed, element)


def _normalized(message: str) -> str:
  """An error's message without the names of the functions and nodes that
  raised it (test_row_store's), nor the ids of the datasets it names (the
  tuned graph's differ from the plain one's)."""
  message = test_row_store._normalized(message)  # noqa: SLF001
  return re.sub(r"(\w+Dataset(V\d+)?):\d+", r"\1", message)


def _epoch(ds: tf.data.Dataset) -> tuple[list[Any], dict | None]:
  """One epoch of a new iterator of `ds`: its elements as lists, an error
  in an element's place as (its class, its normalized message), reading on
  after an error; and, for a tuned `ds`, `TuningSession.cache()` after its
  last element (its session ends with the epoch)."""
  out, cache = [], None
  it = iter(ds)
  tuned = hasattr(it, intune_tf.ops.session.SESSION_IDS_ATTR)
  while True:
    try:
      element = next(it)
    except StopIteration:
      return out, cache
    except tf.errors.OpError as e:
      out.append((type(e).__name__, _normalized(e.message)))
    else:
      out.append(_numpy(element))
    if tuned:
      cache = intune_tf.session_of(it).cache()


def _epochs(ds: tf.data.Dataset,
            count: int = EPOCHS) -> tuple[list[list[Any]], list[dict | None]]:
  """`count` epochs of `ds` (`_epoch`), and the cache's figures of each."""
  epochs, caches = [], []
  for _ in range(count):
    elements, cache = _epoch(ds)
    epochs.append(elements)
    caches.append(cache)
  return epochs, caches


def _assert_served(caches: list[dict], batches: int, rows: int,
                   whole: bool = True) -> None:
  """The row store held `rows` rows after epoch 1, and gave batches from
  epoch 2 on.

  Args:
    caches: `TuningSession.cache()` after each epoch.
    batches: the batches of an epoch.
    rows: the rows the map computed in epoch 1.
    whole: every row reaches the map every epoch: the store holds `rows`
      after each epoch and gives every batch after epoch 1. Else it holds
      at least `rows` and gives some. Default True.
  """
  assert KEPT in caches[0]["reason"], caches[0]["reason"]
  assert caches[0]["row_store_rows"] == rows, caches[0]
  assert caches[0]["row_store_gathered"] == 0, caches[0]
  assert caches[1]["row_store_gathered"] > 0, caches[1]
  if whole:
    assert [c["row_store_rows"] for c in caches] == [rows] * len(caches), (
        caches)
    assert [c["row_store_gathered"] for c in caches] == [
        batches * e for e in range(len(caches))], caches
  else:
    assert all(rows <= c["row_store_rows"] for c in caches), caches


def _assert_not_kept(caches: list[dict]) -> None:
  for cache in caches:
    assert KEPT not in cache["reason"], cache["reason"]
    assert cache["row_store_rows"] == 0, cache
    assert cache["row_store_gathered"] == 0, cache


# test_row_wise's row-wise maps but Identity, which TF's noop_elimination
# takes out of the graph before InTune's rewrite sees it.
ROW_WISE = [r for r in test_row_wise.ROW_WISE if r[0] != "Identity"]


@pytest.mark.parametrize("name,source,f", ROW_WISE,
                         ids=[r[0] for r in ROW_WISE])
def test_a_row_wise_map_gives_plain_elements_from_the_store(name, source, f,
                                                            tmp_path):
  del name
  expected, _ = _epochs(_pipeline(source, str(tmp_path), f))
  got, caches = _epochs(_tuned(_pipeline(source, str(tmp_path), f)))
  # The shuffle reorders the rows every epoch: the check compares orders.
  assert expected[0] != expected[1]
  assert got == expected
  _assert_served(caches, BATCHES, ROWS)


def _parse(s: tf.Tensor) -> dict:
  return tf.io.parse_example(s, test_row_wise._DENSE)  # noqa: SLF001


# (name, source, the maps): row-wise maps run as one.
CHAINS = [
    ("parse, a sum of features, sqrt", "examples",
     (_parse, lambda d: tf.cast(d["a"], tf.float32) + d["b"][:, 0],
      tf.math.sqrt)),
    ("csv, then a tuple of casts", "lines",
     (lambda s: tf.io.decode_csv(s, [[0], [0.0], [""]]),
      lambda a, b, c: (tf.cast(a, tf.float32) * b,
                       tf.strings.to_hash_bucket_fast(c, 5)))),
    ("math, then one_hot", "ints",
     (lambda x: x * 3 + 1, lambda x: tf.one_hot(x % 4, 4))),
]


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("name,source,maps", CHAINS, ids=[c[0] for c in CHAINS])
def test_a_chain_of_row_wise_maps_runs_as_one_from_the_store(
    name, source, maps, parallel, tmp_path):
  del name
  expected, _ = _epochs(_pipeline(source, str(tmp_path), *maps,
                                  parallel=parallel))
  got, caches = _epochs(_tuned(_pipeline(source, str(tmp_path), *maps,
                                         parallel=parallel)))
  assert got == expected
  _assert_served(caches, BATCHES, ROWS)
  assert " (run as one map, " in caches[0]["reason"], caches[0]["reason"]


@pytest.mark.parametrize("prefetch_between", [False, True])
@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("drop_remainder", [False, True])
@pytest.mark.parametrize("seed", [None, 7])
def test_shuffle_seeds_batches_and_maps_give_plain_elements(
    seed, drop_remainder, parallel, prefetch_between, tmp_path):
  def make() -> tf.data.Dataset:
    return _pipeline("examples", str(tmp_path), _parse, seed=seed,
                     drop_remainder=drop_remainder, parallel=parallel,
                     prefetch_between=prefetch_between)

  expected, _ = _epochs(make())
  got, caches = _epochs(_tuned(make()))
  assert expected[0] != expected[1]
  assert got == expected
  # A dropped remainder never reaches the map: its rows, other ones each
  # epoch, are computed in a later epoch when they come in a whole batch.
  batches = ROWS // BATCH if drop_remainder else BATCHES
  rows = batches * BATCH if drop_remainder else ROWS
  _assert_served(caches, batches, rows, whole=not drop_remainder)


def _with_option(ds: tf.data.Dataset) -> tf.data.Dataset:
  options = tf.data.Options()
  options.experimental_intune = True
  return ds.with_options(options)


@pytest.mark.parametrize("turn_on", [intune_tf.tune, _with_option],
                         ids=["tune", "experimental_intune"])
def test_the_default_options_give_plain_elements_from_the_store(turn_on,
                                                                 tmp_path):
  def make() -> tf.data.Dataset:
    return _pipeline("examples", str(tmp_path), _parse, parallel=True)

  expected, _ = _epochs(make())
  got, caches = _epochs(turn_on(make()))
  assert got == expected
  assert KEPT in caches[0]["reason"], caches[0]["reason"]
  assert caches[1]["row_store_gathered"] > 0, caches[1]


def _examples(folder: str, malformed: int | None) -> tf.data.Dataset:
  path = os.path.join(folder, "rows.tfrecord")
  _write(path, test_row_store._rows(malformed))  # noqa: SLF001
  return tf.data.TFRecordDataset(path)


def _parse_rows(s: tf.Tensor) -> dict:
  return tf.io.parse_example(s, test_row_store.FEATURES)


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("malformed", [0, 17, test_row_store.ROWS - 1])
def test_a_malformed_row_raises_where_plain_raises_every_epoch(
    malformed, parallel, tmp_path):
  def make() -> tf.data.Dataset:
    return _examples(str(tmp_path), malformed).shuffle(16, seed=SEED).batch(
        4).map(_parse_rows, num_parallel_calls=2 if parallel else None
               ).prefetch(2)

  expected, _ = _epochs(make())
  got, caches = _epochs(_tuned(make()))
  errors = [[i for i, e in enumerate(epoch) if isinstance(e, tuple)]
            for epoch in expected]
  assert [len(e) for e in errors] == [1] * EPOCHS, errors
  assert expected[0][errors[0][0]][0] == "InvalidArgumentError"
  assert "Key: x, Index: " in (
      expected[0][errors[0][0]][1]), expected[0][errors[0][0]]
  assert got == expected
  assert KEPT in caches[0]["reason"], caches[0]["reason"]
  # Every row but those of the batch that raised is stored in epoch 1.
  assert caches[0]["row_store_rows"] == test_row_store.ROWS - 4, caches[0]
  assert caches[2]["row_store_gathered"] > 0, caches[2]


def _criteo_text(folder: str, bad_line: int | None = None) -> list[str]:
  """400 synthetic Criteo rows in 2 TSV files; line `bad_line` of the
  first (1-based) replaced by a row of 3 fields."""
  from intune_tf.criteo import synthetic  # noqa: PLC0415  only these tests
  files = synthetic.generate(400, folder, seed=5, rows_per_file=200)
  if bad_line is not None:
    with open(files[0], "rb") as f:
      lines = f.read().split(b"\n")
    lines[bad_line - 1] = b"1\t2\t3"
    with open(files[0], "wb") as f:
      f.write(b"\n".join(lines))
  return files


def _criteo_pipeline(files: list[str], level: int) -> tf.data.Dataset:
  from intune_tf.criteo import pipelines  # noqa: PLC0415  only these tests
  return pipelines.pipeline(level, files, batch_size=32, shuffle_buffer=64,
                            seed=SEED, num_buckets=97, vocab_size=20,
                            noise_std=0.0)


@pytest.mark.parametrize("level", [3, 4])
def test_the_criteo_text_parse_gives_plain_rows_from_the_store(level,
                                                               tmp_path):
  # The parse splits each line into fields padded to 40, checks every row
  # with an assert whose message a cond makes, and gathers by the file's
  # index: row-wise. Level 4's features map (random noise, here of 0
  # deviation: the order of its parallel calls moves it) runs every epoch.
  files = _criteo_text(str(tmp_path))
  expected, _ = _epochs(_criteo_pipeline(files, level))
  got, caches = _epochs(_tuned(_criteo_pipeline(files, level)))
  assert expected[0] != expected[1]
  assert got == expected
  assert "_Parse" in caches[0]["reason"] or KEPT in caches[0]["reason"]
  _assert_served(caches, -(-400 // 32), 400)


@pytest.mark.parametrize("bad_line", [1, 150])
def test_a_bad_criteo_line_raises_where_plain_raises_every_epoch(bad_line,
                                                                 tmp_path):
  files = _criteo_text(str(tmp_path), bad_line)
  expected, _ = _epochs(_criteo_pipeline(files, 3))
  got, caches = _epochs(_tuned(_criteo_pipeline(files, 3)))
  # An error is (its class, its message); an element (features, label).
  errors = [[i for i, e in enumerate(epoch) if isinstance(e[0], str)]
            for epoch in expected]
  assert [len(e) for e in errors] == [1] * EPOCHS, errors
  assert f":{bad_line}: has 3 fields" in expected[0][errors[0][0]][1], (
      expected[0][errors[0][0]])
  assert got == expected
  assert KEPT in caches[0]["reason"], caches[0]["reason"]
  # Every row but those of the batch that raised is stored in epoch 1.
  assert caches[0]["row_store_rows"] == 400 - 32, caches[0]
  assert caches[2]["row_store_gathered"] > 0, caches[2]


def _unordered_examples(folder: str) -> tf.data.Dataset:
  """test_row_store's rows in 4 TFRecord files, read 2 at a time by an
  interleave with deterministic=False."""
  rows = test_row_store._rows()  # noqa: SLF001
  paths = []
  for part in range(4):
    paths.append(os.path.join(folder, f"rows-{part}.tfrecord"))
    _write(paths[-1], rows[part::4])
  return tf.data.Dataset.from_tensor_slices(paths).interleave(
      tf.data.TFRecordDataset, cycle_length=2, num_parallel_calls=2,
      deterministic=False)


@pytest.mark.parametrize("ram_budget", [None, 4096], ids=["whole", "partial"])
def test_an_unordered_input_gets_no_row_store_and_every_row_once(ram_budget,
                                                                 tmp_path):
  # The rows below the shuffle may come in another order each epoch, with
  # the records cache holding all of them or part: no positions, the rows
  # as plain TF gives them, each once.
  def make() -> tf.data.Dataset:
    return _unordered_examples(str(tmp_path)).shuffle(16, seed=SEED).batch(
        4).map(_parse_rows).prefetch(2)

  fields = {} if ram_budget is None else {"ram_budget": ram_budget}
  tuned = intune_tf.tune(make(), policy="manual", warm_start=False,
                         cache=True, **fields)
  for elements, cache in zip(*_epochs(tuned)):
    rows = sorted(i for element in elements for i in element["i"])
    assert rows == list(range(test_row_store.ROWS))
    assert "no row store: the rows below the shuffle change order" in (
        cache["reason"]), cache["reason"]
    assert cache["row_store_rows"] == 0, cache


# The refused maps of test_row_wise, and a lookup of a StaticHashTable (the
# root's graph holds the table as a placeholder: its kind is not known).
REFUSED = [r[:3] for r in test_row_wise.REFUSED] + [
    ("a lookup of a StaticHashTable", "words",
     test_row_wise._table().lookup),  # noqa: SLF001
]


@pytest.mark.parametrize("name,source,f", REFUSED, ids=[r[0] for r in REFUSED])
def test_a_map_that_is_not_row_wise_is_left_as_it_is(name, source, f,
                                                     tmp_path):
  del name
  expected, _ = _epochs(_pipeline(source, str(tmp_path), f))
  got, caches = _epochs(_tuned(_pipeline(source, str(tmp_path), f)))
  assert got == expected
  _assert_not_kept(caches)


def _example(i: int, shift: float = 0.0) -> bytes:
  """Row `i` with test_row_store.FEATURES, its floats moved by `shift`: the
  same bytes' length whatever `shift`."""
  feature = {
      "x": tf.train.Feature(float_list=tf.train.FloatList(
          value=[i + shift, i + 0.5, -i - shift])),
      "i": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
      "s": tf.train.Feature(bytes_list=tf.train.BytesList(
          value=[b"row-%02d" % i])),
  }
  return tf.train.Example(features=tf.train.Features(
      feature=feature)).SerializeToString()


# The rows of the files written again: an epoch long enough that checking
# the file (a stat, under 1% of an epoch's time, or the cache is declined)
# stays below 1% on a busy machine.
FILE_ROWS = 400


def _versions(change: str) -> tuple[list[bytes], list[bytes]]:
  """The rows of a TFRecord file before and after it is written again:
  "same size" changes values and keeps every byte count, "more rows" adds
  rows, "fewer rows" drops some."""
  before = [_example(i % 100) for i in range(FILE_ROWS)]
  if change == "same size":
    after = [_example(i % 100, shift=0.25) for i in range(FILE_ROWS)]
    assert [len(r) for r in after] == [len(r) for r in before]
  elif change == "more rows":
    after = before + [_example(i) for i in range(7)]
  else:
    after = before[3:]
  return before, after


@pytest.mark.parametrize("change", ["same size", "more rows", "fewer rows"])
def test_files_written_again_give_their_new_rows(change, tmp_path):
  path = str(tmp_path / "rows.tfrecord")
  before, after = _versions(change)
  _write(path, before)

  def make() -> tf.data.Dataset:
    return tf.data.TFRecordDataset(path).shuffle(BUFFER, seed=SEED).batch(
        BATCH).map(_parse_rows).prefetch(2)

  plain, tuned = make(), _tuned(make())
  expected, _ = _epochs(plain, 1)
  got, caches = _epochs(tuned, 1)
  assert KEPT in caches[0]["reason"], caches[0]["reason"]
  assert caches[0]["row_store_rows"] == FILE_ROWS, caches[0]
  _write(path, after)
  more_expected, _ = _epochs(plain, 2)
  more_got, more_caches = _epochs(tuned, 2)
  assert expected + more_expected == got + more_got
  assert more_expected[0] != expected[0]
  # The store was dropped with the cache's elements, and holds the new rows.
  assert [c["row_store_rows"] for c in more_caches] == [len(after)] * 2, (
      more_caches)
  assert more_caches[0]["row_store_gathered"] == 0, more_caches


@pytest.mark.parametrize("size", [30, 1 << 20])
def test_a_captured_tensor_is_stored_or_refused(size, tmp_path):
  # An eager tensor the map captures: the root's graph passes it by
  # reference (a placeholder), so its value is not in the store's key.
  captured = tf.constant(np.arange(size, dtype=np.float32))

  def f(x: tf.Tensor) -> tf.Tensor:
    return x + tf.size(captured, out_type=tf.int64)

  expected, _ = _epochs(_pipeline("ints", str(tmp_path), f))
  got, caches = _epochs(_tuned(_pipeline("ints", str(tmp_path), f)))
  assert got == expected
  if KEPT in caches[0]["reason"]:
    _assert_served(caches, BATCHES, ROWS)
  else:
    assert "a tensor passed by reference" in caches[0]["reason"], caches[0]
    _assert_not_kept(caches)


def _checkpointed(path: str, prefetched: bool) -> tf.data.Dataset:
  """The pipeline that the checkpoint tests save and restore: with a
  parallel map and a prefetch (`prefetched`), a checkpoint holds batches
  already mapped; without, only the shuffle's rows and their positions."""
  ds = tf.data.TFRecordDataset(path).shuffle(BUFFER, seed=SEED).batch(BATCH)
  if not prefetched:
    return ds.map(_parse_rows)
  return ds.map(_parse_rows, num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)


# Restores the checkpoint argv[5] of `_checkpointed(argv[2], argv[3] ==
# "prefetched")` (tuned when argv[4] is "tuned") into a new iterator, and
# pickles its remaining elements to argv[6].
RESTORE_SCRIPT = """
import pickle, sys
sys.path.insert(0, sys.argv[1])
import tensorflow as tf
import test_insert_row_store as t
ds = t._checkpointed(sys.argv[2], sys.argv[3] == "prefetched")
if sys.argv[4] == "tuned":
  ds = t._tuned(ds)
it = iter(ds)
tf.train.Checkpoint(iterator=it).restore(sys.argv[5])
with open(sys.argv[6], "wb") as f:
  pickle.dump([t._numpy(e) for e in it], f)
"""


def _restored_in_new_process(folder: str, args: list[str]) -> list[Any]:
  """RESTORE_SCRIPT's elements, run with `args` (argv[2:6])."""
  script = os.path.join(folder, "restore.py")
  out = os.path.join(folder, "restored.pickle")
  with open(script, "w") as f:
    f.write(RESTORE_SCRIPT)
  done = subprocess.run(
      [sys.executable, script, os.path.dirname(__file__), *args, out],
      capture_output=True, text=True, timeout=300, check=False, cwd=folder)
  assert done.returncode == 0, done.stderr[-3000:]
  with open(out, "rb") as f:
    return pickle.load(f)


def _saved_and_restored(ds: tf.data.Dataset, folder: str,
                        taken: int) -> tuple[list[Any], str, list[Any],
                                             list[Any]]:
  """A new iterator of `ds` after `taken` elements, checkpointed under
  `folder`: the elements taken, the checkpoint's prefix, the elements after
  them, and those of a new iterator restored from the checkpoint."""
  it = iter(ds)
  head = [_numpy(next(it)) for _ in range(taken)]
  prefix = tf.train.Checkpoint(iterator=it).save(os.path.join(folder, "ckpt"))
  rest = [_numpy(e) for e in it]
  again = iter(ds)
  tf.train.Checkpoint(iterator=again).restore(prefix)
  return head, prefix, rest, [_numpy(e) for e in again]


def _checkpoint_run(folder: str, mode: str, prefetched: bool,
                    taken: int) -> dict[str, Any]:
  """Epoch 1 of `_checkpointed`, then `taken` elements of epoch 2 and a
  checkpoint of its iterator: the elements after them as that iterator
  gives them, as a new iterator of the same dataset restored from the
  checkpoint gives them, and as one in a new process does."""
  path = os.path.join(folder, "rows.tfrecord")
  ds = _checkpointed(path, prefetched)
  if mode == "tuned":
    ds = _tuned(ds)
  first, cache = _epoch(ds)
  if mode == "tuned":
    assert KEPT in cache["reason"], cache["reason"]
  head, prefix, rest, restored = _saved_and_restored(
      ds, os.path.join(folder, mode), taken)
  args = [path, "prefetched" if prefetched else "sequential", mode, prefix]
  return {"first": first, "head": head, "rest": rest, "restored": restored,
          "new process": _restored_in_new_process(folder, args)}


# A checkpoint holds the positions of the rows the shuffle holds, tagged
# with the store of this process: restored here they name a live store,
# restored in another process none (their batches are computed there).
@pytest.mark.slow
@pytest.mark.parametrize("taken", [1, 3])
@pytest.mark.parametrize("prefetched", [False, True],
                         ids=["sequential", "prefetched"])
def test_a_checkpoint_in_epoch_2_restores_plain_elements(prefetched, taken,
                                                         tmp_path):
  _write(str(tmp_path / "rows.tfrecord"), [_example(i) for i in range(ROWS)])
  expected = _checkpoint_run(str(tmp_path), "plain", prefetched, taken)
  got = _checkpoint_run(str(tmp_path), "tuned", prefetched, taken)
  assert len(expected["rest"]) == BATCHES - taken
  assert expected["restored"] == expected["rest"]
  assert expected["new process"] == expected["rest"]
  assert got == expected


@pytest.mark.parametrize("mode", ["plain", "tuned"])
def test_a_checkpoint_under_the_fail_policy_saves(mode, tmp_path):
  path = str(tmp_path / "rows.tfrecord")
  _write(path, [_example(i) for i in range(ROWS)])
  options = tf.data.Options()
  options.experimental_external_state_policy = (
      tf.data.experimental.ExternalStatePolicy.FAIL)
  ds = _checkpointed(path, prefetched=True).with_options(options)
  if mode == "tuned":
    ds = _tuned(ds)
  _, cache = _epoch(ds)
  if mode == "tuned":
    assert KEPT in cache["reason"], cache["reason"]
  (head,), _, rest, restored = _saved_and_restored(ds, str(tmp_path), 1)
  assert restored == rest
  assert len([head] + rest) == BATCHES
