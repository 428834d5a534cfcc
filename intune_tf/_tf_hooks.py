"""The one place where intune_tf reaches into TensorFlow's private API.

`import intune_tf` adds the `experimental_intune` option to `tf.data.Options`
and makes every iterator creation of a dataset with the option on go through
`intune_tf._root.tune`. The hooks are pinned to the tested TF versions and
`check()` fails loudly when TensorFlow moves them.

- `tf.data.Options.experimental_intune`: a property storing its value in
  `Options._options`, so `merge_options` (used by `with_options`) keeps it.
- `DatasetV2.with_options`: the value does not survive the options proto that
  TF keeps in the graph, so the dataset returned by `with_options` also
  carries it as a Python attribute, found again by walking `_inputs()`.
- `DatasetV2.options`: reports the value found that way.
- `DatasetV2._apply_debug_options`: called by every iterator creation (`for`,
  `iter`, tf.function loops, Keras `fit`); returns the tuned dataset.
"""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.data.ops import options as options_lib
from tensorflow.python.data.util import options as options_base

from intune_tf import options as intune_options

TESTED_TF = ("2.16", "2.21")
_OPTION = "experimental_intune"
_ATTR = "_intune_options"
_installed = False


class HookError(ImportError):
  """TensorFlow moved a private hook that intune_tf relies on."""


def check() -> None:
  """Raises HookError if a hook point is missing from the installed TF."""
  for owner, name in ((dataset_ops.DatasetV2, "_apply_debug_options"),
                      (dataset_ops.DatasetV2, "with_options"),
                      (dataset_ops.DatasetV2, "options"),
                      (dataset_ops.DatasetV2, "_inputs"),
                      (options_base.OptionsBase, "__setattr__")):
    if not callable(getattr(owner, name, None)):
      raise HookError(
          f"intune_tf needs {owner.__name__}.{name} of TensorFlow, which "
          f"TensorFlow {tf.__version__} does not have (tested: "
          f"{', '.join(TESTED_TF)}).")
  if not isinstance(getattr(options_lib.Options(), "_options", None), dict):
    raise HookError("tf.data.Options no longer keeps its values in "
                    f"`_options` (TensorFlow {tf.__version__}; tested: "
                    f"{', '.join(TESTED_TF)}).")


def _get(options: options_lib.Options) -> Any:
  return options._options.get(_OPTION)  # pylint: disable=protected-access


def _set(options: options_lib.Options, value: Any) -> None:
  intune_options.coerce(value)  # type check with a clear message
  options._options[_OPTION] = value  # pylint: disable=protected-access


_PROPERTY = property(
    _get, _set, None,
    "InTune tuning of this dataset: True, False or an "
    "`intune_tf.IntuneOptions`. Default None (off).")


def find(dataset: tf.data.Dataset) -> Any:
  """The `experimental_intune` value closest to `dataset`'s output, or None.

  Returns `False` for a dataset that is already under an InTune root.
  """
  from intune_tf import _root  # pylint: disable=g-import-not-at-top

  todo, seen = [dataset], set()
  while todo:
    ds = todo.pop(0)
    if id(ds) in seen:
      continue
    seen.add(id(ds))
    if isinstance(ds, _root.IntuneDataset):
      return False
    if hasattr(ds, _ATTR):
      return getattr(ds, _ATTR)
    try:
      todo.extend(ds._inputs())  # pylint: disable=protected-access
    except (AttributeError, NotImplementedError, TypeError):
      pass
  return None


def install() -> None:
  """Installs the hooks (idempotent)."""
  global _installed
  if _installed:
    return
  check()
  options_lib.Options.experimental_intune = _PROPERTY

  original_with_options = dataset_ops.DatasetV2.with_options
  original_options = dataset_ops.DatasetV2.options
  original_apply = dataset_ops.DatasetV2._apply_debug_options  # pylint: disable=protected-access

  @functools.wraps(original_with_options)
  def with_options(self, options, name=None):
    result = original_with_options(self, options, name=name)
    value = _get(options) if isinstance(options, options_lib.Options) else None
    if value is not None:
      object.__setattr__(result, _ATTR, value)
    return result

  @functools.wraps(original_options)
  def options(self):
    result = original_options(self)
    value = find(self)
    if value is not None and value is not False:
      result._options[_OPTION] = value  # pylint: disable=protected-access
    return result

  @functools.wraps(original_apply)
  def _apply_debug_options(self):
    dataset = original_apply(self)
    value = find(self)
    tuned = intune_options.coerce(value) if value is not False else None
    if tuned is None:
      return dataset
    from intune_tf import _root  # pylint: disable=g-import-not-at-top
    return _root.tune(dataset, tuned)

  dataset_ops.DatasetV2.with_options = with_options
  dataset_ops.DatasetV2.options = options
  dataset_ops.DatasetV2._apply_debug_options = _apply_debug_options  # pylint: disable=protected-access
  _installed = True
