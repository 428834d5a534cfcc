"""Per-step observations of a live pipeline."""

import gc
import time

import tensorflow as tf

import intune_tf
from intune_tf import host
from intune_tf import observation


def test_observation_of_a_running_pipeline():
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(
      policy="manual", ram_budget=1 << 30)
  ds = tf.data.Dataset.range(10**9).map(
      lambda x: tf.fill([256], x), num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.prefetch(tf.data.AUTOTUNE).with_options(options)
  it = iter(ds)
  next(it)
  session = intune_tf.sessions()[-1]
  observer = observation.Observer(session)
  observer.observe()
  start = time.monotonic()
  n = 0
  while time.monotonic() - start < 0.5:
    next(it)
    n += 1
  obs = observer.observe()
  # Elements returned over the step's interval, within 20% of our own count.
  assert abs(obs.output_rate * obs.interval_s - n) <= 0.2 * n + 2
  by_kind = {s.name.split("(")[0]: s for s in obs.stages}
  par_map = by_kind["ParallelMapV2"]
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
