"""Hand-built observations for policy and agent tests."""

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
