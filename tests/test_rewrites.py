"""The rewrite passes (C++, `rewrites/`), on hand-built graphs and graphs of
real datasets, through `intune_tf.rewrites` (the IntuneRewriteGraph op) and
through TF's own RewriteDataset op (Grappler, as the root runs them)."""

import copy

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import dataset_options_pb2
from tensorflow.core.framework import graph_pb2
from tensorflow.core.framework import node_def_pb2
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.data.ops import dataset_ops

from intune_tf import rewrites
from intune_tf.agent import warmstart
from intune_tf.ops import loader as _kernels

AUTOTUNE = tf.data.AUTOTUNE
PREFETCH = "PrefetchDataset"
INTERLEAVE = "ParallelInterleaveDatasetV4"
# Where TF's stages hold their knob: a data input counted from the end.
KNOB_INPUT = {"ParallelMapDatasetV2": -1, INTERLEAVE: -1,
              "ParallelBatchDataset": -2, "MapAndBatchDataset": -2,
              PREFETCH: -1}
PER_ELEMENT_OPS = ("InterleaveDataset", "FlatMapDataset", INTERLEAVE)
# Only the pass under test: the others off (make_tunable, strip_roots and
# disable_tf_autotune always run; the cache's pass is test_cache_point's).
ONLY_ALWAYS = dict(insert_prefetch=False, inner_stats=True, cache=False)


# Reading graphs.

def _serialized(variant) -> graph_pb2.GraphDef:
  return graph_pb2.GraphDef.FromString(tf.raw_ops.DatasetToGraphV2(
      input_dataset=variant, external_state_policy=1,
      strip_device_assignment=True).numpy())


def _graph(ds) -> graph_pb2.GraphDef:
  return _serialized(ds._variant_tensor)  # noqa: SLF001


def _nodes(graph_def):
  return {n.name: n for n in graph_def.node}


def _name(reference):
  return reference.lstrip("^").split(":")[0]


def _data_inputs(node):
  return [r for r in node.input if not r.startswith("^")]


def _const(graph_def, reference):
  tensor = _nodes(graph_def)[_name(reference)].attr["value"].tensor
  return (tensor.int64_val or tensor.int_val)[0]


def _knob_values(graph_def):
  """{op: value of its knob input} of the graph's stages."""
  return {n.op: _const(graph_def, _data_inputs(n)[KNOB_INPUT[n.op]])
          for n in graph_def.node if n.op in KNOB_INPUT}


def _one(graph_def, op):
  (node,) = [n for n in graph_def.node if n.op == op]
  return node


def _consumers(graph_def, name):
  return [n for n in graph_def.node
          if name in [_name(r) for r in _data_inputs(n)]]


def _function(graph_def, name):
  return {f.signature.name: f for f in graph_def.library.function}[name]


def _returned(function):
  (ret,) = function.ret.values()
  return _nodes_of(function)[_name(ret)]


def _nodes_of(function):
  return {n.name: n for n in function.node_def}


# Pipelines.

def _elements(ds):
  return [np.asarray(x).tolist() for x in ds.as_numpy_iterator()]


def _fixed():
  return tf.data.Dataset.range(100).map(
      lambda x: x + 1, num_parallel_calls=3).batch(
          4, num_parallel_calls=2).prefetch(5)


def _interleaved():
  return tf.data.Dataset.range(4).interleave(
      lambda x: tf.data.Dataset.range(x).map(lambda y: y + 1),
      cycle_length=2, num_parallel_calls=2).map(
          lambda x: x * 2, num_parallel_calls=3).prefetch(5)


def _lines(x):
  return tf.data.Dataset.from_tensors(tf.strings.as_string(x)).repeat(5)


def _records():
  return tf.data.Dataset.range(4).interleave(
      _lines, cycle_length=2, num_parallel_calls=2).map(
          lambda x: x, num_parallel_calls=AUTOTUNE)


def _with_options():
  options = tf.data.Options()
  options.autotune.enabled = True
  return _interleaved().with_options(options)


PIPELINES = [_fixed, _interleaved, _records, _with_options]


# Grappler's additions (tensorflow/core/data/rewrite_utils.cc): a "Sink"
# Identity on the output and a "FakeSink<i>" Identity on every function's
# outputs, to which the ret then points.

def _add_sinks(graph_def):
  result = copy.deepcopy(graph_def)
  retval = _one(result, "_Retval")
  sink = result.node.add(name="Sink", op="Identity", input=[retval.input[0]])
  sink.attr["T"].type = types_pb2.DT_VARIANT
  for function in result.library.function:
    for i, output in enumerate(function.signature.output_arg):
      fake = function.node_def.add(name=f"FakeSink{i}", op="Identity",
                                   input=[function.ret[output.name]])
      fake.attr["T"].type = output.type
      function.ret[output.name] = f"FakeSink{i}:output:0"
  return result


def _remove_fake_sinks(graph_def):
  """RemoveFakeSinks: a ret at an Identity goes to the Identity's input."""
  result = copy.deepcopy(graph_def)
  for function in result.library.function:
    identities = {n.name: n.input[0] for n in function.node_def
                  if n.op == "Identity" and len(n.input) == 1}
    for key, ret in function.ret.items():
      if _name(ret) in identities:
        function.ret[key] = identities[_name(ret)]
  return result


# make_tunable

@pytest.mark.parametrize("stage,op,value", [
    (lambda ds: ds.map(lambda x: x, num_parallel_calls=4),
     "ParallelMapDatasetV2", 4),
    (lambda ds: ds.batch(2, num_parallel_calls=5), "ParallelBatchDataset", 5),
    (lambda ds: ds.prefetch(6), PREFETCH, 6),
    (lambda ds: ds.interleave(tf.data.Dataset.range, cycle_length=3,
                              num_parallel_calls=3), INTERLEAVE, 3),
    (lambda ds: ds.apply(tf.data.experimental.map_and_batch(
        lambda x: x, 2, num_parallel_calls=7)), "MapAndBatchDataset", 7),
])
def test_include_fixed_makes_every_stage_a_knob(stage, op, value):
  graph = _graph(stage(tf.data.Dataset.range(8)))
  assert _knob_values(graph) == {op: value}
  kept, fixed = rewrites.rewrite_graph(graph, **ONLY_ALWAYS)
  assert _knob_values(kept) == {op: value} and fixed == {}
  tuned, fixed = rewrites.rewrite_graph(graph, include_fixed=True,
                                        **ONLY_ALWAYS)
  assert _knob_values(tuned) == {op: AUTOTUNE}
  assert fixed == {_one(graph, op).name: value}


def test_autotune_prefetch_leaves_the_legacy_autotuner():
  graph, fixed = rewrites.rewrite_graph(_graph(
      tf.data.Dataset.range(4).prefetch(AUTOTUNE)), **ONLY_ALWAYS)
  prefetch = _one(graph, PREFETCH)
  assert prefetch.attr["legacy_autotune"].b is False
  # It starts at one element, as TF's legacy autotuner does, not at 0.
  assert prefetch.attr["buffer_size_min"].i == 1
  assert fixed == {}


def test_fixed_stages_stay_unless_asked():
  graph = _graph(_fixed())
  same, fixed = rewrites.rewrite_graph(graph, **ONLY_ALWAYS)
  assert same == graph and fixed == {}
  tuned, fixed = rewrites.rewrite_graph(graph, include_fixed=True,
                                        **ONLY_ALWAYS)
  assert set(_knob_values(tuned).values()) == {AUTOTUNE}
  assert sorted(fixed.values()) == [2, 3, 5]
  # Fixed prefetches are knobs again, on the new model.
  assert _one(tuned, PREFETCH).attr["legacy_autotune"].b is False


def test_prefetch_of_zero_stays():
  graph = _graph(tf.data.Dataset.range(4).prefetch(0))
  tuned, fixed = rewrites.rewrite_graph(graph, include_fixed=True,
                                        **ONLY_ALWAYS)
  assert tuned == graph and fixed == {}


def test_shared_const_is_not_changed_in_place():
  graph = _graph(_fixed())
  pmap = _one(graph, "ParallelMapDatasetV2")
  pbatch = _one(graph, "ParallelBatchDataset")
  # The batch reads its parallelism from the map's Const (shared).
  shared = pmap.input[-1]
  pbatch.input[len(pbatch.input) - 2] = shared
  tuned, _ = rewrites.rewrite_graph(graph, include_fixed=True, **ONLY_ALWAYS)
  assert _const(tuned, shared) == _const(graph, shared) == 3
  assert set(_knob_values(tuned).values()) == {AUTOTUNE}


# All passes

@pytest.mark.parametrize("make", PIPELINES)
def test_passes_are_idempotent_and_leave_the_input_alone(make):
  graph = _graph(make())
  before = copy.deepcopy(graph)
  once = rewrites.run_passes(graph, include_fixed=True, interleave_buffer=16)
  assert graph == before
  again = rewrites.run_passes(once.graph_def, include_fixed=True,
                              interleave_buffer=16)
  assert again.graph_def == once.graph_def
  assert again.fixed == {} and again.skipped == [] and once.skipped == []
  assert not again.structure_changed


@pytest.mark.parametrize("make", PIPELINES)
def test_passes_under_grappler_sinks_match_the_plain_graph(make):
  # What the root's optimizer sees: the same graph with Sink and FakeSinks.
  graph = _graph(make())
  plain = rewrites.run_passes(graph, include_fixed=True, interleave_buffer=16)
  sunk = rewrites.run_passes(_add_sinks(graph), include_fixed=True,
                             interleave_buffer=16)
  assert sunk.fingerprint == plain.fingerprint
  assert sunk.fixed == plain.fixed and sunk.skipped == []
  assert sunk.structure_changed == plain.structure_changed
  # The Sink reads what the _Retval reads.
  assert (_nodes(sunk.graph_def)["Sink"].input[0] ==
          _one(sunk.graph_def, "_Retval").input[0])
  # Once Grappler's RemoveFakeSinks has run, every function returns what it
  # returns without the sinks.
  unsunk = _remove_fake_sinks(sunk.graph_def)
  for function in plain.graph_def.library.function:
    assert (_function(unsunk, function.signature.name).ret ==
            function.ret)


# insert_prefetch

def test_insert_prefetch_after_parallel_stages_without_one():
  ds = tf.data.Dataset.range(10).map(
      lambda x: x, num_parallel_calls=AUTOTUNE).map(lambda x: x + 1)
  result = rewrites.run_passes(_graph(ds), insert_prefetch=True,
                               inner_stats=True)
  graph = result.graph_def
  pmap = _one(graph, "ParallelMapDatasetV2")
  (prefetch,) = _consumers(graph, pmap.name)
  assert prefetch.op == PREFETCH and result.structure_changed
  assert _const(graph, prefetch.input[1]) == AUTOTUNE
  assert prefetch.attr["legacy_autotune"].b is False
  assert prefetch.attr["buffer_size_min"].i == 1
  assert prefetch.attr["output_types"] == pmap.attr["output_types"]
  assert prefetch.attr["output_shapes"] == pmap.attr["output_shapes"]


def test_insert_prefetch_rewires_the_retval():
  ds = tf.data.Dataset.range(10).map(lambda x: x, num_parallel_calls=2)
  graph = rewrites.run_passes(_graph(ds), insert_prefetch=True,
                              inner_stats=True, cache=False).graph_def
  retval = _one(graph, "_Retval")
  assert _nodes(graph)[_name(retval.input[0])].op == PREFETCH


def test_no_second_prefetch():
  graph = _graph(tf.data.Dataset.range(3).map(
      lambda x: x, num_parallel_calls=2).prefetch(1))
  result = rewrites.run_passes(graph, insert_prefetch=True,
                               inner_stats=True, cache=False)
  assert result.graph_def == graph and not result.structure_changed


# untrack_inner

@pytest.mark.parametrize("sinks", [False, True], ids=["plain", "fake_sinks"])
@pytest.mark.parametrize("transform", [
    lambda ds, f: ds.interleave(f, cycle_length=2),
    lambda ds, f: ds.interleave(f, cycle_length=2, num_parallel_calls=2),
    lambda ds, f: ds.flat_map(f),
], ids=["interleave", "parallel_interleave", "flat_map"])
def test_untrack_inner_wraps_the_per_element_dataset(transform, sinks):
  ds = transform(tf.data.Dataset.range(3),
                 lambda x: tf.data.Dataset.range(x).repeat(2))
  original = _graph(ds)
  graph = _add_sinks(original) if sinks else original
  result = rewrites.run_passes(graph, insert_prefetch=False)
  # The wrapper is transparent to iterator checkpoints.
  assert not result.structure_changed
  (outer,) = [n for n in result.graph_def.node if n.op in PER_ELEMENT_OPS]
  name = outer.attr["f"].func.name
  wrapper = _returned(_function(_remove_fake_sinks(result.graph_def), name))
  assert wrapper.op == rewrites.UNTRACKED_OP
  assert wrapper.attr["output_types"] == outer.attr["output_types"]
  assert wrapper.attr["output_shapes"] == outer.attr["output_shapes"]
  # What the function returned before is the wrapper's input.
  assert _name(wrapper.input[0]) == _returned(_function(original, name)).name
  if sinks:
    # The wrapper goes before the FakeSink, which the ret still points at.
    function = _function(result.graph_def, name)
    assert _returned(function).name == "FakeSink0"
    assert _name(_returned(function).input[0]) == wrapper.name
  again = rewrites.run_passes(result.graph_def, insert_prefetch=False)
  assert again.graph_def == result.graph_def and not again.structure_changed


@pytest.mark.parametrize("inner", [
    lambda x: tf.data.Dataset.range(x).prefetch(1),
    lambda x: tf.data.Dataset.range(x).map(lambda y: y,
                                           num_parallel_calls=AUTOTUNE),
    # A buffering stage one function further down.
    lambda x: tf.data.Dataset.range(x).interleave(
        lambda y: tf.data.Dataset.range(y).prefetch(2), cycle_length=1),
])
def test_untrack_inner_keeps_functions_that_buffer(inner):
  graph = _graph(tf.data.Dataset.range(3).interleave(inner, cycle_length=2))
  result = rewrites.run_passes(graph, insert_prefetch=False, cache=False)
  assert result.graph_def == graph and not result.structure_changed


def test_untrack_inner_can_be_off():
  graph = _graph(tf.data.Dataset.range(3).flat_map(tf.data.Dataset.range))
  result = rewrites.run_passes(graph, **ONLY_ALWAYS)
  assert result.graph_def == graph and not result.structure_changed


# raise_interleave_buffers

def _interleave_buffer(graph_def):
  """buffer_output_elements of the graph's one ParallelInterleaveDatasetV4."""
  return _const(graph_def, _data_inputs(_one(graph_def, INTERLEAVE))[-3])


# Only untrack_inner and the raise: the raise needs the wrapper.
ONLY_RAISE = dict(insert_prefetch=False, inner_stats=False, cache=False)


def _raised(graph_def):
  """(records per input, workers, buffer group of the function's wrapper) of
  the graph's bounded interleave, or None if it is not bounded."""
  node = _one(graph_def, INTERLEAVE)
  releases = [n for n in graph_def.node if n.op == "IntuneBufferReleaseDataset"]
  if not releases:
    return None
  (release,) = releases
  assert release.input[0] == node.name
  # Every consumer of the interleave now reads the release op.
  assert _consumers(graph_def, node.name) == [release]
  wrapper = _returned(_function(graph_def, node.attr["f"].func.name))
  assert wrapper.op == "IntuneUntrackedDataset"
  group = release.attr["buffer_group"].s
  assert wrapper.attr["buffer_group"].s == group == node.name.encode()
  records = release.attr["records_per_input"].i
  assert _interleave_buffer(graph_def) == records
  return records, _const(graph_def, _data_inputs(node)[-1]), group


@pytest.mark.parametrize("inner,block,calls,expected", [
    # Records (scalar strings), block 1: TF's 2 * 1 + 1 = 3 is raised to 16;
    # the interleave runs cycle_length (2) workers.
    (_lines, 1, 2, 16),
    (_lines, 1, AUTOTUNE, 16),
    # Block 4: TF's 2 * 4 + 1 = 9, raised to 16.
    (_lines, 4, 2, 16),
    # Block 8: TF's 2 * 8 + 1 = 17 is already deeper; left alone.
    (_lines, 8, 2, None),
    # Fewer workers than the cycle length: a held input could take the thread
    # another input needs; TF's buffers stay.
    (_lines, 1, 1, None),
    # Elements that are not records (vectors of 1,000) keep TF's 3.
    (lambda x: tf.data.Dataset.from_tensors(tf.fill([1000], x)).repeat(5),
     1, 2, None),
])
def test_raise_interleave_buffers(inner, block, calls, expected):
  ds = tf.data.Dataset.range(4).interleave(
      inner, cycle_length=2, block_length=block, num_parallel_calls=calls)
  before = _graph(ds)
  assert _interleave_buffer(before) == 2 * block + 1  # TF's own default
  graph, _ = rewrites.rewrite_graph(before, interleave_buffer=16,
                                    **ONLY_RAISE)
  raised = _raised(graph)
  if expected is None:
    assert raised is None
    assert _interleave_buffer(graph) == 2 * block + 1
  else:
    assert raised[:2] == (expected, 2)
  assert rewrites.rewrite_graph(graph, interleave_buffer=16,
                                **ONLY_RAISE)[0] == graph
  # The original graph is not modified.
  assert _interleave_buffer(before) == 2 * block + 1
  # None (and 0) keep TF's, and so does an interleave whose function is not
  # wrapped (untrack_inner off): the guard could not bound its buffers.
  for keep in (dict(interleave_buffer=None, **ONLY_RAISE),
               dict(interleave_buffer=0, **ONLY_RAISE),
               dict(interleave_buffer=16, **ONLY_ALWAYS)):
    graph = rewrites.rewrite_graph(before, **keep)[0]
    assert _interleave_buffer(graph) == 2 * block + 1
    assert _raised(graph) is None


# disable_tf_autotune

def test_tf_autotune_is_switched_off_in_the_options():
  graph, _ = rewrites.rewrite_graph(_graph(_with_options()), **ONLY_ALWAYS)
  node = _one(graph, "OptionsDataset")
  parsed = dataset_options_pb2.Options.FromString(
      node.attr["serialized_options"].s)
  assert parsed.autotune_options.enabled is False
  assert parsed.optimization_options.inject_prefetch is False


# strip_roots

def _add_roots(graph_def, count, op=rewrites.ROOT_OP):
  """`count` nested `op` nodes between the output and _Retval."""
  result = copy.deepcopy(graph_def)
  retval = _one(result, "_Retval")
  source = retval.input[0]
  for i in range(count):
    root = result.node.add(name=f"root_{i}", op=op, input=[source])
    root.attr["output_types"].CopyFrom(
        _nodes(result)[_name(source)].attr["output_types"])
    source = f"root_{i}"
  retval.input[0] = source
  return result


@pytest.mark.parametrize("op", [rewrites.ROOT_OP, rewrites.LEGACY_ROOT_OP,
                                rewrites.OPTIONS_OP])
@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize("make", PIPELINES)
def test_strip_roots_gives_the_graph_without_them(make, count, op):
  graph = _graph(make())
  stripped = rewrites.run_passes(_add_roots(graph, count, op), **ONLY_ALWAYS)
  # Both ops are transparent to iterator checkpoints: no structure change.
  assert not stripped.structure_changed and stripped.skipped == []
  assert stripped.graph_def == rewrites.run_passes(
      graph, **ONLY_ALWAYS).graph_def


def _node(name, op, *inputs):
  return node_def_pb2.NodeDef(name=name, op=op, input=list(inputs))


def test_strip_roots_rewires_every_consumer():
  # Two branches under roots, zipped, under two more roots; a control input
  # on a root and Grappler's Sink on top.
  graph = graph_pb2.GraphDef(node=[
      _node("a", "RangeDataset"),
      _node("b", "RangeDataset"),
      _node("root_a", rewrites.ROOT_OP, "a"),
      _node("root_b", rewrites.ROOT_OP, "b:0"),
      _node("zip", "ZipDataset", "root_a", "root_b:0", "^root_a"),
      _node("root_1", rewrites.ROOT_OP, "zip"),
      _node("root_2", rewrites.ROOT_OP, "root_1"),
      _node("dataset", "_Retval", "root_2"),
      _node("Sink", "Identity", "root_2:0"),
  ])
  result = rewrites.run_passes(graph, **ONLY_ALWAYS)
  assert not result.structure_changed and result.skipped == []
  nodes = _nodes(result.graph_def)
  assert sorted(nodes) == ["Sink", "a", "b", "dataset", "zip"]
  assert list(nodes["zip"].input) == ["a", "b:0", "^a"]
  assert list(nodes["dataset"].input) == ["zip"]
  assert list(nodes["Sink"].input) == ["zip"]
  # The fingerprint is of the graph as given, roots included, Sink not.
  assert result.fingerprint != rewrites.fingerprint(result.graph_def)
  without_sink = copy.deepcopy(graph)
  del without_sink.node[-1]
  assert result.fingerprint == rewrites.fingerprint(without_sink)


@pytest.mark.parametrize("bad", [
    [_node("root", rewrites.ROOT_OP)],
    [_node("root", rewrites.ROOT_OP, "^a"), _node("a", "RangeDataset")],
    [_node("r1", rewrites.ROOT_OP, "r2"), _node("r2", rewrites.ROOT_OP, "r1")],
], ids=["no_input", "control_input", "cycle"])
def test_a_pass_that_fails_is_skipped_and_the_others_run(bad):
  options = dataset_options_pb2.Options()
  options.autotune_options.enabled = True
  graph = graph_pb2.GraphDef(node=bad + [
      _node("options", "OptionsDataset", bad[0].name),
      _node("dataset", "_Retval", "options")])
  graph.node[-2].attr["serialized_options"].s = options.SerializeToString()
  result = rewrites.run_passes(graph)
  assert [s.split(":")[0] for s in result.skipped] == ["strip_roots"]
  assert not result.structure_changed
  # The roots are still there; the options pass still ran.
  assert [n.op for n in result.graph_def.node].count(rewrites.ROOT_OP) == [
      n.op for n in bad].count(rewrites.ROOT_OP)
  parsed = dataset_options_pb2.Options.FromString(
      _nodes(result.graph_def)["options"].attr["serialized_options"].s)
  assert parsed.autotune_options.enabled is False


def test_bad_graphs_for_other_passes_are_skipped():
  graph = graph_pb2.GraphDef(node=[
      _node("range", "RangeDataset"),
      # A parallel map without output_types, a V4 interleave of records with
      # too few inputs, options that do not parse.
      _node("map", "ParallelMapDatasetV2", "range", "n"),
      _node("n", "Const"),
      _node("interleave", INTERLEAVE, "map"),
      _node("options", "OptionsDataset", "interleave"),
      _node("dataset", "_Retval", "options"),
  ])
  _nodes(graph)["interleave"].attr["output_shapes"].list.shape.add()
  _nodes(graph)["options"].attr["serialized_options"].s = b"\xff"
  before = copy.deepcopy(graph)
  result = rewrites.run_passes(graph, insert_prefetch=True,
                               interleave_buffer=16)
  assert [s.split(":")[0] for s in result.skipped] == [
      "insert_cache", "insert_prefetch", "raise_interleave_buffers",
      "disable_tf_autotune"]
  assert result.graph_def == before


def test_an_unusable_graph_is_an_error():
  graph = graph_pb2.GraphDef(node=[_node("a", "RangeDataset"),
                                   _node("a", "RangeDataset")])
  with pytest.raises(tf.errors.InvalidArgumentError, match="two nodes"):
    rewrites.run_passes(graph)


@pytest.mark.parametrize("graph_def,message", [
    ([b"", b""], "must be a scalar"),
    (b"\xff\xff", "not a GraphDef"),
])
def test_the_op_checks_its_input(graph_def, message):
  with pytest.raises(tf.errors.InvalidArgumentError, match=message):
    _kernels.ops().intune_rewrite_graph(graph_def=graph_def)


# The fingerprint

def _files(path):
  ds = tf.data.Dataset.from_tensor_slices([path]).repeat()
  return ds.map(tf.strings.length, num_parallel_calls=AUTOTUNE)


def test_fingerprint_sees_structure_not_constants():
  a = rewrites.fingerprint(_graph(_files("/data/day1")))
  b = rewrites.fingerprint(_graph(_files("/data/day2")))
  c = rewrites.fingerprint(_graph(_files("/x").batch(2)))
  d = rewrites.fingerprint(_graph(
      tf.data.Dataset.from_tensor_slices(["/x"]).repeat().map(
          tf.strings.length)))
  assert a == b and len({a, c, d}) == 3
  assert len(a) == 16 and int(a, 16) >= 0
  assert warmstart.graph_fingerprint(_graph(_files("/y"))) == a


@pytest.mark.parametrize("make", PIPELINES)
def test_fingerprint_is_of_the_graph_before_the_passes(make):
  graph = _graph(make())
  result = rewrites.run_passes(graph, include_fixed=True, interleave_buffer=16)
  assert result.fingerprint == rewrites.fingerprint(graph)
  assert result.fingerprint == rewrites.fingerprint(_graph(make()))
  assert result.fingerprint == rewrites.fingerprint(_add_sinks(graph))
  if result.structure_changed:
    assert rewrites.fingerprint(result.graph_def) != result.fingerprint


# What the root gives data::RewriteDataset

@pytest.mark.parametrize("options", [
    {},
    dict(include_fixed=True, insert_prefetch=True, inner_stats=True,
         interleave_buffer=4),
])
def test_rewriter_config_runs_only_the_passes_with_the_options(options):
  config = rewrites.rewriter_config(**options)
  assert list(config.optimizers) == [rewrites.OPTIMIZER_NAME]
  assert config.meta_optimizer_iterations == (
      rewriter_config_pb2.RewriterConfig.ONE)
  assert config.fail_on_optimizer_errors is False
  assert config.min_graph_nodes == -1
  (custom,) = config.custom_optimizers
  assert custom.name == rewrites.OPTIMIZER_NAME
  parameters = custom.parameter_map
  # The defaults are IntuneOptions()'s (tests/test_option_fields.py).
  assert parameters["include_fixed"].b == options.get("include_fixed", False)
  assert parameters["insert_prefetch"].b == options.get("insert_prefetch",
                                                         False)
  assert parameters["inner_stats"].b == options.get("inner_stats", False)
  assert parameters["interleave_buffer"].i == options.get(
      "interleave_buffer", 16)


@pytest.mark.parametrize("make", PIPELINES)
def test_tf_rewrite_dataset_runs_the_passes(make):
  # TF's RewriteDataset op calls data::RewriteDataset with our optimizer by
  # name (default options): Grappler, Sink and FakeSinks as in the root.
  _kernels.ops()  # registers the optimizer
  ds = make()
  variant = tf.raw_ops.RewriteDataset(
      input_dataset=ds._variant_tensor,  # noqa: SLF001
      rewrite_name=rewrites.OPTIMIZER_NAME,
      **ds._flat_structure)  # noqa: SLF001
  rewritten = dataset_ops._VariantDataset(  # noqa: SLF001
      variant, ds.element_spec)
  assert _elements(rewritten) == _elements(ds)
  graph = _serialized(variant)
  expected = rewrites.run_passes(_graph(ds)).graph_def
  # Constants aside: raise_interleave_buffers leaves the interleave's old
  # buffer sizes in the graph, unused, and serializing a dataset drops them.
  assert sorted(n.op for n in graph.node if n.op != "Const") == sorted(
      n.op for n in expected.node if n.op != "Const")
  for function in expected.library.function:
    assert (_returned(_function(graph, function.signature.name)).op ==
            _returned(function).op)
