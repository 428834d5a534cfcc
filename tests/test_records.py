"""Tests of intune_tf.records: knob and stage names (no TensorFlow)."""

import json
import pathlib
import re

import pytest

from intune_tf import records


@pytest.mark.parametrize("name,steps,op,depth", [
    ("Prefetch", (("Prefetch", ""),), "Prefetch", 1),
    ("Prefetch.ParallelMapV2", (("Prefetch", ""), ("ParallelMapV2", "")),
     "ParallelMapV2", 2),
    ("Zip[1].ParallelMapV2", (("Zip", "1"), ("ParallelMapV2", "")),
     "ParallelMapV2", 2),
    ("ParallelInterleaveV4[*].ParallelMapV2.Range",
     (("ParallelInterleaveV4", "*"), ("ParallelMapV2", ""), ("Range", "")),
     "Range", 3),
    # Names saved by earlier versions: depth is the node id.
    ("ParallelMapV2(id:7)", (("ParallelMapV2", ""),), "ParallelMapV2", 7),
])
def test_parse_stage(name, steps, op, depth):
  stage = records.parse_stage(name)
  assert (stage.steps, stage.op, stage.depth) == (steps, op, depth)
  assert stage.per_element == ("[*]" in name)
  knob, kind = records.parse_knob(f"{name}/parallelism")
  assert knob == stage and kind == "parallelism"


@pytest.mark.parametrize("bad", ["", "Prefetch.", "Zip[1]", "A[x].B", "A B",
                                 "Prefetch/", "/parallelism", "Map(id:x)"])
def test_parse_rejects_what_is_not_a_name(bad):
  with pytest.raises(ValueError, match="Not a"):
    records.parse_knob(bad if "/" in bad else f"{bad}/parallelism")


def test_encloses_follows_the_path():
  parse = records.parse_stage
  zip_ = parse("Prefetch.Zip")
  assert zip_.encloses(parse("Prefetch.Zip[0].Map"))
  assert zip_.encloses(parse("Prefetch.Zip[1].Map.Range"))
  assert not zip_.encloses(parse("Prefetch.Zip"))
  assert not parse("Prefetch.Zip[0].Map").encloses(parse("Prefetch.Zip[1].Map"))
  assert parse("A(id:2)").encloses(parse("B(id:5)"))


@pytest.mark.parametrize("name,key", [
    ("Prefetch.ParallelMapV2/parallelism",
     "Prefetch.ParallelMapV2/parallelism"),
    ("ParallelInterleaveV4[*].ParallelMapV2/parallelism",
     "ParallelInterleaveV4-each.ParallelMapV2/parallelism"),
    ("Zip[1].Prefetch/buffer_size", "Zip-1.Prefetch/buffer_size"),
    ("ParallelMapV2(id:3)/parallelism", "ParallelMapV2-3/parallelism"),
])
def test_log_key(name, key):
  assert records.log_key(name) == key


def test_input_first_orders_from_the_input_end():
  names = ["Prefetch/buffer_size", "Prefetch.ParallelMapV2/parallelism",
           "Prefetch.ParallelMapV2.Prefetch/buffer_size", "not a name"]
  # depths 1, 2, 3; an unparsable name sorts with depth 0, after them.
  assert sorted(names, key=records.input_first) == [
      "Prefetch.ParallelMapV2.Prefetch/buffer_size",
      "Prefetch.ParallelMapV2/parallelism", "Prefetch/buffer_size",
      "not a name"]


def test_knob_stage():
  knob = records.Knob("Zip[1].ParallelMapV2/parallelism", "parallelism",
                      2.0, 1.0, 8.0)
  assert knob.stage == "Zip[1].ParallelMapV2"


def test_a_decision_logs_only_the_fields_it_has():
  assert records.Decision(3, "hold").fields() == {"step": 3, "action": "hold"}
  full = records.Decision(4, "no-op", rate=10.0, reward=0.5, loss=0.1,
                          seconds=0.002)
  assert full.fields() == {"step": 4, "action": "no-op", "rate": 10.0,
                           "reward": 0.5, "loss": 0.1, "seconds": 0.002}


@pytest.mark.parametrize("cpe,rate,out,expected", [
    (0.002, 400.0, 100.0, 0.008),   # 0.002 s x 400/s / 100/s: 4 per output
    (0.002, 100.0, 100.0, 0.002),   # one element per output element
    (0.010, 25.0, 100.0, 0.0025),   # 4 outputs per element: 0.01 / 4
    (0.002, 400.0, 0.0, 0.0),       # nothing returned yet: no cost known
])
def test_stage_cost(cpe, rate, out, expected):
  assert records.stage_cost(cpe, rate, out) == pytest.approx(expected)


@pytest.mark.parametrize("cpe,rate,threads,expected", [
    (0.002, 1500.0, 4, 0.75),    # 3 CPUs busy over 4 threads
    (0.002, 1500.0, None, 3.0),  # no parallelism knob: one thread
    (0.002, 1500.0, 0, 3.0),     # below one thread counts as one
    (0.004, 500.0, 2, 1.0),      # 2 CPUs busy over 2 threads: saturated
])
def test_stage_utilization(cpe, rate, threads, expected):
  assert records.stage_utilization(cpe, rate, threads) == pytest.approx(
      expected)


def test_utilization_is_output_rate_times_cost_per_thread():
  # The two readings of "busy": 0.003 s x 200/s over 3 threads = 0.2, and
  # output 50/s x cost (0.003 x 200 / 50 = 0.012 s) / 3 = 0.2.
  cost = records.stage_cost(0.003, 200.0, 50.0)
  assert records.stage_utilization(0.003, 200.0, 3) == pytest.approx(
      50.0 * cost / 3) == pytest.approx(0.2)


def _stage(name, parallelism=None, buffer_size=None, buffered=0):
  return records.StageObservation(
      name=name, rate=0.0, cpu_per_element_s=0.0, parallelism=parallelism,
      buffer_size=buffer_size, buffer_fill=0.0, bytes_per_element=0.0,
      bytes_produced_per_s=0.0, buffered_bytes=buffered, time_share=0.0)


def test_unlowerable_bytes_are_those_of_stages_without_a_memory_knob():
  mb = 1 << 20
  stages = [_stage("Prefetch", buffer_size=4, buffered=8 * mb),
            _stage("Prefetch.Shuffle", buffered=64 * mb),
            _stage("Prefetch.Shuffle.ParallelMapV2", parallelism=2,
                   buffered=16 * mb),
            _stage("Prefetch.Shuffle.Cache"),  # holds nothing yet
            # Two instances of an inner shuffle: 3 + 5 MB.
            _stage("Interleave[0].Shuffle", buffered=3 * mb),
            _stage("Interleave[0].Shuffle", buffered=5 * mb)]
  assert records.unlowerable_bytes(stages) == {
      "Prefetch.Shuffle": 64 * mb, "Interleave[0].Shuffle": 8 * mb}


@pytest.mark.parametrize("bounded,expected_mb", [
    ((), {"Prefetch.Shuffle": 64, "Prefetch.Shuffle.Interleave": 20}),
    # The guard lowers a bounded interleave's records per input: not counted.
    (("Prefetch.Shuffle.Interleave",), {"Prefetch.Shuffle": 64}),
    # A name that is no stage changes nothing.
    (("Prefetch.Other",),
     {"Prefetch.Shuffle": 64, "Prefetch.Shuffle.Interleave": 20}),
])
def test_unlowerable_bytes_leave_out_bounded_stages(bounded, expected_mb):
  mb = 1 << 20
  stages = [_stage("Prefetch", buffer_size=4, buffered=8 * mb),
            _stage("Prefetch.Shuffle", buffered=64 * mb),
            # A bounded interleave: no knob, 20 MB of records.
            _stage("Prefetch.Shuffle.Interleave", buffered=20 * mb)]
  assert records.unlowerable_bytes(stages, bounded) == {
      name: held * mb for name, held in expected_mb.items()}


def test_a_cache_state_is_written_and_read_as_its_value():
  # The kernel spells the states as intune_tf/cc/cache_decision.h's
  # CacheStateName; the status file and the decision log hold the value.
  assert [s.value for s in records.CacheState] == ["off", "placed",
                                                   "declined"]
  for state in records.CacheState:
    assert records.CacheState(json.loads(json.dumps(state))) is state
    assert str(state) == f"{state}" == state.value
  header = (pathlib.Path(__file__).resolve().parents[1] / "intune_tf" / "cc" /
            "cache_decision.h").read_text()
  spelled = re.findall(r'return "(\w+)";', header)
  assert sorted(spelled) == sorted(s.value for s in records.CacheState)
