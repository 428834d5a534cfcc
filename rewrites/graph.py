"""Helpers over a serialized dataset graph (`GraphDef`)."""

from __future__ import annotations

from tensorflow.core.framework import attr_value_pb2
from tensorflow.core.framework import graph_pb2
from tensorflow.core.framework import node_def_pb2
from tensorflow.core.framework import tensor_pb2
from tensorflow.core.framework import tensor_shape_pb2
from tensorflow.core.framework import types_pb2

AUTOTUNE = -1
PREFETCH = "PrefetchDataset"

# Stages whose parallelism or buffer size can be a knob, and which of their
# data inputs (counted from the end, control inputs excluded) holds it:
#   ParallelMapDatasetV2(input, captured..., num_parallel_calls)
#   ParallelInterleaveDatasetV2/V3/V4(input, captured..., cycle_length,
#       block_length, [buffer_output_elements, prefetch_input_elements,]
#       num_parallel_calls)
#   ParallelBatchDataset(input, batch_size, num_parallel_calls, drop_remainder)
#   MapAndBatchDataset(input, captured..., batch_size, num_parallel_calls,
#       drop_remainder)
#   PrefetchDataset(input, buffer_size)
KNOB_INPUT = {
    "ParallelMapDatasetV2": -1,
    "ParallelInterleaveDatasetV2": -1,
    "ParallelInterleaveDatasetV3": -1,
    "ParallelInterleaveDatasetV4": -1,
    "ParallelBatchDataset": -2,
    "MapAndBatchDataset": -2,
    PREFETCH: -1,
}
PARALLEL_STAGES = tuple(op for op in KNOB_INPUT if op != PREFETCH)


def copy(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
  result = graph_pb2.GraphDef()
  result.CopyFrom(graph_def)
  return result


def nodes_by_name(graph_def: graph_pb2.GraphDef) -> dict[str, node_def_pb2.NodeDef]:
  return {n.name: n for n in graph_def.node}


def data_inputs(node: node_def_pb2.NodeDef) -> list[int]:
  """Indices into `node.input` of the data (non-control) inputs."""
  return [i for i, name in enumerate(node.input) if not name.startswith("^")]


def input_name(reference: str) -> str:
  """'node:0' -> 'node'; '^node' -> 'node'."""
  return reference.lstrip("^").split(":")[0]


def knob_input_index(node: node_def_pb2.NodeDef) -> int | None:
  """Index into `node.input` of the knob's input, or None if not a stage."""
  offset = KNOB_INPUT.get(node.op)
  if offset is None:
    return None
  indices = data_inputs(node)
  return indices[offset] if len(indices) >= -offset + 1 else None


def const_int(node: node_def_pb2.NodeDef) -> int | None:
  """The scalar integer held by a Const node, or None."""
  if node.op != "Const" or "value" not in node.attr:
    return None
  tensor = node.attr["value"].tensor
  if tensor.tensor_shape.dim:
    return None
  if tensor.int64_val:
    return int(tensor.int64_val[0])
  if tensor.int_val:
    return int(tensor.int_val[0])
  if tensor.tensor_content:
    return int.from_bytes(tensor.tensor_content, "little", signed=True)
  return 0


def make_const(name: str, value: int) -> node_def_pb2.NodeDef:
  """A scalar int64 Const node."""
  node = node_def_pb2.NodeDef(name=name, op="Const")
  node.attr["dtype"].type = types_pb2.DT_INT64
  node.attr["value"].tensor.CopyFrom(tensor_pb2.TensorProto(
      dtype=types_pb2.DT_INT64,
      tensor_shape=tensor_shape_pb2.TensorShapeProto(), int64_val=[value]))
  return node


def unique_name(graph_def: graph_pb2.GraphDef, base: str) -> str:
  names = {n.name for n in graph_def.node}
  candidate, i = base, 0
  while candidate in names:
    i += 1
    candidate = f"{base}_{i}"
  return candidate


def set_bool(node: node_def_pb2.NodeDef, attr: str, value: bool) -> None:
  node.attr[attr].CopyFrom(attr_value_pb2.AttrValue(b=value))
