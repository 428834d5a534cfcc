"""What InTune's cache holds in memory, measured as the process's RSS beside
the kernel's own count.

`structured` (the default): a pipeline of `SparseTensor` elements and one of
`RaggedTensor` elements (`--elements` of `--element-mb` each), under a RAM
budget of `--budget-mb`, over `--epochs` epochs. Each variant runs in a child
process of its own: plain tf.data (no option), and InTune with its cache.
Printed per kind: the RSS growth of each from before the first epoch to the
end of each epoch, the cached variant's growth beyond plain tf.data's
against the budget, and the bytes the kernel counts in its cache against
the bytes its elements hold (their values, indices and row splits, read in
Python), with the ratio of the two.

`fit`: a training and a validation dataset over `--epochs` epochs of
`model.fit`, with the default RAM budget, in a child process under a real
memory cgroup of `--limit-mb`: the process's budget for its caches and
buffers comes from the memory it may use there. A thread samples the
process's caches and buffers (`intune_tf.ops.session.process_caches`) every
20 ms, during and between epochs and after `fit`; printed: the samples, the
highest caches-plus-buffers against the budget in force at that sample, and
how many samples passed it.

Run: `python benchmarks/cache_memory.py [structured|fit]`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

import _memcg
import psutil

from intune_tf import arguments

MB = 1 << 20


def _structured_dataset(tf, kind: str, elements: int, element_bytes: int):
  if kind == "sparse":
    # 16 bytes of indices and 4 of value per value.
    count = element_bytes // 20

    def make(i):
      columns = tf.range(count, dtype=tf.int64)
      return tf.sparse.SparseTensor(
          tf.stack([tf.zeros_like(columns), columns], axis=1),
          tf.fill([count], tf.cast(i, tf.float32)), [1, count])
  else:
    count = element_bytes // 4

    def make(i):
      return tf.RaggedTensor.from_row_lengths(
          tf.fill([count], tf.cast(i, tf.float32)),
          [count // 2, count - count // 2], validate=False)
  return tf.data.Dataset.range(elements).map(make)


def _held_bytes(tf, element) -> int:
  """Bytes an element's tensors hold, as Python sees them."""
  if isinstance(element, tf.SparseTensor):
    parts = [element.indices, element.values, element.dense_shape]
  else:
    parts = [element.flat_values, *element.nested_row_splits]
  return sum(int(p.numpy().nbytes) for p in parts)


def _structured_child(kind: str, variant: str, args) -> dict:
  import tensorflow as tf  # noqa: PLC0415 (the child's own import)

  import intune_tf  # noqa: PLC0415

  ds = _structured_dataset(tf, kind, args.elements, args.element_mb * MB)
  if variant == "intune cache":
    options = tf.data.Options()
    options.experimental_intune = intune_tf.IntuneOptions(
        ram_budget=args.budget_mb * MB, warm_start=False)
    ds = ds.with_options(options)
  process = psutil.Process()
  before = process.memory_info().rss
  growth, stats = [], {}
  real = 0
  for _ in range(args.epochs):
    it = iter(ds)
    session = intune_tf.session_of(it) if variant == "intune cache" else None
    sizes = [_held_bytes(tf, e) for e in it]
    if session is not None:
      stats = session.cache()
      # The cache holds a prefix of the epoch: its elements' own bytes.
      real = sum(sizes[:stats["elements"]])
    del it
    growth.append(process.memory_info().rss - before)
  return {"growth": growth, "counted": stats.get("bytes", 0),
          "elements": stats.get("elements", 0), "real": real}


def _fit_child(args) -> dict:
  import keras  # noqa: PLC0415
  import tensorflow as tf  # noqa: PLC0415

  import intune_tf  # noqa: PLC0415
  from intune_tf.ops import session as session_lib  # noqa: PLC0415

  width = args.element_kb * 1024 // 4

  def data(n, seed):
    ds = tf.data.Dataset.range(n).map(
        lambda i: (tf.sin(tf.cast(tf.range(width, dtype=tf.int64) + i * seed,
                                  tf.float32)),
                   tf.cast(i % 2, tf.float32)))
    options = tf.data.Options()
    options.experimental_intune = intune_tf.IntuneOptions(warm_start=False)
    return ds.batch(32).with_options(options)

  model = keras.Sequential([keras.Input([width]), keras.layers.Dense(1)])
  model.compile("sgd", "mse")
  samples = []
  stop = threading.Event()

  def sample():
    while not stop.is_set():
      c = session_lib.process_caches()
      samples.append((time.monotonic(), c["bytes"], c["buffered"],
                      c["budget"]))
      stop.wait(0.02)

  thread = threading.Thread(target=sample, daemon=True)
  thread.start()
  train = data(args.train_elements, 1)
  validation = data(args.train_elements // 4, 2)
  model.fit(train, validation_data=validation, epochs=args.epochs, verbose=0)
  time.sleep(1.0)  # samples after fit, with both datasets alive
  stop.set()
  thread.join()
  held = [(b + f, budget) for _, b, f, budget in samples if budget > 0]
  over = [h - budget for h, budget in held if h > budget]
  return {"samples": len(samples),
          "max_held_mb": max(h for h, _ in held) / MB,
          "budget_mb_at_max": max(held)[1] / MB,
          "min_budget_mb": min(b for _, b in held) / MB,
          "max_cache_mb": max(s[1] for s in samples) / MB,
          "over": len(over), "max_over_mb": max(over, default=0) / MB}


def _run_child(argv: list[str], cgroup=None) -> dict:
  preexec = None
  if cgroup is not None:
    procs = str(cgroup / "cgroup.procs")

    def preexec():
      with open(procs, "w") as f:
        f.write(str(os.getpid()))
  out = subprocess.run([sys.executable, __file__, *argv], check=True,
                       capture_output=True, text=True, preexec_fn=preexec)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("what", nargs="?", default="structured",
                      choices=("structured", "fit"))
  parser.add_argument("--elements", type=arguments.positive_int, default=60)
  parser.add_argument("--element-mb", type=arguments.positive_int, default=32)
  parser.add_argument("--budget-mb", type=arguments.positive_int, default=64)
  parser.add_argument("--epochs", type=arguments.positive_int, default=3)
  parser.add_argument("--train-elements", type=arguments.positive_int,
                      default=4096)
  parser.add_argument("--element-kb", type=arguments.positive_int, default=256)
  parser.add_argument("--limit-mb", type=arguments.positive_int, default=3072)
  parser.add_argument("--child", default="", help=argparse.SUPPRESS)
  args = parser.parse_args()
  passed = [a for a in sys.argv[1:] if not a.startswith("--child")]
  if args.child:
    kind, _, variant = args.child.partition(":")
    result = (_fit_child(args) if kind == "fit"
              else _structured_child(kind, variant, args))
    print(json.dumps(result))
    return
  print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"load {os.getloadavg()[0]:.1f}")
  if args.what == "fit":
    with _memcg.memory_cgroup(args.limit_mb * MB) as (path, _):
      r = _run_child([*passed, "--child=fit:"], cgroup=path)
    print(f"fit, {args.epochs} epochs, train {args.train_elements} x "
          f"{args.element_kb} KB + validation {args.train_elements // 4}, "
          f"cgroup {args.limit_mb} MB: {r['samples']} samples; caches + "
          f"buffers at most {r['max_held_mb']:.0f} MB (budget then "
          f"{r['budget_mb_at_max']:.0f} MB, lowest {r['min_budget_mb']:.0f} "
          f"MB); caches at most {r['max_cache_mb']:.0f} MB; "
          f"{r['over']} samples over the budget (by at most "
          f"{r['max_over_mb']:.1f} MB)")
    return
  budget = args.budget_mb * MB
  for kind in ("sparse", "ragged"):
    plain = _run_child([*passed, f"--child={kind}:plain"])
    cached = _run_child([*passed, f"--child={kind}:intune cache"])
    beyond = [c - p for c, p in zip(cached["growth"], plain["growth"])]
    ratio = cached["counted"] / cached["real"] if cached["real"] else 0.0
    print(f"{kind}: {args.elements} x {args.element_mb} MB, budget "
          f"{args.budget_mb} MB; RSS growth per epoch plain "
          f"{[round(g / MB) for g in plain['growth']]} MB, cached "
          f"{[round(g / MB) for g in cached['growth']]} MB; beyond plain "
          f"{[round(b / MB) for b in beyond]} MB (budget {args.budget_mb}: "
          f"{'within' if max(beyond) <= budget else 'OVER'}); the kernel "
          f"counts {cached['counted'] / MB:.1f} MB for {cached['elements']} "
          f"elements holding {cached['real'] / MB:.1f} MB (ratio "
          f"{ratio:.3f})")


if __name__ == "__main__":
  main()
