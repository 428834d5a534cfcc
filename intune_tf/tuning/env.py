"""What a policy tunes (`TuningEnv`), and the one step of a policy on it.

A `TuningEnv` is a pipeline as a policy sees it: its knobs, an observation
of the pipeline each tuning period, and a way to set knob values. Two
implementations share the contract, so that a policy, a search and the
agent's collection run unchanged on either (tf-agents' `PyEnvironment` plays
this part there):

- `intune_tf.sim.simulator.Simulator`: a simulated pipeline (time moves
  when it is told to, `Simulator.advance`);
- `intune_tf.live.observation.LiveEnv`: a live tuning session (time moves by
  itself).

`policy_step` is the one step of a policy on an environment, used by the
live tuner and by the simulations alike.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Mapping, Protocol

if TYPE_CHECKING:
  from intune_tf.records import Knob
  from intune_tf.records import Observation
  from intune_tf.tuning.policies import Policy


class TuningEnv(Protocol):
  """A pipeline as a policy tunes it."""

  def knobs(self) -> list[Knob]:
    """The knobs in force, from the input stage to the output stage."""

  def observe(self) -> Observation:
    """The pipeline since the last observation (its knobs included)."""

  def set(self, values: Mapping[str, float]) -> dict[str, float]:
    """Sets knobs at once: all of them, or none if one is invalid.

    Args:
      values: `{knob name: value}`; values are rounded to integers.

    Returns:
      The values in force afterwards, by name (a memory knob may be lower
      than asked: the RAM budget comes first).

    Raises:
      KeyError: a name is not a knob (the message lists the valid names).
      ValueError: a value is not a finite number or is outside the knob's
        [min, max].
    """


class PolicyError(Exception):
  """The policy's own `step` failed (the cause is chained): the environment
  was left as it was."""


@dataclasses.dataclass(frozen=True)
class Step:
  """One step of a policy on an environment.

  Attributes:
    observation: what the policy saw.
    wanted: what its `step` returned.
    applied: the values in force afterwards of the knobs it changed (only
      knobs the observation has, and only values that differ: a knob the
      policy remembers may have vanished since, for example a stage rebuilt
      inside an interleave).
  """
  observation: Observation
  wanted: dict[str, float]
  applied: dict[str, float]

  @property
  def in_force(self) -> dict[str, float]:
    """Every knob's value after the step."""
    return {**{k.name: k.value for k in self.observation.knobs},
            **self.applied}

  @property
  def changed(self) -> bool:
    """Whether the step changed a knob's value."""
    before = {k.name: k.value for k in self.observation.knobs}
    return any(before[name] != value for name, value in self.applied.items())


def changes(knobs: tuple[Knob, ...] | list[Knob],
            wanted: Mapping[str, float]) -> dict[str, float]:
  """The values of `wanted` for knobs in `knobs` that differ from the value
  in force; the rest is left out, idle knobs too (`Knob.idle`: their stage
  does not run, so a change would be judged on what it does not do)."""
  current = {k.name: k.value for k in knobs if not k.idle}
  return {name: value for name, value in wanted.items()
          if name in current and current[name] != value}


def policy_step(env: TuningEnv, policy: Policy,
                obs: Observation | None = None) -> Step:
  """One step of `policy` on `env`: observe (unless `obs` is given), ask the
  policy, set what it changes.

  Raises:
    PolicyError: the policy's `step` raised or returned no mapping (the
      environment is untouched).
    KeyError, ValueError: `env.set` refused the values (nothing applied).
  """
  obs = env.observe() if obs is None else obs
  try:
    wanted = policy.step(obs)
  except Exception as e:
    raise PolicyError(f"{type(policy).__name__}.step failed: {e!r}") from e
  if not isinstance(wanted, Mapping):
    raise PolicyError(f"{type(policy).__name__}.step returned {wanted!r:.80},"
                      " not a mapping of knob names to values")
  todo = changes(obs.knobs, wanted)
  applied = env.set(todo) if todo else {}
  return Step(obs, dict(wanted), applied)
