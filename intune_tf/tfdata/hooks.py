"""The hooks into TensorFlow's private tf.data API (with `dataset.py`, which
builds the InTune datasets on TF's dataset classes), and `tune`, the one
place that sets the option on a dataset.

`import intune_tf` adds the `experimental_intune` option to `tf.data.Options`
and makes every iterator creation of a dataset with the option on go through
`intune_tf.tfdata.dataset.apply_root`. The hooks are pinned to the tested TF
versions and `check()` fails loudly when TensorFlow moves them.

- `tf.data.Options.experimental_intune`: a property storing its value in
  `Options._options`, so `merge_options` (used by `with_options`) keeps it.
- `DatasetV2.with_options`: the options proto that TF keeps in the graph has
  no room for the value, so the dataset returned by `with_options` is put
  under an `IntuneOptionsDataset` that carries it in the graph.
- `DatasetV2.options`: reports the value in force (TF's merge order).
- `DatasetV2._apply_debug_options`: called by every iterator creation (`for`,
  `iter`, tf.function loops, Keras `fit`, tf.data service registration);
  returns the dataset under the InTune root.
- `OwnedIterator._create_iterator` (eager `iter()`): remembers on the
  iterator the sessions its creation made, for `intune_tf.session_of`.
- `OwnedIterator._restore_from_tensors` (a checkpoint restored into an
  eager iterator rebuilds its pipeline): remembers the new sessions.
- `tf.data.experimental.get_model_proto` (TF 2.17 and later): TF's own
  autotuner is off under the root, so its iterator holds no model; an
  iterator with a session answers with the session's model, unless the
  dataset's options turn autotune off (then TF's NotFoundError, as
  without InTune).
"""

from __future__ import annotations

import functools
import importlib
import threading
from typing import Any

import tensorflow as tf
from tensorflow.core.framework import model_pb2
from tensorflow.python.data.ops import dataset_ops
from tensorflow.python.data.ops import iterator_ops
from tensorflow.python.data.ops import options as options_lib
from tensorflow.python.data.util import options as options_base

from intune_tf import options as intune_options
from intune_tf.ops import session as session_lib
from intune_tf.tfdata import dataset as dataset_lib

TESTED_TF = ("2.16", "2.21")
_OPTION = "experimental_intune"
_installed = False
# Per thread, while an eager iterator is made: the newest session id before
# its root was put on (set by `_apply_debug_options`, read by
# `_create_iterator`).
_creating = threading.local()


class HookError(ImportError):
  """TensorFlow moved a private hook that intune_tf relies on."""


def check() -> None:
  """Raises HookError if a hook point is missing from the installed TF."""
  for owner, name in ((iterator_ops.OwnedIterator, "_create_iterator"),
                      (iterator_ops.OwnedIterator, "_restore_from_tensors"),
                      (dataset_ops.DatasetV2, "_apply_debug_options"),
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


def _session_model(iterator: Any) -> model_pb2.ModelProto | None:
  """The model of `iterator`'s InTune session (an eager iterator, or a
  NumpyIterator over one), or None: no session, or autotune turned off by
  the dataset's options."""
  owned = getattr(iterator, "_iterator", iterator)  # a NumpyIterator's
  # The root's own options turn TF's autotuner off; its input's are the
  # user's.
  user = getattr(getattr(owned, "_dataset", None), "_input_dataset", None)
  if (not getattr(owned, session_lib.SESSION_IDS_ATTR, None) or
      user is None or user.options().autotune.enabled is False):
    return None
  try:
    return session_lib.session_of(owned).model_proto()
  except session_lib.SessionGoneError:
    return None


def _install_model_proto() -> None:
  """Wraps `get_model_proto` where TensorFlow has it (2.17 and later)."""
  try:
    module = importlib.import_module(
        "tensorflow.python.data.experimental.ops.iterator_model_ops")
  except ImportError:
    return
  original = module.get_model_proto

  @functools.wraps(original)
  def get_model_proto(iterator):
    try:
      return original(iterator)
    except tf.errors.NotFoundError:
      proto = _session_model(iterator)
      if proto is None:
        raise
      return proto

  module.get_model_proto = get_model_proto
  tf.data.experimental.get_model_proto = get_model_proto


def _get(options: options_lib.Options) -> Any:
  return options._options.get(_OPTION)  # noqa: SLF001


def _set(options: options_lib.Options, value: Any) -> None:
  intune_options.coerce(value)  # type check with a clear message
  options._options[_OPTION] = value  # noqa: SLF001


_PROPERTY = property(
    _get, _set, None,
    "InTune tuning of this dataset: True, False or an "
    "`intune_tf.IntuneOptions`. Default None (off).")


def _inputs(dataset: tf.data.Dataset) -> list[tf.data.Dataset]:
  # A DatasetV1Adapter (what TF1 iterators and `tf.compat.v1.data` wrap a
  # dataset in) answers with the inputs of the dataset it wraps, skipping
  # that dataset, which may be the declaration itself.
  if isinstance(dataset, dataset_ops.DatasetV1Adapter):
    return [dataset._dataset]  # noqa: SLF001
  try:
    return list(dataset._inputs())  # noqa: SLF001
  except (AttributeError, NotImplementedError, TypeError):
    return []


def find(dataset: tf.data.Dataset) -> tuple[Any, bool]:
  """The `experimental_intune` value in force for `dataset`, by TF's order
  for options (a `with_options` overrides what is below it; among the inputs
  of one dataset the later wins), and whether part of the graph is hidden
  from Python (a dataset rebuilt from a variant or loaded from files), where
  the kernel may find a value that Python cannot.

  Returns:
    (value or None, hidden).
  """

  # Depth first without recursion: a pipeline may be thousands of datasets
  # deep (a chain of `concatenate`s), past Python's recursion limit. A
  # dataset's value is memoized once its inputs have theirs; one met again
  # while its inputs are walked (a cycle) counts as None.
  memo: dict[int, Any] = {}
  inputs_of: dict[int, list[tf.data.Dataset]] = {}
  hidden = False
  stack: list[tuple[tf.data.Dataset, bool]] = [(dataset, False)]
  while stack:
    ds, inputs_done = stack.pop()
    key = id(ds)
    if inputs_done:
      result = None
      for child in inputs_of.pop(key):
        found = memo.get(id(child))
        if found is not None:
          result = found
      memo[key] = result
      continue
    if key in memo:
      continue
    memo[key] = None
    if isinstance(ds, dataset_lib.IntuneOptionsDataset):
      memo[key] = ds.intune_value
      continue
    inputs = _inputs(ds)
    if not inputs and _opaque(ds):
      hidden = True
    inputs_of[key] = inputs
    stack.append((ds, True))
    stack.extend((child, False) for child in reversed(inputs))
  return memo[id(dataset)], hidden


def _opaque(dataset: tf.data.Dataset) -> bool:
  """Whether `dataset` is a graph Python cannot walk."""
  return type(dataset).__name__ in ("_VariantDataset", "_LoadDataset",
                                    "LoadDataset")


def tune(dataset: tf.data.Dataset,
         options: intune_options.IntuneOptions | bool = True,
         **fields: Any) -> tf.data.Dataset:
  """Returns `dataset` with `tf.data.Options().experimental_intune` set.

      ds = intune_tf.tune(ds, cpu_budget=4)
      # the same as
      options = tf.data.Options()
      options.experimental_intune = intune_tf.IntuneOptions(cpu_budget=4)
      ds = ds.with_options(options)

  Args:
    dataset: Any `tf.data.Dataset`.
    options: `True` (default) for `IntuneOptions()`, an `IntuneOptions`, or
      `False` to turn InTune off below this point.
    **fields: Fields of `IntuneOptions` (policy, budgets, ...); only with
      `options=True`. Default: none.

  Returns:
    The dataset with the option set.

  Raises:
    TypeError: `fields` given with an `IntuneOptions` or `False`.
  """
  if fields:
    if options is not True:
      raise TypeError("intune_tf.tune: pass either an IntuneOptions or its "
                      f"fields, not both (got {options!r} and {fields}).")
    options = intune_options.IntuneOptions(**fields)
  intune_options.coerce(options)  # type check with a clear message
  # Only the option: `with_options(tf.data.Options())` would also apply the
  # other fields' defaults, which TF's test mode changes (it turns on
  # `experimental_warm_start`, which ran a map before its table was ready).
  return dataset_lib.declare(dataset, options)


def install() -> None:
  """Installs the hooks (idempotent)."""
  global _installed
  if _installed:
    return
  check()
  options_lib.Options.experimental_intune = _PROPERTY

  original_with_options = dataset_ops.DatasetV2.with_options
  original_options = dataset_ops.DatasetV2.options
  original_apply = dataset_ops.DatasetV2._apply_debug_options  # noqa: SLF001

  @functools.wraps(original_with_options)
  def with_options(self, options, name=None):
    result = original_with_options(self, options, name=name)
    value = _get(options) if isinstance(options, options_lib.Options) else None
    if value is None:
      return result
    return dataset_lib.declare(result, value)

  @functools.wraps(original_options)
  def options(self):
    result = original_options(self)
    value, _ = find(self)
    if value is not None:
      result._options[_OPTION] = value  # noqa: SLF001
    return result

  @functools.wraps(original_apply)
  def _apply_debug_options(self):
    dataset = original_apply(self)
    if isinstance(dataset, dataset_lib.IntuneRootDataset):
      return dataset
    value, hidden = find(dataset)
    if value is None and not hidden:
      return dataset
    if tf.executing_eagerly():
      _creating.after = session_lib.newest_session_id()
    return dataset_lib.apply_root(dataset)

  original_create = iterator_ops.OwnedIterator._create_iterator  # noqa: SLF001

  @functools.wraps(original_create)
  def _create_iterator(self, dataset):
    _creating.after = None
    original_create(self, dataset)
    after, _creating.after = getattr(_creating, "after", None), None
    if after is not None:
      session_lib.record_sessions(self, after)

  original_restore = (
      iterator_ops.OwnedIterator._restore_from_tensors)  # noqa: SLF001

  @functools.wraps(original_restore)
  def _restore_from_tensors(self, restored_tensors):
    tracked = getattr(self, session_lib.SESSION_IDS_ATTR, None)
    if not tracked or not tf.executing_eagerly():
      return original_restore(self, restored_tensors)
    before = session_lib.newest_session_id()
    result = original_restore(self, restored_tensors)
    if session_lib.sessions_made_by_this_thread(before):
      session_lib.record_sessions(self, before)
    return result

  dataset_ops.DatasetV2.with_options = with_options
  dataset_ops.DatasetV2.options = options
  dataset_ops.DatasetV2._apply_debug_options = (  # noqa: SLF001
      _apply_debug_options)
  iterator_ops.OwnedIterator._create_iterator = _create_iterator  # noqa: SLF001
  iterator_ops.OwnedIterator._restore_from_tensors = (  # noqa: SLF001
      _restore_from_tensors)
  _install_model_proto()
  _installed = True
