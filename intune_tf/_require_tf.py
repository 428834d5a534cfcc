"""Imported first by the package: without TensorFlow, one clear message."""

from intune_tf import tf_versions

try:
  import tensorflow  # noqa: F401  the check itself
except ModuleNotFoundError as e:
  if e.name != "tensorflow":
    raise
  raise ImportError(tf_versions.no_tensorflow_message(),
                    name="tensorflow") from None
