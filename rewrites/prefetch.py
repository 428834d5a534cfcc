"""Pass: give every parallel stage a prefetch (a memory knob) after it."""

from __future__ import annotations

from tensorflow.core.framework import graph_pb2
from tensorflow.core.framework import node_def_pb2

from intune_tf.rewrites import graph as g


def insert_prefetch(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
  """Adds `PrefetchDataset(AUTOTUNE, legacy_autotune=False)` after each
  parallel stage whose consumers are not all prefetches.

  The prefetch takes the producer's `output_types`/`output_shapes`; every
  consumer (including the graph's `_Retval`) is rewired to it. Element order
  and values are unchanged.

  Args:
    graph_def: the dataset graph; not modified.

  Returns:
    The new graph.
  """
  result = g.copy(graph_def)
  consumers: dict[str, list[tuple[node_def_pb2.NodeDef, int]]] = {}
  for node in result.node:
    for i, ref in enumerate(node.input):
      if not ref.startswith("^"):
        consumers.setdefault(g.input_name(ref), []).append((node, i))
  for producer in list(result.node):
    if producer.op not in g.PARALLEL_STAGES:
      continue
    uses = consumers.get(producer.name, [])
    if not uses or all(c.op == g.PREFETCH for c, _ in uses):
      continue
    buffer = g.make_const(g.unique_name(result, f"{producer.name}/intune_buffer"),
                          g.AUTOTUNE)
    prefetch = node_def_pb2.NodeDef(
        name=g.unique_name(result, f"{producer.name}/intune_prefetch"),
        op=g.PREFETCH, input=[producer.name, buffer.name])
    for attr in ("output_types", "output_shapes"):
      prefetch.attr[attr].CopyFrom(producer.attr[attr])
    g.set_bool(prefetch, "legacy_autotune", False)
    result.node.extend([buffer, prefetch])
    for consumer, i in uses:
      if consumer.op != g.PREFETCH:
        consumer.input[i] = prefetch.name
  return result
