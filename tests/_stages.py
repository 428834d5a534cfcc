"""What tests read of a pipeline's stages."""

import tensorflow as tf


def parallel_calls(ds: tf.data.Dataset) -> list[tuple[str, int]]:
  """Each stage's num_parallel_calls (or buffer size), output first, read
  from the Python dataset objects (tf.data has no public accessor)."""
  found = []
  while ds is not None:
    for attr in ("_num_parallel_calls", "_buffer_size"):
      value = getattr(ds, attr, None)
      if value is not None:
        found.append((type(ds).__name__, int(value)))
    ds = getattr(ds, "_input_dataset", None)
  return found
