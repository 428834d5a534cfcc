"""Sizing a tf.data service pool live: a consumer fast, slow, then fast.

Each run starts `intune service dispatcher --workers local:MIN-MAX` (pool
period 2 s, minimum interval 5 s) and waits until MIN workers serve. The
trainer then reads `3 * --phase` batches of `--batch` rows of a repeated
dataset, `distributed_epoch`, through `service.ConsumerMeter`: each row
costs the worker a `busy_udf(--udf-size)` of CPU (a map on 1 thread:
`cpu_budget=1`, so one worker is one CPU's worth). The trainer prefetches
`--prefetch` batches and "computes" each by sleeping (an accelerator step,
which takes none of the host's CPU): `--step-ms` in the first and last
third, 4x as long in the middle one. Unless given, `--step-ms` is
calibrated first (`calibrate`: fixed pools of 1 and 2 workers read by a
consumer that does not wait), so that 2 workers deliver 1/`--fast-share`
of the fast pace on any machine.

Pools, interleaved, `--repeats` times (the order rotates each round):
InTune's controller on local:1-4, with one warm standby process
(`--pool-standby 1`, the default) and without (`intune-cold`); fixed pools
of 1, 2, 3 and 4 workers; TensorFlow's formula (`tf-formula`, its estimate
applied as if it scaled) and Cachew's hill climb (`cachew`), both on
local:1-4 with the standby.

Per run: the whole run's time (first element asked to the last one's step
done; the iterator's teardown after it is printed apart),
worker-seconds (the pool's asked-for size, read from the dispatcher's
status every 0.25 s, over the run), standby-seconds (the warm processes
kept beside it, which serve nothing and use no CPU while they wait), the
changes the dispatcher logged during the run, and each phase's seconds.
Prints each run, then per pool the medians and the ratios to the best fixed
pool (by median time) and to the fixed pool whose time matches.

Run: `python benchmarks/service_pool.py [--repeats 5]` (about 20 minutes a
round on 2 cores, after a minute of calibration).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from intune_tf import arguments

POOLS = {  # name: (--workers, --pool-controller, --pool-standby)
    "intune": ("local:1-4", "intune", "1"),
    "intune-cold": ("local:1-4", "intune", "0"),
    "fixed-1": ("local:1-1", "intune", "1"),
    "fixed-2": ("local:2-2", "intune", "1"),
    "fixed-3": ("local:3-3", "intune", "1"),
    "fixed-4": ("local:4-4", "intune", "1"),
    "tf-formula": ("local:1-4", "tf-formula", "1"),
    "cachew": ("local:1-4", "cachew", "1"),
}
# A change the dispatcher logged, with its glog time stamp (local time, no
# year): "I1129 13:11:22.045359 ... Worker pool 1 -> 2: <reason>".
_CHANGE = re.compile(r"^I(\d\d)(\d\d) (\d\d):(\d\d):(\d\d\.\d+) .*"
                     r"Worker pool \d+ -> \d+: ", re.MULTILINE)


@dataclasses.dataclass
class Run:
  pool: str
  seconds: float
  worker_seconds: float
  standby_seconds: float
  changes: int
  elements: int
  phases: tuple[float, ...] = ()  # seconds of the fast, slow, fast phase


def _free_port() -> int:
  import socket  # noqa: PLC0415
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def one_run(name: str, args: argparse.Namespace, say) -> Run:
  """Starts a dispatcher with the pool `name`, reads one epoch through it,
  stops it; returns the run's figures."""
  import tensorflow as tf  # noqa: PLC0415

  import intune_tf  # noqa: PLC0415
  from intune_tf import service  # noqa: PLC0415
  from intune_tf.bench import demo  # noqa: PLC0415

  spec, controller, standby = POOLS[name]
  low = int(spec.split(":")[1].split("-")[0])
  status_dir = pathlib.Path(tempfile.mkdtemp(prefix="intune-pool-bench-"))
  port = _free_port()
  address = f"127.0.0.1:{port}"
  log_path = status_dir / "dispatcher.log"
  env = dict(os.environ, INTUNE_STATUS_DIR=str(status_dir),
             TF_CPP_MIN_LOG_LEVEL="1")
  intune = str(pathlib.Path(sys.executable).with_name("intune"))
  with open(log_path, "wb") as log:
    dispatcher = subprocess.Popen(
        [intune, "service", "dispatcher", "--port", str(port), "--workers",
         spec, "--pool-controller", controller, "--pool-period", "2",
         "--pool-min-interval", "5", "--pool-standby", standby],
        stdout=log, stderr=subprocess.STDOUT,
        env=env)
  try:
    while ((service.dispatcher_pool(address, status_dir) or {}).get(
        "serving", 0) < low):
      if dispatcher.poll() is not None:
        raise SystemExit(f"the dispatcher exited; see {log_path}")
      time.sleep(0.25)
    total = 3 * args.phase
    # Repeated, as a trainer's input usually is (`steps_per_epoch`): a
    # worker stopped mid-epoch would hold a finite epoch's end until its
    # address serves again.
    ds = tf.data.Dataset.range(10**9).map(
        demo.busy_udf(args.udf_size), num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(args.batch)
    options = tf.data.Options()
    options.experimental_intune = intune_tf.IntuneOptions(
        policy="even", cpu_budget=1, name="pool-bench",
        host_share=not args.no_host_share)
    ds = ds.with_options(options).apply(
        tf.data.experimental.service.distribute(
            "distributed_epoch", f"grpc://{address}",
            job_name=f"bench-{port}")).take(total).prefetch(args.prefetch)
    # The trainer's own pipeline (past `distribute`: plain tf.data) without
    # tf.data's autotune: its model thread can miss the wake-up of the
    # iterator's teardown and hold it until its next pass, up to 60 s later
    # (docs/service.md); the same for every pool, and not the pool's time.
    trainer_options = tf.data.Options()
    trainer_options.autotune.enabled = False
    ds = ds.with_options(trainer_options)
    sizes: list[tuple[float, int]] = []
    standbys: list[tuple[float, int]] = []
    done = threading.Event()

    def sample():
      while not done.is_set():
        info = service.dispatcher_pool(address, status_dir) or {}
        if "size" in info:
          sizes.append((time.monotonic(), int(info["size"])))
          standbys.append((time.monotonic(), int(info.get("standby", 0))))
        done.wait(0.25)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    meter = service.ConsumerMeter(address, status_dir=str(status_dir))
    step_s = args.step_ms / 1000.0
    count = 0
    start = end = time.monotonic()
    marks = [start]
    wall_start = time.time()
    for _ in meter.iterate(ds.as_numpy_iterator()):
      slow = args.phase <= count < 2 * args.phase
      time.sleep(step_s * (4 if slow else 1))
      count += 1
      end = time.monotonic()
      if count % args.phase == 0:
        marks.append(end)
    # The iterator's end and teardown are not the pool's.
    teardown = time.monotonic() - end
    wall_end = time.time() - teardown
    done.set()
    sampler.join()
    meter.close()
  finally:
    dispatcher.send_signal(signal.SIGTERM)
    try:
      dispatcher.wait(60)
    except subprocess.TimeoutExpired:
      dispatcher.kill()
  worker_seconds = _integral(sizes, start, end, low)
  standby_seconds = _integral(standbys, start, end, 0)
  changes = changes_between(log_path.read_text(errors="replace"),
                            wall_start, wall_end)
  phases = tuple(b - a for a, b in zip(marks, marks[1:]))
  run = Run(name, end - start, worker_seconds, standby_seconds, changes,
            count, phases)
  say(f"{name:11s} {run.seconds:7.1f} s {run.worker_seconds:7.1f} "
      f"worker-s {run.standby_seconds:6.1f} standby-s {run.changes:3d} "
      f"changes {run.elements} elements, phases "
      f"{'/'.join(f'{p:.1f}' for p in phases)} s (teardown {teardown:.1f} s)")
  return run


def calibrate(args: argparse.Namespace, say, phase: int = 60) -> float:
  """The fast step (ms) at which the consumer asks `--fast-share` of what a
  fixed pool of 2 workers delivers to a consumer that does not wait (its
  rows/s over the last two of three phases of `phase` batches: the first
  holds the pipelines' start-up). A machine of another speed keeps the
  set-up: 1 worker short of the fast pace, 2 enough, 1 enough for the slow
  one. Prints what 1 and 2 workers delivered."""
  free = argparse.Namespace(**dict(vars(args), step_ms=0.0, phase=phase))
  rates = {}
  for name in ("fixed-1", "fixed-2"):
    run = one_run(name, free, say)
    rates[name] = 2 * phase * args.batch / sum(run.phases[1:])
  step_ms = 1000.0 * args.batch / (args.fast_share * rates["fixed-2"])
  fast = args.batch / step_ms * 1000
  say(f"calibration: 1 worker {rates['fixed-1']:.0f} rows/s "
      f"({rates['fixed-1'] / fast:.2f} of the fast pace), 2 workers "
      f"{rates['fixed-2']:.0f} ({rates['fixed-2'] / fast:.2f}); fast step "
      f"{step_ms:.1f} ms, slow {4 * step_ms:.1f} ms")
  return step_ms


def changes_between(log: str, start: float, end: float) -> int:
  """The pool changes in a dispatcher's `log` stamped within [start, end]
  (Unix times; a log's stamps are local time, of the year of `start`):
  what the controller decided while the trainer read, not after it
  stopped."""
  year = datetime.datetime.fromtimestamp(start).year
  count = 0
  for month, day, hour, minute, second in _CHANGE.findall(log):
    stamp = datetime.datetime(year, int(month), int(day), int(hour),
                              int(minute)).timestamp() + float(second)
    count += start <= stamp <= end
  return count


def _integral(samples: list[tuple[float, int]], start: float, end: float,
              initial: int) -> float:
  """The integral over [start, end] of a step function sampled as
  (time, value): each value holds until the next sample; `initial` before
  the first."""
  total, t, value = 0.0, start, initial
  for when, size in samples:
    if when <= start:
      value = size
      continue
    if when >= end:
      break
    total += value * (when - t)
    t, value = when, size
  return total + value * (end - t)


def summary(runs: list[Run]) -> str:
  """Per pool: medians, and the ratios the issue's bars use."""
  by = {}
  for r in runs:
    by.setdefault(r.pool, []).append(r)
  med = {p: (statistics.median(r.seconds for r in rs),
             statistics.median(r.worker_seconds for r in rs),
             statistics.median(r.changes for r in rs), len(rs),
             statistics.median(r.standby_seconds for r in rs),
             "/".join(f"{statistics.median(ph):.1f}" for ph in
                      zip(*(r.phases for r in rs))))
         for p, rs in by.items()}
  fixed = {p: m for p, m in med.items() if p.startswith("fixed-")}
  lines = ["| pool | runs | time (s), median | worker-s, median | "
           "standby-s, median | changes, median | phases (s), median | "
           "time / best fixed | worker-s / matching fixed |",
           "|---|---|---|---|---|---|---|---|---|"]
  best = min(fixed.values(), key=lambda m: m[0]) if fixed else None
  for p, (t, ws, ch, n, sb, ph) in med.items():
    ratio_t = f"{t / best[0]:.3f}" if best else "-"
    # The fixed pool whose time matches: the smallest within 5% of this
    # pool's time, else the fastest.
    matching = [m for m in sorted(fixed.values(), key=lambda m: m[1])
                if m[0] <= 1.05 * t]
    match = matching[0] if matching else best
    ratio_w = f"{ws / match[1]:.3f}" if match else "-"
    lines.append(f"| {p} | {n} | {t:.1f} | {ws:.1f} | {sb:.1f} | {ch:g} | "
                 f"{ph} | {ratio_t} | {ratio_w} |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=arguments.positive_int, default=5)
  parser.add_argument("--phase", type=arguments.positive_int, default=200,
                      help="Batches per phase (default 200).")
  parser.add_argument("--batch", type=arguments.positive_int, default=20,
                      help="Rows per batch (default 20).")
  parser.add_argument("--udf-size",
                      type=arguments.positive_int, default=190_000,
                      help="busy_udf size per element (default 190,000).")
  parser.add_argument("--step-ms", type=arguments.positive_float, default=None,
                      help="The fast consumer's step per batch (default: "
                      "calibrated, `calibrate`).")
  parser.add_argument("--fast-share",
                      type=arguments.positive_float, default=0.85,
                      help="The calibrated fast pace as a share of what 2 "
                      "workers deliver (default 0.85).")
  parser.add_argument("--prefetch", type=arguments.positive_int, default=4,
                      help="Batches the trainer prefetches from the "
                      "service (default 4).")
  parser.add_argument("--pools", nargs="+", default=list(POOLS),
                      choices=list(POOLS))
  parser.add_argument("--no-host-share", action="store_true",
                      help="The workers' pipelines keep per-process budgets "
                      "(IntuneOptions(host_share=False)) instead of sharing "
                      "the host through the arbiter.")
  args = parser.parse_args()
  start = time.monotonic()

  def say(*parts):
    print(f"{time.monotonic() - start:7.1f} s", *parts, flush=True)

  if not 0 < args.fast_share < 2:
    parser.error(f"--fast-share must be in (0, 2), got {args.fast_share}")
  if args.step_ms is None:
    args.step_ms = calibrate(args, say)
  print(f"busy_udf size {args.udf_size}, batch {args.batch}, fast step "
        f"{args.step_ms:.1f} ms ({args.batch / args.step_ms * 1000:.0f} "
        "rows/s)", flush=True)

  # Killed (SIGTERM), stop the run's dispatcher and its workers too (the
  # `finally` of `one_run`): they would outlive it and load the machine.
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
  runs = []
  names = list(args.pools)
  for i in range(args.repeats):
    order = names[i % len(names):] + names[:i % len(names)]
    for name in order:
      runs.append(one_run(name, args, say))
  print(summary(runs))


if __name__ == "__main__":
  main()
