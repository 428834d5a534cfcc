"""Cost of making iterators with the option on, against plain TF.

A pipeline over a 200 MB `from_tensor_slices` (then a parallel map and a
batch): the time of the first `iter()` of a freshly built dataset, and of
each later `iter()` of the same dataset (a new epoch, as Keras makes one),
with the option off and on, interleaved, medians of repeats. With the
option on, the root rewrites the pipeline inside the kernel by reference:
the 200 MB tensor is not serialized.
Run: `python benchmarks/iterator_creation.py [repeats] [megabytes]`.
"""

import sys
import time

from _common import median
from _common import with_intune
import numpy as np
import tensorflow as tf


def pipeline(data: np.ndarray, on: bool) -> tf.data.Dataset:
  ds = tf.data.Dataset.from_tensor_slices(data)
  ds = ds.map(lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE).batch(256)
  return with_intune(ds, policy="manual") if on else ds


def measure(data: np.ndarray, on: bool, epochs: int = 5) -> tuple[float, float]:
  """Seconds of the first iter() + next(), and the median of later ones."""
  ds = pipeline(data, on)
  start = time.perf_counter()
  next(iter(ds))
  first = time.perf_counter() - start
  later = []
  for _ in range(epochs):
    start = time.perf_counter()
    next(iter(ds))
    later.append(time.perf_counter() - start)
  return first, median(later)


def main(repeats: int = 5, megabytes: int = 200) -> None:
  data = np.random.default_rng(0).random((megabytes * 2**20 // 8 // 64, 64))
  results = {False: [], True: []}
  measure(data, False)  # warm-up: TF's and InTune's one-off loading
  measure(data, True)
  for _ in range(repeats):
    for on in (False, True):
      results[on].append(measure(data, on))
  first = {on: median([r[0] for r in results[on]]) for on in results}
  later = {on: median([r[1] for r in results[on]]) for on in results}
  print(f"{megabytes} MB from_tensor_slices, {repeats} interleaved repeats "
        "(medians):")
  print(f"  first iter(): plain {first[False] * 1e3:.1f} ms, intune "
        f"{first[True] * 1e3:.1f} ms, ratio {first[True] / first[False]:.2f}")
  print(f"  later iter(): plain {later[False] * 1e3:.1f} ms, intune "
        f"{later[True] * 1e3:.1f} ms, added "
        f"{(later[True] - later[False]) * 1e3:.1f} ms")


if __name__ == "__main__":
  main(*(int(a) for a in sys.argv[1:3]))
