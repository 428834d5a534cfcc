"""Lazy loading of the InTune kernel library.

Two kinds of library, each with a stamp (`_intune_ops.tfversion`, the
TensorFlow version it was compiled against) beside it:

- a source build (`pip install --no-build-isolation .`, `make build`):
  `_intune_ops.so` in this folder, for the TensorFlow installed at build time;
- the wheel's prebuilt libraries, one per supported TensorFlow minor:
  `_lib/tf<major>_<minor>/_intune_ops.so` (intune_tf/tf_versions.py).

A source build for the installed TensorFlow (any patch release of its minor)
comes first; else the prebuilt library of the installed minor. When neither
serves the installed TensorFlow, importing warns once, and the first use
raises `KernelLibraryError` saying what to install or how to build.
"""

from __future__ import annotations

import functools
import os
import threading
from types import ModuleType
import warnings

import tensorflow as tf

from intune_tf import tf_versions

_LIBRARY = "_intune_ops.so"
_STAMP = "_intune_ops.tfversion"
_PREBUILT = "_lib"
_REBUILD = ("Rebuild it against the installed TensorFlow with "
            "`pip install --no-build-isolation -e .` (or `make build`) in the "
            "intune_tf checkout.")
_REINSTALL = ("Reinstall intune_tf: `pip install --force-reinstall --no-deps "
              "intune-tf`, or build it from source: "
              f"`{tf_versions.INSTALL_FROM_SOURCE}`.")
_lock = threading.Lock()


class KernelLibraryError(ImportError):
  """The InTune kernel library is missing or does not match TensorFlow."""


class TensorFlowVersionWarning(UserWarning):
  """No kernel library of this intune_tf serves the installed TensorFlow."""


def _directory() -> str:
  return os.path.dirname(os.path.abspath(__file__))


def _stamp(directory: str) -> str | None:
  try:
    with open(os.path.join(directory, _STAMP)) as f:
      return f.read().strip() or None
  except OSError:
    return None


def _same_minor_release(built: str, installed: str) -> bool:
  """Whether a library built for `built` serves `installed`: the same
  version, or releases of one supported minor (same ABI)."""
  if built == installed:
    return True
  try:
    return (tf_versions.library_folder_for(built) ==
            tf_versions.library_folder_for(installed))
  except tf_versions.UnsupportedTensorFlowError:
    return False


def _source_build(directory: str, installed: str) -> str | None:
  """The folder of a source build serving `installed`, or None."""
  stamp = _stamp(directory)
  if (stamp is not None and os.path.exists(os.path.join(directory, _LIBRARY))
      and _same_minor_release(stamp, installed)):
    return directory
  return None


def find(directory: str, installed: str) -> str:
  """The folder whose library serves TensorFlow `installed`.

  Args:
    directory: the package's `ops` folder.
    installed: the installed TensorFlow's version.

  Returns:
    `directory` itself for a matching source build, else the prebuilt
    library's folder (which may be missing: `_load` says so).

  Raises:
    KernelLibraryError: no library can serve `installed`; the message names
      it, the supported minors, and the commands to run.
  """
  found = _source_build(directory, installed)
  if found is not None:
    return found
  stamp = _stamp(directory)
  source_built = os.path.join(directory, _LIBRARY)
  mismatch = (f"The InTune kernel library at {source_built} was built for "
              f"TensorFlow {stamp}, but TensorFlow {installed} is installed. "
              f"{_REBUILD}")
  try:
    folder = tf_versions.library_folder_for(installed)
  except tf_versions.UnsupportedTensorFlowError as e:
    if stamp is not None and os.path.exists(source_built):
      raise KernelLibraryError(f"{mismatch} {e}") from None
    raise KernelLibraryError(str(e)) from None
  prebuilt = os.path.join(directory, _PREBUILT, folder)
  if (stamp is not None and os.path.exists(source_built) and
      not os.path.exists(os.path.join(prebuilt, _LIBRARY))):
    raise KernelLibraryError(mismatch)
  return prebuilt


def _load(directory: str, installed: str | None = None) -> ModuleType:
  installed = installed or tf.__version__
  folder = find(directory, installed)
  path = os.path.join(folder, _LIBRARY)
  how = _REBUILD if folder == directory else _REINSTALL
  if not os.path.exists(path):
    raise KernelLibraryError(
        f"The InTune kernel library is missing: {path} does not exist "
        f"(installed TensorFlow: {installed}). {how}")
  stamp = _stamp(folder)
  try:
    return tf.load_op_library(path)
  except tf.errors.NotFoundError as e:
    raise KernelLibraryError(
        f"Could not load the InTune kernel library {path}, built for "
        f"TensorFlow {stamp or 'an unknown version'}, into the installed "
        f"TensorFlow {installed}: {e.message.strip()}. {how}") from None


def built_for() -> str | None:
  """The TensorFlow version of the library `ops()` loads, if known."""
  try:
    return _stamp(find(_directory(), tf.__version__))
  except KernelLibraryError:
    return None


def unsupported_warning(directory: str, installed: str) -> str | None:
  """The warning for importing under `installed`, or None if it is served."""
  if _source_build(directory, installed) is not None:
    return None
  reason = tf_versions.why_unsupported(installed)
  if reason is None:
    return None
  return tf_versions.unsupported_message(installed, reason)


@functools.cache
def ops() -> ModuleType:
  """Loads the kernel library once and returns its generated op wrappers.

  Raises:
    KernelLibraryError: the library is missing, or was built for another
      TensorFlow, or cannot be loaded.
  """
  with _lock:
    return _load(_directory())


_warning = unsupported_warning(_directory(), tf.__version__)
if _warning is not None:
  warnings.warn(_warning, TensorFlowVersionWarning, stacklevel=2)
