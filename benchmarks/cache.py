"""InTune's cache (`IntuneOptions(cache=True)`) on Criteo L4 under `model.fit`.

Rows come from `intune criteo generate` (made once into `--data-dir`). The
tiny DLRM (`intune_tf.bench.demo.tiny_dlrm`, traced once before) trains 3
epochs on the L4 pipeline, one `fit` per variant and repeat, interleaved
(the order rotates each repeat), each on new dataset objects, so that every
cache starts empty:

- `autotune`: the pipeline as written, TF's AUTOTUNE;
- `intune`: `intune_tf.tune(..., cache=False)`;
- `intune cache`: `intune_tf.tune(..., cache=True)`;
- `hand .cache()`: AUTOTUNE with a `.cache()` where InTune puts its own, the
  deepest point that repeats each epoch (after the read, below the shuffle
  that reshuffles each epoch and the noise of the features stage);
- `bound`: the same `fit` fed from the preprocessed epoch already in memory
  (the whole pipeline's output cached by a `.cache()` filled before the
  timer starts): what the model's own steps allow.

Then a one-epoch job, interleaved: `intune` against `intune cache`.
Reported: whole-`fit` seconds (median), per-epoch medians, process
CPU-seconds, medians of the ratios paired within a repeat.

Run: `python benchmarks/cache.py [--rows 100000] [--repeats 5]`;
`--epoch-mb 300` sizes the rows so that one preprocessed epoch holds about
300 MB, which takes much longer.

`--pipeline FILE.py:FUNCTION` runs the same interleaving on your own
pipeline, read (no model; `--step-ms` sleeps after each element, `--take`
limits an epoch) in this one process, as `autotune`, `intune` and `intune
cache`: the figures `intune try` measures in a fresh process per run.
`--json F` writes its speed-ups.

`--half-budget` instead runs `intune cache` under a RAM budget that holds
half of what its cache holds for a whole epoch (the buffers' peak plus half
the cache's bytes, measured here first), against `autotune` and `intune`,
interleaved. Each fit runs in a child process of its own (the model traced
first), so that no fit pays for the heap another left. The cached one runs
under a real memory cgroup (the others unlimited) whose limit is the
highest peak of children with `autotune` and `intune` (two each), plus
their spread (the most and the least of those peaks apart), plus that
budget. Reported: the times, the bytes cached and the fraction of each
epoch served from them (a probe child under the same limit), each
variant's highest peak against the limit, and the OOM kills.
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import _memcg
import keras
import numpy as np
import tensorflow as tf

import intune_tf
from intune_tf import arguments
from intune_tf import host
from intune_tf.bench import demo
from intune_tf.bench import trial
from intune_tf.criteo import pipelines
from intune_tf.criteo import reader

LEVEL = 4


def _files(rows: int, data_dir: str) -> list[str]:
  out = os.path.join(data_dir, f"rows-{rows}")
  files = sorted(glob.glob(os.path.join(out, "*.tsv")))
  if files:
    return files
  os.makedirs(data_dir, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f"rows-{rows}-", dir=data_dir)
  subprocess.run([sys.executable, "-m", "intune_tf", "criteo", "generate",
                  "--rows", str(rows), "--out", tmp, "--rows-per-file",
                  str(max(1, rows // 4)), "--quiet"], check=True,
                 stdout=subprocess.DEVNULL)
  os.rename(tmp, out)
  return sorted(glob.glob(os.path.join(out, "*.tsv")))


# "text" (the L4 pipeline of `pipelines.pipeline`) or "tfrecord" (its stages
# over TFRecord Examples, `pipelines.examples_pipeline`); set by main.
_SOURCE = ["text"]


def _records(files, data_dir: str) -> list[str]:
  """`files` converted to TFRecord Examples once, into `data_dir`."""
  out = os.path.join(data_dir, os.path.basename(os.path.dirname(files[0])) +
                     "-tfrecord")
  records = sorted(glob.glob(os.path.join(out, "*.tfrecord")))
  if records:
    return records
  subprocess.run([sys.executable, "-m", "intune_tf", "criteo", "convert",
                  "--out", out, "--rows-per-file",
                  str(max(1, sum(1 for _ in open(files[0])))), "--quiet",
                  *files], check=True, stdout=subprocess.DEVNULL)
  return sorted(glob.glob(os.path.join(out, "*.tfrecord")))


def _pipeline(files, batch_size: int, hand_cache: bool = False):
  """The L4 pipeline, one epoch per iterator (as `fit` reads it); with
  `hand_cache`, a `.cache()` right after the read stage."""
  if _SOURCE[0] == "tfrecord":
    return pipelines.examples_pipeline(LEVEL, files, batch_size=batch_size,
                                       seed=0, cache_records=hand_cache)
  if not hand_cache:
    return pipelines.pipeline(LEVEL, files, batch_size=batch_size, seed=0)
  lines = reader.lines_dataset
  pipelines.reader.lines_dataset = lambda *a, **k: lines(*a, **k).cache()
  try:
    return pipelines.pipeline(LEVEL, files, batch_size=batch_size, seed=0)
  finally:
    pipelines.reader.lines_dataset = lines


def _row_bytes(files, batch_size: int) -> float:
  batch = next(iter(_pipeline(files, batch_size)))
  rows = int(tf.shape(batch[1])[0])
  return sum(int(np.asarray(t).nbytes)
             for t in tf.nest.flatten(batch)) / rows


class _EpochTimes(keras.callbacks.Callback):

  def __init__(self):
    super().__init__()
    self.times = []

  def on_epoch_begin(self, epoch, logs=None):
    self._start = time.perf_counter()

  def on_epoch_end(self, epoch, logs=None):
    self.times.append(time.perf_counter() - self._start)


def _variant(name: str, files, batch_size: int):
  """The dataset of `name`, new (every cache empty), and a fill step that
  runs before the timer (the bound's preprocessed epoch)."""
  if name == "autotune":
    return _pipeline(files, batch_size)
  if name == "intune":
    return intune_tf.tune(_pipeline(files, batch_size), cache=False)
  if name == "intune cache":
    return intune_tf.tune(_pipeline(files, batch_size), cache=True)
  if name.startswith("intune cache budget="):
    return intune_tf.tune(_pipeline(files, batch_size), cache=True,
                          ram_budget=int(name.split("=", 1)[1]))
  if name == "hand .cache()":
    return _pipeline(files, batch_size, hand_cache=True)
  if name == "bound":
    ds = _pipeline(files, batch_size).cache()
    for _ in ds:  # fill: the preprocessed epoch in memory
      pass
    return ds
  raise ValueError(name)


def _fit(model, ds, epochs: int) -> tuple[float, float, list[float]]:
  """(seconds, process CPU-seconds, seconds per epoch) of one `fit`."""
  gc.collect()
  times = _EpochTimes()
  cpu0, start = time.process_time(), time.perf_counter()
  model.fit(ds, epochs=epochs, verbose=0, shuffle=False, callbacks=[times])
  return time.perf_counter() - start, time.process_time() - cpu0, times.times


def run(model, names, make, epochs, repeats):
  """`repeats` interleaved rounds (the order rotates each round) of one `fit`
  per variant, each on the new dataset `make(name)`: `{name: [(seconds,
  CPU-seconds, seconds per epoch), ...]}`."""
  results = {name: [] for name in names}
  for repeat in range(repeats):
    order = names[repeat % len(names):] + names[:repeat % len(names)]
    for name in order:
      ds = make(name)
      seconds, cpu_s, per_epoch = _fit(model, ds, epochs)
      del ds
      gc.collect()
      results[name].append((seconds, cpu_s, per_epoch))
      print(f"  repeat {repeat + 1}/{repeats} {name}: {seconds:.2f} s "
            f"(epochs {' '.join(f'{t:.2f}' for t in per_epoch)}), "
            f"CPU {cpu_s:.2f} s", flush=True)
  return results


def run_reads(names, make, epochs, repeats, step_s):
  """As `run`, each run reading the new dataset `make(name)` for `epochs`
  epochs (`trial.read_epochs`) instead of fitting a model."""
  results = {name: [] for name in names}
  for repeat in range(repeats):
    order = names[repeat % len(names):] + names[:repeat % len(names)]
    for name in order:
      ds = make(name)
      gc.collect()
      cpu0, start = time.process_time(), time.perf_counter()
      per_epoch = trial.read_epochs(ds, epochs, step_s)["epoch_s"]
      seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu0
      del ds
      gc.collect()
      results[name].append((seconds, cpu_s, per_epoch))
      print(f"  repeat {repeat + 1}/{repeats} {name}: {seconds:.2f} s "
            f"(epochs {' '.join(f'{t:.2f}' for t in per_epoch)})", flush=True)
  return results


def own_pipeline(args) -> int:
  """`--pipeline`: see the module docstring."""
  try:
    trial.make_dataset(args.pipeline, args.take)
  except trial.BadInput as e:
    print(f"cache.py: {e}", file=sys.stderr)
    return 2

  def make(name):
    ds = trial.make_dataset(args.pipeline, args.take)
    if name == "autotune":
      return ds
    return intune_tf.tune(ds, cache=name == "intune cache")

  names = ["autotune", "intune", "intune cache"]
  results = run_reads(names, make, args.epochs, args.repeats,
                      args.step_ms / 1000)
  print(f"\n{args.pipeline}, {args.epochs} epochs, {args.repeats} "
        f"interleaved repeats, {host.usable_cpus()} CPUs\n")
  table(results, "autotune", args.epochs)
  it = iter(intune_tf.tune(trial.make_dataset(args.pipeline, args.take),
                           cache=True))
  next(it)
  cache = intune_tf.session_of(it).cache()
  print(f"\nintune cache: {cache['state'].value} after {cache['point']}: "
        f"{cache['reason']}")
  if args.json:
    figures = {name: paired(results, name, "autotune") for name in names[1:]}
    with open(args.json, "w") as f:
      json.dump({"speedup": {n: v[0] for n, v in figures.items()},
                 "spread": {n: [v[1], v[2]] for n, v in figures.items()},
                 "runs": results}, f, indent=1)
  return 0


def paired(results, name, base, key=lambda r: r[0]):
  ratios = [key(b) / key(a) for a, b in zip(results[name], results[base])]
  return statistics.median(ratios), min(ratios), max(ratios)


def table(results, base, epochs):
  heads = " | ".join(f"epoch {e + 1}" for e in range(epochs))
  print(f"| variant | fit s (median) | {heads} | CPU s | "
        f"speed-up vs {base} (median of paired ratios, min-max) |")
  print("|---|---|" + "---|" * epochs + "---|---|")
  for name, runs in results.items():
    epoch_medians = " | ".join(
        f"{statistics.median(r[2][e] for r in runs):.2f}"
        for e in range(epochs))
    med, lo, hi = paired(results, name, base)
    print(f"| {name} | {statistics.median(r[0] for r in runs):.2f} | "
          f"{epoch_medians} | {statistics.median(r[1] for r in runs):.2f} | "
          f"{med:.2f}x ({lo:.2f}-{hi:.2f}) |")


def one_epoch_report(single) -> None:
  """Prints the one-epoch table of `run`'s `intune` and `intune cache`, and
  their paired time and CPU ratios."""
  print("\n1 epoch:\n")
  table(single, "intune", 1)
  wall = paired(single, "intune cache", "intune")
  cpu = paired(single, "intune cache", "intune", key=lambda r: r[1])
  print(f"\none-epoch job, cache=True / cache=False (median of paired "
        f"ratios): time {1 / wall[0]:.3f}, CPU {1 / cpu[0]:.3f}")


def _cache_probe(files, batch_size: int, epochs: int,
                 ram_budget: int | None = None) -> list[dict]:
  """Per epoch of `intune cache` (one iterator each, as `fit` makes them):
  the session's cache figures, its buffers' peak bytes and its RAM budget
  at the end."""
  ds = intune_tf.tune(_pipeline(files, batch_size), cache=True,
                      ram_budget=ram_budget)
  out = []
  for _ in range(epochs):
    it = iter(ds)
    session = intune_tf.session_of(it)
    buffered = 0
    for _ in it:
      buffered = max(buffered, session.counters()["buffered_bytes"])
    out.append({**session.cache(), "buffered_peak": buffered,
                "ram_budget": session.counters()["ram_budget"]})
  return out


def _child(args) -> int:
  """`--child`: the fits of `args.child` (variants, comma-separated) and,
  with `--probe`, `_cache_probe`'s epochs, as one JSON line on stdout."""
  _SOURCE[0] = args.source
  files = _files(args.rows, args.data_dir)
  if args.source == "tfrecord":
    files = _records(files, args.data_dir)
  names = [n for n in args.child.split(",") if n]
  model = demo.tiny_dlrm()
  if names:
    model.fit(_pipeline(files, args.batch_size), epochs=1, verbose=0)
  results = run(model, names, lambda name: _variant(name, files,
                                                    args.batch_size),
                args.epochs, args.repeats) if names else {}
  probe = []
  if args.probe:
    probe = _cache_probe(files, args.batch_size, args.epochs,
                         args.probe_budget)
  print(json.dumps({"results": results, "probe": probe}), flush=True)
  return 0


def _in_cgroup(args, variants: list[str], limit: int,
               probe_budget: int | None = None) -> tuple[dict, int, int]:
  """Runs `_child` with `variants` (and with `probe_budget`, `_cache_probe`
  under that RAM budget) under a memory cgroup of `limit` bytes (unlimited:
  0): (its JSON, the cgroup's peak bytes, its OOM kills)."""
  command = [sys.executable, os.path.abspath(__file__), "--child=" +
             ",".join(variants), "--rows", str(args.rows), "--repeats",
             str(args.repeats), "--epochs", str(args.epochs), "--batch-size",
             str(args.batch_size), "--data-dir", args.data_dir,
             "--source", args.source]
  if probe_budget:
    command += ["--probe", "--probe-budget", str(probe_budget)]
  with _memcg.memory_cgroup(limit or (1 << 60), "intune-cache") as (cg, v2):
    procs = cg / "cgroup.procs"
    proc = subprocess.run(
        command, stdout=subprocess.PIPE, text=True, check=False,
        preexec_fn=lambda: procs.write_text(str(os.getpid())))
    peak, kills = _memcg.peak(cg, v2), _memcg.oom_kills(cg, v2)
  print("\n".join(line for line in proc.stdout.splitlines()
                   if not line.startswith("{")), flush=True)
  lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
  if proc.returncode != 0 or not lines:
    return {}, peak, kills
  return json.loads(lines[-1]), peak, kills


def half_budget(args, files) -> int:
  """`--half-budget`: see the module docstring."""
  full = _cache_probe(files, args.batch_size, 1)[0]
  held = full["bytes"] + full["row_store_bytes"]
  budget = full["buffered_peak"] + held // 2
  print(f"A whole epoch's cache: {full['bytes'] / 1e6:.1f} MB, and its row "
        f"store {full['row_store_bytes'] / 1e6:.1f} MB; buffers' "
        f"peak {full['buffered_peak'] / 1e6:.1f} MB; RAM budget "
        f"{budget / 1e6:.1f} MB", flush=True)
  one = argparse.Namespace(**{**vars(args), "repeats": 1})
  base = [_in_cgroup(one, [name], 0)[1]
          for name in ("autotune", "intune", "autotune", "intune")]
  base_peak, spread = max(base), max(base) - min(base)
  limit = base_peak + spread + budget
  print(f"children that fit without the cache peak at "
        f"{', '.join(f'{p / 1e6:.0f}' for p in base)} MB: the cached "
        f"one's cgroup limit is the highest, plus the spread "
        f"{spread / 1e6:.0f} MB, plus the budget: {limit / 1e6:.0f} MB",
        flush=True)
  cached = f"intune cache budget={budget}"
  names = ["autotune", "intune", cached]
  results = {name: [] for name in names}
  peaks = {name: 0 for name in names}
  kills = 0
  for repeat in range(args.repeats):
    for name in names[repeat % 3:] + names[:repeat % 3]:
      # The baselines run unlimited: AUTOTUNE's buffers can outgrow any
      # limit (one was OOM-killed at its own earlier peak plus 151 MB).
      out, peak, killed = _in_cgroup(one, [name],
                                     limit if name == cached else 0)
      kills += killed
      peaks[name] = max(peaks[name], peak)
      if not out:
        print(f"the {name} child failed: {killed} OOM kills, peak "
              f"{peak / 1e6:.0f} MB of {limit / 1e6:.0f} MB")
        return 1
      results[name] += out["results"][name]
  out, probe_peak, killed = _in_cgroup(one, [], limit, budget)
  kills += killed
  if not out:
    print(f"the probe child failed: {killed} OOM kills, peak "
          f"{probe_peak / 1e6:.0f} MB of {limit / 1e6:.0f} MB")
    return 1
  print(f"\nCriteo L{LEVEL}, {args.rows:,} rows, {args.epochs} epochs, "
        f"{args.repeats} interleaved repeats (one child each), RAM budget "
        f"{budget / 1e6:.1f} MB, cgroup limit {limit / 1e6:.0f} MB\n")
  table(results, "autotune", args.epochs)
  probe = out["probe"]
  print(f"\nUnder the budget, per epoch: cache held (MB) "
        f"{[round(e['bytes'] / 1e6, 1) for e in probe]}; served from it "
        f"{[round(e['served'], 3) for e in probe]}; row store rows "
        f"{[e['row_store_rows'] for e in probe]}, batches gathered "
        f"{[e['row_store_gathered'] for e in probe]}; highest cgroup peak "
        f"(MB): " + ", ".join(f"{n.split(' budget=')[0]} {p / 1e6:.0f}"
                              for n, p in peaks.items())
        + f", probe {probe_peak / 1e6:.0f}, of {limit / 1e6:.0f}; "
        f"{kills} OOM kills")
  return 0


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rows", type=arguments.positive_int, default=100_000,
                      help="Rows generated (default 100,000).")
  parser.add_argument("--epoch-mb", type=arguments.positive_float,
                      default=None,
                      help="Rows for a preprocessed epoch of about this many "
                      "MB (instead of --rows).")
  parser.add_argument("--repeats", type=arguments.positive_int, default=5,
                      help="Interleaved repeats (default 5).")
  parser.add_argument("--epochs", type=arguments.positive_int, default=3,
                      help="Epochs per fit (default 3).")
  parser.add_argument("--batch-size", type=arguments.positive_int, default=4096)
  parser.add_argument("--data-dir", default=os.path.expanduser(
      "~/.cache/intune_tf/cache-bench"), help="Where the rows are made.")
  parser.add_argument("--source", choices=("text", "tfrecord"),
                      default="text",
                      help="text: Criteo L4 as `pipelines.pipeline` builds "
                      "it; tfrecord: its stages over TFRecord Examples "
                      "(`pipelines.examples_pipeline`, converted once).")
  parser.add_argument("--half-budget", action="store_true",
                      help="The half-epoch RAM budget run (see above).")
  parser.add_argument("--pipeline", default=None,
                      help="FILE.py:FUNCTION: your own pipeline instead of "
                      "Criteo L4 (see above).")
  parser.add_argument("--step-ms", type=trial.milliseconds, default=0.0,
                      help="With --pipeline: ms slept after each element "
                      "(default 0).")
  parser.add_argument("--take", type=arguments.positive_int, default=None,
                      help="With --pipeline: elements per epoch (default "
                      "all).")
  parser.add_argument("--json", type=arguments.output_file, default=None,
                      help="With --pipeline: write the speed-ups here.")
  parser.add_argument("--child", help=argparse.SUPPRESS)
  parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--probe-budget",
                      type=arguments.positive_int, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  os.environ["INTUNE_WARMSTART_DIR"] = tempfile.mkdtemp(prefix="intune-ws-")
  if args.child is not None:
    return _child(args)
  if args.pipeline is not None:
    return own_pipeline(args)

  rows = args.rows
  if args.epoch_mb:
    probe = _files(20_000, args.data_dir)
    rows = int(args.epoch_mb * 1e6 / _row_bytes(probe, args.batch_size))
  files = _files(rows, args.data_dir)
  _SOURCE[0] = args.source
  if args.source == "tfrecord":
    files = _records(files, args.data_dir)
  args.rows = rows
  row_bytes = _row_bytes(files, args.batch_size)
  print(f"Criteo L{LEVEL} ({args.source}), {rows:,} generated rows in "
        f"{len(files)} files, "
        f"batch {args.batch_size}; one preprocessed epoch "
        f"{rows * row_bytes / 1e6:.0f} MB; {args.repeats} interleaved "
        f"repeats; {host.usable_cpus()} CPUs, TF {tf.__version__}", flush=True)

  if args.half_budget:
    return half_budget(args, files)
  model = demo.tiny_dlrm()
  # Build and trace the model (a full and the last, short batch's shape)
  # once, outside the measured fits.
  model.fit(_pipeline(files, args.batch_size), epochs=1, verbose=0)

  print(f"\n{args.epochs} epochs per fit:", flush=True)
  names = ["autotune", "intune", "intune cache", "hand .cache()", "bound"]

  def make(name):
    return _variant(name, files, args.batch_size)

  multi = run(model, names, make, args.epochs, args.repeats)
  print("\n1 epoch per fit:", flush=True)
  single = run(model, ["intune", "intune cache"], make, 1, args.repeats)

  print(f"\nCriteo L{LEVEL} under model.fit of the tiny DLRM, {rows:,} rows "
        f"({rows * row_bytes / 1e6:.0f} MB preprocessed per epoch), batch "
        f"{args.batch_size}, {args.repeats} interleaved repeats, "
        f"{host.usable_cpus()} CPUs\n")
  print(f"{args.epochs} epochs:\n")
  table(multi, "autotune", args.epochs)
  cached = paired(multi, "intune cache", "hand .cache()")
  bound = paired(multi, "intune cache", "bound")
  print(f"\nintune cache / hand .cache() time ratio (median of paired): "
        f"{1 / cached[0]:.3f}; intune cache / bound: {1 / bound[0]:.3f}")
  one_epoch_report(single)
  print("\nintune cache, per epoch (one tuned dataset read alone):")
  for epoch, figures in enumerate(_cache_probe(files, args.batch_size,
                                               args.epochs)):
    print(f"  epoch {epoch + 1}: cache {figures['bytes'] / 1e6:.0f} MB, "
          f"served {figures['served']:.2f}; row store "
          f"{figures['row_store_rows']:,} rows, "
          f"{figures['row_store_bytes'] / 1e6:.0f} MB, "
          f"{figures['row_store_gathered']:,} batches gathered")
  print(f"  reason: {figures['reason']}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
