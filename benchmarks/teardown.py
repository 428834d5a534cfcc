"""How long destroying a tf.data iterator takes, with the option off and on.

tf.data's autotune runs a model thread per iterator (`Model::OptimizeLoop`)
that sleeps between passes at doubling intervals capped at 60 s. The
iterator's destructor cancels it, and the cancellation's wake-up can come
before the manager reads as cancelled: the thread then sleeps again, and
the destructor waits for it until its next pass (docs/service.md). With
`experimental_intune` on, TF's autotune is off in the rewritten graph, so no
such thread exists.

Each trial builds `range -> map(AUTOTUNE) -> prefetch(AUTOTUNE)`, reads one
element every 10 ms for `--seconds`, then deletes the iterator and times the
deletion (with a garbage collection). Off and on alternate. Prints each
trial, then per side the median, the largest and the trials over 1 s.

Run: `python benchmarks/teardown.py [--trials 8] [--seconds 6]`.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from intune_tf import arguments


def one_trial(intune: bool, seconds: float) -> float:
  """Seconds that deleting the iterator took after `seconds` of reading."""
  import tensorflow as tf  # noqa: PLC0415

  import intune_tf  # noqa: PLC0415 (registers the option)

  ds = tf.data.Dataset.range(10**9).map(
      lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
          tf.data.AUTOTUNE)
  options = tf.data.Options()
  # The tuning alone: benchmarks/cache*.py measure the cache.
  options.experimental_intune = (intune_tf.IntuneOptions(cache=False)
                                 if intune else False)
  it = iter(ds.with_options(options))
  start = time.monotonic()
  while time.monotonic() - start < seconds:
    next(it)
    time.sleep(0.01)
  begin = time.monotonic()
  del it
  gc.collect()
  return time.monotonic() - begin


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--trials", type=arguments.positive_int, default=8,
                      help="Trials per side (default 8).")
  parser.add_argument("--seconds", type=arguments.duration, default=6.0,
                      help="Seconds of reading before the deletion (default "
                      "6: autotune's next pass is then at 10.2 s).")
  args = parser.parse_args()
  took = {False: [], True: []}
  for i in range(args.trials):
    for intune in (False, True):
      took[intune].append(one_trial(intune, args.seconds))
      print(f"trial {i} {'on ' if intune else 'off'}: deleting took "
            f"{took[intune][-1]:.2f} s", flush=True)
  for intune, values in took.items():
    print(f"option {'on ' if intune else 'off'}: median "
          f"{statistics.median(values):.2f} s, largest {max(values):.2f} s, "
          f"{sum(v > 1.0 for v in values)} of {len(values)} over 1 s")


if __name__ == "__main__":
  main()
