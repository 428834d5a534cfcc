"""The public control API: sessions, knobs, set, stats, configurations."""

import dataclasses
import gc
import json
import re
import subprocess
import sys
import threading
import time

from _waiting import wait_for
import pytest
import tensorflow as tf
from tensorflow.core.framework import model_pb2

import intune_tf
from intune_tf import arbiter
from intune_tf import host
from intune_tf.ops import loader as _kernels
from intune_tf.ops import session as session_lib

_PAR = "ParallelMapV2"


def _iterator(**option_fields):
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(
      policy="fixed", config={"none/parallelism": 1}, **option_fields)
  ds = tf.data.Dataset.range(10_000).map(
      lambda x: x + 1, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
          tf.data.AUTOTUNE).with_options(options)
  it = iter(ds)
  next(it)
  return it, intune_tf.session_of(it)


@pytest.fixture
def live():
  it, session = _iterator()
  yield it, session
  del it
  gc.collect()


def _by_kind(session, kind):
  return [k for k in session.knobs() if k.kind == kind]


def test_sessions_are_listed_oldest_first():
  it1, s1 = _iterator(name="first")
  it2, s2 = _iterator(name="second")
  ids = [s.id for s in intune_tf.sessions()]
  assert ids.index(s1.id) < ids.index(s2.id)
  assert s1.options.name == "first" and s2.options.name == "second"
  # A session's tag is parsed once: later listings return the same object,
  # and a session that ended drops out of the listing.
  again = {s.id: s for s in intune_tf.sessions()}
  assert again[s1.id] is intune_tf.sessions()[ids.index(s1.id)]
  assert again[s2.id].options.name == "second"
  del it1
  gc.collect()
  assert s1.id not in {s.id for s in intune_tf.sessions()}
  del it2


def test_knobs_have_names_kinds_and_ranges(live):
  _, session = live
  knobs = session.knobs()
  kinds = {k.kind for k in knobs}
  assert kinds == {"parallelism", "buffer_size"}
  par = _by_kind(session, "parallelism")[0]
  assert par.name == f"Prefetch.{_PAR}/parallelism"
  assert par.display.startswith(f"{_PAR}(id:")
  assert par.min == 1 and par.max >= 1 and par.min <= par.value <= par.max


def test_set_applies_and_reads_back(live):
  it, session = live
  buf = _by_kind(session, "buffer_size")[0]
  par = _by_kind(session, "parallelism")[0]
  applied = session.set({buf.name: 3, par.name: par.min})
  assert applied == {buf.name: 3.0, par.name: par.min}
  values = {k.name: k.value for k in session.knobs()}
  assert values[buf.name] == 3 and values[par.name] == par.min
  assert int(next(it)) >= 2  # still iterates


def test_unknown_knob_lists_valid_names_and_changes_nothing(live):
  _, session = live
  buf = _by_kind(session, "buffer_size")[0]
  session.set({buf.name: 2})
  with pytest.raises(KeyError, match=r"Unknown knob 'Nope/parallelism'.*"
                     r"Valid knobs: \[.*ParallelMapV2"):
    session.set({buf.name: 5, "Nope/parallelism": 1})
  assert {k.name: k.value for k in session.knobs()}[buf.name] == 2


@pytest.mark.parametrize("delta", [-1, +1000])
def test_value_outside_range_is_rejected(live, delta):
  _, session = live
  par = _by_kind(session, "parallelism")[0]
  bad = par.min + delta if delta < 0 else par.max + delta
  with pytest.raises(ValueError, match="outside its range"):
    session.set({par.name: bad})


def test_kernel_rejects_out_of_range_too(live):
  # The kernel validates on its own (for callers that bypass Python checks).
  from intune_tf.ops import loader as _kernels  # noqa: PLC0415
  _, session = live
  par = _by_kind(session, "parallelism")[0]
  with pytest.raises(tf.errors.OutOfRangeError, match="outside its range"):
    _kernels.ops().intune_set_knobs(session.id, [par.name], [par.max + 1.0])


def test_kernel_rejects_a_session_id_that_is_not_a_scalar():
  from intune_tf.ops import loader as _kernels  # noqa: PLC0415
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="session_id must be a scalar"):
    _kernels.ops().intune_list_knobs(tf.constant([1, 2], tf.int64))


def test_python_names_the_tables_as_the_kernels_lay_them_out(live):
  from intune_tf.ops import loader as _kernels  # noqa: PLC0415
  counters, columns = (t.numpy().astype(str).tolist()
                       for t in _kernels.ops().intune_layout())
  assert tuple(counters) == session_lib.COUNTERS
  assert tuple(columns) == session_lib.STAGE_COLUMNS
  # StageStats takes the statistics columns in order, before its own fields.
  fields = [f.name for f in dataclasses.fields(intune_tf.StageStats)]
  assert fields[1:session_lib.NODE_ID_COLUMN + 1] == list(columns[:-1])
  # The names read the right entries: a creation time in microseconds since
  # the epoch (within the last hour) and the elements returned so far.
  _, session = live
  counters = session.counters()
  assert 0 < time.time() - counters["created_us"] / 1e6 < 3600
  assert 1 <= counters["elements"] < 10**6



@dataclasses.dataclass(frozen=True)
class _Share:
  cpus: int
  ram: int
  processes: int


def test_host_counters_come_from_the_source_set_from_above(live):
  """The tuner sets where sessions read the host share (the arbiter sits
  above this module); the counters report that source's share, 0 without."""
  _, session = live
  before = session_lib._host_share[0]  # noqa: SLF001  restored below
  try:
    session_lib.set_host_share_source(lambda: _Share(3, 1 << 20, 2))
    assert [session.counters()[k] for k in session_lib.HOST_COUNTERS] == [
        3, 1 << 20, 2]
    session_lib.set_host_share_source(lambda: None)  # not sharing
    assert [session.counters()[k] for k in session_lib.HOST_COUNTERS] == [
        0, 0, 0]
    session_lib.set_host_share_source(None)
    assert [session.counters()[k] for k in session_lib.HOST_COUNTERS] == [
        0, 0, 0]
  finally:
    session_lib.set_host_share_source(before)


def test_the_tuner_sets_the_host_share_source(live):
  assert session_lib._host_share[0] is arbiter.current_share  # noqa: SLF001

_SESSION_CALLS = {
    "knobs": lambda s: s.knobs(),
    "observe": lambda s: s._snapshot(),  # noqa: SLF001
    "set": lambda s: s.set({"x/parallelism": 1}),
    "model_proto": lambda s: s.model_proto(),
    "counters": lambda s: s.counters(),
    "set_ram_budget": lambda s: s.set_ram_budget(1 << 20),
}


@pytest.mark.parametrize("call", sorted(_SESSION_CALLS))
def test_session_whose_iterator_is_gone(capfd, call):
  it, session = _iterator()
  del it
  gc.collect()
  assert not session.alive
  capfd.readouterr()
  with pytest.raises(intune_tf.SessionGoneError,
                     match=rf"InTune session {session.id} is gone"):
    _SESSION_CALLS[call](session)
  # An expected outcome for the tuner, whose step may race the iterator's
  # end: neither the kernels nor TensorFlow log anything for it (an op that
  # failed made TensorFlow log "Local rendezvous is aborting ...").
  assert capfd.readouterr().err == ""


@pytest.mark.parametrize("tag", ["{not json", '{"policy": 7}'])
def test_options_this_process_cannot_read_leave_the_session_untuned(
    live, tag):
  _, session = live
  # As a tf.data service worker of another intune_tf version sees them.
  foreign = intune_tf.TuningSession(session.id, tag)
  assert foreign.options_error
  assert foreign.options.policy == "manual"  # no policy moves its knobs
  readable = intune_tf.TuningSession(session.id, session.options.to_json())
  assert readable.options_error is None


def test_session_of_an_iterator_is_its_own_whatever_else_runs():
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(policy="manual")
  ds = tf.data.Dataset.range(10).map(
      lambda x: x + 1, num_parallel_calls=tf.data.AUTOTUNE).with_options(
          options)
  first, second = iter(ds), iter(ds)  # one dataset, one session each
  made = {}

  def make(k):  # iterators made at the same time in other threads
    it = iter(ds)
    made[k] = (it, intune_tf.session_of(it).id)  # noqa: F821

  threads = [threading.Thread(target=make, args=(k,)) for k in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  ids = [intune_tf.session_of(first).id, intune_tf.session_of(second).id]
  ids += [made[k][1] for k in range(4)]
  assert len(set(ids)) == 6 and set(ids) <= {s.id for s in
                                             intune_tf.sessions()}
  with pytest.raises(ValueError, match="has no InTune session"):
    intune_tf.session_of(iter(tf.data.Dataset.range(3)))  # option off
  session = intune_tf.session_of(second)
  assert [int(x) for x in second] == list(range(1, 11))
  session_id = session.id
  del second, made
  gc.collect()
  assert wait_for(lambda: session_id not in
                  {s.id for s in intune_tf.sessions()})


def test_stats_follow_the_pipeline(live):
  it, session = live
  for _ in range(100):
    next(it)
  stats = {s.name: s for s in session.stats()}
  assert set(stats) == {"Prefetch", f"Prefetch.{_PAR}",
                        f"Prefetch.{_PAR}.Range"}
  par = stats[f"Prefetch.{_PAR}"]
  assert par.elements >= 100 and par.processing_time_ns > 0
  assert par.display.startswith(f"{_PAR}(id:")
  assert par.parameters["parallelism"] >= 1
  assert stats["Prefetch"].inputs == (f"Prefetch.{_PAR}",)
  counters = session.counters()
  assert counters["elements"] == 101
  assert counters["gap_count"] == 100


def test_config_round_trip_through_json(live):
  _, session = live
  buf = _by_kind(session, "buffer_size")[0]
  session.set({buf.name: 4})
  saved = json.dumps(session.config())
  session.set({buf.name: 1})
  session.apply_config(saved)
  assert {k.name: k.value for k in session.knobs()}[buf.name] == 4


@pytest.mark.parametrize("bad", [{}, {"knobs": {}}, "[]",
                                 {"format": "other", "knobs": {}}])
def test_apply_config_rejects_foreign_data(live, bad):
  _, session = live
  with pytest.raises((ValueError, json.JSONDecodeError)):
    session.apply_config(bad)


@pytest.mark.parametrize("bad,match", [
    (0, "positive int"), (-5, "positive int"), (1.5, "positive int"),
    (True, "positive int"),
    # Used to fail with a bare conversion error, yet stay pinned.
    (2**63, r"TuningSession\.set_ram_budget: ram_budget 9223372036854775808 "
     r"is out of its range 1\.\.9223372036854775807 \(bytes, an int64\)\. "
     r"Pass at most 9223372036854775807; nothing was changed\."),
    (2**70, r"ram_budget 1180591620717411303424 is out of its range"),
])
def test_set_ram_budget_rejects_bad_values_and_pins_nothing(live, bad, match):
  _, session = live
  before = session.counters()["ram_budget"]
  with pytest.raises(ValueError, match=match):
    session.set_ram_budget(bad)
  assert session.pinned_ram_budget is None
  assert session.counters()["ram_budget"] == before


def test_the_largest_ram_budget_is_pinned(live):
  _, session = live
  session.set_ram_budget(session_lib.MAX_RAM_BUDGET)
  assert session.pinned_ram_budget == 2**63 - 1
  assert session.counters()["ram_budget"] == 2**63 - 1


def test_a_pin_is_kept_by_the_kernels_session(live):
  _, session = live
  session.set_ram_budget(77 << 20)
  raw = _kernels.ops().intune_session_counters(
      tf.constant(session.id, tf.int64)).counters.numpy()
  assert raw[session_lib.COUNTERS.index("pinned_ram_budget")] == 77 << 20
  assert session.pinned_ram_budget == 77 << 20
  # The tuner's budget writes leave the pin as it is.
  session._apply_ram_budget(5 << 20)  # noqa: SLF001
  assert session.pinned_ram_budget == 77 << 20
  assert session.counters()["ram_budget"] == 5 << 20


def test_an_unset_budget_is_resolved_where_the_iterator_is_made(monkeypatch):
  # The graph is built where 100 GiB are available and iterated where 2 GiB
  # are (a tf.data service worker builds the client's graph): the session
  # budgets from the 2 GiB, and the graph carries no bytes at all.
  gib = 1 << 30
  monkeypatch.setattr(host, "available_memory", lambda: 100 * gib)
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(
      policy="fixed", config={"none/parallelism": 1}, host_share=False)
  ds = tf.data.Dataset.range(100).prefetch(1).with_options(options)
  graph = tf.compat.v1.GraphDef.FromString(
      ds._as_serialized_graph().numpy())  # noqa: SLF001
  assert [n.attr["ram_budget"].i for n in graph.node
          if n.op == "IntuneOptionsDataset"] == [0]
  monkeypatch.setattr(host, "available_memory", lambda: 2 * gib)
  it = iter(ds)
  next(it)
  # Half of the 2 GiB (options.DEFAULT_RAM_SHARE), or a share of that half;
  # what this process's caches and buffers hold counts as available (a few
  # KB, from the tests before), far from the 50 GiB of the graph's machine.
  assert 0 < intune_tf.session_of(it).counters()["ram_budget"] <= 1.01 * gib
  del it
  gc.collect()


def test_apply_config_of_a_string_that_is_not_json_says_so(live):
  # Used to raise a JSONDecodeError naming no field.
  _, session = live
  with pytest.raises(ValueError, match=(
      r"TuningSession\.apply_config: the string is not JSON \(Expecting "
      r"property name enclosed in double quotes: line 1 column 2 "
      r"\(char 1\)\): pass the dict from TuningSession\.config\(\) or "
      r"json\.dumps of it\.")):
    session.apply_config("{not json")


# Used to raise "could not convert string to float" naming no knob.
@pytest.mark.parametrize("value,shown", [
    ("abc", "'abc'"), (float("nan"), "nan"), (None, "None"), (True, "True")])
def test_apply_config_names_the_knob_whose_value_is_not_a_number(
    live, value, shown):
  _, session = live
  buf = _by_kind(session, "buffer_size")[0]
  session.set({buf.name: 3})
  config = {"format": session.config()["format"], "knobs": {buf.name: value}}
  with pytest.raises(ValueError, match=(
      rf"TuningSession\.apply_config: knob {re.escape(repr(buf.name))} has "
      rf"value {re.escape(shown)}, not a finite number\. Give each knob a "
      r"number \(as TuningSession\.config\(\) does\); nothing was changed\.")):
    session.apply_config(config)
  assert {k.name: k.value for k in session.knobs()}[buf.name] == 3


@pytest.mark.parametrize("value", [True, "3", float("nan"), float("inf")])
def test_value_that_is_not_a_finite_number_is_rejected(live, value):
  _, session = live
  buf = _by_kind(session, "buffer_size")[0]
  session.set({buf.name: 2})
  with pytest.raises(ValueError, match="not a finite number"):
    session.set({buf.name: value})
  assert {k.name: k.value for k in session.knobs()}[buf.name] == 2


def test_snapshot_agrees_with_the_public_readings(live):
  # The tuner's one-call reading (IntuneObserve) against knobs(), stats()
  # (a parsed ModelProto) and counters(), taken just before it.
  it, session = live
  for _ in range(50):
    next(it)
  knobs, stats, counters = session.knobs(), session.stats(), session.counters()
  snap = session._snapshot()  # noqa: SLF001
  assert list(snap.knobs) == knobs
  assert snap.stage_names == tuple(s.name for s in stats)
  assert snap.stage_stats.shape == (len(stats), 7)  # and the node id
  for row, st in zip(snap.stage_stats, stats):
    # Cumulative counts only grow (prefetch threads may run meanwhile).
    assert row[0] >= st.elements and row[1] >= st.processing_time_ns
    assert row[4] >= st.bytes_produced and row[5] >= st.bytes_consumed
  assert snap.counters["elements"] == counters["elements"] == 51


def test_snapshot_knobs_follow_every_change(live):
  # A reading whose knob names and values did not change reuses the knobs
  # of the one before; a change shows at the next reading.
  _, session = live
  first = session._snapshot().knobs  # noqa: SLF001
  assert session._snapshot().knobs is first  # noqa: SLF001
  buf = next(k for k in first if k.kind == "buffer_size")
  for value in (buf.value + 1, buf.value + 2, buf.value + 1):
    assert session.set({buf.name: value}) == {buf.name: value}
    knobs = session._snapshot().knobs  # noqa: SLF001
    assert {k.name: k.value for k in knobs}[buf.name] == value
    assert knobs == tuple(session.knobs())


def test_set_applies_the_values_of_each_call(live, monkeypatch):
  # Repeated and new (name, value) tuples, more than the session keeps as
  # tensors for set().
  monkeypatch.setattr(intune_tf.ops.session, "_SET_TENSORS", 3)
  _, session = live
  buf = _by_kind(session, "buffer_size")[0]
  par = _by_kind(session, "parallelism")[0]
  for values in ({buf.name: 2}, {buf.name: 3}, {buf.name: 2},
                 {par.name: par.min}, {buf.name: 3.0},
                 {buf.name: 4, par.name: par.min},
                 {par.name: par.min, buf.name: 5}, {buf.name: 2},
                 {buf.name: 6}, {buf.name: 4, par.name: par.min}):
    assert session.set(values) == {n: float(v) for n, v in values.items()}
    current = {k.name: k.value for k in session.knobs()}
    assert {n: current[n] for n in values} == values


def _files(tmp_path, n=12, records=200):
  paths = []
  for i in range(n):
    path = str(tmp_path / f"part-{i:02d}.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
      for j in range(records):
        w.write(tf.train.Example(features=tf.train.Features(feature={
            "x": tf.train.Feature(int64_list=tf.train.Int64List(
                value=[i * records + j]))})).SerializeToString())
    paths.append(path)
  return paths


def _parse(record):
  return tf.io.parse_single_example(
      record, {"x": tf.io.FixedLenFeature([], tf.int64)})["x"]


def _tuned(ds, **fields):
  fields.setdefault("policy", "manual")
  fields.setdefault("warm_start", False)
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(**fields)
  return ds.with_options(options)


_AUTOTUNE = tf.data.AUTOTUNE
# Pipelines whose tuned stages are re-created every epoch: (factory, size of
# an epoch in elements).
_REPEATS = {
    "repeat_above": (lambda: tf.data.Dataset.range(40).map(
        lambda x: x + 1, num_parallel_calls=_AUTOTUNE).prefetch(
            _AUTOTUNE).repeat(), 40),
    "steps_per_epoch_take": (lambda: tf.data.Dataset.range(40).map(
        lambda x: x + 1, num_parallel_calls=_AUTOTUNE).prefetch(
            _AUTOTUNE).repeat().take(10**6), 40),
    "batched_epochs": (lambda: tf.data.Dataset.range(64).map(
        lambda x: x * 2, num_parallel_calls=_AUTOTUNE).batch(
            8, num_parallel_calls=_AUTOTUNE).prefetch(_AUTOTUNE).repeat(), 8),
}


def _knob_table(session):
  return {k.name: (k.value, k.display) for k in session.knobs()}


@pytest.mark.parametrize("pipeline", sorted(_REPEATS))
def test_names_and_set_values_survive_every_epoch(pipeline):
  make, epoch = _REPEATS[pipeline]
  # Without the cache, which would serve the epochs after the first from
  # the stages' output (test_cache covers the knobs below it).
  it = iter(_tuned(make(), cache=False))
  next(it)
  session = intune_tf.session_of(it)
  first = _knob_table(session)
  assert first and not any("(id:" in n for n in first)
  wanted = {}
  for name in first:
    kind = name.rpartition("/")[2]
    wanted[name] = 1.0 if kind == "parallelism" else 3.0
  assert session.set(wanted) == wanted
  seen = set()
  for _ in range(4):  # four epochs
    for _ in range(epoch):
      next(it)
    table = _knob_table(session)
    assert {n: v for n, (v, _) in table.items()} == wanted
    seen.add(tuple(d for _, d in table.values()))
  # The stages were re-created (new node ids), under the same names.
  assert len(seen) > 1
  del it


def test_names_are_the_same_for_a_new_and_a_restored_iterator(tmp_path):
  make, _ = _REPEATS["repeat_above"]
  ds = _tuned(make())
  it = iter(ds)
  for _ in range(55):
    next(it)
  names = set(_knob_table(intune_tf.session_of(it)))
  checkpoint = tf.train.Checkpoint(it=it)
  path = checkpoint.save(str(tmp_path / "ckpt"))
  again = iter(ds)
  next(again)
  assert set(_knob_table(intune_tf.session_of(again))) == names
  restored = iter(ds)
  tf.train.Checkpoint(it=restored).restore(path)
  assert int(next(restored)) == 55 - 40 + 1  # where `it` left off
  assert set(_knob_table(intune_tf.session_of(restored))) == names
  del it, again, restored


def test_branches_of_multi_input_stages_are_distinct():
  r = tf.data.Dataset.range
  branch = lambda: r(100).map(lambda x: x + 1, num_parallel_calls=_AUTOTUNE)
  ds = tf.data.Dataset.zip((branch(), branch())).prefetch(_AUTOTUNE)
  it = iter(_tuned(ds))
  next(it)
  names = set(_knob_table(intune_tf.session_of(it)))
  assert {"Prefetch.Zip[0].ParallelMapV2/parallelism",
          "Prefetch.Zip[1].ParallelMapV2/parallelism"} <= names
  del it
  ds = branch().concatenate(branch()).prefetch(_AUTOTUNE)
  it = iter(_tuned(ds))
  next(it)
  session = intune_tf.session_of(it)
  assert "Prefetch.Concatenate[0].ParallelMapV2/parallelism" in _knob_table(
      session)
  session.set({"Prefetch.Concatenate[0].ParallelMapV2/parallelism": 1})
  for _ in range(150):  # into the second input
    next(it)
  table = _knob_table(session)
  assert table["Prefetch.Concatenate[1].ParallelMapV2/parallelism"][0] > 1
  del it


def test_live_names_agree_with_names_of_the_whole_model():
  # A live session names nodes as it first sees them; IntuneStageNames names
  # a whole model at once: the same grammar gives the same names.
  make, _ = _REPEATS["batched_epochs"]
  it = iter(_tuned(tf.data.Dataset.zip((make(), make()))))
  for _ in range(20):
    next(it)
  session = intune_tf.session_of(it)
  by_id = intune_tf.ops.session.proto_stage_names(session.model_proto())
  snap = session._snapshot()  # noqa: SLF001
  ids = snap.stage_stats[:, -1].tolist()
  assert {i: by_id.get(i) for i in ids} == dict(zip(ids, snap.stage_names))
  del it


def _proto(output, nodes):
  """A ModelProto of `nodes` ({id: (name, [input ids])})."""
  proto = model_pb2.ModelProto(output=output)
  for nid, (name, inputs) in nodes.items():
    proto.nodes[nid].CopyFrom(
        model_pb2.ModelProto.Node(id=nid, name=name, inputs=inputs))
  return proto


@pytest.mark.parametrize("nodes,expected", [
    # Prefetch <- release <- interleave <- Range: the interleave is bounded.
    ({1: ("Prefetch", [2]), 2: ("IntuneBufferRelease", [3]),
      3: ("ParallelInterleaveV4", [4]), 4: ("Range", [])},
     {"Prefetch.ParallelInterleaveV4"}),
    # Two releases in a row (a rewrite run twice): the node below both.
    ({1: ("Prefetch", [2]), 2: ("IntuneBufferRelease", [3]),
      3: ("IntuneBufferRelease", [4]), 4: ("ParallelInterleaveV4", [])},
     {"Prefetch.ParallelInterleaveV4"}),
    # No release node: nothing is bounded.
    ({1: ("Prefetch", [2]), 2: ("ParallelInterleaveV4", [3]),
      3: ("Range", [])}, set()),
])
def test_bounded_stage_names_are_the_nodes_below_a_release(nodes, expected):
  names = session_lib.bounded_stage_names(_proto(1, nodes))
  assert names == expected


def test_stats_inputs_pass_through_a_release_node(tmp_path):
  # Batch <- IntuneBufferRelease <- ParallelInterleaveV4: the release node is
  # no stage; the batch's input is the bounded interleave.
  ds = tf.data.Dataset.list_files(_files(tmp_path), shuffle=False).interleave(
      tf.data.TFRecordDataset, cycle_length=3, num_parallel_calls=_AUTOTUNE)
  it = iter(_tuned(ds.batch(4).prefetch(_AUTOTUNE)))
  next(it)
  session = intune_tf.session_of(it)
  proto = session.model_proto()
  assert "IntuneBufferRelease" in {n.name for n in proto.nodes.values()}
  interleave = "Prefetch.BatchV2.ParallelInterleaveV4"
  stats = {s.name: s for s in session.stats()}
  assert stats["Prefetch.BatchV2"].inputs == (interleave,)
  assert stats[interleave].inputs[0] == f"{interleave}.TensorSlice"
  assert session_lib.bounded_stage_names(proto) == {interleave}
  del it


@pytest.mark.parametrize("model,root,message", [
    (b"\xff\xff", "Intune", "model_proto is not a serialized ModelProto"),
    ([b""], "Intune", "model_proto must be a scalar"),
    (b"", ["Intune"], "root must be a scalar"),
])
def test_stage_names_op_names_a_bad_input(model, root, message):
  with pytest.raises(tf.errors.InvalidArgumentError, match=message):
    _kernels.ops().intune_stage_names(tf.constant(model), tf.constant(root))


# --- an interleave's per-element datasets: one knob per stage ---------------

def _dlrm_reader(files, **fields):
  ds = tf.data.Dataset.list_files(files, shuffle=False).interleave(
      lambda f: tf.data.TFRecordDataset(f).map(
          _parse, num_parallel_calls=_AUTOTUNE),
      cycle_length=3, num_parallel_calls=_AUTOTUNE)
  return _tuned(ds.batch(16).prefetch(_AUTOTUNE), **fields)


def _instances(session, stage):
  return [s for s in session.stats() if s.name == stage]


@pytest.mark.parametrize("inner_stats", [False, True])
def test_inner_map_of_an_interleave_is_one_knob(tmp_path, inner_stats):
  files = _files(tmp_path)
  it = iter(_dlrm_reader(files, inner_stats=inner_stats))
  for _ in range(5):
    next(it)
  session = intune_tf.session_of(it)
  inner = "Prefetch.BatchV2.ParallelInterleaveV4[*].ParallelMapV2"
  # A function with a parallel stage is recorded (not "untracked") whatever
  # inner_stats says: its nodes are in the model.
  assert len(_instances(session, inner)) >= 2
  knobs = [k for k in session.knobs() if k.name.startswith(inner + "/")]
  assert [k.name for k in knobs] == [f"{inner}/parallelism"]
  assert knobs[0].display.count("ParallelMapV2(id:") >= 2
  assert session.set({f"{inner}/parallelism": 1}) == {
      f"{inner}/parallelism": 1.0}
  first = {s.display for s in _instances(session, inner)}
  assert all(s.parameters["parallelism"] == 1
             for s in _instances(session, inner))
  got = []
  for _ in range(60):  # 12 files of 200 records in batches of 16: new files
    got.extend(next(it).numpy().tolist())
  now = _instances(session, inner)
  assert {s.display for s in now} - first  # new instances
  assert all(s.parameters["parallelism"] == 1 for s in now)
  assert [k.value for k in session.knobs() if k.name.startswith(inner)] == [1]
  del it


# --- starts: TF's own, whatever the policy ---------------------------------

def _prefetch_holds(session):
  stats = {s.name: s for s in session.stats()}
  # Under the prefetch TF injects above the repeat (inject_prefetch).
  return stats["Prefetch.ForeverRepeat.Prefetch"].buffered_elements >= 1


@pytest.mark.parametrize("policy", ["manual", "fixed"])
def test_prefetch_autotune_holds_an_element_in_every_epoch(policy):
  make, epoch = _REPEATS["repeat_above"]
  fields = {"policy": policy, "period_s": 60.0}
  if policy == "fixed":
    fields["config"] = {
        "Prefetch.ForeverRepeat.Prefetch.ParallelMapV2/parallelism": 1}
  it = iter(_tuned(make(), **fields))
  next(it)
  session = intune_tf.session_of(it)
  buffer = "Prefetch.ForeverRepeat.Prefetch/buffer_size"
  for _ in range(3):
    # The consumer waits: the guard's pass gave the new prefetch its start,
    # so it fills before anything reads the session.
    time.sleep(0.2)
    assert _prefetch_holds(session)
    assert _knob_table(session)[buffer][0] >= 1
    for _ in range(epoch):
      next(it)
  del it


# --- bad inputs --------------------------------------------------------------

_BAD_INPUTS = {
    "model_proto/session_id": "ops.intune_model_proto(i64([pid]))",
    "list_knobs/session_id": "ops.intune_list_knobs(i64([[pid]]))",
    "session_stats/session_id":
        "ops.intune_session_counters(i64([pid, pid]))",
    "observe/session_id": "ops.intune_observe(i64([pid]))",
    "set_knobs/session_id":
        "ops.intune_set_knobs(i64([pid]), [name], [1.0])",
    "set_knobs/names": "ops.intune_set_knobs(sid, name, [1.0])",
    "set_knobs/values": "ops.intune_set_knobs(sid, [name], [[1.0]])",
    "set_knobs/lengths": "ops.intune_set_knobs(sid, [name, name], [1.0])",
    "set_ram_budget/session_id":
        "ops.intune_set_ram_budget(i64([pid]), i64(1))",
    "set_ram_budget/ram_budget":
        "ops.intune_set_ram_budget(sid, i64([1, 2]))",
}
_PROGRAM = """
import sys
import tensorflow as tf, intune_tf
from intune_tf.ops import loader as _kernels
options = tf.data.Options()
options.experimental_intune = intune_tf.IntuneOptions(policy="manual",
                                                      warm_start=False)
it = iter(tf.data.Dataset.range(100).map(
    lambda x: x + 1, num_parallel_calls=tf.data.AUTOTUNE).with_options(options))
next(it)
session = intune_tf.session_of(it)
pid = session.id
sid = tf.constant(pid, tf.int64)
name = session.knobs()[0].name
ops = _kernels.ops()
i64 = lambda value: tf.constant(value, tf.int64)
for case, call in CASES.items():
  print(case, end=": ", flush=True)
  try:
    eval(call)
    print("NO ERROR", flush=True)
  except tf.errors.InvalidArgumentError as e:
    print("INVALID ARGUMENT:", e.message.replace(chr(10), " "), flush=True)
"""


@pytest.fixture(scope="module")
def bad_input_results(tmp_path_factory):
  """Every call of `_BAD_INPUTS` in one child process: a CHECK failure
  aborts the process, which must fail the tests, not end pytest. (It runs
  outside the source tree, so that it imports the installed package.)"""
  program = f"CASES = {_BAD_INPUTS!r}\n{_PROGRAM}"
  result = subprocess.run([sys.executable, "-c", program],
                          capture_output=True, text=True, timeout=300,
                          cwd=tmp_path_factory.mktemp("child"), check=False)
  lines = dict(line.split(": ", 1) for line in result.stdout.splitlines()
               if ": " in line)
  return result, lines


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(_BAD_INPUTS))
def test_control_ops_reject_inputs_of_the_wrong_shape(case, bad_input_results):
  result, lines = bad_input_results
  assert result.returncode == 0, result.stdout + result.stderr[-2000:]
  what = case.split("/")[1]
  expected = ("knob names but" if what == "lengths" else
              rf"{what} must be a (scalar|vector), got shape")
  assert re.match(rf"INVALID ARGUMENT: .*{expected}", lines.get(case, "")), (
      result.stdout)


def _int64(value):
  return tf.constant(value, tf.int64)


@pytest.mark.parametrize("op,args", [
    ("intune_model_proto", lambda: (_int64([1]),)),
    ("intune_list_knobs", lambda: (_int64([1]),)),
    ("intune_session_counters", lambda: (_int64([1]),)),
    ("intune_observe", lambda: (_int64([[1]]),)),
    ("intune_set_knobs", lambda: (_int64(1), [["a"]], [1.0])),
    ("intune_set_knobs", lambda: (_int64(1), ["a", "b"], [1.0])),
    ("intune_set_ram_budget", lambda: (_int64(1), _int64([5]))),
    ("intune_stage_names", lambda: ([b""], "Intune")),
    ("intune_stage_names", lambda: (b"", ["Intune"])),
])
def test_shape_functions_check_ranks(op, args):
  from intune_tf.ops import loader as _kernels  # noqa: PLC0415
  fn = getattr(_kernels.ops(), op)
  with pytest.raises(ValueError, match="rank|must be equal"):
    tf.function(lambda: fn(*args())).get_concrete_function()


def test_knob_set_to_its_max_is_clamped_to_what_int64_holds(live):
  it, session = live
  for knob in session.knobs():
    applied = session.set({knob.name: knob.max})[knob.name]
    assert applied <= knob.max and applied < 2.0**63
    if knob.kind == "parallelism":
      assert applied == knob.max
    else:  # 2^63 does not fit an int64: the largest double below it
      assert knob.max == 2.0**63
      assert applied <= 2.0**63 - 1024
  values = [int(next(it)) for _ in range(20)]
  assert values == list(range(values[0], values[0] + 20))
  session.set({k.name: 1 for k in session.knobs()})


@pytest.mark.parametrize("value", [float("nan"), float("-inf"),
                                   float("inf")])
def test_kernel_rejects_values_that_are_not_finite(live, value):
  from intune_tf.ops import loader as _kernels  # noqa: PLC0415
  _, session = live
  par = _by_kind(session, "parallelism")[0]
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="not a finite number"):
    _kernels.ops().intune_set_knobs(session.id, [par.name], [value])


def test_kernel_rejects_a_value_above_the_max(live):
  from intune_tf.ops import loader as _kernels  # noqa: PLC0415
  _, session = live
  buf = _by_kind(session, "buffer_size")[0]
  with pytest.raises(tf.errors.OutOfRangeError, match="outside its range"):
    _kernels.ops().intune_set_knobs(session.id, [buf.name], [2.0**64])
