"""The tuned pipeline keeps the user's semantics; nothing is lost."""

import collections
import gc
import os
import subprocess
import sys
import tempfile
import threading
import time

from _waiting import poll_for
from _waiting import wait_for
from _waiting import wait_until
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

import intune_tf
from intune_tf import rewrites
from intune_tf.live import tuner

AUTOTUNE = tf.data.AUTOTUNE


def _with_option(ds, **fields):
  options = tf.data.Options()
  options.experimental_intune = (
      intune_tf.IntuneOptions(**fields) if fields else True)
  return ds.with_options(options)


def _deterministic(ds, value):
  options = tf.data.Options()
  options.deterministic = value
  return ds.with_options(options)


def _records(tmp_path, kind):
  path = str(tmp_path / f"data.{kind}")
  if kind == "tfrecord":
    with tf.io.TFRecordWriter(path) as w:
      for i in range(50):
        w.write(f"record-{i}".encode())
  else:
    with open(path, "w") as f:
      f.write("".join(f"line {i}\n" for i in range(50)))
  return path


def _pipelines(tmp_path):
  var = tf.Variable(3, dtype=tf.int64)
  table = tf.lookup.StaticHashTable(
      tf.lookup.KeyValueTensorInitializer(
          tf.range(10, dtype=tf.int64), tf.range(10, dtype=tf.int64) * 7), -1)
  r = tf.data.Dataset.range
  return {
      "map": lambda: r(100).map(lambda x: x * 2),
      "parallel_map": lambda: r(100).map(lambda x: x * 2,
                                         num_parallel_calls=AUTOTUNE),
      "interleave": lambda: r(4).interleave(
          lambda x: r(x * 10, x * 10 + 5), cycle_length=2,
          num_parallel_calls=AUTOTUNE),
      "interleave_text": lambda: r(3).interleave(
          lambda x: tf.data.TextLineDataset(_records(tmp_path, "txt")).skip(x),
          cycle_length=2, num_parallel_calls=AUTOTUNE),
      "flat_map_text": lambda: r(3).flat_map(
          lambda x: tf.data.TextLineDataset(_records(tmp_path, "txt")).skip(x)),
      "parallel_batch": lambda: r(100).batch(7, num_parallel_calls=AUTOTUNE),
      "map_and_batch": lambda: r(100).map(
          lambda x: x + 1, num_parallel_calls=AUTOTUNE).batch(8),
      "filter": lambda: r(100).filter(lambda x: x % 3 == 0),
      "seeded_shuffle": lambda: r(100).shuffle(
          20, seed=7, reshuffle_each_iteration=False),
      "prefetch": lambda: r(100).map(lambda x: -x).prefetch(AUTOTUNE),
      "fixed_parallelism": lambda: r(100).map(
          lambda x: x * 5, num_parallel_calls=2).prefetch(3),
      "variable": lambda: r(20).map(lambda x: x * var,
                                    num_parallel_calls=AUTOTUNE),
      "hash_table": lambda: r(12).map(table.lookup,
                                      num_parallel_calls=AUTOTUNE),
      "random": lambda: r(20).map(
          lambda x: tf.random.stateless_uniform([2], seed=[x, 1])),
      "ragged": lambda: r(10).map(lambda x: tf.range(x)).ragged_batch(3),
      "dict": lambda: r(10).map(
          lambda x: {"a": x, "b": tf.strings.as_string(x)},
          num_parallel_calls=AUTOTUNE),
      "from_generator": lambda: tf.data.Dataset.from_generator(
          lambda: iter(range(30)),
          output_signature=tf.TensorSpec([], tf.int64)).map(
              lambda x: x + 1, num_parallel_calls=AUTOTUNE),
      "tfrecord": lambda: tf.data.TFRecordDataset(
          _records(tmp_path, "tfrecord")).map(
              tf.strings.length, num_parallel_calls=AUTOTUNE),
      "textline": lambda: tf.data.TextLineDataset(
          _records(tmp_path, "txt")).map(
              lambda s: tf.strings.split(s)[1], num_parallel_calls=AUTOTUNE),
  }


_NAMES = sorted(_pipelines(None))


def _values(element):
  return [x.to_list() if isinstance(x, tf.RaggedTensor) else
          np.asarray(x).tolist() for x in tf.nest.flatten(element)]


def _key(element):
  return repr(_values(element))


def _leaves(ds):
  out = []

  def walk(x):
    if isinstance(x, list):
      for y in x:
        walk(y)
    else:
      out.append(repr(x))

  for element in ds:
    walk(_values(element))
  return out


@pytest.mark.parametrize("name", _NAMES)
@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("include_fixed,insert_prefetch",
                         [(False, False), (True, True)])
def test_same_output_with_the_option(tmp_path, name, deterministic,
                                     include_fixed, insert_prefetch):
  make = _pipelines(tmp_path)[name]
  plain = _deterministic(make(), deterministic)
  tuned = _with_option(_deterministic(make(), deterministic),
                       include_fixed=include_fixed,
                       insert_prefetch=insert_prefetch)
  expected = [_key(e) for e in plain]
  got = [_key(e) for e in tuned]
  if deterministic:
    assert got == expected
  else:
    # Without determinism, even the split of elements into batches may
    # differ: compare the multiset of every value.
    assert collections.Counter(_leaves(tuned)) == collections.Counter(
        _leaves(plain))
  assert tuned.cardinality() == plain.cardinality()


def _live_sessions() -> int:
  """How many sessions are live; also from inside a TF1 graph (a new thread
  runs eagerly)."""
  count = []
  thread = threading.Thread(
      target=lambda: count.append(len(intune_tf.sessions())))
  thread.start()
  thread.join()
  return count[0]


@pytest.mark.parametrize("iterate", ["eager", "one_shot", "initializable"])
@pytest.mark.parametrize("option", [True, False])
@pytest.mark.parametrize("buffer", [1, 2])
def test_fixed_prefetch_buffers_as_plain_tf(iterate, option, buffer):
  """A user's prefetch(B) last in the pipeline, the option set by the last
  `with_options`: the map runs at most B elements ahead of the consumer, as
  on plain TF (no prefetch of TF's inject_prefetch above it), and the
  pipeline is tuned exactly when the option is on, TF1 iterators included
  (they wrap the dataset in a DatasetV1Adapter)."""
  calls = []

  def f(x):
    calls.append(int(x))
    return x

  def make():
    ds = tf.data.Dataset.range(100).map(
        lambda x: tf.numpy_function(f, [x], tf.int64)).prefetch(buffer)
    options = tf.data.Options()
    options.experimental_intune = option
    return ds.with_options(options)

  before = _live_sessions()
  ahead, sessions = 0, None
  if iterate == "eager":
    it = iter(make())
    get = lambda: next(it)
    sessions = _live_sessions() - before
    for i in range(12):
      time.sleep(0.05)  # the producers run ahead as far as they can
      ahead = max(ahead, len(calls) - i)
      get()
    del it
  else:
    with tf.Graph().as_default():
      ds = make()
      if iterate == "one_shot":
        it = tf.compat.v1.data.make_one_shot_iterator(ds)
      else:
        it = tf.compat.v1.data.make_initializable_iterator(ds)
      nxt = it.get_next()
      with tf.compat.v1.Session() as s:
        if iterate == "initializable":
          s.run(it.initializer)
        for i in range(12):
          if i == 1:
            sessions = _live_sessions() - before
          time.sleep(0.05)
          ahead = max(ahead, len(calls) - i)
          s.run(nxt)
  assert calls[:12] == list(range(12))
  assert ahead <= buffer, f"the map ran {ahead} elements ahead"
  assert sessions == (1 if option else 0)
  gc.collect()


@pytest.mark.parametrize("source", ["range", "interleave"])
def test_checkpointed_iterator_resumes_exactly(tmp_path, source):
  r = tf.data.Dataset.range
  data = r(200) if source == "range" else r(4).interleave(
      lambda x: r(50 * x, 50 * (x + 1)), cycle_length=1)
  ds = _with_option(data.map(
      lambda x: x * 3, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE))
  it = iter(ds)
  first = [int(next(it)) for _ in range(57)]
  ckpt = tf.train.Checkpoint(iterator=it)
  path = ckpt.save(str(tmp_path / "ckpt"))
  rest_original = [int(x) for x in it]
  it2 = iter(ds)
  next(it2)
  tf.train.Checkpoint(iterator=it2).restore(path)
  rest_restored = [int(x) for x in it2]
  assert first == [3 * i for i in range(57)]
  assert rest_restored == rest_original == [3 * i for i in range(57, 200)]


@pytest.mark.parametrize("inner_stats", [False, True])
def test_per_element_datasets_run_without_the_model_by_default(inner_stats):
  r = tf.data.Dataset.range
  ds = _with_option(r(4).interleave(
      lambda x: tf.data.Dataset.zip((r(x, 100), r(100))).skip(1),
      cycle_length=2, num_parallel_calls=AUTOTUNE).map(
          lambda a, b: a + b, num_parallel_calls=AUTOTUNE),
      inner_stats=inner_stats, policy="manual", warm_start=False)
  it = iter(ds)
  for _ in range(50):
    next(it)
  session = intune_tf.session_of(it)
  kinds = {intune_tf.records.parse_stage(s.name).op for s in session.stats()}
  inner = {"Zip", "FiniteSkip"}  # the outer Range(4) is recorded either way
  if inner_stats:
    assert inner <= kinds and "IntuneUntracked" not in kinds
  else:
    assert not inner & kinds and "IntuneUntracked" in kinds
    untracked = [s for s in session.stats()
                 if s.name.endswith("[*].IntuneUntracked")]
    # Each wrapper accounts for its whole per-element dataset.
    assert sum(s.elements for s in untracked) > 0
    assert all(s.processing_time_ns > 0 for s in untracked if s.elements)
  # The interleave's own knob is there with TF's buffers (inner stats);
  # with the deeper buffers the guard bounds, it runs cycle_length workers.
  assert any(intune_tf.records.parse_knob(k.name)[0].op ==
             "ParallelInterleaveV4" for k in session.knobs()) == inner_stats
  del it


@pytest.mark.parametrize("interleave_buffer,expected", [
    # TF's: (prefetched inputs 2 * cycle 2 + cycle 2) * (2 * block 1 + 1)
    # = 6 * 3 = 18 results at most.
    (None, 18),
    # Deeper: 6 * 16 = 96.
    (16, 96),
])
def test_interleave_buffers_are_deeper_by_default(interleave_buffer, expected):
  r = tf.data.Dataset.range
  ds = _with_option(r(4).interleave(lambda x: r(x, 100), cycle_length=2,
                                    num_parallel_calls=AUTOTUNE),
                    interleave_buffer=interleave_buffer, policy="manual",
                    warm_start=False)
  it = iter(ds)
  assert [int(next(it)) for _ in range(4)] == [0, 1, 1, 2]
  (node,) = [n for n in intune_tf.session_of(it).model_proto().nodes.values()
             if n.name.startswith("ParallelInterleave")]
  params = {p.name: p.value for p in node.parameters}
  assert params["max_buffered_elements"] == expected
  assert intune_tf.IntuneOptions().interleave_buffer == 16
  del it


# TF's static optimizations that run only with autotune on (the root turns
# TF's autotuner off): under InTune they run as the user's options ask.
@pytest.mark.parametrize("tf_options,knobs", [
    # map_parallelization (default on): the stateless map becomes parallel,
    # and a pipeline ending in a parallel stage gets no injected prefetch.
    ({}, ["ParallelMapV2/parallelism"]),
    # inject_prefetch (default on): a prefetch above the synchronous map.
    ({"map_parallelization": False}, ["Prefetch/buffer_size"]),
    ({"map_parallelization": False, "inject_prefetch": False}, []),
])
def test_tf_autotune_only_optimizations_run_as_the_options_ask(tf_options,
                                                               knobs):
  ds = tf.data.Dataset.range(100).map(lambda x: x * 3)
  options = tf.data.Options()
  for name, value in tf_options.items():
    setattr(options.experimental_optimization, name, value)
  it = iter(_with_option(ds.with_options(options)))
  assert [int(next(it)) for _ in range(3)] == [0, 3, 6]
  session = intune_tf.session_of(it)
  assert sorted(k.name for k in session.knobs()) == knobs
  del it


def _tuned_map() -> tf.data.Dataset:
  return _with_option(tf.data.Dataset.range(10).map(
      lambda x: x + 1, num_parallel_calls=AUTOTUNE))


def _root_graph(tuned: tf.data.Dataset) -> graph_pb2.GraphDef:
  """The graph of `tuned` with its root (`_apply_debug_options`)."""
  return graph_pb2.GraphDef.FromString(tf.raw_ops.DatasetToGraphV2(
      input_dataset=tuned._variant_tensor).numpy())  # noqa: SLF001


def _rebuilt(graph: graph_pb2.GraphDef, element_spec) -> tf.data.Dataset:
  return tf.data.experimental.from_variant(
      tf.raw_ops.DatasetFromGraph(graph_def=graph.SerializeToString()),
      element_spec)


def test_dataset_survives_graph_serialization():
  ds = _tuned_map()
  it = iter(ds)  # the tuned dataset is built at iteration time
  tuned = ds._apply_debug_options()  # noqa: SLF001
  graph = _root_graph(tuned)
  assert [n.op for n in graph.node].count(rewrites.ROOT_OP) == 1
  rebuilt = _rebuilt(graph, tuned.element_spec)
  assert [int(x) for x in rebuilt] == list(range(1, 11))
  del it


def test_a_graph_saved_under_the_former_root_name_runs_tuned():
  tuned = _tuned_map()._apply_debug_options()  # noqa: SLF001
  graph = _root_graph(tuned)
  for node in graph.node:
    if node.op == rewrites.ROOT_OP:
      node.op = rewrites.LEGACY_ROOT_OP
  before = {s.id for s in intune_tf.sessions()}
  rebuilt = _rebuilt(graph, tuned.element_spec)
  it = iter(rebuilt)
  assert [int(x) for x in it] == list(range(1, 11))
  # The old name's kernel is the root's: it tuned the pipeline.
  made = [s for s in intune_tf.sessions() if s.id not in before]
  assert [k.name for s in made for k in s.knobs()] == [
      "ParallelMapV2/parallelism"]
  del it


def _big_elements(budget=None, **fields):
  ds = tf.data.Dataset.range(10**6).map(
      lambda x: tf.fill([2 * 1024 * 1024], tf.cast(x, tf.float32)))  # 8 MB
  ds = ds.prefetch(AUTOTUNE)
  if budget:
    ds = _with_option(ds, ram_budget=budget, **fields)
  return ds


def _sample_peak(session_of, seconds):
  """Consumes in bursts, sampling buffered bytes every 2 ms."""
  peak, stop = [0], threading.Event()

  def sampler():
    while not stop.is_set():
      peak[0] = max(peak[0], session_of())
      time.sleep(0.002)

  return peak, stop, threading.Thread(target=sampler, daemon=True)


@pytest.mark.slow
def test_guard_lowers_only_what_the_budget_needs_and_raises_back():
  # No policy moves the knobs: only the test and the guard do.
  it = iter(_big_elements(1 << 30, policy="manual"))  # 8 MB elements
  next(it)
  session = intune_tf.session_of(it)
  buf = [k for k in session.knobs() if k.kind == "buffer_size"][0].name
  values = lambda: {k.name: k.value for k in session.knobs()}
  session.set({buf: 16})
  assert wait_for(lambda: session.counters()["buffered_bytes"] >= 12 * 8 << 20)
  session.set_ram_budget(80 << 20)
  chosen = values()[buf]
  # (buffer + 1 + parallelism + 1) x 8 MB within 80 MB: far above the minimum.
  assert 3 <= chosen < 16, values()
  for _ in range(8):  # the 16 buffered elements drain
    next(it)
    time.sleep(0.05)
  assert values()[buf] == chosen, values()  # not lowered for draining ones
  session.set_ram_budget(1 << 30)
  assert values()[buf] == 16  # what was set comes back
  del it
  gc.collect()


@pytest.mark.slow
def test_guard_keeps_buffers_under_the_budget():
  budget = 64 << 20
  it = iter(_big_elements(budget))
  next(it)
  session = intune_tf.session_of(it)
  buf = [k for k in session.knobs() if k.kind == "buffer_size"][0]
  # Whatever the policy or the user asks, the guard holds the budget.
  session.set({buf.name: 64})
  peak, stop, thread = _sample_peak(
      lambda: session.counters()["buffered_bytes"], 8)
  thread.start()
  end = time.monotonic() + 8
  while time.monotonic() < end:
    for _ in range(20):
      next(it)
    time.sleep(0.3)
  stop.set()
  thread.join()
  assert 0 < peak[0] <= budget
  assert session.counters()["guard_shrinks"] > 0
  del it
  gc.collect()


def test_what_the_guard_cannot_lower_is_counted_far_below_the_budget():
  # 8 buffered 1 MB elements against 1 GB: the guard's rounds plan nothing,
  # but the counter still reads what the shuffle holds.
  mb = 1 << 20
  ds = tf.data.Dataset.range(10**6).map(
      lambda x: tf.fill([mb // 4], tf.cast(x, tf.float32)))  # 1 MB
  it = iter(_with_option(ds.shuffle(8, seed=1), ram_budget=1 << 30,
                         policy="manual"))
  next(it)
  session = intune_tf.session_of(it)
  assert wait_for(lambda: session.counters()["unlowerable_bytes"] >= 7 * mb)
  assert session.counters()["unlowerable_bytes"] <= 8 * mb
  del it
  gc.collect()


def test_what_the_guard_cannot_lower_is_counted_and_told_once(monkeypatch):
  from absl import logging  # noqa: PLC0415
  told = []
  monkeypatch.setattr(logging, "warning", lambda *a, **k: told.append(a))
  # Told once per stage name in a process: a test before this one in its
  # process with a stage of the same name hid it (compat stack, with a
  # second make test beside it).
  monkeypatch.setattr(intune_tf.global_tuner(), "_unlowerable_told", set())
  mb = 1 << 20
  ds = tf.data.Dataset.range(10**6).map(
      lambda x: tf.fill([mb // 4], tf.cast(x, tf.float32)))  # 1 MB
  ds = ds.shuffle(16, seed=1).prefetch(AUTOTUNE)
  it = iter(_with_option(ds, ram_budget=24 * mb, policy="manual",
                         period_s=0.02))
  next(it)
  session = intune_tf.session_of(it)
  buf = [k for k in session.knobs() if k.kind == "buffer_size"][0].name
  session.set({buf: 64})
  # The shuffle's 15 or 16 buffered elements cannot be lowered: they are
  # counted, and the prefetch buffer gets what is left of the 24 MB.
  assert wait_for(lambda: session.counters()["unlowerable_bytes"] >= 15 * mb)
  for _ in range(50):
    next(it)
    intune_tf.global_tuner().step()
  assert 15 * mb <= session.counters()["unlowerable_bytes"] <= 16 * mb
  value = {k.name: k.value for k in session.knobs()}[buf]
  assert 1 <= value <= 24 - 15 - 1  # (value + 1) x 1 MB within what is left
  # Told once, naming the stage and its bytes: what it held when the tuner
  # first saw it reach the share that matters (the shuffle may still be
  # filling then, on a busy machine). While nothing changes, a static
  # policy's session is observed once a second (tuner._HELD_OBSERVE_S), so
  # the 50 steps can end before the observation that sees the full shuffle.
  def warned():
    intune_tf.global_tuner().step()
    return [a for a in told if "cannot lower" in str(a[0])]

  wait_until(warned, what="the cannot-lower warning", period_s=0.05)
  # Still once after more than one observation.
  mine = poll_for(warned, 1.5 * tuner._HELD_OBSERVE_S)  # noqa: SLF001
  assert len(mine) == 1, told
  assert mine[0][2].endswith("Shuffle"), mine
  assert tuner.UNLOWERABLE_WARN_SHARE * 24 <= mine[0][3] <= 16, mine
  del it
  gc.collect()


# --- deeper interleave buffers, bounded by the budget -----------------------

_RECORD = 256 * 1024


def _big_records(cycle=4, **fields):
  """A parallel interleave of 256 KB serialized records (scalar strings), the
  deeper buffers at 256 records per input."""
  record = lambda i: tf.io.serialize_tensor(
      tf.fill([_RECORD // 4], tf.cast(i, tf.float32)))
  ds = tf.data.Dataset.range(8).interleave(
      lambda i: tf.data.Dataset.range(10**6).map(record),
      cycle_length=cycle, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)
  return _with_option(ds, interleave_buffer=256, policy="manual", **fields)


def _busy_processes(n: int) -> list[subprocess.Popen]:
  """N processes that each keep a CPU busy until terminated."""
  return [subprocess.Popen([sys.executable, "-c", "while True: pass"])
          for _ in range(n)]


# With two busy processes on the 2 cores, the guard's thread and the
# interleave's workers compete for the CPU: the bound is held where a record
# is admitted, not by the thread.
@pytest.mark.parametrize("busy", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_interleave_buffers_stay_under_the_budget_and_grow_back(busy):
  budget = 24 << 20
  hogs = _busy_processes(busy)
  try:
    it = iter(_big_records(ram_budget=budget))
    next(it)
    session = intune_tf.session_of(it)
    peak, stop, thread = _sample_peak(
        lambda: session.counters()["buffered_bytes"], 6)
    thread.start()
    for _ in range(15):  # bursts of 40 records (10 MB)
      for _ in range(40):
        next(it)
      time.sleep(0.2)
    stop.set()
    thread.join()
  finally:
    for hog in hogs:
      hog.terminate()
      hog.wait()
  # Unbounded, 8 inputs (4 read, 4 prefetched) x 256 records x 256 KB would
  # hold 512 MB; the budget holds, and every burst was served. The kernel's
  # peak is taken where a record is admitted (the records the interleave
  # holds plus what every other stage buffers then), whether or not the
  # guard's thread gets the CPU; the 2 ms samples can only miss a peak.
  counted = session.counters()["peak_buffered_bytes"]
  assert 0 < counted <= budget, counted
  assert 0 < peak[0] <= budget, peak[0]
  # With room again, the buffers deepen past the old budget.
  session.set_ram_budget(1 << 30)
  assert wait_for(lambda: session.counters()["buffered_bytes"] > 4 * budget)
  del it
  gc.collect()


def _uneven_records():
  # Inputs of 0 to 12 records: the cycle refills as inputs end.
  return tf.data.Dataset.range(11).interleave(
      lambda i: tf.data.Dataset.range((i * 7) % 13).map(
          lambda j, i=i: tf.strings.format("{}-{}", (i, j))),
      cycle_length=3, block_length=2, num_parallel_calls=AUTOTUNE)


@pytest.mark.slow
@pytest.mark.parametrize("deterministic", [True, False])
def test_interleave_held_at_one_record_per_input_reads_as_plain_tf(
    deterministic):
  plain = [x.numpy() for x in _deterministic(_uneven_records(), deterministic)]
  # A 1-byte budget holds every input at one record.
  ds = _deterministic(_with_option(
      _uneven_records(), ram_budget=1, interleave_buffer=256,
      policy="manual", warm_start=False), deterministic)
  start = time.monotonic()
  for _ in range(3):  # new iterators, and epochs of a repeat
    assert [x.numpy() for x in ds] == plain or not deterministic
    assert sorted(x.numpy() for x in ds.repeat(2)) == sorted(plain * 2)
  # No input waited for the last-resort escape (200 ms a record).
  assert time.monotonic() - start < 0.2 * len(plain)


@pytest.mark.parametrize("on_restore", [True, False])
def test_interleave_held_at_one_record_checkpoints_mid_epoch(on_restore):
  plain = [x.numpy() for x in _uneven_records()]
  tuned = _with_option(_uneven_records(), ram_budget=1, interleave_buffer=256,
      policy="manual", warm_start=False)
  it = iter(tuned)
  head = [next(it).numpy() for _ in range(17)]
  checkpoint = tf.train.Checkpoint(it=it)
  saved = checkpoint.write(os.path.join(tempfile.mkdtemp(), "ckpt"))
  fresh = iter(tuned if on_restore else _uneven_records())
  tf.train.Checkpoint(it=fresh).read(saved).assert_consumed()
  assert head + [x.numpy() for x in fresh] == plain
