"""The InTune DQN: state features, actions, reward, TD targets, the network.

State. The paper's factors (pipeline latency, free CPUs, free memory, model
latency, DRAM bandwidth, CPU speed), computed per knob: every knob gets a row
of `NUM_FEATURES` features (its kind and value, its stage's share of the
pipeline's CPU time, how busy the stage is, the gap to a proportional share,
buffer fill and bytes) followed by the pipeline-wide factors. One network,
shared by all knobs, maps a row to the Q-values of that knob's moves, so
one agent serves pipelines of any length (no padding at inference; padding to
`MAX_KNOBS` only inside training batches). Sharing also means what is learned
on one stage transfers to every other stage and pipeline size.

Actions. Per knob: -5, -1, +1, +5 (`MOVES`: threads for parallelism knobs,
elements for buffer knobs: our prefetch knobs count elements, not MB), plus
one shared no-op: 4n + 1 actions for n knobs (`MOVES_PER_KNOB` = 4). Flat
index `MOVES_PER_KNOB * k + j` for knob k and move `MOVES[j]`, and
`MOVES_PER_KNOB * n` for the no-op. The no-op's value is the mean over
knobs of each knob's "stay" output.

Reward. `reward()`: throughput relative to the work ceiling, times a memory
factor that is 1 up to `MEMORY_SAFE` of memory in use and falls linearly to 0
at 100% (the paper's shape).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from typing import TYPE_CHECKING, Sequence
import zipfile

import numpy as np

from intune_tf import files
from intune_tf import records

if TYPE_CHECKING:
  from intune_tf.records import Knob
  from intune_tf.records import Observation

# Knob moves of the action space, in knob units.
MOVES = (-5, -1, 1, 5)
# Flat actions per knob (the no-op is one more, shared by all knobs).
MOVES_PER_KNOB = len(MOVES)
# Network outputs per knob: the moves and "stay" (index 2).
_OUTPUTS = (-5, -1, 0, 1, 5)
_STAY = 2
# The outputs of the moves, in the order of `MOVES`: [0, 1, 3, 4].
_MOVE_OUTPUTS = [_OUTPUTS.index(m) for m in MOVES]
NUM_FEATURES = 18
# Knobs per pipeline a training batch holds (inference has no limit).
MAX_KNOBS = 32
# The agent never takes a buffer below one element: a prefetch of 0 does not
# overlap the pipeline with its consumer at all, a loss the simulator's
# jitter model does not price (measured live: Criteo L4 spent half a
# benchmark at 0). A buffer already below it may still grow.
MIN_BUFFER = 1
# The agent never takes a parallel stage below min(CPUs, MIN_THREADS)
# threads: a tf.data thread blocked on its input or output costs no CPU, and
# a stage with one thread has nothing in flight while it hands an element
# over (Criteo L4 on 2 CPUs: 35,840 rows/s with one thread per stage, 54,272
# with two; the simulator prices every thread, idle or not).
MIN_THREADS = 2
# Largest buffer the agent sets, elements.
MAX_BUFFER = 64
# Memory-use fraction above which the reward starts to fall.
MEMORY_SAFE = 0.9
HIDDEN = 64
# The CPU clock (MHz) and DRAM bandwidth (GB/s) the state gives the network:
# the machine of the simulator, which models neither, so the shipped
# networks learned nothing from them. The observation still reports the
# host's values; the state holds these so that a live host (44 GB/s here)
# does not feed the network inputs it never saw in training.
SIM_CPU_MHZ = 2500.0
SIM_DRAM_GBPS = 10.0


# --- reward and targets ------------------------------------------------------
def memory_factor(memory_fraction: float) -> float:
  """1 up to `MEMORY_SAFE` (0.9) of memory in use, then linearly to 0 at 1.0.

  memory_factor(0.95) == 0.5: (1 - 0.95) / (1 - 0.9).
  """
  if memory_fraction <= MEMORY_SAFE:
    return 1.0
  return max(0.0, (1.0 - memory_fraction) / (1.0 - MEMORY_SAFE))


def reward(rate: float, reference_rate: float, memory_fraction: float) -> float:
  """The agent's reward for a step.

  Args:
    rate: output elements/s measured over the step.
    reference_rate: the work ceiling estimate (usable CPUs / CPU-seconds per
      output element), so rewards compare across pipelines; <= 0 gives 0.
    memory_fraction: memory in use / memory available to the job.

  Returns:
    min(rate / reference_rate, 2) * memory_factor(memory_fraction).
  """
  if reference_rate <= 0:
    return 0.0
  return min(rate / reference_rate, 2.0) * memory_factor(memory_fraction)


def td_targets(rewards: np.ndarray, next_q_target: np.ndarray,
               next_mask: np.ndarray, dones: np.ndarray, gamma: float,
               next_q_online: np.ndarray | None = None) -> np.ndarray:
  """One-step TD targets y = r + gamma * (1 - done) * Q_target(s', a*).

  a* is the best valid action under `next_q_online` (double DQN) or, when it
  is None, under `next_q_target` itself. Works on numpy arrays or tensors of
  shape [batch] (rewards, dones) and [batch, actions] (q values, mask).
  """
  chooser = next_q_target if next_q_online is None else next_q_online
  masked = np.where(next_mask, chooser, -np.inf)
  best = np.argmax(masked, axis=1)
  value = np.take_along_axis(next_q_target, best[:, None], axis=1)[:, 0]
  value = np.where(next_mask.any(axis=1), value, 0.0)
  return rewards + gamma * (1.0 - dones) * value


# --- actions -----------------------------------------------------------------
def cpu_limit(parallel_knobs: int, cpu_budget: int) -> int:
  """Most threads all parallel stages together may hold: 2 (C + n - 1),
  twice the C CPUs plus each stage's first thread, since tf.data's threads
  also wait on their inputs and outputs (Criteo L4, 4 parallel stages, runs
  fastest with 2 threads on every stage: 8 threads on 2 cores)."""
  return 2 * (int(cpu_budget) + max(int(parallel_knobs), 1) - 1)


def thread_floor(cpu_budget: int) -> int:
  """Fewest threads the agent leaves a parallel stage: min(C, MIN_THREADS)."""
  return max(1, min(int(cpu_budget), MIN_THREADS))


def knob_bounds(knob: "Knob", cpu_budget: int) -> tuple[float, float]:
  """`(lowest, highest)` value the agent may give `knob`.

  A parallelism: from `thread_floor` to `cpu_budget` threads; a buffer:
  from `MIN_BUFFER` to `MAX_BUFFER` elements; both within the knob's own
  range. Totals (`cpu_limit`, the RAM budget) are limits on top.
  """
  if knob.kind == "parallelism":
    return max(knob.min, thread_floor(cpu_budget)), min(knob.max, cpu_budget)
  return max(knob.min, MIN_BUFFER), min(knob.max, MAX_BUFFER)


def committed_bytes(obs: "Observation",
                    values: dict[str, float] | None = None) -> float:
  """Bytes the buffers may hold: buffer size times element size, over all
  buffer knobs (an unknown element size counts as 0 bytes), with `values`
  (knob name -> value) in place of the values in force."""
  values = values or {}
  bpe = obs.bytes_per_element
  return sum(max(values.get(k.name, k.value), 0) * bpe.get(k.stage, 0.0)
             for k in obs.knobs if k.kind == "buffer_size")


def action_mask(obs: "Observation") -> np.ndarray:
  """Valid flat actions (bool, length 4n + 1) for the knobs of `obs`.

  A move is valid when the new value stays within `knob_bounds` (a buffer
  at least `MIN_BUFFER`, a parallelism at least `thread_floor` and at most
  `cpu_budget`), a move that adds threads keeps all parallel stages
  together at most `cpu_limit`, and a move that grows a buffer keeps
  `committed_bytes` within the RAM budget. The no-op is always valid.
  """
  knobs = obs.knobs
  parallel = [k for k in knobs if k.kind == "parallelism"]
  threads = sum(k.value for k in parallel)
  limit = cpu_limit(len(parallel), obs.cpu_budget)
  bpe = obs.bytes_per_element
  committed = committed_bytes(obs)
  mask = np.zeros(MOVES_PER_KNOB * len(knobs) + 1, dtype=bool)
  for i, k in enumerate(knobs):
    lo, hi = knob_bounds(k, obs.cpu_budget)
    for j, move in enumerate(MOVES):
      new = k.value + move
      if new < lo:
        continue
      if k.kind == "parallelism":
        ok = new <= hi and (move < 0 or threads + move <= limit)
      else:
        ok = (new <= hi and
              (move < 0 or committed + move * bpe.get(k.stage, 0.0)
               <= obs.ram_budget))
      mask[MOVES_PER_KNOB * i + j] = ok
  mask[-1] = True
  return mask


def action_of(knob_index: int, move: int) -> int:
  """The flat action that moves knob `knob_index` by `move` (in `MOVES`)."""
  return MOVES_PER_KNOB * knob_index + MOVES.index(move)


def apply_action(obs: "Observation", action: int) -> dict[str, float]:
  """The knob values an action sets ({} for the no-op)."""
  knobs = obs.knobs
  if action >= MOVES_PER_KNOB * len(knobs):
    return {}
  k = knobs[action // MOVES_PER_KNOB]
  return {k.name: float(k.value + MOVES[action % MOVES_PER_KNOB])}


def describe_action(obs: "Observation", action: int) -> str:
  if action >= MOVES_PER_KNOB * len(obs.knobs):
    return "no-op"
  move = MOVES[action % MOVES_PER_KNOB]
  return f"{obs.knobs[action // MOVES_PER_KNOB].name} {move:+d}"


# --- state -------------------------------------------------------------------
def stage_costs(obs: "Observation") -> dict[str, float]:
  """CPU-seconds each stage spends per output element (`records.stage_cost`;
  {} before the pipeline returned anything)."""
  if obs.output_rate <= 0:
    return {}
  return {st.name: records.stage_cost(st.cpu_per_element_s, st.rate,
                                      obs.output_rate)
          for st in obs.stages}


def reference_rate(obs: "Observation") -> float:
  """The work-ceiling estimate: usable CPUs / CPU-seconds per output element
  summed over stages (0 before anything was measured)."""
  total = sum(stage_costs(obs).values())
  return obs.usable_cpus / total if total > 0 else 0.0


def memory_fraction(obs: "Observation") -> float:
  """Memory in use: the larger of the host's share in use and the buffered
  bytes' share of the RAM budget (so the budget counts as the job's limit)."""
  host = 1.0 - obs.free_memory / obs.total_memory if obs.total_memory else 0.0
  budget = obs.buffered_bytes / obs.ram_budget if obs.ram_budget else 0.0
  return max(host, budget)


def features(obs: "Observation") -> np.ndarray:
  """The state: one row of `NUM_FEATURES` per knob, shape [n, NUM_FEATURES]."""
  knobs = obs.knobs
  out = np.zeros((len(knobs), NUM_FEATURES), dtype=np.float32)
  if not knobs:
    return out
  costs = stage_costs(obs)
  total_cost = sum(costs.values())
  cpus = max(1, obs.cpu_budget)
  parallel = [k for k in knobs if k.kind == "parallelism"]
  threads = sum(k.value for k in parallel)
  limit = cpu_limit(len(parallel), cpus)
  par_by_stage = {k.stage: max(k.value, 1.0) for k in parallel}
  knob_cost = sum(costs.get(k.stage, 0.0) for k in parallel)
  # Each knob's stage's utilization (`records.stage_utilization`) at its
  # parallelism knob's value, capped at 2; 0 until the pipeline returns.
  busy = {}
  for k in knobs:
    st = obs.stage(k.stage)
    busy[k.stage] = (min(2.0, records.stage_utilization(
        st.cpu_per_element_s, st.rate, par_by_stage.get(k.stage, 1.0)))
                     if costs and st is not None else 0.0)
  bottleneck = max(busy, key=busy.get) if busy else None
  ref = obs.usable_cpus / total_cost if total_cost > 0 else 0.0
  bpe = obs.bytes_per_element
  ram = max(1.0, float(obs.ram_budget))
  globals_ = [
      (limit - threads) / cpus,
      threads / cpus,
      min(2.0, obs.buffered_bytes / ram),
      1.0 - obs.free_memory / obs.total_memory if obs.total_memory else 0.0,
      min(2.0, (obs.model_step_s or 0.0) * obs.output_rate),
      math.log2(cpus) / 7.0,
      min(2.0, obs.output_rate / ref) if ref > 0 else 0.0,
      SIM_CPU_MHZ / 5000.0,
      SIM_DRAM_GBPS / 50.0,
  ]
  out[:, 9:] = globals_
  for i, k in enumerate(knobs):
    cost = costs.get(k.stage, 0.0)
    share = cost / total_cost if total_cost > 0 else 0.0
    st = obs.stage(k.stage)
    row = out[i]
    if k.kind == "parallelism":
      ideal = cpus * (cost / knob_cost if knob_cost > 0 else 1 / len(parallel))
      row[0] = 1.0
      row[2] = k.value / cpus
      row[5] = (ideal - k.value) / max(1.0, ideal, k.value)
    else:
      row[1] = 1.0
      row[2] = k.value / MAX_BUFFER
      row[5] = st.buffer_fill if st else 0.0
    row[3] = math.log1p(max(k.value, 0.0)) / math.log1p(128)
    row[4] = share
    row[6] = busy.get(k.stage, 0.0)
    row[7] = 1.0 if k.stage == bottleneck else 0.0
    row[8] = min(2.0, max(k.value, 0) * bpe.get(k.stage, 0.0) / ram)
  return out


# --- network -----------------------------------------------------------------
def build_network(hidden: int = HIDDEN, seed: int = 0):
  """The Q-network: a 3-layer ReLU MLP applied to every knob's row.

  Input [batch, knobs, NUM_FEATURES] -> output [batch, knobs, 5] (the
  Q-values of -5, -1, stay, +1, +5).
  """
  # Deferred: Keras only to build the network: acting and the simulator use
  # numpy.
  import keras  # noqa: PLC0415
  init = keras.initializers.GlorotUniform(seed=seed)
  return keras.Sequential([
      keras.Input((None, NUM_FEATURES)),
      keras.layers.Dense(hidden, activation="relu", kernel_initializer=init),
      keras.layers.Dense(hidden, activation="relu", kernel_initializer=init),
      keras.layers.Dense(len(_OUTPUTS), kernel_initializer=init),
  ])


def forward(weights: Sequence[np.ndarray], x: np.ndarray) -> np.ndarray:
  """The network in numpy (inference without TF's per-call overhead)."""
  h = x
  layers = len(weights) // 2
  for i in range(layers):
    h = h @ weights[2 * i] + weights[2 * i + 1]
    if i < layers - 1:
      h = np.maximum(h, 0.0)
  return h


def flat_q(per_knob: np.ndarray, knob_mask: np.ndarray | None = None
           ) -> np.ndarray:
  """Per-knob outputs [..., n, 5] -> flat action values [..., 4n + 1].

  The no-op's value is the mean "stay" output over (valid) knobs.
  """
  moves = per_knob[..., _MOVE_OUTPUTS]
  flat = moves.reshape(moves.shape[:-2] + (-1,))
  stay = per_knob[..., _STAY]
  if knob_mask is None:
    noop = stay.mean(axis=-1) if stay.shape[-1] else np.zeros(stay.shape[:-1])
  else:
    noop = (stay * knob_mask).sum(-1) / np.maximum(knob_mask.sum(-1), 1)
  return np.concatenate([flat, noop[..., None]], axis=-1)


def select(q: np.ndarray, mask: np.ndarray, epsilon: float,
           rng: np.random.Generator, margin: float = 0.0) -> int:
  """Epsilon-greedy over the valid actions (the no-op, last, is always
  valid). The greedy move is taken only when its value beats the no-op's by
  more than `margin` (default 0); otherwise the no-op."""
  valid = np.flatnonzero(mask)
  if rng.random() < epsilon:
    return int(rng.choice(valid))
  best = int(valid[np.argmax(q[valid])])
  noop = len(q) - 1
  return best if q[best] > q[noop] + margin else noop


def pad_action(action: int, knobs: int) -> int:
  """A flat action of an n-knob pipeline -> its index at `MAX_KNOBS` knobs."""
  if action >= MOVES_PER_KNOB * knobs:
    return MOVES_PER_KNOB * MAX_KNOBS
  return action


class Replay:
  """A ring buffer of transitions padded to `MAX_KNOBS` knobs."""

  def __init__(self, capacity: int = 50_000):
    self.capacity = capacity
    self.size = 0
    self._next = 0
    k, f, a = MAX_KNOBS, NUM_FEATURES, MOVES_PER_KNOB * MAX_KNOBS + 1
    self.state = np.zeros((capacity, k, f), np.float32)
    self.knobs = np.zeros((capacity, k), np.float32)
    self.action = np.zeros(capacity, np.int64)
    self.reward = np.zeros(capacity, np.float32)
    self.next_state = np.zeros((capacity, k, f), np.float32)
    self.next_knobs = np.zeros((capacity, k), np.float32)
    self.next_mask = np.zeros((capacity, a), bool)
    self.done = np.zeros(capacity, np.float32)

  def add(self, state, action, r, next_state, next_mask, done) -> bool:
    """Stores a transition; False (not stored) past `MAX_KNOBS` knobs."""
    n, m = len(state), len(next_state)
    if n > MAX_KNOBS or m > MAX_KNOBS or n == 0:
      return False
    i = self._next
    self.state[i] = 0
    self.state[i, :n] = state
    self.knobs[i] = 0
    self.knobs[i, :n] = 1
    self.action[i] = pad_action(action, n)
    self.reward[i] = r
    self.next_state[i] = 0
    self.next_state[i, :m] = next_state
    self.next_knobs[i] = 0
    self.next_knobs[i, :m] = 1
    self.next_mask[i] = False
    self.next_mask[i, :MOVES_PER_KNOB * m] = next_mask[:MOVES_PER_KNOB * m]
    self.next_mask[i, -1] = True
    self.done[i] = float(done)
    self._next = (i + 1) % self.capacity
    self.size = min(self.size + 1, self.capacity)
    return True

  @property
  def nbytes(self) -> int:
    """Bytes of the transitions stored so far: the ring is written from
    its first row on, and rows never written take no memory (`np.zeros`
    pages are mapped on first write)."""
    arrays = (self.state, self.knobs, self.action, self.reward,
              self.next_state, self.next_knobs, self.next_mask, self.done)
    return sum(a.nbytes for a in arrays) * self.size // self.capacity

  def sample(self, rng: np.random.Generator, batch: int):
    idx = rng.integers(0, self.size, batch)
    return (self.state[idx], self.knobs[idx], self.action[idx],
            self.reward[idx], self.next_state[idx], self.next_knobs[idx],
            self.next_mask[idx], self.done[idx])


class Agent:
  """A DQN over the per-knob network: act, remember, learn, save, load.

  Args:
    seed: seeds the network's initialization and exploration. Default 0.
    gamma: discount. Default 0.9 (the effect of a move shows within a few
      tuning steps).
    learning_rate: Adam's learning rate. Default 1e-3.
    batch_size: transitions per gradient step. Default 64.
    target_period: gradient steps between target-network copies.
      Default 250.
    replay_capacity: transitions kept. Default 50,000.
  """

  def __init__(self, seed: int = 0, gamma: float = 0.9,
               learning_rate: float = 1e-3, batch_size: int = 64,
               target_period: int = 250, replay_capacity: int = 50_000):
    # Deferred: Keras only to train: acting and the simulator use numpy.
    import keras  # noqa: PLC0415
    self.gamma = gamma
    self.batch_size = batch_size
    self.target_period = target_period
    self.rng = np.random.default_rng(seed)
    self.network = build_network(seed=seed)
    self.target = build_network(seed=seed)
    self.target.set_weights(self.network.get_weights())
    self.optimizer = keras.optimizers.Adam(learning_rate)
    self.replay = Replay(replay_capacity)
    self.weights = [w.astype(np.float32) for w in self.network.get_weights()]
    self.gradient_steps = 0
    self._train_fn = None

  @property
  def nbytes(self) -> int:
    """Host memory the agent holds: its replay buffer, and its network,
    target network, acting copy and Adam's two moments (5 copies of the
    weights)."""
    return self.replay.nbytes + 5 * sum(w.nbytes for w in self.weights)

  # --- acting -------------------------------------------------------------
  def q_values(self, state: np.ndarray) -> np.ndarray:
    return flat_q(forward(self.weights, state))

  def act(self, state: np.ndarray, mask: np.ndarray, epsilon: float,
          margin: float = 0.0) -> int:
    return select(self.q_values(state), mask, epsilon, self.rng, margin)

  # --- learning -----------------------------------------------------------
  def _make_train_fn(self):
    # Deferred: TensorFlow only to train: acting and the simulator use numpy.
    import tensorflow as tf  # noqa: PLC0415
    network, optimizer = self.network, self.optimizer
    huber = tf.keras.losses.Huber() if hasattr(tf, "keras") else None

    @tf.function(reduce_retracing=True)
    def train(state, knobs, action, target):
      with tf.GradientTape() as tape:
        per_knob = network(state, training=True)
        moves = tf.gather(per_knob, _MOVE_OUTPUTS, axis=2)
        flat = tf.reshape(moves, [tf.shape(moves)[0], -1])
        stay = per_knob[:, :, _STAY]
        noop = tf.reduce_sum(stay * knobs, 1) / tf.maximum(
            tf.reduce_sum(knobs, 1), 1.0)
        q = tf.concat([flat, noop[:, None]], axis=1)
        chosen = tf.gather(q, action, axis=1, batch_dims=1)
        loss = huber(target, chosen)
      grads = tape.gradient(loss, network.trainable_variables)
      optimizer.apply_gradients(zip(grads, network.trainable_variables))
      return loss
    return train

  def learn(self) -> float | None:
    """One gradient step on a replay sample (None until a batch is stored)."""
    if self.replay.size < self.batch_size:
      return None
    if self._train_fn is None:
      self._train_fn = self._make_train_fn()
    (s, k, a, r, s2, k2, m2, d) = self.replay.sample(self.rng, self.batch_size)
    target_w = self._target_weights()
    q_next_t = flat_q(forward(target_w, s2), k2)
    q_next_o = flat_q(forward(self.weights, s2), k2)
    y = td_targets(r, q_next_t, m2, d, self.gamma, q_next_o).astype(np.float32)
    loss = self._train_fn(s, k, a, y)
    self.weights = [w.numpy() if hasattr(w, "numpy") else np.asarray(w)
                    for w in self.network.trainable_variables]
    self.gradient_steps += 1
    if self.gradient_steps % self.target_period == 0:
      self.target.set_weights(self.network.get_weights())
      self._target_cache = None
    return float(loss)

  def _target_weights(self):
    cache = getattr(self, "_target_cache", None)
    if cache is None:
      cache = [w.astype(np.float32) for w in self.target.get_weights()]
      self._target_cache = cache
    return cache

  # --- persistence ----------------------------------------------------------
  def get_weights(self) -> list[np.ndarray]:
    return [np.asarray(w) for w in self.network.get_weights()]

  def set_weights(self, weights: Sequence[np.ndarray]) -> None:
    shapes = [tuple(w.shape) for w in self.network.get_weights()]
    got = [tuple(np.shape(w)) for w in weights]
    if shapes != got:
      raise ValueError(f"Agent weights have shapes {got}; this agent needs "
                       f"{shapes}.")
    self.network.set_weights(list(weights))
    self.target.set_weights(list(weights))
    self._target_cache = None
    self.weights = [np.asarray(w, np.float32) for w in weights]

  def save(self, path: str, metadata: dict | None = None) -> None:
    """Writes the weights as a numpy .npz (no pickle) with JSON metadata."""
    save_weights(path, self.get_weights(), metadata)

  def load(self, path: str) -> dict:
    weights, metadata = load_weights(path)
    self.set_weights(weights)
    return metadata

  def load_shared(self, path: str) -> dict:
    """`load`, reading the file once per process while it is unchanged.

    Every new tuning session loads the shipped weights; numpy parses a file's
    header with `ast`, which on Python 3.11 can fail when another thread
    parses at the same time (a user's AutoGraph conversion), so the tuner
    thread reads each file once.
    """
    weights, metadata = _load_weights_cached(path, *_file_key(path))
    self.set_weights([w.copy() for w in weights])
    return dict(metadata)


def save_weights(path: str, weights: Sequence[np.ndarray],
                 metadata: dict | None = None) -> None:
  """Writes weights and JSON metadata to an .npz file atomically (a temp file
  of its own in the same folder, then a rename: concurrent saves of one path
  never share a temp file)."""
  arrays = {f"w{i}": np.asarray(w, np.float32) for i, w in enumerate(weights)}
  arrays["metadata"] = np.frombuffer(
      json.dumps(metadata or {}).encode(), dtype=np.uint8)
  with files.atomic_write(path, binary=True) as f:
    np.savez_compressed(f, **arrays)


# Limits on a weights file, checked before any array is read: the shipped
# network is 23 KB on disk and 27 KB of float32 arrays.
MAX_WEIGHTS_FILE_BYTES = 4 << 20
MAX_WEIGHTS_ARRAY_BYTES = 16 << 20
_MAX_METADATA_BYTES = 1 << 20


def _check_weights_archive(path: str) -> None:
  """Checks an .npz's size, member names and .npy headers (dtype, shape)
  without reading any array.

  Raises:
    ValueError: what is wrong with the file.
  """
  size = os.path.getsize(path)
  if size > MAX_WEIGHTS_FILE_BYTES:
    raise ValueError(f"{size} bytes, more than an agent weights file may "
                     f"hold ({MAX_WEIGHTS_FILE_BYTES})")
  with zipfile.ZipFile(path) as archive:
    members = archive.infolist()
    if len(members) > 16:
      raise ValueError(f"{len(members)} members")
    for member in members:
      if not re.fullmatch(r"(w\d+|metadata)\.npy", member.filename):
        raise ValueError(f"unexpected member {member.filename!r}")
      is_metadata = member.filename == "metadata.npy"
      limit = _MAX_METADATA_BYTES if is_metadata else MAX_WEIGHTS_ARRAY_BYTES
      if member.file_size > limit + 1024:
        raise ValueError(f"{member.filename} unpacks to {member.file_size} "
                         f"bytes (limit {limit})")
      with archive.open(member) as stream:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
          shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
          shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
          raise ValueError(f"{member.filename}: .npy version {version}")
      wanted = np.uint8 if is_metadata else np.float32
      if dtype != wanted:
        raise ValueError(f"{member.filename} holds {dtype}, not "
                         f"{np.dtype(wanted)}")
      if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize > limit:
        raise ValueError(f"{member.filename} declares shape {shape}")
      if not is_metadata:
        # w0, w2, w4: a layer's kernel (2-D); w1, w3, w5: its bias (1-D).
        ndim = 2 if int(member.filename[1:-4]) % 2 == 0 else 1
        if len(shape) != ndim:
          raise ValueError(
              f"{member.filename} has shape {shape}; an agent's w0, w2, w4 "
              "are 2-D kernels and w1, w3, w5 1-D biases")


def _file_key(path: str) -> tuple[int, int]:
  stat = os.stat(path)
  return stat.st_mtime_ns, stat.st_size


@functools.lru_cache(maxsize=8)
def _load_weights_cached(path: str, mtime_ns: int,
                         size: int) -> tuple[list[np.ndarray], dict]:
  del mtime_ns, size  # part of the cache key only
  return load_weights(path)


def load_weights(path: str) -> tuple[list[np.ndarray], dict]:
  """Reads `save_weights` files; never unpickles (allow_pickle=False).

  Raises:
    ValueError: the file is not an agent weights file (names what is wrong).
    OSError: it cannot be read.
  """
  try:
    _check_weights_archive(path)
    with np.load(path, allow_pickle=False) as data:
      names = sorted((n for n in data.files if n.startswith("w")),
                     key=lambda n: int(n[1:]))
      weights = [data[n] for n in names]
      metadata = (json.loads(bytes(data["metadata"]).decode())
                  if "metadata" in data.files else {})
  except (zipfile.BadZipFile, ValueError, KeyError, EOFError) as e:
    raise ValueError(
        f"{path} is not an InTune agent weights file ({e}).") from e
  if len(weights) != 6 or weights[0].shape[0] != NUM_FEATURES:
    raise ValueError(
        f"{path} holds {len(weights)} arrays (first "
        f"{weights[0].shape if weights else None}); "
        f"an InTune agent has 6, the first of shape ({NUM_FEATURES}, hidden).")
  # Dense layers: kernel (n, m) then bias (m,), each layer's n the last m.
  expected_in = NUM_FEATURES
  for layer in range(3):
    kernel, bias = weights[2 * layer], weights[2 * layer + 1]
    if (kernel.ndim != 2 or kernel.shape[0] != expected_in or
        bias.shape != (kernel.shape[1],)):
      raise ValueError(
          f"{path}: layer {layer} has shapes {kernel.shape} and {bias.shape}; "
          f"expected ({expected_in}, m) and (m,).")
    expected_in = kernel.shape[1]
  for i, w in enumerate(weights):
    if not np.all(np.isfinite(w)):
      raise ValueError(f"{path}: array w{i} holds NaN or infinite values; "
                       "delete the file (a warm start then starts cold).")
  return weights, metadata
