"""The learned allocation: after a change, a network proposes the whole
configuration at once, and measurement confirms it.

A Keras network, trained in the simulator on the optimum of each state it
meets (`intune pretrain --allocator`: pipelines of 3-8 stages on 8-128 CPUs
of random machines, through the events of the dynamic suite), maps each
knob's row of the MDP's features (`mdp.features`) to the knob's value at the
optimum: a parallel stage's threads as a share of the CPU budget. The
default policy (`ranked.JumpSearchPolicy`) tries that allocation first at
each (re)start of its search (a new CPU budget or set of knobs, or a settled
search re-opening on a change) and keeps it only if it measures better than
the configuration in force.

The network sees what the search sees (costs as measured under the
contention in force, the rate against the work ceiling, the threads in
force), and learned from the simulator's optima how far those readings are
from the allocation that is best: a search must walk there, trial by
trial, paying for every worse trial.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from intune_tf.agent import dqn
from intune_tf.tuning import mdp
from intune_tf.tuning import search

if TYPE_CHECKING:
  from intune_tf.records import Observation

# The shipped allocation network (command, samples and time in its
# metadata).
ALLOCATOR_WEIGHTS = os.path.join(os.path.dirname(__file__), "allocator.npz")
HIDDEN = 64
# The label of the proposal in the decision log.
LABEL = "learned allocation"


def build_network(hidden: int = HIDDEN, seed: int = 0):
  """The allocation network: a 3-layer ReLU MLP applied to every knob's
  row, [batch, `mdp.NUM_FEATURES`] -> [batch, 1]."""
  # Deferred: Keras only to train: proposing runs the weights in numpy.
  import keras  # noqa: PLC0415
  init = keras.initializers.GlorotUniform(seed=seed)
  return keras.Sequential([
      keras.Input((mdp.NUM_FEATURES,)),
      keras.layers.Dense(hidden, activation="relu", kernel_initializer=init),
      keras.layers.Dense(hidden, activation="relu", kernel_initializer=init),
      keras.layers.Dense(1, kernel_initializer=init),
  ])


def allocation(obs: Observation, shares: np.ndarray) -> dict[str, float]:
  """The knob values of `shares` (one per knob of `obs`: threads as a share
  of the CPU budget) that differ from those in force: each parallelism at
  its share of the CPU budget, made to fit the agent's limits
  (`search.fit_threads`); buffers are left as they are.

  allocation(obs at 8 CPUs with knobs A 2 and B 2 threads, [0.25, 0.5]) ==
  {"B/parallelism": 4.0}: A at 0.25 x 8 = 2 is unchanged.
  """
  wanted = {k.name: max(0.0, float(s)) * obs.cpu_budget
            for k, s in zip(obs.knobs, shares) if k.kind == "parallelism"}
  values = search.fit_threads(obs, wanted) if wanted else {}
  current = {k.name: k.value for k in obs.knobs}
  return {n: v for n, v in values.items() if v != current[n]}


class Allocator:
  """Proposes whole allocations from observations.

  Args:
    weights: the network's weights file. Default `ALLOCATOR_WEIGHTS`.
    constant: the share every parallel knob gets in place of the
      network's output (the ablation, which carries no learned
      information). Default None: the network's output.
  """

  def __init__(self, weights: str | None = None,
               constant: float | None = None):
    self.constant = constant
    self.weights: list[np.ndarray] = []
    if constant is None:
      loaded, _ = dqn.load_weights(weights or ALLOCATOR_WEIGHTS)
      if loaded[-1].shape != (1,):
        raise ValueError(f"{weights or ALLOCATOR_WEIGHTS} is not an "
                         "allocation network: its output layer has "
                         f"{loaded[-1].shape[0]} units, not 1.")
      self.weights = [np.asarray(w, np.float32) for w in loaded]

  def shares(self, obs: Observation) -> np.ndarray:
    """The network's output for each knob of `obs` (or the constant)."""
    if self.constant is not None:
      return np.full(len(obs.knobs), self.constant, np.float32)
    return dqn.forward(self.weights, mdp.features(obs))[:, 0]

  def propose(self, obs: Observation) -> tuple[str, dict[str, float]] | None:
    """(label, values) of the proposed allocation, or None when it changes
    nothing or nothing was measured yet."""
    if not obs.knobs or obs.output_rate <= 0:
      return None
    values = allocation(obs, self.shares(obs))
    return (LABEL, values) if values else None
