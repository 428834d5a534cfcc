"""Loading the kernel library, and its errors."""

import pathlib
import shutil

import pytest
import tensorflow as tf

from intune_tf.ops import loader as _kernels


def test_library_loads_and_was_built_for_the_installed_tf():
  assert _kernels.built_for() == tf.__version__
  assert hasattr(_kernels.ops(), "intune_dataset")


def test_missing_library_says_how_to_rebuild(tmp_path):
  with pytest.raises(_kernels.KernelLibraryError) as e:
    _kernels._load(str(tmp_path))  # noqa: SLF001  loads from a given folder
  message = str(e.value)
  assert "missing" in message and tf.__version__ in message
  assert "pip install --no-build-isolation" in message


def test_library_built_for_another_tf_names_both_versions(tmp_path):
  here = pathlib.Path(_kernels.__file__).parent
  shutil.copy(here / "_intune_ops.so", tmp_path / "_intune_ops.so")
  (tmp_path / "_intune_ops.tfversion").write_text("2.9.9\n")
  with pytest.raises(_kernels.KernelLibraryError) as e:
    _kernels._load(str(tmp_path))  # noqa: SLF001  loads from a given folder
  message = str(e.value)
  assert "built for TensorFlow 2.9.9" in message
  assert f"TensorFlow {tf.__version__} is installed" in message
  assert "Rebuild" in message


def test_unloadable_library_is_one_clear_error(tmp_path):
  (tmp_path / "_intune_ops.so").write_bytes(b"not a shared library")
  (tmp_path / "_intune_ops.tfversion").write_text(tf.__version__)
  with pytest.raises(_kernels.KernelLibraryError) as e:
    _kernels._load(str(tmp_path))  # noqa: SLF001  loads from a given folder
  assert "Could not load the InTune kernel library" in str(e.value)
