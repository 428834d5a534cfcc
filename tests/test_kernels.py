"""Loading the kernel library, its errors, and what the library links."""

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

from intune_tf import tf_versions
from intune_tf.ops import loader as _kernels

_MINOR = ".".join(tf.__version__.split(".")[:2])


def _library() -> pathlib.Path:
  """The library `ops()` loads for the installed TensorFlow."""
  folder = _kernels.find(_kernels._directory(), tf.__version__)  # noqa: SLF001
  return pathlib.Path(folder) / "_intune_ops.so"


def _prebuilt(directory: pathlib.Path, minor: str, version: str) -> None:
  """A stand-in prebuilt library folder (the loader only looks for it)."""
  folder = directory / "_lib" / f"tf{minor.replace('.', '_')}"
  folder.mkdir(parents=True)
  (folder / "_intune_ops.so").write_bytes(b"")
  (folder / "_intune_ops.tfversion").write_text(version + "\n")


def test_library_loads_and_was_built_for_the_installed_minor():
  built = _kernels.built_for()
  assert built is not None and built.startswith(_MINOR + "."), built
  assert hasattr(_kernels.ops(), "intune_dataset")


@pytest.mark.parametrize("installed", ["2.21.0", "2.21.3"])
def test_a_patch_release_loads_its_minors_prebuilt_library(tmp_path,
                                                           installed):
  _prebuilt(tmp_path, "2.21", "2.21.0")
  assert _kernels.find(str(tmp_path), installed) == str(
      tmp_path / "_lib" / "tf2_21")


@pytest.mark.parametrize("stamp,installed,found", [
    ("2.21.0", "2.21.0", "."),  # the source build
    ("2.21.0", "2.21.1", "."),  # a patch upgrade: same ABI
    ("2.22.0-dev20260101", "2.22.0-dev20260101", "."),  # built for it
    ("2.20.0", "2.21.0", "_lib/tf2_21"),  # stale: the prebuilt one
])
def test_a_source_build_for_the_installed_minor_comes_first(
    tmp_path, stamp, installed, found):
  (tmp_path / "_intune_ops.so").write_bytes(b"")
  (tmp_path / "_intune_ops.tfversion").write_text(stamp + "\n")
  _prebuilt(tmp_path, "2.21", "2.21.0")
  assert _kernels.find(str(tmp_path), installed) == os.path.normpath(
      tmp_path / found)


@pytest.mark.parametrize("installed,reason", [
    ("2.15.1", "minor 2.15 is not one of 2.16, 2.17, 2.18, 2.19, 2.20 and "
     "2.21"),
    ("2.22.0-dev20260101", "a nightly build, whose ABI changes from day to "
     "day"),
])
def test_an_unsupported_tensorflow_is_one_error_saying_what_to_do(
    tmp_path, installed, reason):
  _prebuilt(tmp_path, "2.21", "2.21.0")
  with pytest.raises(_kernels.KernelLibraryError) as e:
    _kernels.find(str(tmp_path), installed)
  assert str(e.value) == tf_versions.unsupported_message(installed, reason)
  assert (_kernels.unsupported_warning(str(tmp_path), installed) ==
          str(e.value))


def test_a_supported_tensorflow_gets_no_warning(tmp_path):
  assert _kernels.unsupported_warning(str(tmp_path), "2.18.0") is None


def test_missing_library_says_how_to_reinstall(tmp_path):
  with pytest.raises(_kernels.KernelLibraryError) as e:
    _kernels._load(str(tmp_path), "2.21.0")  # noqa: SLF001  a given folder
  assert str(e.value) == (
      "The InTune kernel library is missing: "
      f"{tmp_path}/_lib/tf2_21/_intune_ops.so does not exist (installed "
      "TensorFlow: 2.21.0). Reinstall intune_tf: `pip install "
      "--force-reinstall --no-deps intune-tf`, or build it from source: "
      "`pip install --no-binary intune-tf --no-build-isolation intune-tf`.")


def test_library_built_for_another_tf_names_both_versions(tmp_path):
  shutil.copy(_library(), tmp_path / "_intune_ops.so")
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


def _readelf(library: pathlib.Path) -> str:
  readelf = shutil.which("readelf")
  assert readelf, "readelf (binutils) is needed to inspect the library"
  return subprocess.run([readelf, "-d", str(library)], capture_output=True,
                        text=True, check=True).stdout


def test_library_links_only_tensorflows_framework_and_has_no_run_path():
  dynamic = _readelf(_library())
  needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic)
  tf_libraries = [n for n in needed if "tensorflow" in n]
  assert tf_libraries == ["libtensorflow_framework.so.2"], needed
  # Only the C++ runtime and the C library besides.
  assert set(needed) - {"libtensorflow_framework.so.2", "libstdc++.so.6",
                        "libm.so.6", "libgcc_s.so.1", "libc.so.6",
                        "ld-linux-x86-64.so.2"} == set(), needed
  paths = re.findall(r"\((?:RPATH|RUNPATH)\)\s+Library r(?:un)?path: \[(.+?)\]",
                     dynamic)
  assert all(p.startswith("$ORIGIN") for path in paths
             for p in path.split(":")), paths


# Runs `code` in a fresh interpreter whose path starts with a copy of the
# installed package (folder `root`) and has no site-packages of its own when
# `site` is False.
def _python(root: pathlib.Path, code: str, site: bool = True):
  flags = ["-I"] if site else ["-I", "-S"]
  return subprocess.run(
      [sys.executable, *flags, "-c",
       f"import sys; sys.path.insert(0, {str(root)!r}); {code}"],
      capture_output=True, text=True, timeout=600, check=False, cwd=root,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))


def _copy_package(root: pathlib.Path) -> pathlib.Path:
  """Copies the imported package (subpackages mapped by setup.py's
  package_dir included) to root/intune_tf, as installed."""
  import intune_tf  # noqa: PLC0415  the package under test, for its paths
  from intune_tf import criteo  # noqa: PLC0415  mapped elsewhere in a checkout
  from intune_tf import rewrites  # noqa: PLC0415  mapped elsewhere in a checkout

  target = root / "intune_tf"
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
  shutil.copytree(intune_tf.__path__[0], target, ignore=ignore)
  for name, module in (("criteo", criteo), ("rewrites", rewrites)):
    if not (target / name).exists():
      shutil.copytree(module.__path__[0], target / name, ignore=ignore)
  return target


@pytest.mark.slow
def test_import_without_tensorflow_says_what_to_install(tmp_path):
  _copy_package(tmp_path)
  result = _python(tmp_path, "import intune_tf", site=False)
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
      "ImportError: " + tf_versions.no_tensorflow_message())


# Imports the package (warnings shown) and uses the option once.
_USE = ("import warnings; warnings.simplefilter('default'); "
        "import tensorflow as tf; {fake}import intune_tf; "
        "o = tf.data.Options(); o.experimental_intune = True; "
        "print(list(tf.data.Dataset.range(3).with_options(o)))")


@pytest.mark.slow
def test_deleted_kernel_library_is_one_error_at_first_use(tmp_path):
  package = _copy_package(tmp_path)
  version = tf.__version__
  folder = tf_versions.library_folder_for(version)
  for library in [package / "ops" / "_intune_ops.so",
                  package / "ops" / "_lib" / folder / "_intune_ops.so"]:
    library.unlink(missing_ok=True)
  result = _python(tmp_path, _USE.format(fake=""))
  assert result.returncode == 1, result.stdout
  missing = package / "ops" / "_lib" / folder / "_intune_ops.so"
  assert result.stderr.strip().splitlines()[-1] == (
      "intune_tf.ops.loader.KernelLibraryError: The InTune kernel library is "
      f"missing: {missing} does not exist (installed TensorFlow: {version}). "
      "Reinstall intune_tf: `pip install --force-reinstall --no-deps "
      "intune-tf`, or build it from source: `pip install --no-binary "
      "intune-tf --no-build-isolation intune-tf`.")


@pytest.mark.slow
@pytest.mark.parametrize("fake,reason", [
    ("2.15.1", "minor 2.15 is not one of 2.16, 2.17, 2.18, 2.19, 2.20 and "
     "2.21"),
    ("2.22.0-dev20260101", "a nightly build, whose ABI changes from day to "
     "day"),
])
def test_unsupported_tensorflow_warns_at_import_and_fails_at_first_use(
    tmp_path, fake, reason):
  # The installed TensorFlow, reporting another version (no such TensorFlow
  # can be installed beside the one under test).
  _copy_package(tmp_path)
  result = _python(tmp_path, _USE.format(
      fake=f"tf.__version__ = {fake!r}; "))
  message = tf_versions.unsupported_message(fake, reason)
  assert result.returncode == 1, result.stdout
  warnings = [l for l in result.stderr.splitlines()
              if "TensorFlowVersionWarning" in l]
  assert len(warnings) == 1, result.stderr[-3000:]
  assert warnings[0].endswith("TensorFlowVersionWarning: " + message)
  assert result.stderr.strip().splitlines()[-1] == (
      "intune_tf.ops.loader.KernelLibraryError: " + message)
