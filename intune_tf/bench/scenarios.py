"""Benchmark scenarios: the pipelines `intune bench` runs policies on.

The Criteo text pipelines (`criteo-l*`, `resize`, `sharded`), `memory-cap`,
and two pipelines of other shapes from `workloads`: `tfrecord-examples` and
`image-augment`.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Mapping

import tensorflow as tf

from intune_tf.bench import workloads
from intune_tf.criteo import files
from intune_tf.criteo import pipelines

MB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Scenario:
  """A pipeline and the conditions it runs under.

  Attributes:
    name: the name given to `intune bench --scenarios`.
    description: one line for reports.
    make: builds the plain pipeline (AUTOTUNE stages); with a mapping
      `{stage: parallelism}` those stages get fixed values instead.
    rows_per_element: rows in one element of the output (the batch size).
    resize: `[(fraction of the run, CPUs), ...]` CPU changes during a run.
    cotenant: `[(start, end, processes), ...]` (fractions of the run): the
      harness runs that many CPU-burning processes of its own in each
      window (`resize.CoTenant`).
    ram_budget: bytes the InTune policies may buffer (None: the default).
    pause_every: a bursty consumer pauses `pause_s` every this many elements.
    pause_s: see `pause_every`.
    prefixes: `(stage, make)` pairs; `make()` builds the pipeline up to and
      including that stage with one thread per stage, so the stage's cost is
      the difference of consecutive prefixes (used for the ceiling). Empty:
      the whole pipeline is measured as one stage.
  """
  name: str
  description: str
  make: Callable[[Mapping[str, int] | None], tf.data.Dataset]
  rows_per_element: int
  resize: tuple[tuple[float, int], ...] = ()
  cotenant: tuple[tuple[float, float, int], ...] = ()
  ram_budget: int | None = None
  pause_every: int = 0
  pause_s: float = 0.0
  prefixes: tuple[tuple[str, Callable[[], tf.data.Dataset]], ...] = ()


def _criteo(level: int, batch_size: int):
  def make(parallelism=None):
    return pipelines.pipeline(level, files.default_files(),
                           batch_size=batch_size, parallelism=parallelism,
                           repeat=True, seed=0)
  return make


_ONE_THREAD = {"read": 1, "batch": 1, "parse": 1, "features": 1, "heavy": 1,
               "prefetch": 1}


def _criteo_prefixes(level: int, batch_size: int):
  """Levels 1..level are prefixes of each other: L1 = read + batch, each
  next level adds one stage."""
  names = {1: "read+batch", 2: "shuffle", 3: "parse", 4: "features",
           5: "heavy"}
  def make(k):
    def build():
      par = {s: v for s, v in _ONE_THREAD.items()
             if s in pipelines.STAGES[k]}
      return pipelines.pipeline(k, files.default_files(),
                                batch_size=batch_size, parallelism=par,
                                repeat=True, seed=0)
    return build
  return tuple((names[k], make(k)) for k in range(1, level + 1))


def _sharded(parallelism=None):
  del parallelism
  return pipelines.sharded_pipeline(files.default_files(), batch_size=4096,
                                    repeat=True)


def _big_elements(parallelism=None):
  """8 MB elements, map then prefetch(AUTOTUNE): AUTOTUNE's prefetch grows."""
  del parallelism
  return tf.data.Dataset.range(10**9).map(
      lambda x: tf.fill([2 * MB], tf.cast(x, tf.float32))).prefetch(
          tf.data.AUTOTUNE)


def _examples(parallelism=None):
  return workloads.examples_pipeline(workloads.examples_files(),
                                     parallelism=parallelism)


def _examples_prefixes():
  """One thread per stage; each prefix adds one stage to the previous."""
  one = {s: 1 for s in workloads.EXAMPLES_TUNABLE}
  def make(last):
    return lambda: workloads.examples_pipeline(
        workloads.examples_files(), parallelism=one, last_stage=last)
  return (("read+batch", make("batch")), ("parse", make("parse")),
          ("features", make("features")))


def _images(parallelism=None):
  return workloads.images_pipeline(parallelism=parallelism)


# One substantial stage (decode); the ceiling's one prefix is the whole
# pipeline with one thread (it counts the batch copy with decode).
_IMAGES_PREFIXES = (("decode+batch", functools.partial(
    workloads.images_pipeline, parallelism={"decode": 1, "prefetch": 1})),)


@functools.cache
def all_scenarios() -> dict[str, Scenario]:
  result = {}
  for level in range(1, 6):
    for batch in (1024, 4096):
      name = f"criteo-l{level}-b{batch}"
      result[name] = Scenario(
          name, f"Criteo L{level} pipeline, batch {batch}",
          _criteo(level, batch), batch,
          prefixes=_criteo_prefixes(level, batch))
  result["resize"] = Scenario(
      "resize", "Criteo L4, batch 4096; usable CPUs 1 -> 2 -> 1",
      _criteo(4, 4096), 4096, resize=((0.0, 1), (1 / 3, 2), (2 / 3, 1)),
      prefixes=_criteo_prefixes(4, 4096))
  result["cotenant"] = Scenario(
      "cotenant", "Criteo L4, batch 4096; a co-tenant burns 2 CPUs in the "
      "middle third of the run", _criteo(4, 4096), 4096,
      cotenant=((1 / 3, 2 / 3, 2),), prefixes=_criteo_prefixes(4, 4096))
  result["sharded"] = Scenario(
      "sharded", "Model Garden DLRM reader shape: shards interleaved, parse "
      "inside the interleave function, batch 4096", _sharded, 4096)
  result["memory-cap"] = Scenario(
      "memory-cap", "8 MB elements, prefetch(AUTOTUNE), bursty consumer, "
      "64 MB budget", _big_elements, 1, ram_budget=64 * MB, pause_every=50,
      pause_s=0.3)
  result["tfrecord-examples"] = Scenario(
      "tfrecord-examples", "TFRecord of tf.train.Example (13 int64, 26 "
      "bytes features): interleave, batch, parse_example, hashing; batch "
      f"{workloads.EXAMPLES_BATCH}", _examples, workloads.EXAMPLES_BATCH,
      prefixes=_examples_prefixes())
  result["image-augment"] = Scenario(
      "image-augment", f"{workloads.IMAGE_SIZE}x{workloads.IMAGE_SIZE} JPEGs "
      "in memory: decode, "
      "random crop, flip, brightness, normalize; batch "
      f"{workloads.IMAGES_BATCH}", _images, workloads.IMAGES_BATCH,
      prefixes=_IMAGES_PREFIXES)
  return result


DEFAULT = "criteo-l4-b4096"


def names() -> list[str]:
  """Every scenario's name, sorted."""
  return sorted(all_scenarios())


def get(name: str) -> Scenario:
  scenarios = all_scenarios()
  if name not in scenarios:
    raise ValueError(f"Unknown scenario {name!r}. Valid scenarios: "
                     f"{sorted(scenarios)}.")
  return scenarios[name]
