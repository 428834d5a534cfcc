"""Imported first by the package: without TensorFlow, one clear message.

Looks TensorFlow up without importing it: the package loads it only when a
part that needs it is used.
"""

import importlib.util

from intune_tf import tf_versions

if importlib.util.find_spec("tensorflow") is None:
  raise ImportError(tf_versions.no_tensorflow_message(), name="tensorflow")
