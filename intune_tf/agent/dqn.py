"""The InTune DQN: TD targets, the Q-network, its replay buffer and agent.

It acts in the tuning MDP (`intune_tf.tuning.mdp`: actions, mask, state
features, reward). One network, shared by all knobs, maps a knob's row of
`mdp.NUM_FEATURES` features to the Q-values of that knob's moves and of
"stay", so one agent serves pipelines of any length (no padding at
inference; padding to `MAX_KNOBS` only inside training batches). Sharing
also means what is learned on one stage transfers to every other stage and
pipeline size. The no-op's value is the mean over knobs of each knob's
"stay" output.
"""

from __future__ import annotations

import functools
import json
import os
import re
from typing import TYPE_CHECKING, NamedTuple, Sequence
import zipfile

import numpy as np

from intune_tf import files
from intune_tf.tuning import mdp

if TYPE_CHECKING:
  from intune_tf.records import Observation

# Network outputs per knob: the moves and "stay" (index 2).
_OUTPUTS = (-5, -1, 0, 1, 5)
_STAY = 2
# The outputs of the moves, in the order of `mdp.MOVES`: [0, 1, 3, 4].
_MOVE_OUTPUTS = [_OUTPUTS.index(m) for m in mdp.MOVES]
# Knobs per pipeline a training batch holds (inference has no limit).
MAX_KNOBS = 32
HIDDEN = 64


# --- targets -----------------------------------------------------------------
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


# --- network -----------------------------------------------------------------
def build_network(hidden: int = HIDDEN, seed: int = 0):
  """The Q-network: a 3-layer ReLU MLP applied to every knob's row.

  Input [batch, knobs, mdp.NUM_FEATURES] -> output [batch, knobs, 5] (the
  Q-values of -5, -1, stay, +1, +5).
  """
  # Deferred: Keras only to build the network: acting and the simulator use
  # numpy.
  import keras  # noqa: PLC0415
  init = keras.initializers.GlorotUniform(seed=seed)
  return keras.Sequential([
      keras.Input((None, mdp.NUM_FEATURES)),
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
  if action >= mdp.MOVES_PER_KNOB * knobs:
    return mdp.MOVES_PER_KNOB * MAX_KNOBS
  return action


class Replay:
  """A ring buffer of transitions padded to `MAX_KNOBS` knobs."""

  def __init__(self, capacity: int = 50_000):
    self.capacity = capacity
    self.size = 0
    self._next = 0
    k, f, a = MAX_KNOBS, mdp.NUM_FEATURES, mdp.MOVES_PER_KNOB * MAX_KNOBS + 1
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
    moves = mdp.MOVES_PER_KNOB * m
    self.next_mask[i, :moves] = next_mask[:moves]
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


class LossInfo(NamedTuple):
  """What one gradient step did (the shape of tf-agents' `LossInfo`).

  Attributes:
    loss: the agent's loss on the batch, before the step.
    td_error: mean |TD target - Q(s, a)| on the batch, before the step.
    gradient_step: the step's number, from 1.
    target_updated: whether the target network was copied after the step.
  """
  loss: float
  td_error: float
  gradient_step: int
  target_updated: bool


class Agent:
  """A DQN over the per-knob network: act, remember, learn, save, load.

  Args:
    seed: seeds the network's initialization and exploration. Default 0.
    gamma: discount. Default 0.9 (the effect of a move shows within a few
      tuning steps).
    learning_rate: Adam's learning rate, when no `optimizer` is given.
      Default 1e-3.
    batch_size: transitions per gradient step. Default 64.
    target_period: gradient steps between target-network copies.
      Default 250.
    replay_capacity: transitions kept. Default 50,000.
    network: the Q-network, a Keras model of Dense layers with ReLU between
      them from [batch, knobs, `mdp.NUM_FEATURES`] to [batch, knobs, 5]
      (acting runs its weights in numpy, `forward`). Default
      `build_network(seed=seed)`.
    optimizer: a Keras optimizer. Default Adam at `learning_rate`.
    loss: a Keras loss of (TD targets, Q-values). Default Huber.
  """

  def __init__(self, seed: int = 0, gamma: float = 0.9,
               learning_rate: float = 1e-3, batch_size: int = 64,
               target_period: int = 250, replay_capacity: int = 50_000,
               network=None, optimizer=None, loss=None):
    # Deferred: Keras only to train: acting and the simulator use numpy.
    import keras  # noqa: PLC0415
    self.gamma = gamma
    self.batch_size = batch_size
    self.target_period = target_period
    self.rng = np.random.default_rng(seed)
    self.network = network if network is not None else build_network(
        seed=seed)
    self.target = keras.models.clone_model(self.network)
    self.target.set_weights(self.network.get_weights())
    self.optimizer = (optimizer if optimizer is not None
                      else keras.optimizers.Adam(learning_rate))
    self.loss = loss if loss is not None else keras.losses.Huber()
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
    network, optimizer, loss_fn = self.network, self.optimizer, self.loss
    if not optimizer.built:
      # Made before the trace, the optimizer's slots are not created inside
      # the first step, which tf.function then traces once instead of twice
      # (about 1 s of CPU less for each agent that learns).
      optimizer.build(network.trainable_variables)

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
        loss = loss_fn(target, chosen)
      grads = tape.gradient(loss, network.trainable_variables)
      optimizer.apply_gradients(zip(grads, network.trainable_variables))
      return loss
    return train

  def learn(self) -> LossInfo | None:
    """One gradient step on a replay sample (None until a batch is
    stored)."""
    if self.replay.size < self.batch_size:
      return None
    if self._train_fn is None:
      self._train_fn = self._make_train_fn()
    (s, k, a, r, s2, k2, m2, d) = self.replay.sample(self.rng, self.batch_size)
    target_w = self._target_weights()
    q_next_t = flat_q(forward(target_w, s2), k2)
    q_next_o = flat_q(forward(self.weights, s2), k2)
    y = td_targets(r, q_next_t, m2, d, self.gamma, q_next_o).astype(np.float32)
    chosen = np.take_along_axis(flat_q(forward(self.weights, s), k),
                                a[:, None], axis=1)[:, 0]
    loss = self._train_fn(s, k, a, y)
    self.weights = [w.numpy() if hasattr(w, "numpy") else np.asarray(w)
                    for w in self.network.trainable_variables]
    self.gradient_steps += 1
    copied = self.gradient_steps % self.target_period == 0
    if copied:
      self.target.set_weights(self.network.get_weights())
      self._target_cache = None
    return LossInfo(loss=float(loss),
                    td_error=float(np.mean(np.abs(y - chosen))),
                    gradient_step=self.gradient_steps, target_updated=copied)

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


class Collected(NamedTuple):
  """What one collect step saw: the observation's features and action mask,
  the reward of the action before it, and the gradient step taken (None:
  none this step)."""
  state: np.ndarray
  mask: np.ndarray
  reward: float
  loss: LossInfo | None


class Collector:
  """The one collect step of the DQN, in the simulator (pretraining) and on
  a live session (`intune-dqn`): the reward of the last action, read from
  the observation that followed it, is stored with its transition, and a
  gradient step is taken every `learn_every` collect steps.

  The reward's reference rate is the best `mdp.reference_rate` seen since
  the usable CPUs last changed (`begin` starts over).

  Args:
    agent: the agent whose replay and network it feeds.
    learn_every: collect steps per gradient step. Default 1.
    learn: take gradient steps at all. Default True.
  """

  def __init__(self, agent: Agent, learn_every: int = 1, learn: bool = True):
    self.agent = agent
    self.learn_every = learn_every
    self.learn = learn
    self.steps = 0
    self.begin()

  def begin(self) -> None:
    """A new episode: no reference rate, no action pending."""
    self._reference, self._reference_cpus = 0.0, None
    self._pending: tuple[np.ndarray, int] | None = None

  def acted(self, state: np.ndarray, action: int) -> None:
    """`action` was taken from `state`: its reward comes with the next
    collect step."""
    self._pending = (state, action)

  def forget(self) -> None:
    """What was set since the last action was no action of the agent's (a
    hold, a revert, a budget fit): no transition is stored for it."""
    self._pending = None

  def reference_rate(self, obs: "Observation") -> float:
    if obs.usable_cpus != self._reference_cpus:
      self._reference_cpus, self._reference = obs.usable_cpus, 0.0
    self._reference = max(self._reference, mdp.reference_rate(obs))
    return self._reference

  def collect(self, obs: "Observation", done: bool = False) -> Collected:
    """One collect step on the observation after the last action."""
    self.steps += 1
    state, mask = mdp.features(obs), mdp.action_mask(obs)
    r = mdp.reward(obs.output_rate, self.reference_rate(obs),
                   mdp.memory_fraction(obs))
    loss = None
    if self._pending is not None:
      self.agent.replay.add(*self._pending, r, state, mask, done)
      self._pending = None
      if self.learn and self.steps % self.learn_every == 0:
        loss = self.agent.learn()
    return Collected(state, mask, r, loss)


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
  if len(weights) != 6 or weights[0].shape[0] != mdp.NUM_FEATURES:
    raise ValueError(
        f"{path} holds {len(weights)} arrays (first "
        f"{weights[0].shape if weights else None}); "
        f"an InTune agent has 6, the first of shape ({mdp.NUM_FEATURES}, "
        "hidden).")
  # Dense layers: kernel (n, m) then bias (m,), each layer's n the last m.
  expected_in = mdp.NUM_FEATURES
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
