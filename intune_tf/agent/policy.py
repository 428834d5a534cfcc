"""`policy="intune-dqn"`: the pretrained DQN acting alone, fine-tuned
online, with a guard (the default `intune` is the Q-ranked measured search
of `intune_tf.agent.ranked`).

Each tuning step: read the state, store the previous step's transition
(its reward is this step's throughput), take one gradient step from the live
replay buffer, pick a move (epsilon-greedy over the valid moves), and return
the knob values. Around the agent:

- Start: a live pipeline starts at `start_allocation` (the even split, at
  least min(C, 2) threads per stage), held for `MIN_SAMPLES` decisions.
- Greedy moves must beat the no-op by `MOVE_MARGIN`; moves into a
  configuration the guard measured clearly worse are masked out.
- Budget projection: when usable CPUs drop below the threads in force (a
  resize), the largest stages give threads back at once, so the allocation
  fits the new budget without waiting for one-knob moves.
- No-regression guard: throughput is credited to the configuration that
  produced it; the best configuration seen (at least `MIN_SAMPLES`
  measurements, per CPU count) is remembered. When the smoothed throughput
  stays below `1 - REGRESSION` of the best for more than `PATIENCE` steps,
  the policy returns to the best configuration and holds it for `HOLD`
  steps before exploring again.
- Floors: a buffer below one element (a prefetch that registers at 0 after
  the first step) is raised to one; when the CPU budget grows, parallel
  stages below `mdp.start_threads` (one thread each on 1 CPU, say) are
  raised to it at once. The agent never lowers a buffer below one element
  nor a stage below `mdp.thread_floor`.
- Warm start: `bind(session)` loads the configuration (and fine-tuned
  weights) saved for the same pipeline on the same machine
  (`intune_tf.agent.warmstart`) and starts there.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time
from typing import TYPE_CHECKING

from absl import logging
import numpy as np

from intune_tf import records
from intune_tf.agent import dqn
from intune_tf.agent import warmstart
from intune_tf.tuning import mdp
from intune_tf.tuning import policies
from intune_tf.tuning import search

if TYPE_CHECKING:
  from intune_tf.options import IntuneOptions
  from intune_tf.records import Observation

# The pretrained agent shipped with the package (see docs/agent.md).
DEFAULT_WEIGHTS = os.path.join(os.path.dirname(__file__), "weights.npz")
# Exploration while tuning a live pipeline.
ONLINE_EPSILON = 0.05
# A greedy move must beat staying put by this much (Q units; values are
# about 1 / (1 - gamma) = 10 rewards, so 0.05 is 0.5%) to be taken: near-ties
# stay put instead of churning the pipeline. Chosen by `intune simulate` over
# 0, 0.05, 0.1 and 0.25 (docs/agent.md).
MOVE_MARGIN = 0.05
# A regression: smoothed throughput below (1 - REGRESSION) x the best.
REGRESSION = 0.08
PATIENCE = 3
HOLD = 6
MIN_SAMPLES = 2
# Smoothing of the current throughput (weight of the newest step).
SMOOTHING = 0.5
# Decisions per online gradient step (a step costs a few ms of CPU).
LEARN_EVERY = 4
# Steps between saves of the warm-start state.
SAVE_EVERY = 20
# A decision waits for `search.MIN_ELEMENTS` output elements (the one rule
# of a measurement, owned by the measured search) or this many seconds.
MAX_WAIT_S = 3.0


def project_to_budget(obs: "Observation") -> dict[str, float]:
  """Parallelism values that fit the CPU budget, taken from the largest
  stages one thread at a time ({} when the allocation already fits)."""
  parallel = [k for k in obs.knobs if k.kind == "parallelism"]
  limit = mdp.cpu_limit(len(parallel), obs.cpu_budget)
  values = {k.name: min(k.value, max(k.min, obs.cpu_budget)) for k in parallel}
  while sum(values.values()) > limit:
    name = max(values, key=values.get)
    if values[name] <= 1:
      break
    values[name] -= 1
  return {k.name: values[k.name] for k in parallel if values[k.name] != k.value}


def start_allocation(obs: "Observation") -> dict[str, float]:
  """Where a live pipeline starts: the usable CPUs split evenly over the
  parallel stages (the paper's start), but at least min(C, 2) threads each,
  and the RAM budget split evenly over the buffers.

  A live pipeline's initial knob values (a prefetch of 0, one thread per
  stage) are arbitrary, and on a machine with fewer CPUs than stages the
  even split is one thread each, which starves stages that wait on each
  other (measured on Criteo L4: `mdp.MIN_THREADS`). Examples: 4 stages
  on 2 CPUs: [2, 2, 2, 2]; 2 stages on 5 CPUs: [3, 2]. Two threads per
  stage always fit `mdp.cpu_limit`.
  """
  parallel = [k for k in obs.knobs if k.kind == "parallelism"]
  buffers = [k for k in obs.knobs if k.kind == "buffer_size"]
  floor = mdp.start_threads(obs.cpu_budget)
  shares = policies.even_split(obs.cpu_budget, len(parallel))
  values = {k.name: float(min(max(share, floor, k.min), k.max))
            for k, share in zip(parallel, shares)}
  values.update(policies.even_buffers(obs, buffers))
  return values


def raise_low_buffers(obs: "Observation") -> dict[str, float]:
  """Buffers below `mdp.MIN_BUFFER` (e.g. a prefetch registered at 0 after
  the start) raised to it ({} when none is)."""
  return {k.name: float(mdp.MIN_BUFFER) for k in obs.knobs
          if k.kind == "buffer_size" and k.value < mdp.MIN_BUFFER <= k.max}


def raise_low_threads(obs: "Observation") -> dict[str, float]:
  """Parallel stages below `mdp.start_threads` (one thread each after the
  usable CPUs grew from 1 to 2, say) raised to it ({} when none is)."""
  floor = mdp.start_threads(obs.cpu_budget)
  return {k.name: float(floor) for k in obs.knobs
          if k.kind == "parallelism" and k.value < floor <= k.max}


def config_key(config: dict[str, float]) -> tuple:
  """A configuration as a hashable key (its items, sorted by knob name)."""
  return tuple(sorted(config.items()))


class BestConfigs:
  """Remembers the best configuration per CPU count and detects regressions.

  Args:
    regression: relative drop that counts as a regression. Default 0.08.
    patience: steps a regression may last before a revert. Default 3.
    min_samples: measurements a configuration needs to count as best.
      Default 2.
  """

  def __init__(self, regression: float = REGRESSION, patience: int = PATIENCE,
               min_samples: int = MIN_SAMPLES):
    self.regression = regression
    self.patience = patience
    self.min_samples = min_samples
    self._rates: dict[tuple, list[float]] = collections.defaultdict(list)
    self._cpus = None
    self._smooth = None
    self._below = 0

  def best(self) -> tuple[dict[str, float] | None, float]:
    """(best configuration, its mean rate) at the current CPU count."""
    best, best_rate = None, 0.0
    for key, rates in self._rates.items():
      if len(rates) >= self.min_samples:
        mean = float(np.mean(rates[-5:]))
        if mean > best_rate:
          best, best_rate = dict(key), mean
    return best, best_rate

  def worse_keys(self) -> set[tuple]:
    """Keys (`config_key`) of the configurations with `min_samples`
    measurements at the current CPU count whose mean is below
    `1 - regression` of the best's."""
    _, best_rate = self.best()
    return {key for key, rates in self._rates.items()
            if len(rates) >= self.min_samples and
            float(np.mean(rates[-5:])) < (1 - self.regression) * best_rate}

  def known_worse(self, config: dict[str, float]) -> bool:
    """Whether `config` is among `worse_keys()`."""
    return config_key(config) in self.worse_keys()

  def update(self, config: dict[str, float], rate: float, cpus: int) -> bool:
    """Credits `rate` to `config`; True when the pipeline should revert."""
    if cpus != self._cpus:
      self._rates.clear()
      self._cpus, self._smooth, self._below = cpus, None, 0
    key = config_key(config)
    self._rates[key].append(rate)
    self._smooth = rate if self._smooth is None else (
        SMOOTHING * rate + (1 - SMOOTHING) * self._smooth)
    best, best_rate = self.best()
    if best is None or best == config:
      self._below = 0
      return False
    if self._smooth < (1 - self.regression) * best_rate:
      self._below += 1
    else:
      self._below = 0
    if self._below > self.patience:
      self._below = 0
      self._smooth = best_rate
      return True
    return False


class IntunePolicy(policies.Policy):
  """The InTune agent as a tuning policy (module docstring).

  Args:
    options: the session's options.
    weights: agent weights file. Default: the shipped pretrained agent.
    learn: fine-tune from the live replay buffer. Default True.
    epsilon: exploration rate. Default `ONLINE_EPSILON` (0.05).
    seed: exploration seed. Default 0.
    move_margin: how much a greedy move's value must beat the no-op's.
      Default `MOVE_MARGIN` (0.05).
  """

  def __init__(self, options: "IntuneOptions", weights: str | None = None,
               learn: bool = True, epsilon: float = ONLINE_EPSILON,
               seed: int = 0, agent: dqn.Agent | None = None,
               move_margin: float | None = None):
    super().__init__(options)
    self.agent = agent or dqn.Agent(seed=seed, replay_capacity=5_000,
                                    batch_size=32)
    if agent is None:
      path = weights or DEFAULT_WEIGHTS
      if os.path.exists(path):
        self.agent.load_shared(path)
      else:
        logging.warning("InTune agent weights %s not found: the agent starts "
                        "untrained.", path)
    self.collector = dqn.Collector(self.agent, learn_every=LEARN_EVERY,
                                   learn=learn)
    self.epsilon = epsilon
    self.move_margin = MOVE_MARGIN if move_margin is None else move_margin
    self.best_configs = BestConfigs()
    self.steps = 0
    self._hold = 0
    self._acc_elements = 0.0
    self._acc_seconds = 0.0
    self._started = False
    self._hold_values: dict[str, float] = {}
    self._warm: warmstart.State | None = None
    self._cpu_budget: int | None = None
    self.session = None

  # --- warm start -----------------------------------------------------------
  def bind(self, session) -> None:
    """Called by the tuner with the live session: loads warm-start state."""
    self.session = session
    state = warmstart.load(session)
    if state is not None:
      self._warm = state
      if state.weights is not None:
        try:
          self.agent.set_weights(state.weights)
        except ValueError as e:
          logging.warning("Ignoring warm-start agent weights: %s", e)

  def warm_config(self) -> dict[str, float] | None:
    """The warm-start configuration loaded and not applied yet (None:
    none)."""
    return None if self._warm is None else self._warm.config

  def _save(self) -> None:
    best, rate = self.best_configs.best()
    if best is None:
      return
    try:
      warmstart.save(self.session, best, rate,
                     warmstart.fine_tuned_weights(self))
    except OSError as e:
      logging.log_first_n(logging.WARNING,
                          "InTune: cannot save the warm-start state: %s", 1, e)

  # --- the step --------------------------------------------------------------
  def _measured(self, obs: "Observation") -> "Observation | None":
    """`obs` with its rate taken over enough elements, or None to wait.

    A tuning period may see only a few elements of a pipeline of large
    batches (4 batches of 4096 rows in 0.5 s): a rate counted over so few is
    mostly quantization noise. Periods accumulate until `search.MIN_ELEMENTS`
    elements or `MAX_WAIT_S` seconds were seen.
    """
    self._acc_elements += obs.output_rate * obs.interval_s
    self._acc_seconds += obs.interval_s
    if (self._acc_elements < search.MIN_ELEMENTS and
        self._acc_seconds < MAX_WAIT_S):
      return None
    rate = self._acc_elements / max(self._acc_seconds, 1e-9)
    self._acc_elements = self._acc_seconds = 0.0
    return dataclasses.replace(obs, output_rate=rate)

  def _avoid_known_worse(self, obs: "Observation", config: dict[str, float],
                         mask: np.ndarray) -> np.ndarray:
    """`mask` without the moves into configurations the guard measured
    clearly worse than the best (the agent's prior can be wrong for a
    machine; the measurements say so long before fine-tuning does)."""
    worse = self.best_configs.worse_keys()
    if not worse:
      return mask
    mask = mask.copy()
    for a in np.flatnonzero(mask[:-1]):
      if config_key({**config, **mdp.apply_action(obs, int(a))}) in worse:
        mask[a] = False
    return mask

  def held_bytes(self) -> int:
    """The agent's memory (`dqn.Agent.nbytes`): its replay buffer grows
    to about 23 MB at 5,000 transitions."""
    return self.agent.nbytes

  def step(self, obs: "Observation") -> dict[str, float]:
    values = {**raise_low_buffers(obs), **self._step(obs)}
    # Held, reverted or warm-start values obey the floor too.
    floored = {k.name for k in obs.knobs
               if k.kind == "buffer_size" and k.max >= mdp.MIN_BUFFER}
    return {name: max(v, mdp.MIN_BUFFER) if name in floored else v
            for name, v in values.items()}

  def _step(self, obs: "Observation") -> dict[str, float]:
    """The phases of a step, in order; the first that acts decides it."""
    start = time.perf_counter()
    if not obs.knobs:
      return {}
    for phase in (self._fit_budget, self._begin):
      values = phase(obs)
      if values is not None:
        return values
    measured = self._measured(obs)
    if measured is None:
      return {}
    return self._decide(measured, start)

  def _fit_budget(self, obs: "Observation") -> dict[str, float] | None:
    """Phase 1: threads raised to the floor after the CPU budget grew, or
    cut to fit it; None when the configuration fits."""
    grown = self._cpu_budget is not None and obs.cpu_budget > self._cpu_budget
    self._cpu_budget = obs.cpu_budget
    for action, values in (
        ("raise-to-floor", raise_low_threads(obs) if grown else {}),
        ("fit-cpu-budget", project_to_budget(obs))):
      if values:
        self.collector.forget()
        self._acc_elements = self._acc_seconds = 0.0
        self.last_decision = records.Decision(self.steps, action)
        return values
    return None

  def _begin(self, obs: "Observation") -> dict[str, float] | None:
    """Phase 2, once: the warm-start configuration, or (with a session) the
    start allocation, each held for a while; None afterwards."""
    if self._started:
      return None
    self._started = True
    if self._warm is not None:
      values = warmstart.fitting(self._warm, obs.knobs)
      self._warm = None
      if values:
        self._hold, self._hold_values = HOLD, values
        self.last_decision = records.Decision(0, "warm-start")
        return values
    if self.session is None:
      return None
    # Held for MIN_SAMPLES decisions, so the guard knows the start's rate
    # before the agent explores from it.
    values = start_allocation(obs)
    self._hold, self._hold_values = MIN_SAMPLES, values
    self.last_decision = records.Decision(0, "start")
    return values

  def _decide(self, obs: "Observation", start: float) -> dict[str, float]:
    """Phase 3, on a measured observation: learn from the last move, then
    revert to the best, hold, or move as the agent chooses."""
    self.steps += 1
    state, mask, r, info = self.collector.collect(obs)
    loss = info.loss if info is not None else None
    config = {k.name: k.value for k in obs.knobs}
    revert = self.best_configs.update(config, obs.output_rate,
                                      obs.usable_cpus)
    if self.session is not None and self.steps % SAVE_EVERY == 0:
      self._save()
    if revert:
      best, _ = self.best_configs.best()
      values, action = best, "revert-to-best"
      self.collector.forget()
      self._hold, self._hold_values = HOLD, best
    elif self._hold > 0:
      self._hold -= 1
      # Holding re-asserts the held configuration: a stage that initializes
      # after the first step may have reset its knob.
      values, action = dict(self._hold_values), "hold"
      self.collector.forget()
    else:
      mask = self._avoid_known_worse(obs, config, mask)
      a = self.agent.act(state, mask, self.epsilon, self.move_margin)
      values, action = mdp.apply_action(obs, a), mdp.describe_action(obs, a)
      self.collector.acted(state, a)
    self.last_decision = records.Decision(
        self.steps, action, rate=obs.output_rate, reward=r, loss=loss,
        seconds=time.perf_counter() - start)
    return values
