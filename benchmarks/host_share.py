"""Several InTune processes on one host: throughput, fairness and memory.

Throughput and fairness (the default). Each group runs its jobs as separate
processes at once, each with its own pipeline and a plain `next()` consumer:
`2x-l4` (two Criteo L4 batch-4096 jobs), `4x-l4`, and `l4+image` (L4 beside
the image-augment pipeline). Each group runs under the `--modes`, in 5
interleaved repeats (the modes' order rotates every repeat): `autotune`
(tf.data AUTOTUNE everywhere), `autotune-pinned` (AUTOTUNE with job i started
on CPU i mod C alone, as `taskset` would: the placement the arbiter gives
input-bound jobs, by hand), `intune-alone` (InTune with `host_share=False`:
each process plans for the whole host), `intune-shared` (InTune with the host
arbiter) and, only when named, `intune-weighted` (the arbiter with job i given
`host_weight` `--weights[i]`). Every process of a run imports and builds its
pipeline, pulls until a common start time (the warm-up), then counts rows for
`--seconds`; a process that was not ready by the start time is reported late
and its run discarded. Each run gets its own lease folder. Printed per run:
each job's rows/s, the total and Jain's fairness index; then per group and
mode the medians, and per repeat the ratios of the total to AUTOTUNE's. Jain's
index is taken over each job's rows/s divided by the same job's median rows/s
under AUTOTUNE in that group (so pipelines of different row costs compare; for
alike jobs it is the index of the raw rates). The mean of those speedups is
printed too: for unlike jobs (an image row costs about 25 L4 rows) the total
rows/s counts mostly the cheaper pipeline's.

Memory (`--memory LIMIT_MB`). Two processes run under one real cgroup memory
limit (a child of this process's memory cgroup: v2 memory.max with swap 0, or
v1 memory.limit_in_bytes), each reading 8 MB elements through
`prefetch(AUTOTUNE)` with a bursty consumer (a pause of 0.3 s every 50
elements), for `--seconds`; under the three modes, interleaved, `--repeats`
times. Printed per run: whether each process completed (exit 0) or was killed
(the cgroup's oom_kill count), and the cgroup's peak memory against the limit;
then N of N per mode.

The goal (issue 34): shared's total at least 1.15x AUTOTUNE's and at least
alone's, with fairness at least 0.9; under the memory limit, every shared run
completes. The figures need a quiet machine.

Run: `python benchmarks/host_share.py [--repeats 5] [--seconds 20] [--groups
2x-l4,4x-l4,l4+image] [--modes autotune,...] [--weights 4,1] [--setup 60]
[--memory 1500]`.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import _memcg

from intune_tf import arguments

MODES = {
    "autotune": None,
    "autotune-pinned": None,
    "intune-alone": {"host_share": False},
    "intune-shared": {"host_share": True},
    "intune-weighted": {"host_share": True},
}
# The modes run when `--modes` is not given.
DEFAULT_MODES = ("autotune", "autotune-pinned", "intune-alone",
                 "intune-shared")
GROUPS = {
    "2x-l4": ("criteo-l4-b4096",) * 2,
    "4x-l4": ("criteo-l4-b4096",) * 4,
    "l4+image": ("criteo-l4-b4096", "image-augment"),
}
# Modes whose job i runs on CPU i mod C only.
PINNED = frozenset({"autotune-pinned"})
# Seconds every process of a run gets to import TensorFlow, build its
# pipeline and warm up before the common start.
SETUP_S = 60.0
_MB = 1 << 20


def jain_index(values: list[float]) -> float:
  """Jain's fairness index: (sum x)^2 / (n * sum x^2), 1 when all are equal,
  1/n when one takes everything.

  >>> jain_index([2.0, 2.0])
  1.0
  >>> jain_index([3.0, 1.0])  # 16 / (2 * 10)
  0.8
  >>> jain_index([1.0, 0.0, 0.0, 0.0])  # 1 / (4 * 1)
  0.25
  """
  squares = sum(v * v for v in values)
  if not values or squares == 0:
    return 0.0
  return sum(values) ** 2 / (len(values) * squares)


def _child_throughput(scenario_name: str, mode: str, start_at: float,
                      seconds: float, index: int, weight: float) -> dict:
  """Job `index`: rows/s of `scenario_name` under `mode` from `start_at`,
  with `host_weight` `weight` in `intune-weighted`."""
  if mode in PINNED:  # before TensorFlow sizes its thread pools
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[index % len(cpus)]})
  import intune_tf  # noqa: PLC0415 (the parent never loads TensorFlow)
  from intune_tf.bench import meter as meter_lib  # noqa: PLC0415
  from intune_tf.bench import scenarios  # noqa: PLC0415
  scenario = scenarios.get(scenario_name)
  ds = scenario.make(None)
  fields = MODES[mode]
  if fields is not None:
    if mode == "intune-weighted":
      fields = dict(fields, host_weight=weight)
    ds = intune_tf.tune(ds, warm_start=False, cache=False, **fields)
  it = iter(ds)
  next(it)
  late = time.time() > start_at
  while time.time() < start_at:
    next(it)
  meter = meter_lib.pull(it, seconds,
                         rows_of=lambda _: scenario.rows_per_element)
  return {"rows_per_s": meter.rows_per_s, "late": late}


def _child_memory(mode: str, seconds: float) -> dict:
  """One process of the memory run: 8 MB elements, bursty consumer."""
  import tensorflow as tf  # noqa: PLC0415

  import intune_tf  # noqa: PLC0415 (the parent never loads TensorFlow)
  ds = tf.data.Dataset.range(10**9).map(
      lambda x: tf.fill([2 * _MB], tf.cast(x, tf.float32))).prefetch(
          tf.data.AUTOTUNE)
  if MODES[mode] is not None:
    ds = intune_tf.tune(ds, warm_start=False, cache=False, **MODES[mode])
  it = iter(ds)
  end = time.monotonic() + seconds
  n = 0
  while time.monotonic() < end:
    next(it)
    n += 1
    if n % 50 == 0:
      time.sleep(0.3)
  return {"elements": n}


def _launch(args: list[str], host_dir: str, cgroup: pathlib.Path | None
            ) -> subprocess.Popen:
  env = dict(os.environ, INTUNE_HOST_DIR=host_dir, INTUNE_STATUS="off",
             TF_CPP_MIN_LOG_LEVEL="2")

  def enter():
    if cgroup is not None:
      (cgroup / "cgroup.procs").write_text(str(os.getpid()))

  return subprocess.Popen([sys.executable, __file__, "--child", *args],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env, preexec_fn=enter)


def _result(proc: subprocess.Popen, timeout: float) -> dict:
  """The child's last JSON line, or {"error": why} (a timeout, or its exit
  status with the last line of its stderr)."""
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.communicate()
    return {"error": f"no result in {timeout:g} s"}
  lines = [line for line in out.splitlines() if line.startswith("{")]
  if proc.returncode == 0 and lines:
    return json.loads(lines[-1])
  last = (err.strip().splitlines() or [""])[-1][:160]
  return {"error": f"exit status {proc.returncode}: {last}"}


def run_group(jobs: tuple[str, ...], mode: str, seconds: float,
              setup_s: float = SETUP_S,
              weights: tuple[float, ...] = ()) -> list[dict | None]:
  """One run: `jobs` at once under `mode`; one result per job. Job i has
  host weight `weights[i]` (default (): 1 each)."""
  with tempfile.TemporaryDirectory(prefix="intune-host-") as host_dir:
    start_at = time.time() + setup_s
    weights = weights or (1.0,) * len(jobs)
    procs = [_launch(["throughput", job, mode, repr(start_at),
                      repr(seconds), str(i), repr(weights[i])], host_dir,
                     None)
             for i, job in enumerate(jobs)]
    return [_result(p, setup_s + seconds + 60) for p in procs]


def throughput(groups: list[str], modes: list[str], repeats: int,
               seconds: float, setup_s: float = SETUP_S,
               weights: tuple[float, ...] = ()) -> None:
  totals: dict[tuple[str, str], list[float]] = {}
  rates: dict[tuple[str, str], list[list[float]]] = {}
  for repeat in range(repeats):
    order = modes[repeat % len(modes):] + modes[:repeat % len(modes)]
    for group in groups:
      for mode in order:
        results = run_group(GROUPS[group], mode, seconds, setup_s, weights)
        if any("error" in r or r["late"] for r in results):
          print(f"repeat {repeat + 1} {group} {mode}: a process failed or "
                f"was late ({results}); run discarded", flush=True)
          continue
        per_job = [r["rows_per_s"] for r in results]
        totals.setdefault((group, mode), []).append(sum(per_job))
        rates.setdefault((group, mode), []).append(per_job)
        print(f"repeat {repeat + 1} {group} {mode}: "
              + ", ".join(f"{r:,.0f}" for r in per_job)
              + f" rows/s, total {sum(per_job):,.0f}", flush=True)
  print("\n| group | mode | total rows/s (median) | per job rows/s (medians)"
        " | Jain (median) | total vs autotune (median) | mean speedup "
        "(median) |\n|---|---|---|---|---|---|---|")
  for group in groups:
    base_runs = rates.get((group, "autotune"), [])
    base = ([statistics.median(col) for col in zip(*base_runs)]
            if base_runs else None)
    for mode in modes:
      runs = rates.get((group, mode), [])
      if not runs:
        continue
      jobs = [statistics.median(col) for col in zip(*runs)]
      jain = statistics.median(
          jain_index([r / b for r, b in zip(run, base)]) if base
          else jain_index(run) for run in runs)
      speedup = (statistics.median(
          statistics.mean(r / b for r, b in zip(run, base)) for run in runs)
                 if base else float("nan"))
      auto = totals.get((group, "autotune"), [])
      ratio = (statistics.median(t / a for t, a in
                                 zip(totals[(group, mode)], auto))
               if auto else float("nan"))
      total = statistics.median(totals[(group, mode)])
      print(f"| {group} | {mode} | {total:,.0f}"
            f" | {', '.join(f'{j:,.0f}' for j in jobs)} | {jain:.3f} | "
            f"{ratio:.2f}x | {speedup:.2f}x |")


def memory(limit_mb: int, modes: list[str], repeats: int,
           seconds: float) -> None:
  done = {mode: 0 for mode in modes}
  for repeat in range(repeats):
    turn = repeat % len(modes)
    for mode in modes[turn:] + modes[:turn]:
      with _memcg.memory_cgroup(limit_mb * _MB,
                                "intune-host-share") as (cg, v2), (
          tempfile.TemporaryDirectory(prefix="intune-host-")) as host_dir:
        procs = [_launch(["memory", mode, repr(seconds)], host_dir, cg)
                 for _ in range(2)]
        results = [_result(p, SETUP_S + seconds + 60) for p in procs]
        peak, kills = _memcg.peak(cg, v2), _memcg.oom_kills(cg, v2)
      ok = sum("error" not in r for r in results)
      done[mode] += ok == 2
      errors = "; ".join(r["error"] for r in results if "error" in r)
      print(f"repeat {repeat + 1} {mode}: {ok} of 2 completed, "
            f"{kills} OOM kills, peak {peak / _MB:,.0f} MB of "
            f"{limit_mb:,} MB" + (f" ({errors})" if errors else ""),
            flush=True)
  for mode in modes:
    print(f"{mode}: both processes completed in {done[mode]} of {repeats} "
          "runs")


def main() -> None:
  if len(sys.argv) > 1 and sys.argv[1] == "--child":
    kind, rest = sys.argv[2], sys.argv[3:]
    if kind == "throughput":
      result = _child_throughput(rest[0], rest[1], float(rest[2]),
                                 float(rest[3]), int(rest[4]),
                                 float(rest[5]))
    else:
      result = _child_memory(rest[0], float(rest[1]))
    print(json.dumps(result), flush=True)
    return
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--repeats", type=arguments.positive_int, default=5)
  parser.add_argument("--seconds", type=arguments.duration, default=20.0)
  parser.add_argument("--groups", default=",".join(GROUPS))
  parser.add_argument("--modes", default=",".join(DEFAULT_MODES))
  parser.add_argument("--setup", type=arguments.duration, default=SETUP_S,
                      help="Seconds each run's processes get to start and "
                      "warm up before the common start.")
  parser.add_argument("--memory",
                      type=arguments.positive_int,
                      default=None, metavar="LIMIT_MB",
                      help="Run the cgroup memory measurement instead.")
  parser.add_argument("--weights", default="",
                      help="Comma-separated host weights of each group's "
                      "jobs in intune-weighted (default: 1 each).")
  args = parser.parse_args()
  modes = args.modes.split(",")
  unknown = sorted(set(modes) - set(MODES))
  if unknown:
    parser.error(f"unknown modes {unknown}; valid: {sorted(MODES)}")
  if args.memory:
    memory(args.memory, modes, args.repeats, args.seconds)
  else:
    groups = args.groups.split(",")
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
      parser.error(f"unknown groups {unknown}; valid: {sorted(GROUPS)}")
    try:
      weights = tuple(float(w) for w in args.weights.split(",") if w)
    except ValueError:
      parser.error(f"--weights {args.weights!r}: give numbers, e.g. 3,1")
    if weights and any(len(weights) != len(GROUPS[g]) for g in groups):
      parser.error(f"--weights {args.weights!r}: give one per job of "
                   f"every group ({', '.join(groups)})")
    throughput(groups, modes, args.repeats, args.seconds, args.setup,
               weights)


if __name__ == "__main__":
  main()
