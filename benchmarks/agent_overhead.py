"""Cost of the InTune agent's tuning step on a live pipeline.

Drives the tuner by hand on the Criteo L4 pipeline (batch 4096) under
policy "intune", at the default period, and times each part of a step:
observe (model snapshot + host readings), infer (features, mask, the
known-worse filter, network, choice), learn (a gradient step from the live
replay, every LEARN_EVERY steps as the policy does), apply (TuningSession.set).
Wall times include waiting for a core: the pipeline keeps both cores busy,
so the step's own CPU time (thread time) is reported beside them.
It also reports the tuner's CPU time as a share of one core at the default
period (thread CPU time of the steps / wall time), and then the same for the
real background tuner thread (default options, status file on) over
`seconds` after a 15 s warm-up, read from the OS per-thread CPU times.
Run: `python benchmarks/agent_overhead.py [seconds]`.
"""

import sys
import threading
import time

import numpy as np
import psutil

import intune_tf
from intune_tf.agent import policy as agent_lib
from intune_tf.bench import scenarios
from intune_tf.live import observation
from intune_tf.tuning import mdp


def main(seconds: float = 60.0):
  scenario = scenarios.get("criteo-l4-b4096")
  it = iter(intune_tf.tune(scenario.make(None), policy="manual",
                           warm_start=False, cache=False))
  next(it)
  session = intune_tf.session_of(it)
  policy = agent_lib.IntunePolicy(intune_tf.IntuneOptions())
  builder = observation.ObservationBuilder(session)
  period = intune_tf.IntuneOptions().period_s
  # One-off costs stay out of the figures: the DRAM bandwidth reading (first
  # observation) and the tracing of the gradient step (first learn).
  obs = builder.observe()
  state, mask = mdp.features(obs), mdp.action_mask(obs)
  for _ in range(policy.agent.batch_size):
    policy.agent.replay.add(state, 0, 0.5, state, mask, False)
  policy.agent.learn()
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
    obs = builder.observe()
    t1 = time.perf_counter()
    state, mask = mdp.features(obs), mdp.action_mask(obs)
    config = {k.name: k.value for k in obs.knobs}
    mask = policy._avoid_known_worse(obs, config, mask)  # noqa: SLF001
    action = policy.agent.act(state, mask, policy.epsilon, policy.move_margin)
    values = mdp.apply_action(obs, action)
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


def tuner_thread_share(seconds: float, warmup: float = 15.0) -> None:
  """CPU share of the real `intune_tuner` thread under default options."""
  scenario = scenarios.get("criteo-l4-b4096")
  it = iter(intune_tf.tune(scenario.make(None), warm_start=False,
                           cache=False))

  def cpu_seconds() -> float:
    thread = next(t for t in threading.enumerate() if t.name == "intune_tuner")
    times = next(t for t in psutil.Process().threads()
                 if t.id == thread.native_id)
    return times.user_time + times.system_time

  end = time.monotonic() + warmup
  while time.monotonic() < end:
    next(it)
  cpu0, start = cpu_seconds(), time.monotonic()
  while time.monotonic() - start < seconds:
    next(it)
  share = (cpu_seconds() - cpu0) / (time.monotonic() - start)
  print(f"background tuner thread (policy intune, default options): "
        f"{share:.2%} of one core over {seconds:.0f} s")


if __name__ == "__main__":
  main(*[float(a) for a in sys.argv[1:2]])
  tuner_thread_share(*[float(a) for a in sys.argv[1:2]])
