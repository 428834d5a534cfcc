"""Tests of intune_tf.agent.warmstart: fingerprints, save/load, bad files."""

import json
import os
import threading
import types

import _fuzz
from _waiting import wait_for
import numpy as np
import pytest
import tensorflow as tf

import intune_tf
from intune_tf.agent import dqn
from intune_tf.agent import warmstart


def _pipeline(path):
  ds = tf.data.Dataset.from_tensor_slices([path]).repeat()
  return ds.map(tf.strings.length, num_parallel_calls=tf.data.AUTOTUNE)


def _graph(ds):
  graph_def = tf.compat.v1.GraphDef()
  graph_def.ParseFromString(ds._as_serialized_graph().numpy())  # noqa: SLF001
  return graph_def


def test_fingerprint_ignores_paths_and_sees_structure():
  a = warmstart.graph_fingerprint(_graph(_pipeline("/data/day1")))
  b = warmstart.graph_fingerprint(_graph(_pipeline("/data/day2")))
  c = warmstart.graph_fingerprint(_graph(_pipeline("/x").batch(2)))
  assert a == b != c


@pytest.fixture(name="session")
def _session(tmp_path, monkeypatch):
  monkeypatch.setenv("INTUNE_WARMSTART_DIR", str(tmp_path))
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(policy="manual")
  it = iter(_pipeline("/data").with_options(options))
  next(it)
  yield intune_tf.session_of(it)
  del it


@pytest.mark.parametrize("steps, saved", [(0, False), (3, True)])
def test_weights_are_saved_only_once_fine_tuning_changed_them(steps, saved):
  agent = dqn.Agent()
  agent.gradient_steps = steps
  weights = warmstart.fine_tuned_weights(types.SimpleNamespace(agent=agent))
  assert (weights is not None) == saved
  assert warmstart.fine_tuned_weights(object()) is None  # a policy, no agent


def test_save_and_load_round_trip(session, tmp_path):
  knob = session.knobs()[0].name
  weights = dqn.Agent(seed=0).get_weights()
  path = warmstart.save(session, {knob: 2.0}, 123.0, weights)
  assert path.startswith(str(tmp_path)) and session.fingerprint
  state = warmstart.load(session)
  assert state.config == {knob: 2.0} and state.rows_per_s == 123.0
  for a, b in zip(state.weights, weights):
    np.testing.assert_array_equal(a, b)


def test_save_defaults_to_the_knobs_in_force(session):
  warmstart.save(session)
  assert warmstart.load(session).config == session.config()["knobs"]


@pytest.mark.parametrize("corrupt,message", [
    (lambda d: "{truncated", "Expecting"),
    (lambda d: json.dumps({**d, "version": 99}), "format version 99"),
    (lambda d: json.dumps({**d, "machine": {"cpus": 1024, "memory_gib": 1}}),
     "another pipeline or machine"),
    (lambda d: json.dumps({**d, "config": {"k": "fast"}}),
     "not a mapping of knob names to finite numbers"),
    (lambda d: json.dumps({**d, "config": {"k": float("nan")}}),
     "not a mapping of knob names to finite numbers"),
    (lambda d: json.dumps([d]), "not a JSON object"),
    (lambda d: " " * (1 << 20) + json.dumps(d), "more than the 1048576"),
])
def test_corrupt_or_foreign_files_are_ignored_with_a_warning(
    session, corrupt, message, caplog):
  path = warmstart.save(session, {"k": 1.0}, 1.0)
  with open(path) as f:
    data = json.load(f)
  with open(path, "w") as f:
    f.write(corrupt(data))
  with caplog.at_level("WARNING"):
    assert warmstart.load(session) is None
  assert message in caplog.text and path in caplog.text


def test_corrupt_weights_keep_the_configuration(session, caplog):
  path = warmstart.save(session, {"k": 1.0}, 1.0, dqn.Agent().get_weights())
  with open(path.replace(".json", ".npz"), "wb") as f:
    f.write(b"garbage")
  with caplog.at_level("WARNING"):
    state = warmstart.load(session)
  assert state.config == {"k": 1.0} and state.weights is None
  assert "ignoring warm-start weights" in caplog.text


def test_a_fifo_in_place_of_the_file_is_refused_at_once(session, caplog):
  path = warmstart.save(session, {"k": 1.0}, 1.0)
  os.unlink(path)
  os.mkfifo(path)  # nothing ever writes to it: reading would block forever
  with caplog.at_level("WARNING"):
    assert warmstart.load(session) is None
  assert "not a regular file" in caplog.text


def test_concurrent_saves_of_one_pipeline_all_land(session):
  weights = dqn.Agent(seed=0).get_weights()
  errors = []

  def save(n):
    try:
      for _ in range(20):
        warmstart.save(session, {"k": float(n)}, 1.0, weights)
    except Exception as e:  # noqa: BLE001
      errors.append(e)

  threads = [threading.Thread(target=save, args=(n,)) for n in range(6)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors
  state = warmstart.load(session)
  assert state.config["k"] in range(6) and state.weights is not None
  folder = os.path.dirname(warmstart.save(session, {"k": 0.0}, 1.0))
  assert not [f for f in os.listdir(folder) if "tmp" in f]


def test_warm_start_off_saves_and_loads_nothing(tmp_path, monkeypatch):
  monkeypatch.setenv("INTUNE_WARMSTART_DIR", str(tmp_path))
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(policy="manual",
                                                        warm_start=False)
  it = iter(_pipeline("/data").with_options(options))
  next(it)
  session = intune_tf.session_of(it)
  assert warmstart.save(session) is None and warmstart.load(session) is None
  assert not list(tmp_path.iterdir())


def _epochs():
  # The map and prefetch are re-created by the repeat above them every 40
  # elements.
  return tf.data.Dataset.range(40).map(
      lambda x: x + 1, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
          tf.data.AUTOTUNE).repeat()


_BELOW_CACHE = "Prefetch.ForeverRepeat.Prefetch.ParallelMapV2/parallelism"


@pytest.mark.parametrize("cache", [False, True])
def test_warm_start_config_holds_in_every_epoch(tmp_path, monkeypatch,
                                                cache):
  monkeypatch.setenv("INTUNE_WARMSTART_DIR", str(tmp_path))
  probe = tf.data.Options()
  probe.experimental_intune = intune_tf.IntuneOptions(policy="manual",
                                                      cache=cache)
  it = iter(_epochs().with_options(probe))
  next(it)
  # The top prefetch is the one TF injects above the repeat.
  config = {_BELOW_CACHE: 1.0,
            "Prefetch.ForeverRepeat.Prefetch/buffer_size": 3.0,
            "Prefetch/buffer_size": 2.0}
  assert set(config) == {k.name for k in intune_tf.session_of(it).knobs()}
  warmstart.save(intune_tf.session_of(it), config, 100.0)
  del it
  options = tf.data.Options()
  # The agent's first step applies the warm start; no other step for 60 s.
  options.experimental_intune = intune_tf.IntuneOptions(period_s=60.0,
                                                        cache=cache)
  it = iter(_epochs().with_options(options))
  next(it)
  session = intune_tf.session_of(it)
  values = lambda: {k.name: k.value for k in session.knobs()}
  assert wait_for(lambda: values() == config), values()
  # The cache serves the epochs after the first: the map below it no
  # longer runs, and its knob stays, idle, at its value.
  for _ in range(3):
    for _ in range(40):
      next(it)
    assert values() == config
  del it


def test_a_save_keeps_the_knobs_below_a_cache_that_serves_the_epoch(
    tmp_path, monkeypatch):
  monkeypatch.setenv("INTUNE_WARMSTART_DIR", str(tmp_path))
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(policy="manual",
                                                        cache=True)
  ds = _epochs().with_options(options)
  it = iter(ds)
  next(it)
  session = intune_tf.session_of(it)
  assert session.set({_BELOW_CACHE: 1.0}) == {_BELOW_CACHE: 1.0}
  for _ in range(80):  # epochs 2 and 3 come from the cache
    next(it)
  # The map does not run; its knob stays, idle, at its value.
  assert session.config()["knobs"][_BELOW_CACHE] == 1.0
  warmstart.save(session)
  assert warmstart.load(session).config[_BELOW_CACHE] == 1.0
  # The cache outlives the iterator: a new one never runs the map, lists
  # its knob at the value the last session had, and its save keeps it.
  again = iter(ds)
  next(again)
  later = intune_tf.session_of(again)
  assert later.config()["knobs"][_BELOW_CACHE] == 1.0
  warmstart.save(later, {"Prefetch/buffer_size": 2.0})
  assert warmstart.load(later).config[_BELOW_CACHE] == 1.0
  del it, again


@pytest.mark.parametrize("value,outside", [
    (1e9, "= 1e+09 is outside [1, "), (-5.0, "= -5 is outside [1, ")])
def test_a_file_that_does_not_fit_the_knob_ranges_is_dropped_naming_it(
    session, caplog, value, outside):
  knob = session.knobs()[0]  # the map's parallelism
  path = warmstart.save(session, {knob.name: value}, 1.0)
  state = warmstart.load(session)
  assert state.path == path
  with caplog.at_level("WARNING"):
    assert warmstart.fitting(state, session.knobs()) is None
  told = [r.getMessage() for r in caplog.records if path in r.getMessage()]
  assert len(told) == 1 and outside in told[0], told
  assert told[0].startswith(f"InTune: ignoring warm-start file {path}: it "
                            "does not fit this pipeline's knobs (")


def test_a_fitting_file_keeps_the_knobs_the_pipeline_has(session):
  knob = session.knobs()[0]
  warmstart.save(session, {knob.name: knob.min, "Gone/parallelism": 3.0}, 1.0)
  assert warmstart.fitting(warmstart.load(session), session.knobs()) == {
      knob.name: knob.min}


def test_a_warm_start_out_of_range_neither_fails_a_step_nor_applies(
    tmp_path, monkeypatch, caplog):
  # Used to log `ERROR: InTune tuning step ... failed: ValueError(...)` with
  # a traceback, without naming the file.
  monkeypatch.setenv("INTUNE_WARMSTART_DIR", str(tmp_path))
  probe = tf.data.Options()
  probe.experimental_intune = intune_tf.IntuneOptions(policy="manual")
  it = iter(_epochs().with_options(probe))
  next(it)
  knobs = intune_tf.session_of(it).knobs()
  bad = {k.name: 1e9 if k.kind == "parallelism" else -5.0 for k in knobs}
  path = warmstart.save(intune_tf.session_of(it), bad, 100.0)
  del it
  options = tf.data.Options()
  # The agent's first step would apply the warm start; no other for 60 s.
  options.experimental_intune = intune_tf.IntuneOptions(period_s=60.0)
  with caplog.at_level("WARNING"):
    it = iter(_epochs().with_options(options))
    next(it)
    assert wait_for(lambda: path in caplog.text), caplog.text
    for _ in range(40):
      next(it)
  session = intune_tf.session_of(it)
  assert all(k.min <= k.value <= k.max for k in session.knobs())
  assert "does not fit this pipeline's knobs" in caplog.text
  assert "failed" not in caplog.text, caplog.text
  del it


def test_fuzzed_warm_start_files_are_loaded_or_told_once_and_never_raise():
  out = _fuzz.run_reader("""
      import json, logging, os, pathlib, random, shutil, tempfile, time
      import types
      import _fuzz
      from intune_tf import records
      from intune_tf.agent import warmstart

      told = _fuzz.warnings_told()
      session = types.SimpleNamespace(
          fingerprint="fuzz", options=types.SimpleNamespace(warm_start=True))
      knobs = [records.Knob("Prefetch/buffer_size", "buffer_size", 4, 1, 64),
               records.Knob("Prefetch.ParallelMapV2/parallelism",
                            "parallelism", 1, 1, 8)]

      def valid(rng):
        return {"version": warmstart.FORMAT_VERSION, "fingerprint": "fuzz",
                "machine": warmstart.machine(), "saved": time.time(),
                "config": {k.name: rng.uniform(k.min, k.max) for k in knobs},
                "rows_per_s": 100.0, "weights": rng.random() < 0.3}

      def clear(path):
        if os.path.isdir(path) and not os.path.islink(path):
          shutil.rmtree(path)
        elif os.path.lexists(path):
          os.unlink(path)

      for seed in SEEDS:
        print("fuzz seed", seed, flush=True)
        folder = pathlib.Path(tempfile.mkdtemp())
        os.environ["INTUNE_WARMSTART_DIR"] = str(folder)
        base = folder / warmstart.key("fuzz")
        path = pathlib.Path(f"{base}.json")
        npz = pathlib.Path(f"{base}.npz")
        rng = random.Random(seed)
        loaded = 0
        cases = [None] * 60 + _fuzz.grid(valid(rng))
        for i, case in enumerate(cases):
          clear(path)
          clear(npz)
          if rng.random() < 0.3:  # beside it, bad weights of any kind
            _fuzz.odd_kind(npz, rng, b"PK garbage", 1 << 20)
          if case is None:
            _fuzz.fill(folder, seed * 1000 + i, 1, valid,
                       lambda data, i: path.name, 1 << 20)
          else:
            _fuzz.write(path, json.dumps(case, allow_nan=True).encode())
          start = len(told)
          state = warmstart.load(session)
          config = state and warmstart.fitting(state, knobs)
          named = [m for m in told[start:]
                   if f"warm-start file {path}: " in m]
          assert len(named) == (config is None), (seed, i, named)
          assert config is None or all(
              k.min <= config.get(k.name, k.min) <= k.max for k in knobs)
          loaded += config is not None
        print(f"seed {seed}: {len(cases)} files, {loaded} fit", flush=True)
  """)
  print(out)
  assert [line.split()[2] for line in out.splitlines()
          if line.startswith("fuzz seed")] == [str(s) for s in _fuzz.SEEDS]
