"""The budget guard against AUTOTUNE's prefetch growth (the paper's OOM).

A pipeline of 8 MB elements (`map` then `prefetch(AUTOTUNE)`) is read by a
bursty consumer (a 0.3 s pause every 50 elements) for 20 s, once under plain
AUTOTUNE and once with InTune and a 64 MB RAM budget. Buffered bytes are
sampled every 5 ms: AUTOTUNE's from `IteratorGetModelProto`, InTune's from its
session. Run: `python benchmarks/guard.py [seconds]`.
"""

import sys
import threading
import time

from _common import with_intune
import tensorflow as tf
from tensorflow.core.framework import model_pb2

import intune_tf

BUDGET = 64 << 20
ELEMENT = 8 << 20


def pipeline():
  return tf.data.Dataset.range(10**9).map(
      lambda x: tf.fill([ELEMENT // 4], tf.cast(x, tf.float32))).prefetch(
          tf.data.AUTOTUNE)


def autotune_bytes(iterator):
  proto = model_pb2.ModelProto.FromString(tf.raw_ops.IteratorGetModelProto(
      iterator=iterator._iterator_resource).numpy())  # noqa: SLF001
  return sum(n.buffered_bytes for n in proto.nodes.values())


def run(ds, read_bytes, seconds):
  it = iter(ds)
  next(it)
  peak, samples, stop = [0], [0], threading.Event()

  def sample():
    while not stop.is_set():
      try:
        peak[0] = max(peak[0], read_bytes(it))
        samples[0] += 1
      except Exception:  # noqa: BLE001
        pass  # the model may not exist yet
      time.sleep(0.005)

  thread = threading.Thread(target=sample, daemon=True)
  thread.start()
  end, n = time.monotonic() + seconds, 0
  while time.monotonic() < end:
    next(it)
    n += 1
    if n % 50 == 0:
      time.sleep(0.3)
  stop.set()
  thread.join()
  return peak[0], samples[0], n


def main(seconds: float = 20.0):
  rows = []
  peak, samples, n = run(pipeline(), autotune_bytes, seconds)
  rows.append(("AUTOTUNE", peak, samples, n))
  ds = with_intune(pipeline(), ram_budget=BUDGET)
  peak, samples, n = run(
      ds, lambda it: intune_tf.session_of(it).counters()["buffered_bytes"],
      seconds)
  rows.append((f"InTune (even policy), budget {BUDGET >> 20} MB", peak,
               samples, n))

  def greedy_then_read(it):
    # The user asks for 64 buffered elements (512 MB): the guard refuses.
    session = intune_tf.session_of(it)
    knob = [k for k in session.knobs() if k.kind == "buffer_size"][0]
    if knob.value != 64 and not greedy_then_read.asked:
      session.set({knob.name: 64})
      greedy_then_read.asked = True
    return session.counters()["buffered_bytes"]

  greedy_then_read.asked = False
  ds = with_intune(pipeline(), ram_budget=BUDGET, policy="manual")
  peak, samples, n = run(ds, greedy_then_read, seconds)
  rows.append((f"InTune guard alone (manual, buffer set to 64), budget "
               f"{BUDGET >> 20} MB", peak, samples, n))
  print(f"8 MB elements, bursty consumer, {seconds:.0f} s each, sampled every "
        "5 ms")
  print("| policy | peak buffered MB | samples | elements read | over 64 MB |")
  print("|---|---|---|---|---|")
  for name, peak, samples, n in rows:
    print(f"| {name} | {peak / 2**20:.0f} | {samples} | {n} | "
          f"{'yes' if peak > BUDGET else 'no'} |")


if __name__ == "__main__":
  main(float(sys.argv[1]) if len(sys.argv) > 1 else 20.0)
