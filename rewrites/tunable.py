"""Pass: make pipeline stages tunable knobs."""

from __future__ import annotations

from tensorflow.core.framework import graph_pb2

from intune_tf.rewrites import graph as g


def make_tunable(graph_def: graph_pb2.GraphDef, *, include_fixed: bool = False
                ) -> tuple[graph_pb2.GraphDef, dict[str, int]]:
  """Makes AUTOTUNE stages (and, if asked, fixed ones) register as knobs.

  - A `PrefetchDataset` on AUTOTUNE gets `legacy_autotune=False`: with the
    legacy autotuner it grows its buffer by itself and (TF 2.16) does not
    register a tunable `buffer_size`.
  - With `include_fixed`, stages of `graph.KNOB_INPUT` with a fixed positive
    value get a new AUTOTUNE Const (a Const shared with other nodes is never
    changed in place). `prefetch(0)` stays as it is.
  - `deterministic` attributes are never touched, so ordering is kept.
  - Functions in the graph's library (for example an interleave's inner
    datasets) are left alone: their stages run per input element, and their
    knobs would come and go with it.

  Args:
    graph_def: the dataset graph; not modified.
    include_fixed: also turn fixed stages into knobs. Default False.

  Returns:
    The new graph, and the user's fixed values by node name.
  """
  result = g.copy(graph_def)
  by_name = g.nodes_by_name(result)
  fixed = {}
  for node in list(result.node):
    index = g.knob_input_index(node)
    if index is None:
      continue
    const = by_name.get(g.input_name(node.input[index]))
    value = g.const_int(const) if const is not None else None
    if value is None:
      continue
    if value != g.AUTOTUNE:
      if not include_fixed or value <= 0:
        continue
      new = g.make_const(g.unique_name(result, f"{node.name}/intune_autotune"),
                         g.AUTOTUNE)
      result.node.append(new)
      node.input[index] = new.name
      fixed[node.name] = value
    if node.op == g.PREFETCH:
      g.set_bool(node, "legacy_autotune", False)
  return result, fixed
