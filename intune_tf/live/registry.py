"""The policy registry: the names `IntuneOptions(policy=NAME)` selects.

Built-in policies are named here, as (module, class), and imported only when
a policy of that name is made: checking or listing names loads neither the
agent nor TensorFlow. Users add their own with `register`
(`intune_tf.register_policy`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
  from intune_tf.options import IntuneOptions
  from intune_tf.tuning.policies import Policy

# Built-in policies: name -> (module, the class in it that makes them).
_BUILT_IN: dict[str, tuple[str, str]] = {
    "analytic": ("intune_tf.tuning.policies", "AnalyticPolicy"),
    "even": ("intune_tf.tuning.policies", "EvenPolicy"),
    "fixed": ("intune_tf.tuning.policies", "FixedPolicy"),
    "manual": ("intune_tf.tuning.policies", "ManualPolicy"),
    "unoptimized": ("intune_tf.tuning.policies", "UnoptimizedPolicy"),
    "climb": ("intune_tf.tuning.search", "ClimbPolicy"),
    "coordinate": ("intune_tf.tuning.search", "CoordinatePolicy"),
    "plumber": ("intune_tf.tuning.search", "PlumberPolicy"),
    "jump-climb": ("intune_tf.tuning.search", "JumpClimbPolicy"),
    "intune": ("intune_tf.agent.ranked", "JumpSearchPolicy"),
    "intune-ablated": ("intune_tf.agent.ranked", "AblatedSearchPolicy"),
    "intune-search": ("intune_tf.agent.ranked", "RankedSearchPolicy"),
    "intune-jump": ("intune_tf.agent.ranked", "JumpSearchPolicy"),
    "intune-dqn": ("intune_tf.agent.policy", "IntunePolicy"),
}
# Names given to `register`; they hide a built-in of the same name.
_REGISTERED: dict[str, Callable[[IntuneOptions], Policy]] = {}
_HIDDEN: set[str] = set()


def register(name: str, factory: Callable[[IntuneOptions], Policy]) -> None:
  """Makes `IntuneOptions(policy=name)` use policies made by `factory`; a
  built-in of the same name is replaced.

  Args:
    name: the policy's name, a non-empty string without surrounding spaces.
    factory: makes a policy from the options (a `Policy` subclass, say).

  Raises:
    TypeError: `name` is not a string, or `factory` is not callable.
    ValueError: `name` is empty or only spaces, or has spaces around it.
  """
  if not isinstance(name, str):
    raise TypeError(f"register_policy: the name must be a string, got "
                    f"{name!r:.40} ({type(name).__name__}).")
  if not name.strip() or name != name.strip():
    raise ValueError(f"register_policy: the name must be a non-empty string "
                     f"without surrounding spaces, got {name!r:.40}.")
  if not callable(factory):
    raise TypeError(f"register_policy: the factory of {name!r} must be "
                    f"callable (a Policy subclass), got {factory!r:.40}.")
  _REGISTERED[name] = factory
  _HIDDEN.discard(name)


def unregister(name: str) -> None:
  """Forgets `name`, a built-in included (nothing if it is unknown)."""
  _REGISTERED.pop(name, None)
  if name in _BUILT_IN:
    _HIDDEN.add(name)


def names() -> list[str]:
  """Every policy name `IntuneOptions(policy=...)` accepts, built-ins
  included (loading none)."""
  return sorted(set(_REGISTERED) | (set(_BUILT_IN) - _HIDDEN))


def check_name(name: str) -> None:
  """Raises ValueError, listing the valid names, if `name` is none."""
  if name not in _REGISTERED and (name not in _BUILT_IN or name in _HIDDEN):
    raise ValueError(f"Unknown InTune policy {name!r}. Valid policies: "
                     f"{names()}.")


def create(options: IntuneOptions) -> Policy:
  """A new policy of the kind `options.policy` names."""
  check_name(options.policy)
  factory = _REGISTERED.get(options.policy)
  if factory is None:
    module, attribute = _BUILT_IN[options.policy]
    factory = getattr(importlib.import_module(module), attribute)
  return factory(options)
