"""Puts InTune on top of a dataset: the root op, which runs the rewrites."""

from __future__ import annotations

import json

from absl import logging
import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.framework import ops as tf_ops

from intune_tf import _kernels
from intune_tf import tuner as tuner_lib
from intune_tf.options import IntuneOptions


class IntuneDataset(dataset_ops.UnaryUnchangedStructureDataset):
  """A dataset whose iterators are tuned live (one session per iterator)."""

  def __init__(self, input_dataset: tf.data.Dataset, options: IntuneOptions):
    self._input_dataset = input_dataset
    self._intune = options
    tag = json.loads(options.to_json())
    tag["fingerprint"] = _fingerprint(input_dataset)
    variant = _kernels.ops().intune_dataset(
        input_dataset._variant_tensor,  # pylint: disable=protected-access
        tag=json.dumps(tag, sort_keys=True),
        ram_budget=options.resolved_ram_budget(),
        max_parallelism=options.resolved_max_cpus(),
        **self._flat_structure)
    super().__init__(input_dataset, variant)


def _fingerprint(dataset: tf.data.Dataset) -> str:
  """The warm-start fingerprint of the dataset graph ("" inside a
  tf.function, where the graph is not available eagerly)."""
  from intune_tf import warmstart  # pylint: disable=g-import-not-at-top
  if not isinstance(dataset._variant_tensor, tf_ops.EagerTensor):  # pylint: disable=protected-access
    return ""
  graph_def = tf.compat.v1.GraphDef()
  try:
    graph_def.ParseFromString(
        dataset._as_serialized_graph(  # pylint: disable=protected-access
            external_state_policy=(
                tf.data.experimental.ExternalStatePolicy.IGNORE)).numpy())
  except (tf.errors.OpError, ValueError, TypeError) as e:
    logging.warning("InTune: no warm start for this dataset: its graph "
                    "cannot be serialized (%s).", e)
    return ""
  return warmstart.graph_fingerprint(graph_def)


def tune(dataset: tf.data.Dataset, options: IntuneOptions) -> tf.data.Dataset:
  """Returns `dataset` under an InTune root, which rewrites its input graph
  (the passes of `rewrites/`) when it makes its dataset."""
  tuner_lib.global_tuner().start()
  return IntuneDataset(dataset, options)
