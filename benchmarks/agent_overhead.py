"""Cost of the InTune agent's tuning step on a live pipeline.

Drives the tuner by hand on the Criteo L4 pipeline (batch 4096) under
policy "intune", at the default period, and times each part of a step:
observe (model snapshot + host readings), infer (features, mask, network,
choice), learn (a gradient step from the live replay, every
LEARN_EVERY steps as the policy does), apply (Session.set).
Wall times include waiting for a core: the pipeline keeps both cores busy,
so the step's own CPU time (thread time) is reported beside them.
It also reports the tuner's CPU time as a share of one core at the default
period (thread CPU time of the steps / wall time).
Run: `python benchmarks/agent_overhead.py [seconds]`.
"""

import sys
import time

import numpy as np
import tensorflow as tf

import intune_tf
from intune_tf import agent as agent_lib
from intune_tf import dqn
from intune_tf import observation
from intune_tf import scenarios


def main(seconds: float = 60.0):
  scenario = scenarios.get("criteo-l4-b4096")
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(
      policy="manual", warm_start=False)
  it = iter(scenario.make(None).with_options(options))
  next(it)
  session = intune_tf.sessions()[-1]
  policy = agent_lib.IntunePolicy(intune_tf.IntuneOptions())
  observer = observation.Observer(session)
  period = intune_tf.IntuneOptions().period_s
  parts = {"observe": [], "infer": [], "learn": [], "apply": []}
  cpu_total, start, next_step = 0.0, time.monotonic(), time.monotonic()
  steps, step_cpu = 0, []
  while time.monotonic() - start < seconds:
    next(it)
    if time.monotonic() < next_step:
      continue
    next_step += period
    cpu0 = time.thread_time()
    t0 = time.perf_counter()
    obs = observer.observe()
    t1 = time.perf_counter()
    state, mask = dqn.features(obs), dqn.action_mask(obs)
    action = policy.agent.act(state, mask, 0.05)
    values = dqn.apply_action(obs, action)
    t2 = time.perf_counter()
    session.set(values) if values else None
    t3 = time.perf_counter()
    cpu_step = time.thread_time()
    policy.agent.replay.add(state, action, 0.5, state, mask, False)
    loss = (policy.agent.learn() if steps % agent_lib.LEARN_EVERY == 0
            else None)
    t4 = time.perf_counter()
    cpu_total += time.thread_time() - cpu0
    step_cpu.append(cpu_step - cpu0)
    steps += 1
    parts["observe"].append(t1 - t0)
    parts["infer"].append(t2 - t1)
    parts["apply"].append(t3 - t2)
    if loss is not None:
      parts["learn"].append(t4 - t3)
  wall = time.monotonic() - start
  step = [a + b + c for a, b, c in zip(parts["observe"], parts["infer"],
                                       parts["apply"])]
  print(f"{steps} steps at period {period} s over {wall:.0f} s")
  for name, values in parts.items():
    if values:
      print(f"{name:8} median {np.median(values) * 1e3:7.3f} ms  "
            f"p90 {np.percentile(values, 90) * 1e3:7.3f} ms")
  print(f"agent step (observe + infer + apply): median "
        f"{np.median(step) * 1e3:.3f} ms wall, "
        f"{np.median(step_cpu) * 1e3:.3f} ms CPU (thread time)")
  print(f"tuner CPU incl. a gradient step every {agent_lib.LEARN_EVERY} steps: "
        f"{cpu_total / wall:.2%} of one core")


if __name__ == "__main__":
  main(*[float(a) for a in sys.argv[1:2]])
