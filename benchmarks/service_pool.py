"""A dispatcher that sizes its own pool, live: `--workers local:1-2`.

Starts `intune service dispatcher --workers local:1-2` (pool period 2 s,
minimum interval 5 s), waits for its first worker, then reads a tuned
pipeline (a ~0.3 ms UDF per element, parallel map on AUTOTUNE, prefetch;
policy "even") distributed with dynamic sharding, through
`service.ConsumerMeter`, as fast as it comes (a trainer that computes
nothing, so it waits for input). Every 10 s it prints the elements read and
the pool the dispatcher reports (`service.dispatcher_pool`). This shows the
loop working end to end; it is not the benchmark of issue 47 (fast, slow,
fast consumer against fixed pools and the baselines).

Run: `python benchmarks/service_pool.py [--seconds 300]`.
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


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seconds", type=float, default=300.0,
                      help="How long to read once the pool serves.")
  args = parser.parse_args()
  start = time.monotonic()

  def say(*parts):
    print(f"{time.monotonic() - start:7.1f} s", *parts, flush=True)

  status_dir = pathlib.Path(tempfile.mkdtemp(prefix="intune-pool-"))
  os.environ["INTUNE_STATUS_DIR"] = str(status_dir)
  port = _free_port()
  intune = str(pathlib.Path(sys.executable).with_name("intune"))
  log = open(status_dir / "dispatcher.log", "wb")
  dispatcher = subprocess.Popen(
      [intune, "service", "dispatcher", "--port", str(port), "--workers",
       "local:1-2", "--pool-period", "2", "--pool-min-interval", "5"],
      stdout=log, stderr=subprocess.STDOUT)
  try:
    import tensorflow as tf  # noqa: PLC0415  (after the dispatcher starts)

    import intune_tf  # noqa: PLC0415
    from intune_tf import service  # noqa: PLC0415
    from intune_tf.bench import demo  # noqa: PLC0415

    address = f"127.0.0.1:{port}"
    while not (service.dispatcher_pool(address) or {}).get("serving"):
      if dispatcher.poll() is not None:
        raise SystemExit(f"the dispatcher exited; see {log.name}")
      time.sleep(1)
    say("pool serving 1 worker")
    ds = tf.data.Dataset.range(10**9)
    ds = ds.map(demo.busy_udf(2000), num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.experimental_intune = intune_tf.IntuneOptions(
        policy="even", cpu_budget=2, period_s=0.25, name="svc")
    ds = ds.with_options(options).apply(
        tf.data.experimental.service.distribute(
            "distributed_epoch", f"grpc://{address}"))
    meter = service.ConsumerMeter(address)
    began = last = time.monotonic()
    count = shown = 0
    for _ in meter.iterate(ds.as_numpy_iterator()):
      count += 1
      now = time.monotonic()
      if now - last >= 10:
        info = service.dispatcher_pool(address) or {}
        say(f"{(count - shown) / (now - last):6.0f} elements/s; pool size "
            f"{info.get('size')}, serving {info.get('serving')}: "
            f"{info.get('reason')}")
        last, shown = now, count
        if now - began >= args.seconds:
          break
    for event in (service.dispatcher_pool(address) or {}).get(
        "decisions", []):
      say("decision:", event)
    meter.close()
  finally:
    dispatcher.send_signal(signal.SIGTERM)
    try:
      dispatcher.wait(60)
    except subprocess.TimeoutExpired:
      dispatcher.kill()
    log.close()


if __name__ == "__main__":
  main()
