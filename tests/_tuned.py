"""The cache's figures of a pipeline as InTune runs it: through the root's
own rewrite, the graph that RewriteDataset serializes at iterator creation
(captured variables and tables are placeholders there), after TF's own
static rewrites."""

import tensorflow as tf

import intune_tf


def cache_after_first_element(ds) -> dict:
  """`TuningSession.cache()` of a tuned iterator of `ds` (manual policy, no
  warm start, cache on) once it gave its first element."""
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(
      policy="manual", warm_start=False, cache=True)
  it = iter(ds.with_options(options))
  next(it)
  return intune_tf.session_of(it).cache()
