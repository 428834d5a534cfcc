"""tf.data service throughput: 2 InTune workers against 1, same pipeline.

Starts two clusters with the project's launchers (`intune service
dispatcher` / `worker`): one dispatcher with one worker, one with two. The
client reads the same tuned pipeline (a ~0.5 ms UDF per element, parallel
map on AUTOTUNE, batch 32, prefetch; policy "even") distributed with dynamic
sharding (splits of 512 elements) from each cluster in turn (interleaved
repeats, a new job each time), and prints rows/s medians and the ratio.

Layouts: "shared" (every process may use every core), "pinned" (worker i
pinned to core i: two one-core machines; the one-worker cluster's worker is
pinned to core 0). The client is never pinned.

Run: `python benchmarks/service.py [--repeats 5] [--seconds 8] [--warmup 3]
[--layouts shared,pinned] [--compression NONE|AUTO]`.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

from _common import busy_udf
from _common import calibrate
from _common import median
from _common import rate
from _common import single_threaded_ops
from _common import with_intune
import tensorflow as tf

from intune_tf import arguments

_INTUNE = str(pathlib.Path(sys.executable).with_name("intune"))
_BATCH = 32
_BLOCK = 512
_START_TIMEOUT_S = 300.0


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Cluster:
  """A dispatcher and `workers` workers, optionally pinned to cores."""

  def __init__(self, workers: int, pinned: bool, tmp: pathlib.Path):
    self.port = _free_port()
    self.address = f"127.0.0.1:{self.port}"
    env = dict(os.environ, INTUNE_STATUS_DIR=str(tmp / "status"))
    self.logs = []
    self.procs = [self._start(["dispatcher", "--port", str(self.port)], env,
                              tmp, None)]
    cores = sorted(os.sched_getaffinity(0))
    for i in range(workers):
      core = {cores[i % len(cores)]} if pinned else None
      self.procs.append(self._start(
          ["worker", "--dispatcher", self.address, "--port",
           str(_free_port()), "--dispatcher-wait", str(_START_TIMEOUT_S)],
          env, tmp, core))
    deadline = time.monotonic() + _START_TIMEOUT_S
    for log in self.logs[1:]:
      while "Worker registered with dispatcher" not in log.read_text(
          errors="replace"):
        if time.monotonic() > deadline or any(
            p.poll() is not None for p in self.procs):
          raise RuntimeError(f"cluster did not start; see {log}")
        time.sleep(0.5)

  def _start(self, args, env, tmp, core):
    log = tmp / f"{args[0]}-{len(self.logs)}-{self.port}.log"
    self.logs.append(log)
    preexec = (lambda: os.sched_setaffinity(0, core)) if core else None
    with open(log, "wb") as out:
      return subprocess.Popen([_INTUNE, "service", *args], env=env,
                              stdout=out, stderr=subprocess.STDOUT,
                              preexec_fn=preexec)

  def stop(self):
    for p in reversed(self.procs):
      p.send_signal(signal.SIGTERM)
    for p in self.procs:
      try:
        p.wait(30)
      except subprocess.TimeoutExpired:
        p.kill()


def _block(b):
  return tf.data.Dataset.range(b * _BLOCK, (b + 1) * _BLOCK)


def pipeline(size: int) -> tf.data.Dataset:
  # Dynamic sharding hands out one split per source element, over an RPC to
  # the dispatcher: split in blocks of _BLOCK elements (like files), not
  # single elements, or the split RPCs, not the workers, set the pace.
  ds = tf.data.Dataset.range(10**7).flat_map(_block)
  ds = ds.map(busy_udf(size), num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(_BATCH).prefetch(tf.data.AUTOTUNE)
  return with_intune(single_threaded_ops(ds), policy="even", name="bench")


def measure(cluster: Cluster, size: int, warmup: float, seconds: float,
            compression: str | None) -> float:
  """Rows/s read from `cluster` (a new job) after `warmup` seconds."""
  ds = pipeline(size).apply(tf.data.experimental.service.distribute(
      "distributed_epoch", f"grpc://{cluster.address}",
      compression=compression))
  it = iter(ds)
  rate(it, warmup)
  rows_per_s = rate(it, seconds) * _BATCH
  del it
  return rows_per_s


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--repeats", type=arguments.positive_int, default=5)
  parser.add_argument("--seconds", type=arguments.duration, default=8.0)
  parser.add_argument("--warmup", type=arguments.optional_duration, default=3.0)
  parser.add_argument("--layouts", default="shared,pinned")
  parser.add_argument("--udf-ms", type=arguments.positive_float, default=0.5,
                      help="single-threaded cost of the UDF per element")
  parser.add_argument("--compression", default="NONE",
                      choices=("NONE", "AUTO"),
                      help="distribute's compression; AUTO adds a parallel "
                      "compression map on the workers, which the even policy "
                      "gives its share of the CPUs (default NONE: elements "
                      "are 256-byte batches)")
  args = parser.parse_args()
  compression = None if args.compression == "NONE" else args.compression
  size = calibrate(args.udf_ms)
  cores = len(os.sched_getaffinity(0))
  print(f"TF {tf.__version__}, {cores} usable cores, load average "
        f"{os.getloadavg()[0]:.1f}; UDF ~{args.udf_ms} ms/element, batch "
        f"{_BATCH}, compression {args.compression}; {args.repeats} "
        f"interleaved repeats of {args.seconds:g} s after {args.warmup:g} s "
        "warm-up", flush=True)
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for layout in args.layouts.split(","):
      pinned = layout == "pinned"
      clusters = {n: Cluster(n, pinned, pathlib.Path(tmp)) for n in (1, 2)}
      try:
        results = {1: [], 2: []}
        for r in range(args.repeats):
          for n in (1, 2):  # interleaved: 1 2 1 2 ...
            results[n].append(measure(clusters[n], size, args.warmup,
                                      args.seconds, compression))
          print(f"  {layout} repeat {r + 1}: 1 worker {results[1][-1]:,.0f}"
                f" rows/s, 2 workers {results[2][-1]:,.0f}", flush=True)
      finally:
        for c in clusters.values():
          c.stop()
      paired = median([b / a for a, b in zip(results[1], results[2])])
      rows.append((layout, results, paired))
  print()
  print("| layout | workers | rows/s median | min | max | 2 vs 1 (medians) "
        "| 2 vs 1 (median of paired) |")
  print("|---|---|---|---|---|---|---|")
  for layout, results, paired in rows:
    ratio = median(results[2]) / median(results[1])
    for n in (1, 2):
      extra = (f"{ratio:.2f}x | {paired:.2f}x" if n == 2 else " | ")
      print(f"| {layout} | {n} | {median(results[n]):,.0f} | "
            f"{min(results[n]):,.0f} | {max(results[n]):,.0f} | {extra} |")


if __name__ == "__main__":
  main()
