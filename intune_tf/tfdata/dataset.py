"""The InTune dataset ops, as Python datasets.

- `declare` puts an `IntuneOptionsDataset` above a dataset: the option, in the
  graph (it travels with the dataset through tf.function arguments, variants
  and tf.data service).
- `apply_root` puts the root (`IntuneRootDataset`) on top of a dataset whose
  iterator is being made. The root rewrites its input inside the kernel, by
  reference, and tunes it; with nothing asking for InTune below, it returns
  its input.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.framework import ops as tf_ops

from intune_tf import option_fields
from intune_tf import options as options_lib
from intune_tf.live import registry
from intune_tf.live import tuner as tuner_lib
from intune_tf.ops import loader as _kernels


def _settings(value: Any) -> dict[str, Any]:
  """The op attributes of an `experimental_intune` value."""
  options = options_lib.coerce(value)
  if options is None:
    return {"enabled": False}
  try:
    # Here, where the options meet a dataset: the registry as it is now,
    # whatever was imported when the options were made.
    registry.check_name(options.policy)
  except ValueError as e:
    raise ValueError(f"IntuneOptions.policy: {e} A policy of your own must "
                     "be registered (intune_tf.register_policy) before its "
                     "option is set on a dataset.") from None
  values = {field.name: getattr(options, field.name)
            for field in option_fields.FIELDS}
  return {"tag": options.to_json(), "enabled": True,
          **option_fields.graph_attrs(values)}


class IntuneOptionsDataset(dataset_ops.UnaryUnchangedStructureDataset):
  """Carries an `experimental_intune` value in the dataset's graph."""

  def __init__(self, input_dataset: tf.data.Dataset, value: Any):
    self._input_dataset = input_dataset
    self.intune_value = value
    variant = _kernels.ops().intune_options_dataset(
        input_dataset._variant_tensor,  # noqa: SLF001
        **_settings(value), **self._flat_structure)
    super().__init__(input_dataset, variant)


class IntuneRootDataset(dataset_ops.UnaryUnchangedStructureDataset):
  """The root (the `IntuneRootDataset` op): one tuning session per iterator.

  The kernel takes the settings from the `IntuneOptionsDataset` in force in
  the graph below it; with none (for example a pipeline that reaches its
  declaration only through a function, as `prefetch_to_device` does, which
  makes that pipeline's own iterator, and root, inside), or with the option
  off, it returns its input: exactly one root per pipeline.
  """

  def __init__(self, input_dataset: tf.data.Dataset,
               variant: tf.Tensor | None = None):
    """Puts a root on `input_dataset`.

    Args:
      input_dataset: the pipeline to rewrite and tune.
      variant: a root made before on the same `input_dataset`, wrapped again
        (default None: a new root).
    """
    self._input_dataset = input_dataset
    if variant is None:
      variant = _kernels.ops().intune_root_dataset(
          input_dataset._variant_tensor,  # noqa: SLF001
          find_settings=True, **self._flat_structure)
    super().__init__(input_dataset, variant)


def declare(dataset: tf.data.Dataset, value: Any) -> tf.data.Dataset:
  """`dataset` with its `experimental_intune` value carried in the graph."""
  return IntuneOptionsDataset(dataset, value)


_CACHE_ATTR = "_intune_root"


def apply_root(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """`dataset` under an InTune root, for an iterator about to be made.

  In eager mode the root is made once per dataset object (as TF finalizes a
  dataset once, in its kernel), so that a new iterator each epoch costs no new
  rewrite. The dataset keeps only the root's variant, never the Python root,
  which refers back to it: with no reference cycle, the rewritten pipeline and
  what its rewrite made (such as the seed generator of an unseeded shuffle)
  go when the dataset does, not at the next garbage collection, so a copy of
  the pipeline made from its graph then draws its own seeds, as in plain TF.
  """
  eager = isinstance(dataset._variant_tensor,  # noqa: SLF001
                     tf_ops.EagerTensor)
  if eager:
    cached = getattr(dataset, _CACHE_ATTR, None)
    if cached is not None:
      return IntuneRootDataset(dataset, cached)
  tuner_lib.global_tuner().start()
  root = IntuneRootDataset(dataset)
  if eager:
    object.__setattr__(dataset, _CACHE_ATTR,
                       root._variant_tensor)  # noqa: SLF001
  return root
