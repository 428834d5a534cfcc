"""Which TensorFlow versions the prebuilt kernel libraries serve, and what the
errors say otherwise (pure functions of the version string)."""

import pytest

from intune_tf import tf_versions

_SUPPORTED = "2.16, 2.17, 2.18, 2.19, 2.20 and 2.21"
_DO = ("They support TensorFlow 2.16, 2.17, 2.18, 2.19, 2.20 and 2.21 (any "
       "patch release). Either install a supported TensorFlow: `pip install "
       "'tensorflow-cpu==2.21.*'` (or 'tensorflow==2.21.*'), or build InTune "
       "from source against TensorFlow {v} (needs a C++ compiler): `pip "
       "install --no-binary intune-tf --no-build-isolation intune-tf`, or in "
       "an intune_tf checkout `pip install --no-build-isolation .`.")


def test_supported_minors_reads_as_a_list():
  assert tf_versions.supported_minors() == _SUPPORTED


@pytest.mark.parametrize("version,folder", [
    ("2.16.0", "tf2_16"),
    ("2.16.2", "tf2_16"),
    ("2.19.1", "tf2_19"),
    ("2.21.0", "tf2_21"),
    ("2.21.7", "tf2_21"),  # a patch release not out yet: same ABI
    ("2.20.0.post1", "tf2_20"),
])
def test_every_release_of_a_supported_minor_is_served(version, folder):
  assert tf_versions.why_unsupported(version) is None
  assert tf_versions.library_folder_for(version) == folder


@pytest.mark.parametrize("version,reason", [
    ("2.15.1", "minor 2.15 is not one of " + _SUPPORTED),
    ("2.22.0", "minor 2.22 is not one of " + _SUPPORTED),
    ("3.0.0", "minor 3.0 is not one of " + _SUPPORTED),
    ("2.22.0-dev20260101", "a nightly build, whose ABI changes from day to "
     "day"),
    ("2.21.0.dev20251101", "a nightly build, whose ABI changes from day to "
     "day"),
    ("2.21.0rc1", "a pre-release or source build, not a published release"),
    ("2.21.0+local", "a pre-release or source build, not a published "
     "release"),
    ("unknown", "an unrecognized version string"),
])
def test_anything_else_says_why(version, reason):
  assert tf_versions.why_unsupported(version) == reason


def test_tensorflow_2_15_error_text():
  with pytest.raises(tf_versions.UnsupportedTensorFlowError) as e:
    tf_versions.library_folder_for("2.15.1")
  assert str(e.value) == (
      "InTune's prebuilt kernel libraries do not support the installed "
      "TensorFlow 2.15.1 (minor 2.15 is not one of " + _SUPPORTED + "). " +
      _DO.format(v="2.15.1"))


def test_nightly_error_text():
  with pytest.raises(tf_versions.UnsupportedTensorFlowError) as e:
    tf_versions.library_folder_for("2.22.0-dev20260101")
  assert str(e.value) == (
      "InTune's prebuilt kernel libraries do not support the installed "
      "TensorFlow 2.22.0-dev20260101 (a nightly build, whose ABI changes "
      "from day to day). " + _DO.format(v="2.22.0-dev20260101"))


def test_no_tensorflow_text():
  assert tf_versions.no_tensorflow_message() == (
      "intune_tf needs TensorFlow, which is not installed. Install it with "
      "InTune: `pip install 'intune-tf[tensorflow-cpu]'` (or "
      "'intune-tf[tensorflow]' for GPU support), or on its own: `pip install "
      "'tensorflow-cpu==2.21.*'`. Supported TensorFlow versions: " +
      _SUPPORTED + " (any patch release).")
