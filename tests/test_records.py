"""Tests of intune_tf.records: knob and stage names (no TensorFlow)."""

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
    ("Prefetch.ParallelMapV2/parallelism", "Prefetch.ParallelMapV2/parallelism"),
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
