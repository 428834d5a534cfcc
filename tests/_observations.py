"""Hand-built observations for policy and agent tests."""

import dataclasses

from intune_tf import records

MB = 1 << 20


def obs(knobs, cpu_budget=4, ram_budget=40 * MB, bytes_per_element=10 * MB,
         output_rate=100.0, costs=None, buffered=0):
  stages = []
  costs = costs or {}
  for k in knobs:
    stage = k.name.rpartition("/")[0]
    if any(s.name == stage for s in stages):
      continue
    stages.append(records.StageObservation(
        name=stage, rate=output_rate, cpu_per_element_s=costs.get(stage, 0.01),
        parallelism=None, buffer_size=None, buffer_fill=0.5,
        bytes_per_element=bytes_per_element, bytes_produced_per_s=0.0,
        buffered_bytes=0, time_share=0.0))
  return records.Observation(
      time=0.0, interval_s=0.5, knobs=tuple(knobs), stages=tuple(stages),
      output_rate=output_rate, output_latency_s=0.0, consumer_wait_s=0.0,
      usable_cpus=cpu_budget, cpu_budget=cpu_budget, free_memory=8 << 30,
      total_memory=16 << 30, ram_budget=ram_budget, buffered_bytes=buffered,
      cpu_mhz=2500.0, dram_gbps=10.0, model_step_s=None)


def knob(name, kind, value, lo=1.0, hi=4.0):
  return records.Knob(name, kind, float(value), lo, hi)


def at(o, rate, **values):
  """`o` with knob values changed (by stage name) and every rate at
  `rate`."""
  knobs = tuple(dataclasses.replace(k, value=float(values[k.stage]))
                if k.stage in values else k for k in o.knobs)
  stages = tuple(dataclasses.replace(s, rate=rate) for s in o.stages)
  return dataclasses.replace(o, knobs=knobs, stages=stages, output_rate=rate)


def two_stages():
  """A 2 threads, B 2 threads on 8 CPUs, costs A 0.01 and B 0.03: climb's
  order starts at B (the busiest: 0.03 x 100 / 2 = 1.5 against A's
  0.5)."""
  return obs([knob("A/parallelism", "parallelism", 2, hi=8),
              knob("B/parallelism", "parallelism", 2, hi=8)],
             cpu_budget=8, costs={"A": 0.01, "B": 0.03})
