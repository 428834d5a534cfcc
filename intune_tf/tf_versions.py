"""Which TensorFlow releases InTune's prebuilt kernel libraries serve.

Pure functions of a version string (no TensorFlow import): setup.py and the
loader use them, and the tests give them any version. The wheel carries one
kernel library per supported minor, in `intune_tf/ops/_lib/tf<major>_<minor>/`
(symbols embed TF's abseil namespace, which changes between minors); every
patch release of a supported minor loads that minor's library.
"""

from __future__ import annotations

import re

# (major, minor) of every TensorFlow the wheel carries a library for.
SUPPORTED = ((2, 16), (2, 17), (2, 18), (2, 19), (2, 20), (2, 21))
# The pip line for a supported TensorFlow, newest minor.
INSTALL_TF = "pip install 'tensorflow-cpu==2.21.*'"
INSTALL_FROM_SOURCE = (
    "pip install --no-binary intune-tf --no-build-isolation intune-tf")
INSTALL_FROM_CHECKOUT = "pip install --no-build-isolation ."
# A final release, or a post release: 2.21.0, 2.21.1, 2.16.2.post1.
_RELEASE = re.compile(r"(\d+)\.(\d+)\.(\d+)(\.post\d+)?")
_VERSION = re.compile(r"(\d+)\.(\d+)")


class UnsupportedTensorFlowError(ValueError):
  """No prebuilt kernel library serves this TensorFlow version."""


def supported_minors() -> str:
  """'2.16, 2.17, 2.18, 2.19, 2.20 and 2.21'."""
  names = [f"{major}.{minor}" for major, minor in SUPPORTED]
  return ", ".join(names[:-1]) + " and " + names[-1]


def library_folder(major: int, minor: int) -> str:
  """The folder of a minor's library under intune_tf/ops/_lib: 'tf2_21'."""
  return f"tf{major}_{minor}"


def why_unsupported(version: str) -> str | None:
  """Why no prebuilt library serves TensorFlow `version`, or None.

  Args:
    version: `tf.__version__`, e.g. '2.21.1' or '2.22.0-dev20260101'.

  Returns:
    None for a final (or post) release of a supported minor; else the
    reason, e.g. 'minor 2.15 is not one of 2.16, ... and 2.21'.
  """
  release = _RELEASE.fullmatch(version)
  if release:
    major, minor = int(release.group(1)), int(release.group(2))
    if (major, minor) in SUPPORTED:
      return None
    return f"minor {major}.{minor} is not one of {supported_minors()}"
  lowered = version.lower()
  if "dev" in lowered or "nightly" in lowered:
    return "a nightly build, whose ABI changes from day to day"
  if _VERSION.match(version):
    return "a pre-release or source build, not a published release"
  return "an unrecognized version string"


def library_folder_for(version: str) -> str:
  """The prebuilt library's folder for TensorFlow `version`.

  Args:
    version: `tf.__version__`.

  Returns:
    'tf2_21' for any 2.21 release, and so on.

  Raises:
    UnsupportedTensorFlowError: `version` is not a release of a supported
      minor; the message says what to do.
  """
  reason = why_unsupported(version)
  if reason is not None:
    raise UnsupportedTensorFlowError(unsupported_message(version, reason))
  release = _RELEASE.fullmatch(version)
  return library_folder(int(release.group(1)), int(release.group(2)))


def unsupported_message(version: str, reason: str) -> str:
  """What to do when no prebuilt library serves TensorFlow `version`."""
  return (f"InTune's prebuilt kernel libraries do not support the installed "
          f"TensorFlow {version} ({reason}). They support TensorFlow "
          f"{supported_minors()} (any patch release). Either install a "
          f"supported TensorFlow: `{INSTALL_TF}` (or 'tensorflow==2.21.*'), "
          f"or build InTune from source against TensorFlow {version} "
          f"(needs a C++ compiler): `{INSTALL_FROM_SOURCE}`, or in an "
          f"intune_tf checkout `{INSTALL_FROM_CHECKOUT}`.")


def no_tensorflow_message() -> str:
  """What `import intune_tf` says when TensorFlow is not installed."""
  return ("intune_tf needs TensorFlow, which is not installed. Install it "
          "with InTune: `pip install 'intune-tf[tensorflow-cpu]'` (or "
          "'intune-tf[tensorflow]' for GPU support), or on its own: "
          f"`{INSTALL_TF}`. Supported TensorFlow versions: "
          f"{supported_minors()} (any patch release).")
