"""InTune for TensorFlow: live tuning of tf.data input pipelines.

    import intune_tf
    options = tf.data.Options()
    options.experimental_intune = True   # or intune_tf.IntuneOptions(...)
    ds = ds.with_options(options)

Importing the package adds the option, once TensorFlow is imported (before
or after the package). The package itself imports nothing heavy: its public
names load their modules on first use, and the numpy-only parts (records,
the simulator, the searches) import without TensorFlow. The kernel library
is loaded on first use.
"""

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any
import warnings

# First: without TensorFlow, says what to install (without importing it).
from intune_tf import _require_tf  # noqa: F401  the check itself

__version__ = "0.1.0"

# Public name -> (module, attribute): loaded on first use (PEP 562).
_PUBLIC = {
    "CacheState": ("intune_tf.records", "CacheState"),
    "IntuneOptions": ("intune_tf.options", "IntuneOptions"),
    "Knob": ("intune_tf.records", "Knob"),
    "Observation": ("intune_tf.records", "Observation"),
    "KernelLibraryError": ("intune_tf.ops.loader", "KernelLibraryError"),
    "Policy": ("intune_tf.tuning.policies", "Policy"),
    "TuningSession": ("intune_tf.ops.session", "TuningSession"),
    "SessionGoneError": ("intune_tf.ops.session", "SessionGoneError"),
    "StageStats": ("intune_tf.records", "StageStats"),
    "global_tuner": ("intune_tf.live.tuner", "global_tuner"),
    "register_policy": ("intune_tf.live.registry", "register"),
    "report_step_time": ("intune_tf.live.observation", "report_step_time"),
    "session_of": ("intune_tf.ops.session", "session_of"),
    "sessions": ("intune_tf.ops.session", "sessions"),
    "tune": ("intune_tf.tfdata.hooks", "tune"),
}

__all__ = list(_PUBLIC)


def __getattr__(name: str) -> Any:
  try:
    module, attribute = _PUBLIC[name]
  except KeyError:
    raise AttributeError(
        f"module 'intune_tf' has no attribute {name!r}") from None
  value = getattr(importlib.import_module(module), attribute)
  globals()[name] = value
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(_PUBLIC))


def _install_hooks() -> None:
  """Adds the option to tf.data (`intune_tf.tfdata.hooks.install`)."""
  # Deferred: the hooks import TensorFlow, which the package loads only when
  # the program imports it.
  from intune_tf.tfdata import hooks  # noqa: PLC0415
  hooks.install()


class _AfterTensorFlow(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Installs the hooks right after `import tensorflow` completes.

  Finds TensorFlow's spec through the other finders and wraps its loader;
  removes itself from `sys.meta_path` when TensorFlow's import starts.
  """

  def __init__(self, loader: importlib.abc.Loader | None = None):
    self._loader = loader

  def find_spec(self, fullname, path, target=None):
    if fullname != "tensorflow" or self._loader is not None:
      return None
    if self in sys.meta_path:
      sys.meta_path.remove(self)
    for finder in sys.meta_path:
      find = getattr(finder, "find_spec", None)
      spec = find(fullname, path, target) if find else None
      if spec is not None:
        break
    else:
      return None
    if spec.loader is None or not hasattr(spec.loader, "exec_module"):
      return spec
    spec.loader = _AfterTensorFlow(spec.loader)
    return spec

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module: types.ModuleType) -> None:
    module.__spec__.loader = module.__loader__ = self._loader
    self._loader.exec_module(module)
    try:
      _install_hooks()
    except ImportError as e:
      # A TensorFlow whose tf.data lacks a hook point (`hooks.HookError`):
      # the user's `import tensorflow` still works, without the option.
      warnings.warn(f"intune_tf: the option is not available: {e}",
                    RuntimeWarning, stacklevel=2)

  def __getattr__(self, name: str) -> Any:
    # The rest of the real loader's interface (resources, source).
    loader = self.__dict__.get("_loader")
    if loader is None:
      raise AttributeError(name)
    return getattr(loader, name)


if "tensorflow" in sys.modules:
  _install_hooks()
elif not any(isinstance(f, _AfterTensorFlow) for f in sys.meta_path):
  sys.meta_path.insert(0, _AfterTensorFlow())
