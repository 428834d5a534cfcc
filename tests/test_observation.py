"""Per-step observations of a live pipeline."""

import dataclasses
import functools
import gc
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import model_pb2

import intune_tf
from intune_tf import arbiter
from intune_tf import host
from intune_tf import records
from intune_tf.live import observation
from intune_tf.ops import session as session_lib


def test_observation_of_a_running_pipeline():
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(
      policy="manual", ram_budget=1 << 30)
  ds = tf.data.Dataset.range(10**9).map(
      lambda x: tf.fill([256], x), num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.prefetch(tf.data.AUTOTUNE).with_options(options)
  it = iter(ds)
  next(it)
  session = intune_tf.session_of(it)
  builder = observation.ObservationBuilder(session)
  builder.observe()
  start = time.monotonic()
  n = 0
  while time.monotonic() - start < 0.5:
    next(it)
    n += 1
  obs = builder.observe()
  # Elements returned over the step's interval, within 20% of our own count.
  assert abs(obs.output_rate * obs.interval_s - n) <= 0.2 * n + 2
  by_name = {s.name: s for s in obs.stages}
  assert set(by_name) == {"Prefetch", "Prefetch.ParallelMapV2",
                          "Prefetch.ParallelMapV2.Range"}
  par_map = by_name["Prefetch.ParallelMapV2"]
  assert par_map.rate > 0 and par_map.cpu_per_element_s > 0
  assert par_map.parallelism >= 1
  # 256 int64 values per element: 2048 bytes.
  assert 2048 <= par_map.bytes_per_element < 4096
  assert abs(sum(s.time_share for s in obs.stages) - 1) < 1e-6
  assert obs.usable_cpus == host.usable_cpus()
  assert obs.ram_budget == 1 << 30
  assert 0 < obs.free_memory <= obs.total_memory
  assert obs.dram_gbps > 0.1 and obs.cpu_mhz >= 0
  assert obs.consumer_wait_s >= 0 and obs.output_latency_s > 0
  assert isinstance(obs.to_json()["stages"], tuple)
  del it
  gc.collect()


def test_reported_step_time_is_observed():
  observation.report_step_time(0.25)
  assert observation.model_step_time() == 0.25


class _FakeSession:
  """Serves canned snapshots to an `ObservationBuilder`."""

  def __init__(self, snapshots):
    self.options = intune_tf.IntuneOptions()
    self._snapshots = iter(snapshots)

  def _snapshot(self):
    return next(self._snapshots)

  def model_proto(self):  # no bounded interleave
    return model_pb2.ModelProto()


def _snapshot(rows, elements: int = 0,
              knobs=()) -> session_lib._Snapshot:
  """A snapshot of `rows`: (stage name, node id, [elements,
  processing_time_ns, buffered_bytes, buffered_elements, bytes_produced,
  bytes_consumed])."""
  counters = dict.fromkeys(session_lib.COUNTERS, 0)
  counters.update(elements=elements, ram_budget=1 << 20)
  return session_lib._Snapshot(  # noqa: SLF001
      knobs=tuple(knobs), stage_names=tuple(name for name, _, _ in rows),
      stage_stats=np.array([row + [node] for _, node, row in rows],
                           np.int64).reshape(-1, 7),
      counters=counters)


@pytest.fixture
def clock(monkeypatch):
  clock = types.SimpleNamespace(now=10.0, time=time.time)
  clock.monotonic = lambda: clock.now
  monkeypatch.setattr(observation, "time", clock)
  return clock


_BUFFER = records.Knob("Prefetch/buffer_size", "buffer_size", 4.0, 0.0,
                           64.0)
_THREADS = records.Knob("Prefetch.ParallelMapV2/parallelism",
                            "parallelism", 2.0, 1.0, 8.0)


def test_previous_snapshot_is_matched_by_node(clock):
  # The interleave's inner datasets are new nodes (ids) as it cycles: a new
  # one counts from 0; and stages may come in another order.
  builder = observation.ObservationBuilder(_FakeSession([
      _snapshot([("Prefetch", 1, [100, 10**9, 0, 0, 800, 800]),
                 ("Prefetch.ParallelMapV2", 2,
                  [100, 3 * 10**9, 0, 0, 800, 800]),
                 ("Prefetch.ParallelMapV2.Inner", 3,
                  [50, 10**9, 0, 0, 400, 0])], 100,
                knobs=(_BUFFER, _THREADS)),
      _snapshot([("Prefetch.ParallelMapV2.Inner", 4,
                  [20, 10**9, 0, 0, 160, 0]),
                 ("Prefetch.ParallelMapV2", 2,
                  [150, 4 * 10**9, 64, 8, 1200, 1200]),
                 ("Prefetch", 1, [160, 2 * 10**9, 96, 2, 1280, 1280])], 160,
                knobs=(_BUFFER, _THREADS)),
  ]))
  builder.observe()
  clock.now += 1.0
  obs = builder.observe()
  assert obs.interval_s == 1.0 and obs.output_rate == 60.0
  assert [s.name for s in obs.stages] == [
      "Prefetch.ParallelMapV2.Inner", "Prefetch.ParallelMapV2", "Prefetch"]
  inner, par_map, prefetch = obs.stages
  assert (inner.rate, par_map.rate, prefetch.rate) == (20.0, 50.0, 60.0)
  assert (inner.cpu_per_element_s, par_map.cpu_per_element_s,
          prefetch.cpu_per_element_s) == (1 / 20, 1 / 50, 1 / 60)
  assert [s.time_share for s in obs.stages] == [1 / 3, 1 / 3, 1 / 3]
  assert (inner.bytes_produced_per_s, par_map.bytes_produced_per_s) == (
      160.0, 400.0)
  # Buffered bytes per buffered element, else bytes produced per element.
  assert (inner.bytes_per_element, par_map.bytes_per_element,
          prefetch.bytes_per_element) == (8.0, 8.0, 48.0)
  assert (prefetch.buffer_size, prefetch.buffer_fill) == (4.0, 0.5)
  assert (par_map.parallelism, par_map.buffer_size, par_map.buffer_fill) == (
      2.0, None, 0.0)
  assert prefetch.buffered_bytes == 96 and type(prefetch.buffered_bytes) is int
  assert obs.stage("Prefetch") is prefetch
  assert obs.stage("Inner") is None
  assert obs.bytes_per_element == {"Prefetch.ParallelMapV2.Inner": 8.0,
                                   "Prefetch.ParallelMapV2": 8.0,
                                   "Prefetch": 48.0}


def test_instances_of_one_stage_are_one_stage(clock):
  # Two, then three, live instances of the interleave's inner map (one knob):
  # each instance's own delta (the new one from 0), added up.
  inner = "ParallelInterleaveV4[*].ParallelMapV2"
  threads = records.Knob(f"{inner}/parallelism", "parallelism", 3.0, 1.0,
                             8.0)
  builder = observation.ObservationBuilder(_FakeSession([
      _snapshot([("ParallelInterleaveV4", 1, [10, 10**9, 0, 0, 80, 80]),
                 (inner, 5, [4, 10**9, 16, 2, 32, 32]),
                 (inner, 7, [6, 10**9, 8, 1, 48, 48])], 10,
                knobs=(threads,)),
      _snapshot([("ParallelInterleaveV4", 1, [30, 2 * 10**9, 0, 0, 240, 240]),
                 (inner, 5, [14, 2 * 10**9, 16, 2, 112, 112]),
                 (inner, 7, [10, 2 * 10**9, 8, 1, 80, 80]),
                 (inner, 9, [6, 10**9, 24, 3, 48, 48])], 30,
                knobs=(threads,)),
  ]))
  builder.observe()
  clock.now += 2.0
  obs = builder.observe()
  assert [s.name for s in obs.stages] == ["ParallelInterleaveV4", inner]
  stage = obs.stage(inner)
  assert stage.rate == (10 + 4 + 6) / 2
  assert stage.cpu_per_element_s == pytest.approx(3.0 / 20)
  assert stage.parallelism == 3.0
  assert stage.buffered_bytes == 48
  assert stage.bytes_per_element == 8.0
  assert [s.time_share for s in obs.stages] == [0.25, 0.75]


def test_stage_lookup_and_bytes_per_element_of_a_built_observation():
  stage = functools.partial(
      records.StageObservation, rate=1.0, cpu_per_element_s=0.0,
      parallelism=None, buffer_size=None, buffer_fill=0.0,
      bytes_produced_per_s=0.0, buffered_bytes=0, time_share=0.0)
  first, second = stage(name="A", bytes_per_element=1.0), stage(
      name="A", bytes_per_element=2.0)
  obs = records.Observation(
      time=0.0, interval_s=0.5, knobs=(), stages=(first, second,
                                                  stage(name="B",
                                                        bytes_per_element=3.0)),
      output_rate=0.0, output_latency_s=0.0, consumer_wait_s=0.0,
      usable_cpus=1, cpu_budget=1, free_memory=1, total_memory=1,
      ram_budget=1, buffered_bytes=0, cpu_mhz=0.0, dram_gbps=1.0,
      model_step_s=None)
  assert obs.stage("A") is first and obs.stage("C") is None
  per_stage = obs.bytes_per_element
  assert per_stage == {"A": 2.0, "B": 3.0}
  per_stage["B"] = 0.0  # the caller's own copy
  assert obs.bytes_per_element["B"] == 3.0
  assert dataclasses.replace(obs, stages=(second,)).stage("A") is second


_SHARE_1 = arbiter.Share(cpus=1, cpu_share=1.0, ram=1 << 20, processes=2,
                         host_cpus=2, ram_pool=2 << 20)


@pytest.mark.parametrize("kwargs,usable,share,expected", [
    ({}, 2, _SHARE_1, 1),  # the host's share: 1 of the 2 usable
    ({"cpu_budget": 2}, 2, _SHARE_1, 2),  # the user's budget is kept
    ({}, 2, None, 2),  # not sharing: the usable CPUs
    ({"host_share": False}, 2, _SHARE_1, 2),  # opted out
    ({}, 1, dataclasses.replace(_SHARE_1, cpus=2), 1),  # capped by usable
])
def test_host_cpu_budget(kwargs, usable, share, expected):
  options = intune_tf.IntuneOptions(**kwargs)
  assert observation.host_cpu_budget(options, usable, share) == expected


_PEAK_RSS = """
import resource, sys, tensorflow as tf
ds = tf.data.Dataset.range(20000).map(
    lambda i: tf.strings.as_string(tf.range(16, dtype=tf.int64) + i),
    num_parallel_calls=tf.data.AUTOTUNE).shuffle(1000).batch(256).prefetch(
        tf.data.AUTOTUNE)
for _ in ds:  # TensorFlow's own first-iterator costs, in both processes
  pass
if sys.argv[1] == "intune":
  import intune_tf
  ds = intune_tf.tune(ds, policy="even", cache=False)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for _ in range(2):
  for _ in ds:
    pass
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


@pytest.mark.slow
def test_a_tuned_process_peaks_near_plain_tensorflow():
  # The observation's one-time probes (the memory bandwidth copy) must not
  # raise the process's peak: a 64 MB copy made every tuned process peak
  # 128 MB above plain TF's on a pipeline of a few kB.
  peaks = {}
  for variant in ("plain", "intune"):
    run = subprocess.run([sys.executable, "-c", _PEAK_RSS, variant],
                         capture_output=True, text=True, timeout=300,
                         check=True)
    peaks[variant] = int(run.stdout.split()[-1]) / 1024  # KiB -> MB
  assert peaks["intune"] - peaks["plain"] < 48, peaks
