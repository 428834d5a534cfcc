"""Lazy loading of the InTune kernel library.

The library is compiled against one TensorFlow release (see setup.py) and
records that release in `_intune_ops.tfversion` next to it. Loading it under
another release fails with one error that says which it was built for, which
is installed, and how to rebuild.
"""

from __future__ import annotations

import functools
import os
import threading
from types import ModuleType

import tensorflow as tf

_LIBRARY = "_intune_ops.so"
_STAMP = "_intune_ops.tfversion"
_REBUILD = ("Rebuild it against the installed TensorFlow with "
            "`pip install --no-build-isolation -e .` (or `make build`) in the "
            "intune_tf checkout.")
_lock = threading.Lock()


class KernelLibraryError(ImportError):
  """The InTune kernel library is missing or does not match TensorFlow."""


def _directory() -> str:
  return os.path.dirname(os.path.abspath(__file__))


def built_for() -> str | None:
  """The TensorFlow version the kernel library was built for, if recorded."""
  try:
    with open(os.path.join(_directory(), _STAMP)) as f:
      return f.read().strip() or None
  except OSError:
    return None


def _load(directory: str) -> ModuleType:
  path = os.path.join(directory, _LIBRARY)
  installed = tf.__version__
  if not os.path.exists(path):
    raise KernelLibraryError(
        f"The InTune kernel library is missing: {path} does not exist "
        f"(installed TensorFlow: {installed}). {_REBUILD}")
  stamp = None
  try:
    with open(os.path.join(directory, _STAMP)) as f:
      stamp = f.read().strip() or None
  except OSError:
    pass
  if stamp is not None and stamp != installed:
    raise KernelLibraryError(
        f"The InTune kernel library at {path} was built for TensorFlow "
        f"{stamp}, but TensorFlow {installed} is installed. {_REBUILD}")
  try:
    return tf.load_op_library(path)
  except tf.errors.NotFoundError as e:
    raise KernelLibraryError(
        f"Could not load the InTune kernel library {path}, built for "
        f"TensorFlow {stamp or 'an unknown version'}, into the installed "
        f"TensorFlow {installed}: {e.message.strip()}. {_REBUILD}") from None


@functools.cache
def ops() -> ModuleType:
  """Loads the kernel library once and returns its generated op wrappers.

  Raises:
    KernelLibraryError: the library is missing, or was built for another
      TensorFlow, or cannot be loaded.
  """
  with _lock:
    return _load(_directory())
