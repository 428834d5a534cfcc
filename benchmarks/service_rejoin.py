"""How soon a worker taken out of a local pool serves again once the pool
grows back.

A trainer reads a repeated dataset, `distributed_epoch`, from a local pool
of 2 (`workers.LocalWorkers`, a warm standby) under an in-process
dispatcher; each batch carries the pid of the worker that made it. The pool
shrinks to 1 for `--gap` seconds, then grows back to 2. Reported: the
seconds from the growth to the first batch the regrown worker serves, for
each way of shrinking (`VARIANTS`), interleaved, `--repeats` times: the
worker stopped and a new one started on its port
(`LocalWorkers(pause=False)`), or the worker paused (SIGSTOP) and resumed
(`LocalWorkers(pause=True)`, the default).

Run: `python benchmarks/service_rejoin.py [--gap 40] [--repeats 3]` (about
a minute per run; docs/service-design.md has the figures).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time

import tensorflow as tf

from intune_tf import arguments
from intune_tf.service import workers


def _pid_of_worker(x):
  return x, tf.strings.to_number(tf.strings.split(
      tf.io.read_file("/proc/self/stat"), " ")[0], tf.int64)


def _wait(predicate, timeout: float, what: str):
  end = time.monotonic() + timeout
  while time.monotonic() < end:
    value = predicate()
    if value:
      return value
    time.sleep(0.05)
  raise SystemExit(f"timed out waiting for {what}")


# The ways of shrinking compared: `LocalWorkers` arguments.
VARIANTS = {
    "stopped": {"pause": False},
    "paused": {"pause": True},
}


def rejoin(gap_s: float, variant: dict[str, bool]) -> float:
  """Seconds from the growth to the regrown worker's first batch."""
  dispatcher = tf.data.experimental.service.DispatchServer(
      tf.data.experimental.service.DispatcherConfig(port=0))
  address = dispatcher.target.split("://")[1]
  pool = workers.LocalWorkers(
      address, 1, 2, log_dir=tempfile.mkdtemp(prefix="intune-rejoin-"),
      worker_args=("--heartbeat-interval-ms", "500"), standby=1,
      standby_delay_s=0.0, **variant)
  seen: list[tuple[float, int]] = []
  stop = threading.Event()

  def read():
    ds = tf.data.Dataset.range(10**9).map(_pid_of_worker).batch(8).apply(
        tf.data.experimental.service.distribute("distributed_epoch",
                                                dispatcher.target))
    for _, pid in ds:
      seen.append((time.monotonic(), int(pid[0])))
      if stop.wait(0.01):
        return
  reader = threading.Thread(target=read, daemon=True)
  try:
    pool.resize(2)
    _wait(lambda: pool.serving() == 2, 240, "two workers")
    reader.start()
    pids = {w.proc.pid for w in pool.workers}
    _wait(lambda: pids <= {p for _, p in seen}, 240, "rows from both")
    pool.resize(1)
    time.sleep(gap_s)
    grown = time.monotonic()
    pool.resize(2)
    new = pool.workers[1].proc.pid
    first = _wait(lambda: next((t for t, p in seen
                                if p == new and t >= grown), None),
                  240, "the regrown worker's first rows")
    return first - grown
  finally:
    stop.set()
    reader.join(60)
    pool.close()


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--gap", type=arguments.duration, default=40.0,
                      help="Seconds the pool stays shrunk (default 40).")
  parser.add_argument("--repeats", type=arguments.positive_int, default=3,
                      help="Interleaved repeats (default 3).")
  args = parser.parse_args(argv)
  results = {name: [] for name in VARIANTS}
  for repeat in range(args.repeats):
    order = list(results) if repeat % 2 == 0 else list(results)[::-1]
    for name in order:
      seconds = rejoin(args.gap, VARIANTS[name])
      results[name].append(seconds)
      print(f"  repeat {repeat + 1}/{args.repeats} {name}: the regrown "
            f"worker's first rows {seconds:.1f} s after the growth",
            flush=True)
  print(f"\nshrunk for {args.gap:g} s, then grown back (warm standby), "
        f"{args.repeats} interleaved repeats:")
  for name, values in results.items():
    print(f"  {name}: median {statistics.median(values):.1f} s "
          f"({', '.join(f'{v:.1f}' for v in values)})")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
