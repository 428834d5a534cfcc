"""Pass: switch off TF's own autotuner in the options the graph carries."""

from __future__ import annotations

from tensorflow.core.framework import dataset_options_pb2
from tensorflow.core.framework import graph_pb2

from intune_tf.rewrites import graph as g


def disable_tf_autotune(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
  """Sets, in every `OptionsDataset`'s `serialized_options`:

  - `autotune.enabled = False`: no `ModelDataset`, no TF optimization loop,
    and so no static `autotune_buffer_sizes` rewrite (it runs only with
    autotune on);
  - `optimization_options.inject_prefetch = False`.

  The InTune root op sets the same options on its own dataset, so a graph
  without `OptionsDataset` needs nothing here.

  Args:
    graph_def: the dataset graph; not modified.

  Returns:
    The new graph.
  """
  result = g.copy(graph_def)
  for node in result.node:
    if node.op != "OptionsDataset" or "serialized_options" not in node.attr:
      continue
    options = dataset_options_pb2.Options.FromString(
        node.attr["serialized_options"].s)
    options.autotune_options.enabled = False
    options.optimization_options.inject_prefetch = False
    node.attr["serialized_options"].s = options.SerializeToString()
  return result
