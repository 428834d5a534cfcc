"""InTune's cache (IntuneCacheDataset, intune_tf/cc/kernels/cache_*): the
elements are those of the pipeline without it, epoch after epoch, on real
pipelines; files, checkpoints and the RAM budget."""

import gc
import inspect
import json
import logging
import os
import re
import subprocess
import sys
import time

from _waiting import wait_for
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.data.kernel_tests import checkpoint_test_base
from tensorflow.python.data.kernel_tests import tf_record_test_base

import intune_tf
from intune_tf import CacheState
from intune_tf.live import tuner as tuner_lib
from intune_tf.ops import session as session_lib

AUTOTUNE = tf.data.AUTOTUNE


def _tuned(ds, **fields):
  options = tf.data.Options()
  fields.setdefault("cache", True)
  options.experimental_intune = intune_tf.IntuneOptions(
      policy="manual", warm_start=False, **fields)
  return ds.with_options(options)


def _value(element):
  return tf.nest.map_structure(
      lambda t: t.numpy().tolist() if t.shape.rank else t.numpy(), element)


# Seconds a consumer that the tuner must see spends on each element: 2,000
# of them outlast the tuner's search for new sessions (every 0.25 s).
TOLD_PAUSE_S = 0.0003


def _epoch(ds, pause_s=0.0):
  """The elements of one epoch (a new iterator, as `model.fit` makes one per
  epoch), and the session's cache figures before the end. `pause_s`: the
  consumer's time per element."""
  it = iter(ds)
  session = intune_tf.session_of(it)
  elements, stats = [], session.cache()
  for element in it:
    elements.append(_value(element))
    stats = session.cache()
    time.sleep(pause_s)
  return elements, stats


def _records(path, rows, tag="a"):
  with tf.io.TFRecordWriter(path) as writer:
    for i in range(rows):
      writer.write(f"{tag}-{i:04d}".encode())


def _parse(record):
  return tf.strings.length(record), tf.strings.substr(record, 0, 1)


def _pipelines(tmp_path):
  files = []
  for i in range(3):
    files.append(str(tmp_path / f"part-{i}.tfrecord"))
    _records(files[-1], 40, tag=f"f{i}")
  r = tf.data.Dataset.range

  def heavy(x):
    return tf.reduce_sum(tf.sin(tf.cast(tf.range(x % 50 + 200), tf.float32)))

  return {
      "shuffle": lambda: r(300).map(heavy).shuffle(50, seed=3).batch(16),
      "interleave": lambda: tf.data.Dataset.from_tensor_slices(files)
                    .interleave(tf.data.TFRecordDataset, cycle_length=2,
                                num_parallel_calls=AUTOTUNE)
                    .map(_parse, num_parallel_calls=AUTOTUNE)
                    .shuffle(30, seed=5).batch(8).prefetch(AUTOTUNE),
      "filter": lambda: r(300).map(lambda x: x * 7).filter(
          lambda x: x % 3 == 0).batch(10),
      "random_map": lambda: r(200).map(
          heavy, num_parallel_calls=AUTOTUNE).map(
              lambda x: x + tf.random.stateless_uniform(
                  [], seed=[tf.cast(x, tf.int64), 1])).batch(8),
  }


PIPELINES = ("shuffle", "interleave", "filter", "random_map")


@pytest.mark.parametrize("name", PIPELINES)
def test_three_epochs_give_the_elements_of_the_uncached_pipeline(
    tmp_path, name):
  make = _pipelines(tmp_path)[name]
  tf.random.set_seed(11)
  cached = _tuned(make())
  runs = [_epoch(cached) for _ in range(3)]
  tf.random.set_seed(11)
  plain = _tuned(make(), cache=False)
  expected = [_epoch(plain)[0] for _ in range(3)]
  assert [elements for elements, _ in runs] == expected
  # The cache filled in epoch 1 and served epochs 2 and 3 whole.
  first, second, third = (stats for _, stats in runs)
  assert first["point"], first["reason"]
  assert first["hits"] == 0 and first["misses"] > 0
  assert second["complete"] and second["misses"] == 0
  assert second["hits"] == first["misses"] == third["hits"]
  assert third["served"] == 1.0 and third["bytes"] > 0
  assert third["saved_s"] > 0


def test_the_knobs_and_stages_are_named_as_without_the_cache(tmp_path):
  make = _pipelines(tmp_path)["interleave"]
  names = {}
  for cache in (True, False):
    it = iter(_tuned(make(), cache=cache))
    next(it)
    session = intune_tf.session_of(it)
    names[cache] = (sorted(k.name for k in session.knobs()),
                    sorted(s.name for s in session.stats()))
    assert session.cache()["point"] or not cache
  assert names[True] == names[False]
  assert not any("IntuneCache" in n for n in names[True][1])


def test_the_knobs_below_a_cache_that_serves_the_epoch_stay_idle(tmp_path):
  ds = _tuned(_pipelines(tmp_path)["random_map"]().prefetch(AUTOTUNE))
  knobs = []
  for _ in range(3):
    it = iter(ds)
    session = intune_tf.session_of(it)
    for i, _ in enumerate(it):
      if i == 10:
        knobs.append({k.name: (k.value, k.idle) for k in session.knobs()})
  below = "Prefetch.MapAndBatch.ParallelMapV2/parallelism"
  assert sorted(knobs[0]) == [below, "Prefetch/buffer_size"]
  assert not knobs[0][below][1]
  # Epochs 2 and 3 come from the cache: the map below it does not run, and
  # its knob stays, idle, at the value it had.
  assert knobs[1] == knobs[2]
  assert knobs[1][below] == (knobs[0][below][0], True)
  assert sorted(knobs[1]) == sorted(knobs[0])


@pytest.mark.parametrize("cache", [True, False])
def test_a_knob_set_below_a_cache_stays_and_can_be_set_again(cache):
  # A map's knob, set to 1, then 200 more elements: the cache serves the
  # second pass of the repeat, the map does not run.
  ds = _tuned(tf.data.Dataset.range(100).map(
      lambda x: x * 2, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE)
              .repeat(), cache=cache)
  it = iter(ds)
  next(it)
  session = intune_tf.session_of(it)
  below = next(k.name for k in session.knobs() if "ParallelMapV2" in k.name)
  assert session.set({below: 1.0}) == {below: 1.0}
  for _ in range(200):
    next(it)
  knob = next(k for k in session.knobs() if k.name == below)
  assert knob.value == 1.0
  assert knob.idle == cache
  assert session.set({below: 2.0}) == {below: 2.0}
  assert next(k for k in session.knobs() if k.name == below).value == 2.0


@pytest.mark.slow
def test_a_knob_below_the_cache_comes_back_at_its_value_when_it_shrinks():
  # The map below the cache runs in the first pass only. Set to 1 there, it
  # stays in the knobs, idle, while the cache serves the second pass, and is
  # set to 2 meanwhile; memory pressure then drops most of the cache
  # mid-pass, and the map runs again at 2, not at its start.
  ds = _tuned(tf.data.Dataset.range(2000).map(
      lambda x: tf.fill([100], tf.cast(x, tf.float32)) * 1.5,
      num_parallel_calls=AUTOTUNE).repeat(2), ram_budget=64 << 20)
  it = iter(ds)
  next(it)
  session = intune_tf.session_of(it)
  below = next(k.name for k in session.knobs() if "ParallelMapV2" in k.name)
  assert session.set({below: 1.0}) == {below: 1.0}
  for _ in range(2000 + 499):
    next(it)
  assert session.cache()["complete"]
  idle = next(k for k in session.knobs() if k.name == below)
  assert idle.idle and idle.value == 1.0
  assert session.set({below: 2.0}) == {below: 2.0}
  session.set_ram_budget(300 * 400)
  assert wait_for(lambda: session.cache()["bytes"] <= 300 * 400)
  rest, values = [], {}
  for element in it:
    rest.append(int(element[0] / 1.5))
    values = values or {k.name: k.value for k in session.knobs()
                        if k.name == below and not k.idle}
  assert rest == list(range(500, 2000))
  assert values == {below: 2.0}


def test_the_option_off_adds_no_cache(tmp_path):
  ds = _tuned(_pipelines(tmp_path)["filter"](), cache=False)
  _, stats = _epoch(ds)
  _, stats = _epoch(ds)
  assert stats["state"] is CacheState.OFF
  assert stats["point"] == "" and stats["reason"] == ""
  assert stats["hits"] == stats["bytes"] == 0


@pytest.mark.parametrize("cache", [True, False])
def test_a_random_op_upstream_still_changes_each_epoch(cache):
  # With a global seed, TF itself replays the same draws each epoch.
  tf.random.set_seed(None)
  ds = _tuned(tf.data.Dataset.range(50).map(
      lambda x: tf.reduce_sum(tf.sin(tf.cast(tf.range(x + 100), tf.float32))))
      .map(lambda x: x + tf.random.uniform([])), cache=cache)
  epochs = [_epoch(ds) for _ in range(3)]
  values = [elements for elements, _ in epochs]
  assert values[0] != values[1] != values[2]
  if not cache:
    return
  # It cached below the random op: the sums repeat.
  stats = epochs[-1][1]
  assert stats["served"] == 1.0
  assert "is random" in stats["reason"]
  sums = [np.floor(np.array(v)) for v in values]
  assert np.all(np.abs(sums[0] - sums[1]) <= 1)


def _with_errors(it):
  """The elements of `it`, "error" in place of each that raised."""
  out = []
  while True:
    try:
      out.append(int(next(it)))
    except tf.errors.InvalidArgumentError:
      out.append("error")
    except StopIteration:
      return out


@pytest.mark.parametrize("repeat", [1, 2])
def test_an_input_error_is_met_again_in_every_epoch(repeat):
  # Index 5 is out of range: the element in the middle fails, each epoch.
  ds = tf.data.Dataset.from_tensor_slices([0, 5, 1]).map(
      lambda i: tf.gather([10, 20], i)).repeat(repeat)
  want = [10, "error", 20] * repeat
  assert _with_errors(iter(ds)) == want
  cached = _tuned(ds)
  epochs = [_with_errors(iter(cached)) for _ in range(3)]
  assert epochs == [want] * 3
  # What comes before the error is still read from the cache.
  _, stats = _epoch(cached.take(1))
  assert stats["point"] and stats["hits"] == 1


def test_the_users_own_cache_is_the_only_one():
  ds = _tuned(tf.data.Dataset.range(30).map(lambda x: x * 2).cache())
  epochs = [_epoch(ds) for _ in range(2)]
  assert epochs[1][0] == [2 * i for i in range(30)]
  assert epochs[1][1]["state"] is CacheState.DECLINED
  assert epochs[1][1]["point"] == ""
  assert "own cache" in epochs[1][1]["reason"]


@pytest.mark.parametrize("source", ["path", "slices"])
def test_a_file_rewritten_between_epochs_is_read_again(tmp_path, source):
  path = str(tmp_path / "data.tfrecord")
  _records(path, 20, tag="old")
  files = tf.data.Dataset.from_tensor_slices([path])
  base = (tf.data.TFRecordDataset(path) if source == "path"
          else files.flat_map(tf.data.TFRecordDataset))
  ds = _tuned(base.map(lambda r: tf.strings.upper(r)))
  first, _ = _epoch(ds)
  second, stats = _epoch(ds)
  assert second == first and stats["served"] == 1.0
  _records(path, 25, tag="new")
  # A later modification time, whatever the clock's resolution.
  later = time.time() + 5
  os.utime(path, (later, later))
  third, stats = _epoch(ds)
  assert third == [f"NEW-{i:04d}".encode() for i in range(25)]
  assert stats["hits"] == 0
  fourth, stats = _epoch(ds)
  assert fourth == third and stats["served"] == 1.0


def _vectors(n=2000, width=100):
  return tf.data.Dataset.range(n).map(
      lambda x: tf.fill([width], tf.cast(x, tf.float32)) * 1.5)


def _checkpoint_bytes(directory):
  return sum(os.path.getsize(os.path.join(directory, f))
             for f in os.listdir(directory))


@pytest.mark.slow
@pytest.mark.parametrize("fresh", [False, True],
                         ids=["same_dataset", "new_dataset"])
def test_a_checkpoint_mid_epoch_two_holds_no_cached_element(tmp_path, fresh):
  sizes = {}
  rests = {}
  for cache in (True, False):
    ds = _tuned(_vectors(), cache=cache)
    _epoch(ds)
    it = iter(ds)
    for _ in range(700):
      next(it)
    directory = tmp_path / f"cache-{cache}"
    os.makedirs(directory)
    saved = tf.train.Checkpoint(it=it).write(str(directory / "ckpt"))
    sizes[cache] = _checkpoint_bytes(directory)
    target = iter(_tuned(_vectors(), cache=cache) if fresh else ds)
    tf.train.Checkpoint(it=target).read(saved).assert_consumed()
    rests[cache] = [_value(e) for e in target]
    assert [_value(e) for e in it] == rests[cache]
  assert sizes[True] <= 1.1 * sizes[False]
  assert rests[True] == rests[False]
  assert [row[0] for row in rests[True]] == [1.5 * i for i in range(700, 2000)]


@pytest.mark.slow
def test_a_symbolic_checkpoint_mid_epoch_two_restores_without_a_cache(
    tmp_path):
  options = tf.data.Options()
  options.experimental_symbolic_checkpoint = True
  ds = _tuned(_vectors().with_options(options))
  _epoch(ds)
  it = iter(ds)
  for _ in range(700):
    next(it)
  # Symbolic checkpoints are merged from every iterator's GetNext: no cache.
  assert intune_tf.session_of(it).cache()["point"] == ""
  saved = tf.train.Checkpoint(it=it).write(str(tmp_path / "ckpt"))
  target = iter(ds)
  tf.train.Checkpoint(it=target).read(saved).assert_consumed()
  rest = [_value(e) for e in target]
  assert [_value(e) for e in it] == rest
  assert [row[0] for row in rest] == [1.5 * i for i in range(700, 2000)]


def test_tf_data_cache_writes_its_elements_into_checkpoints(tmp_path):
  # What the test above guards against: tf.data's own cache() does.
  ds = _vectors().cache()
  list(ds)
  it = iter(ds)
  for _ in range(700):
    next(it)
  tf.train.Checkpoint(it=it).write(str(tmp_path / "ckpt"))
  assert _checkpoint_bytes(tmp_path) > 700 * 100 * 4


@pytest.mark.slow
def test_memory_pressure_mid_epoch_shrinks_the_cache_and_the_job_goes_on():
  ds = _tuned(_vectors(), ram_budget=64 << 20)
  expected, _ = _epoch(ds)
  it = iter(ds)
  session = intune_tf.session_of(it)
  head = [_value(next(it)) for _ in range(500)]
  before = session.cache()
  assert before["complete"] and before["bytes"] >= 2000 * 400
  session.set_ram_budget(300 * 400)
  assert wait_for(lambda: session.cache()["bytes"] <= 300 * 400)
  rest = [_value(e) for e in it]
  assert head + rest == expected
  after = session.cache()
  assert after["shrunk_bytes"] > 0 and not after["complete"]
  assert after["misses"] > 0


@pytest.mark.slow
def test_an_epoch_larger_than_the_budget_caches_its_first_part():
  # Half an epoch of 2,000 elements of 400 bytes.
  budget = 1000 * 400
  ds = _tuned(_vectors(), ram_budget=budget)
  first, _ = _epoch(ds)
  second, stats = _epoch(ds)
  assert second == first
  assert 0 < stats["bytes"] <= budget
  assert 0 < stats["served"] < 1
  # The first part came from the cache, the rest from the input (which may
  # append a few more elements when the buffers left room since epoch 1).
  assert stats["hits"] >= 800 and stats["misses"] >= 800


def _told(caplog, text):
  return [r for r in caplog.records if text in r.getMessage()]


@pytest.mark.slow
def test_a_budget_too_small_for_any_element_caches_nothing(caplog):
  ds = _tuned(_vectors(), ram_budget=100, period_s=0.01)
  with caplog.at_level(logging.INFO):
    first, _ = _epoch(ds, TOLD_PAUSE_S)
    second, stats = _epoch(ds, TOLD_PAUSE_S)
    third, _ = _epoch(ds, TOLD_PAUSE_S)
  assert second == first == third
  # Room for none of the epoch's 2,000 elements: declined at the first.
  assert stats["state"] is CacheState.DECLINED
  assert stats["point"] and stats["bytes"] == 0 and stats["hits"] == 0
  assert len(_told(caplog, "no cache: the RAM budget")) == 1
  assert not _told(caplog, "cached after")


@pytest.mark.slow
@pytest.mark.parametrize("known,budget,cached", [
    # 2,000 elements of 400 bytes: 4,000 bytes hold 10 of them, 0.5%.
    (True, 4_000, False),
    # 40,000 bytes hold 100, 5%: the first part is cached.
    (True, 40_000, True),
    # Of an epoch of unknown size no share is known: 0.5% is cached.
    (False, 4_000, True),
], ids=["under_1_percent", "5_percent", "unknown_size"])
def test_a_cache_with_room_for_under_one_percent_of_a_known_epoch_is_left_out(
    caplog, known, budget, cached):
  ds = _vectors() if known else _vectors().filter(lambda v: v[0] >= 0)
  assert (ds.cardinality() == 2000) == known
  ds = _tuned(ds, ram_budget=budget, period_s=0.01)
  with caplog.at_level(logging.INFO):
    first, _ = _epoch(ds, TOLD_PAUSE_S)
    second, stats = _epoch(ds, TOLD_PAUSE_S)
  assert second == first and len(first) == 2000
  assert stats["point"]
  assert (stats["hits"] > 0) == cached, stats
  told = _told(caplog, "no cache: the RAM budget leaves it room")
  if cached:
    assert not told and stats["state"] is CacheState.PLACED
  else:
    # The room is what the buffers leave of the budget at the first
    # element: 10 elements with them empty, fewer with some held.
    assert stats["state"] is CacheState.DECLINED
    room = re.fullmatch(
        r"the RAM budget leaves it room for (\d+) of the epoch's "
        r"2000 elements \(400 bytes each\), under 1%", stats["reason"])
    assert room and int(room.group(1)) <= 10, stats["reason"]
    assert len(told) == 1


@pytest.mark.slow
def test_the_log_says_where_it_cached(caplog):
  ds = _tuned(_vectors(), period_s=0.01)
  with caplog.at_level(logging.INFO):
    for _ in range(3):
      _epoch(ds, TOLD_PAUSE_S)
  (line,) = _told(caplog, "cached after")
  assert "MapDataset" in line.getMessage()
  assert not _told(caplog, "no cache")


# An input whose order changes from epoch to epoch: 8 sources of 250
# elements interleaved 4 at a time without a fixed order ("stage":
# deterministic=False on the interleave; "options": options.deterministic=
# False, the interleave left at its default), 2,000 elements of 400 bytes
# (100 float32). Odd sources cost more per element, so the order varies.
def unordered(way):
  def source(i):
    k = 8 + 40 * (i % 2)

    def work(x):
      m = tf.fill([k, k], tf.cast(x % 7, tf.float32))
      return i * 250 + x + tf.cast(tf.reduce_sum(tf.matmul(m, m)) * 0,
                                   tf.int64)
    return tf.data.Dataset.range(250).map(work)
  kwargs = {"cycle_length": 4, "num_parallel_calls": 4}
  if way == "stage":
    kwargs["deterministic"] = False
  ds = tf.data.Dataset.range(8).interleave(source, **kwargs)
  ds = ds.map(lambda v: tf.fill([100], tf.cast(v, tf.float32)))
  if way == "options":
    options = tf.data.Options()
    options.deterministic = False
    ds = ds.with_options(options)
  return ds


UNORDERED_WAYS = ("stage", "options")
EVERY_ELEMENT = [float(i) for i in range(2000)]


def _firsts(elements):
  return sorted(e[0] for e in elements)


@pytest.mark.parametrize("way", UNORDERED_WAYS)
def test_an_unordered_input_under_a_partial_cache_gives_each_element_once(
    way):
  # The budget holds about a quarter of an epoch: the part cached is never
  # served, each epoch reads its input whole.
  ds = _tuned(unordered(way), ram_budget=500 * 400)
  for epoch in range(3):
    elements, stats = _epoch(ds)
    assert _firsts(elements) == EVERY_ELEMENT, epoch
  assert stats["point"], stats["reason"]
  assert "only whole epochs are served" in stats["reason"]
  assert stats["hits"] == 0


@pytest.mark.parametrize("way", UNORDERED_WAYS)
def test_an_unordered_input_held_whole_is_served_from_the_cache(way):
  ds = _tuned(unordered(way))
  first, _ = _epoch(ds)
  for _ in range(2):
    again, stats = _epoch(ds)
    # A cached epoch replays the order of the epoch that filled it.
    assert again == first
    assert stats["complete"] and stats["misses"] == 0 and stats["hits"] > 0
  assert _firsts(first) == EVERY_ELEMENT


@pytest.mark.parametrize("budget", [500 * 400, 64 << 20],
                         ids=["part", "whole"])
def test_two_unordered_iterators_at_once_each_give_each_element_once(budget):
  ds = _tuned(unordered("stage"), ram_budget=budget)
  first, _ = _epoch(ds)
  assert _firsts(first) == EVERY_ELEMENT
  its = [iter(ds), iter(ds)]
  got = [[], []]
  for _ in range(2000):
    for it, elements in zip(its, got):
      elements.append(_value(next(it)))
  for it in its:
    with pytest.raises(StopIteration):
      next(it)
  assert [_firsts(e) for e in got] == [EVERY_ELEMENT, EVERY_ELEMENT]
  third, stats = _epoch(ds)
  assert _firsts(third) == EVERY_ELEMENT
  assert stats["complete"] == (budget > 2000 * 400)


def test_an_unordered_epoch_shrunk_mid_way_still_gives_each_element_once():
  ds = _tuned(unordered("stage"), ram_budget=64 << 20)
  _epoch(ds)
  it = iter(ds)
  session = intune_tf.session_of(it)
  head = [_value(next(it)) for _ in range(500)]
  assert session.cache()["complete"]
  session.set_ram_budget(300 * 400)
  assert wait_for(lambda: session.cache()["bytes"] <= 300 * 400)
  rest = [_value(e) for e in it]
  assert _firsts(head + rest) == EVERY_ELEMENT
  # Under the small budget, the next epoch reads its input whole.
  third, _ = _epoch(ds)
  assert _firsts(third) == EVERY_ELEMENT


RESTORE_SCRIPT = '''
import json, sys
import tensorflow as tf
import intune_tf
''' + inspect.getsource(unordered) + '''

def tuned(ds):
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(
      policy="manual", warm_start=False, cache=True)
  return ds.with_options(options)

step, path = sys.argv[1], sys.argv[2]
ds = tuned(unordered("stage"))
if step == "save":
  list(ds)  # epoch 1 fills the cache
  it = iter(ds)
  head = [float(next(it)[0]) for _ in range(700)]
  tf.train.Checkpoint(it=it).write(path)
  print(json.dumps(head))
else:
  it = iter(ds)
  tf.train.Checkpoint(it=it).read(path).assert_consumed()
  print(json.dumps([float(e[0]) for e in it]))
'''


@pytest.mark.slow
def test_an_unordered_epoch_restored_in_a_new_process_gives_each_element_once(
    tmp_path):
  script = tmp_path / "restore.py"
  script.write_text(RESTORE_SCRIPT)
  path = str(tmp_path / "ckpt")
  runs = []
  for step in ("save", "restore"):
    done = subprocess.run([sys.executable, str(script), step, path],
                          capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
  head, rest = runs
  assert len(head) == 700
  assert sorted(head + rest) == EVERY_ELEMENT


# Epochs of a cached pipeline under five prefetches (each holds its buffer's
# lock while its input's iterator is made) while another thread reads the
# session's knobs (which takes those locks under the session's): a cache
# that attached itself under the session's lock deadlocked here, 3 runs in
# 4 on 2 cores.
ATTACH_SCRIPT = """
import threading, time
import tensorflow as tf
import intune_tf

options = tf.data.Options()
options.experimental_intune = intune_tf.IntuneOptions(
    policy="manual", warm_start=False, cache=True)
ds = tf.data.Dataset.range(16).map(
    lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE)
ds = ds.prefetch(tf.data.AUTOTUNE)
for _ in range(5):
  ds = ds.prefetch(1)
ds = ds.with_options(options)
stop, reads = threading.Event(), [0]

def read_knobs():
  while not stop.is_set():
    for session in intune_tf.sessions():
      try:
        session.knobs()
        reads[0] += 1
      except intune_tf.SessionGoneError:
        pass

reader = threading.Thread(target=read_knobs)
reader.start()
epochs, end = 0, time.monotonic() + 15
while time.monotonic() < end:
  assert sorted(int(v) for v in ds) == list(range(0, 32, 2))
  epochs += 1
stop.set()
reader.join()
print(epochs, reads[0])
"""


@pytest.mark.slow
def test_knobs_read_while_each_epoch_attaches_its_cache_never_deadlock(
    tmp_path):
  script = tmp_path / "attach.py"
  script.write_text(ATTACH_SCRIPT)
  try:
    done = subprocess.run([sys.executable, str(script)], capture_output=True,
                          text=True, timeout=120, check=False)
  except subprocess.TimeoutExpired:
    pytest.fail("Deadlock: the epochs stopped while knobs were read.")
  assert done.returncode == 0, done.stderr[-3000:]
  epochs, reads = map(int, done.stdout.split())
  assert epochs > 100 and reads > 1000


def _plain_epoch(ds):
  return [_value(e) for e in ds]


def _same_second(path, before_ns):
  """Sets `path`'s modification time to another instant of the second of
  `before_ns`, as a rewrite within that second leaves it."""
  second, fraction = divmod(before_ns, 10**9)
  later = second * 10**9 + (fraction + 10**9 // 2) % 10**9
  os.utime(path, ns=(later, later))


def _rewrite(paths, change, tag):
  """Changes the TFRecord files `paths` as `change` says (rows tagged
  `tag`)."""
  for i, path in enumerate(paths):
    before = os.stat(path)
    if change == "appended":
      extra = path + ".extra"
      _records(extra, 5, tag=f"{tag}{i}")
      with open(path, "ab") as out, open(extra, "rb") as more:
        out.write(more.read())
      os.remove(extra)
      assert os.stat(path).st_size > before.st_size
      continue
    if change == "same_second":
      # In place (TFRecordWriter truncates the file: the inode stays).
      _records(path, 20, tag=f"{tag}{i}")
      _same_second(path, before.st_mtime_ns)
      after = os.stat(path)
      assert after.st_ino == before.st_ino
      assert after.st_mtime_ns // 10**9 == before.st_mtime_ns // 10**9
    else:  # "new_inode": a new file put in its place, times kept
      _records(path + ".new", 20, tag=f"{tag}{i}")
      os.replace(path + ".new", path)
      os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
      after = os.stat(path)
      assert after.st_mtime_ns == before.st_mtime_ns
      assert after.st_ino != before.st_ino
    assert after.st_size == before.st_size


@pytest.mark.parametrize("change", ["same_second", "new_inode", "appended"])
def test_three_files_changed_between_epochs_give_their_new_rows(
    tmp_path, change):
  paths = [str(tmp_path / f"part-{i}.tfrecord") for i in range(3)]
  for i, path in enumerate(paths):
    _records(path, 20, tag=f"a{i}")

  def make():
    return tf.data.TFRecordDataset(paths).map(tf.strings.upper)

  ds = _tuned(make())
  first, _ = _epoch(ds)
  second, stats = _epoch(ds)
  assert first == second == _plain_epoch(make())
  assert stats["served"] == 1.0, stats
  _rewrite(paths, change, "b")
  third, stats = _epoch(ds)
  assert third == _plain_epoch(make())
  assert third != first and stats["hits"] == 0


def test_a_ram_file_rewritten_between_epochs_gives_its_new_lines():
  path = f"ram://intune-test-{os.getpid()}/lines.txt"

  def write(tag):
    if tf.io.gfile.exists(path):
      tf.io.gfile.remove(path)  # ram:// appends to a file that exists
    with tf.io.gfile.GFile(path, "w") as out:
      out.write("".join(f"{tag}-{i:04d}\n" for i in range(30)))

  def make():
    return tf.data.TextLineDataset(path).map(tf.strings.upper)

  write("a")
  ds = _tuned(make())
  first, _ = _epoch(ds)
  second, stats = _epoch(ds)
  assert first == second == _plain_epoch(make())
  assert stats["served"] == 1.0, stats
  write("b")  # the same size
  third, stats = _epoch(ds)
  assert third == _plain_epoch(make()) != first
  assert stats["hits"] == 0
  tf.io.gfile.remove(path)


def _heavy_line(line):
  # About a millisecond of work per line.
  work = tf.reduce_sum(tf.sin(tf.range(200_000, dtype=tf.float32)))
  return tf.strings.upper(line), work * 0


@pytest.mark.slow
def test_over_4096_files_are_all_checked(tmp_path):
  paths = []
  for i in range(4200):
    paths.append(str(tmp_path / f"{i:05d}.txt"))
    with open(paths[-1], "w") as out:
      out.write(f"a-{i:05d}\n")

  def make():
    return tf.data.TextLineDataset(paths).map(_heavy_line)

  ds = _tuned(make())
  first, _ = _epoch(ds)
  second, stats = _epoch(ds)
  assert first == second
  assert stats["served"] == 1.0, stats
  with open(paths[-1], "w") as out:
    out.write("changed, and longer\n")
  third, stats = _epoch(ds)
  assert third == _plain_epoch(make()) != first
  assert stats["hits"] == 0


@pytest.mark.slow
def test_a_check_over_one_percent_of_the_epoch_leaves_the_cache_out(
    tmp_path, caplog):
  # 4,200 file names, of which the epoch reads 2: checking them all costs
  # far more than 1% of reading those 2.
  paths = []
  for i in range(4200):
    paths.append(str(tmp_path / f"{i:05d}.txt"))
    with open(paths[-1], "w") as out:
      out.write(f"a-{i:05d}\n")
  ds = _tuned(tf.data.Dataset.from_tensor_slices(paths).take(2).interleave(
      tf.data.TextLineDataset).map(tf.strings.upper),
      # Options of its own: the tuner tells once per point and options.
      period_s=0.02)
  told = "no cache: checking the 4200 files"
  with caplog.at_level(logging.INFO):
    first, _ = _epoch(ds)
    # The second epoch's session, alive until the tuner told why.
    it = iter(ds)
    second = [_value(next(it))]
    assert wait_for(lambda: _told(caplog, told), timeout=30)
    second += [_value(e) for e in it]
    third, stats = _epoch(ds)
  assert first == second == third == [b"A-00000", b"A-00001"]
  assert stats["hits"] == 0 and stats["bytes"] == 0
  assert stats["state"] is CacheState.DECLINED
  assert re.fullmatch(
      r"checking the 4200 files the pipeline reads took "
      r"[\d.]+ ms of CPU, over 1% of an epoch \([\d.]+ ms\)",
      stats["reason"]), stats
  assert len(_told(caplog, told)) == 1


@pytest.mark.parametrize("reader", ["read_file", "text_line_dataset"])
def test_a_file_named_at_run_time_is_read_again(tmp_path, reader):
  directory = str(tmp_path)
  for i in range(3):
    with open(os.path.join(directory, f"part-{i}.txt"), "w") as out:
      out.write(f"a-{i}\n")

  def named(i):
    return tf.strings.join([directory, "/part-", i, ".txt"])

  def make():
    ids = tf.data.Dataset.from_tensor_slices(["0", "1", "2"])
    if reader == "read_file":
      return ids.map(lambda i: tf.strings.upper(tf.io.read_file(named(i))))
    return ids.interleave(
        lambda i: tf.data.TextLineDataset(named(i))).map(tf.strings.upper)

  ds = _tuned(make())
  epochs = [_epoch(ds)[0]]
  for tag in ("b", "cc"):
    with open(os.path.join(directory, "part-1.txt"), "w") as out:
      out.write(f"{tag}-1\n")
    epochs.append(_epoch(ds)[0])
    assert epochs[-1] == _plain_epoch(make())
  assert epochs[0] != epochs[1] != epochs[2]


# Elements of about 1 MB each: a sparse tensor of 50,000 values (16 bytes of
# indices and 4 of value each: 1,000,000 bytes) or a ragged one of 250,000
# values (4 bytes each: 1,000,000 bytes, and 3 row splits).
_ELEMENT_BYTES = 1_000_000


def _structured(kind, n=40):
  def sparse(i):
    count = _ELEMENT_BYTES // 20
    columns = tf.range(count, dtype=tf.int64)
    return tf.sparse.SparseTensor(
        tf.stack([tf.zeros_like(columns), columns], axis=1),
        tf.fill([count], tf.cast(i, tf.float32)), [1, count])

  def ragged(i):
    count = _ELEMENT_BYTES // 4
    return tf.RaggedTensor.from_row_lengths(
        tf.fill([count], tf.cast(i, tf.float32)), [count // 2, count // 2],
        validate=False)  # (its checks are stateful ops: no cache)

  return tf.data.Dataset.range(n).map(sparse if kind == "sparse" else ragged)


def _summary(element):
  values = element.values
  return (int(tf.size(values)), float(tf.reduce_sum(values)),
          tuple(element.shape.as_list()))


@pytest.mark.parametrize("kind", ["sparse", "ragged"])
def test_sparse_and_ragged_elements_count_at_their_bytes(kind):
  budget = 8 << 20
  ds = _tuned(_structured(kind), ram_budget=budget)
  plain = [_summary(e) for e in _structured(kind)]
  for epoch in range(3):
    it = iter(ds)
    session = intune_tf.session_of(it)
    assert [_summary(e) for e in it] == plain, epoch
    stats = session.cache()
  # Some of the epoch is cached, each element at its bytes (within 10%),
  # and no more than the budget holds.
  assert 0 < stats["elements"] < 40, stats
  assert stats["bytes"] <= budget
  per_element = stats["bytes"] / stats["elements"]
  assert _ELEMENT_BYTES <= per_element <= 1.1 * _ELEMENT_BYTES, stats
  assert stats["hits"] == stats["elements"]


def test_elements_that_hold_datasets_are_not_cached():
  ds = _tuned(tf.data.Dataset.range(6).map(
      lambda i: tf.data.Dataset.range(i * 1000).map(lambda x: x * 2)))
  for _ in range(3):
    it = iter(ds)
    session = intune_tf.session_of(it)
    got = [int(inner.reduce(np.int64(0), lambda a, b: a + b)) for inner in it]
    assert got == [i * 1000 * (i * 1000 - 1) for i in range(6)]
  stats = session.cache()
  assert stats["bytes"] == 0 and stats["hits"] == 0
  assert stats["state"] is CacheState.DECLINED
  assert stats["reason"] == (
      "the elements hold tensorflow::DatasetVariantWrapper values, whose "
      "bytes the cache cannot count"), stats


def test_an_idle_cache_fits_the_process_budget_and_goes_with_its_dataset():
  tuner_lib.global_tuner().publish_default_budget()
  before = session_lib.process_caches()
  assert before["budget"] > 0 and before["room"] >= 0
  ds = _tuned(_vectors())
  first, _ = _epoch(ds)
  held = session_lib.process_caches()
  assert held["entries"] >= 1 and held["bytes"] >= 2000 * 400
  try:
    # The process's budget falls while no iterator reads the cache: it
    # shrinks at once, to what the budget holds.
    session_lib.set_default_ram_budget(300 * 400)
    after = session_lib.process_caches()
    assert after["budget"] == 300 * 400
    assert after["bytes"] <= max(0, after["room"]) <= 300 * 400
  finally:
    tuner_lib.global_tuner().publish_default_budget()
  second, _ = _epoch(ds)
  assert second == first
  del ds
  gc.collect()
  assert wait_for(lambda: session_lib.process_caches()["entries"] <=
                  before["entries"])


# Purity on the path production takes: the root rewrites the graph that
# RewriteDataset serializes (captured variables and tables are placeholders
# there), and the elements of 3 epochs, with the outside state changed
# between them, are those of plain tf.data. Each case puts pure work below
# the stage that reads or changes outside state, so that a cache is placed.
def _work(n=40):
  return tf.data.Dataset.range(n).map(
      lambda x: x + tf.cast(tf.reduce_sum(tf.sin(tf.cast(
          tf.range(x % 5 + 50), tf.float32))) * 0, tf.int64))


def _purity_case(name, tmp_path):
  """(a fresh dataset, a change of the outside state after each epoch, what
  the epoch left outside the pipeline), for case `name`."""
  tmp_path.mkdir(parents=True, exist_ok=True)
  state = {"n": 0}
  variable = tf.Variable(0, dtype=tf.int64)
  table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, -1)
  table.insert(tf.range(5, dtype=tf.int64), tf.zeros([5], tf.int64))

  def change():
    state["n"] += 10
    variable.assign_add(100)
    table.insert(tf.range(5, dtype=tf.int64),
                 tf.fill([5], tf.constant(state["n"], tf.int64)))

  def nothing_outside():
    return None

  def py_add(x):
    return x + state["n"]

  def generator():
    for i in range(20):
      yield i + state["n"]

  log = tmp_path / f"{name}.log"
  written = tmp_path / f"{name}-files"
  written.mkdir()

  def files():
    return sorted((p.name, p.read_text()) for p in written.iterdir())

  cases = {
      "variable_read": (lambda: _work().map(lambda x: x + variable),
                        nothing_outside),
      "assign_add": (lambda: _work().map(
          lambda x: x + variable.assign_add(1)), nothing_outside),
      "mutable_table": (lambda: _work().map(
          lambda x: x + table.lookup(x % 5)), nothing_outside),
      "py_function": (lambda: _work().map(
          lambda x: tf.py_function(py_add, [x], tf.int64)), nothing_outside),
      "numpy_function": (lambda: _work().map(
          lambda x: tf.numpy_function(py_add, [x], tf.int64)),
                         nothing_outside),
      "from_generator": (lambda: tf.data.Dataset.from_generator(
          generator, output_signature=tf.TensorSpec([], tf.int64)).map(
              lambda x: x * 3), nothing_outside),
      "print": (lambda: _work().map(lambda x: _printed(x, log)),
                lambda: log.read_text().split()),
      "write_file": (lambda: _work().map(lambda x: _written(
          x + variable, written)), files),
  }
  make, outside = cases[name]
  return make, change, outside


def _printed(x, log):
  with tf.control_dependencies([tf.print(x, output_stream=f"file://{log}")]):
    return tf.identity(x)


def _written(x, directory):
  path = tf.strings.join([str(directory), "/", tf.strings.as_string(x % 7)])
  with tf.control_dependencies([tf.io.write_file(path, tf.strings.as_string(
      x))]):
    return tf.identity(x)


PURITY_CASES = ("variable_read", "assign_add", "mutable_table", "py_function",
                "numpy_function", "from_generator", "print", "write_file")


@pytest.mark.parametrize("name", PURITY_CASES)
def test_outside_state_is_seen_each_epoch_as_by_plain_tf_data(tmp_path, name):
  runs = {}
  for cache in (False, True):
    make, change, outside = _purity_case(name, tmp_path / f"cache-{cache}")
    ds = _tuned(make(), cache=cache)
    epochs = []
    for _ in range(3):
      elements, stats = _epoch(ds)
      epochs.append((elements, outside()))
      change()
    runs[cache] = epochs, stats
  (plain, _), (cached, stats) = runs[False], runs[True]
  assert cached == plain
  # The state did change what the epochs gave or left.
  assert plain[0] != plain[1] != plain[2]
  if name != "from_generator":
    # A cache was placed on the pure work below, not above the stage.
    assert stats["point"], stats["reason"]
    assert stats["complete"] and stats["hits"] > 0



class CancelledInputCheckpointTest(tf_record_test_base.FeaturesTestBase,
                                   checkpoint_test_base.CheckpointTestBase):
  """TF's own checkpoint harness (graph mode: each break a new graph and
  session) on `make_batched_features_dataset`, whose legacy
  parallel_interleave, below the cache, ends its epoch early when its
  iterator is cancelled (an iterator replaced by its restored one). That end
  is not the epoch's."""

  test_session = None  # tf.test.TestCase's deprecated helper, not a test.

  def _dataset(self):
    ds = self.make_batch_feature(filenames=self._filenames, num_epochs=5,
                                 batch_size=2, reader_num_threads=5,
                                 parser_num_threads=10)
    options = tf.data.Options()
    options.experimental_intune = True
    return ds.with_options(options)

  def test_unused_and_broken_iterators_give_every_element(self):
    outputs = self._num_records * self._num_files * 5 // 2
    with tf.Graph().as_default():
      self.verify_unused_iterator(self._dataset, num_outputs=outputs)
      self.verify_multiple_breaks(self._dataset, num_outputs=outputs)
