"""Pass: run the per-element datasets of interleaves without the model."""

from __future__ import annotations

from tensorflow.core.framework import function_pb2
from tensorflow.core.framework import graph_pb2
from tensorflow.core.framework import node_def_pb2

from intune_tf.rewrites import graph as g

UNTRACKED = "IntuneUntrackedDataset"
# Ops that build one dataset per input element with their function `f`.
PER_ELEMENT_OPS = ("InterleaveDataset", "FlatMapDataset",
                   "ParallelInterleaveDataset", "ParallelInterleaveDatasetV2",
                   "ParallelInterleaveDatasetV3", "ParallelInterleaveDatasetV4",
                   "LegacyParallelInterleaveDatasetV2")


def _called_functions(nodes) -> set[str]:
  names = set()
  for node in nodes:
    for attr in node.attr.values():
      if attr.HasField("func"):
        names.add(attr.func.name)
      names.update(f.name for f in attr.list.func)
  return names


def _has_buffering_stage(name: str,
                         library: dict[str, function_pb2.FunctionDef],
                         seen: set[str] | None = None) -> bool:
  """Whether function `name`, or a function it calls, has a stage that
  holds elements (a knob stage, a prefetch or any parallel dataset)."""
  seen = set() if seen is None else seen
  if name in seen or name not in library:
    return False
  seen.add(name)
  nodes = library[name].node_def
  if any(n.op in g.KNOB_INPUT or n.op.startswith(("Parallel", "Legacy")) or
         "Prefetch" in n.op for n in nodes):
    return True
  return any(_has_buffering_stage(f, library, seen)
             for f in _called_functions(nodes))


def untrack_inner(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
  """Wraps the dataset that each interleave's (or flat_map's) function
  returns in an `IntuneUntrackedDataset`.

  The per-element datasets then run without the autotuning model: their
  iterators (a `TextLineDataset` and the zips, skips and repeats around it,
  one element per row) skip the per-element bookkeeping that the model
  costs, and the wrapper's single node in the model accounts for their
  time. Functions with a stage that holds elements (prefetch, parallel map,
  ...) are left alone, so that the budget guard still sees their buffers.
  Element values and order are unchanged.

  Args:
    graph_def: the dataset graph; not modified.

  Returns:
    The new graph.
  """
  result = g.copy(graph_def)
  library = {f.signature.name: f for f in result.library.function}
  done = set()
  for node in result.node:
    if node.op not in PER_ELEMENT_OPS or "f" not in node.attr:
      continue
    name = node.attr["f"].func.name
    function = library.get(name)
    if (name in done or function is None or
        len(function.signature.output_arg) != 1 or
        _has_buffering_stage(name, library)):
      continue
    done.add(name)
    out = function.signature.output_arg[0].name
    existing = {n.name: n for n in function.node_def}
    returned = existing.get(function.ret[out].split(":")[0])
    if returned is not None and returned.op == UNTRACKED:
      continue
    wrapper_name, i = "intune_untracked", 0
    while wrapper_name in existing:
      i += 1
      wrapper_name = f"intune_untracked_{i}"
    wrapper = node_def_pb2.NodeDef(name=wrapper_name, op=UNTRACKED,
                                   input=[function.ret[out]])
    for attr in ("output_types", "output_shapes"):
      wrapper.attr[attr].CopyFrom(node.attr[attr])
    function.node_def.append(wrapper)
    function.ret[out] = f"{wrapper_name}:handle:0"
  return result
