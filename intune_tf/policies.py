"""Tuning policies: what value each knob of a pipeline should have.

A policy sees a session's knobs, per-stage statistics and budgets at every
tuning step and returns the knob values it wants. Register new policies with
`register`; `IntuneOptions(policy=NAME)` selects one.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Callable, Mapping, Sequence

from intune_tf.options import IntuneOptions

# Largest prefetch buffer (elements) the "even" policy gives a stage.
MAX_EVEN_BUFFER = 8


@dataclasses.dataclass(frozen=True)
class Budget:
  """Resources a pipeline may use at one tuning step.

  Attributes:
    cpus: CPUs the parallel stages may keep busy.
    ram_bytes: bytes the buffers may hold.
  """
  cpus: int
  ram_bytes: int


class Policy(abc.ABC):
  """Decides knob values for one tuning session.

  Subclasses implement `step`. The tuner calls it once per tuning step with
  the knobs in force, per-stage bytes per element (0 when not yet known) and
  the budgets; the returned values are applied atomically (knobs left out
  keep their value). A policy that raises keeps the pipeline at its last
  good configuration.
  """

  def __init__(self, options: IntuneOptions):
    self.options = options

  @abc.abstractmethod
  def step(self, knobs: Sequence["Knob"], bytes_per_element: Mapping[str, float],
           budget: Budget) -> dict[str, float]:
    """Returns `{knob name: value}` for this step."""


def even_split(total: int, parts: int) -> list[int]:
  """Splits `total` units over `parts` as evenly as possible, each at least 1.

  The remainder goes to the first parts: even_split(5, 2) == [3, 2].
  """
  if parts <= 0:
    return []
  base, extra = divmod(max(total, parts), parts)
  return [base + (1 if i < extra else 0) for i in range(parts)]


def buffer_elements(ram_bytes: float, bytes_per_element: float,
                    cap: int) -> int:
  """Elements a buffer may hold within `ram_bytes`, in [1, cap].

  An unknown element size (0) gives 1, the safe start.
  """
  if bytes_per_element <= 0:
    return 1
  return int(max(1, min(cap, ram_bytes // bytes_per_element)))


def _clamp(value: float, knob) -> float:
  return float(min(max(value, knob.min), knob.max))


class EvenPolicy(Policy):
  """Usable CPUs split evenly over the parallel stages (the paper's start).

  The RAM budget is split evenly over the buffers, each holding at most
  `MAX_EVEN_BUFFER` elements.
  """

  def step(self, knobs, bytes_per_element, budget):
    parallel = [k for k in knobs if k.kind == "parallelism"]
    buffers = [k for k in knobs if k.kind == "buffer_size"]
    values = {}
    for knob, cpus in zip(parallel, even_split(budget.cpus, len(parallel))):
      values[knob.name] = _clamp(cpus, knob)
    for knob in buffers:
      share = budget.ram_bytes / len(buffers)
      values[knob.name] = _clamp(
          buffer_elements(share, bytes_per_element.get(knob.stage, 0.0),
                          MAX_EVEN_BUFFER), knob)
    return values


class FixedPolicy(Policy):
  """Applies `IntuneOptions.config` (clamped to each knob's range)."""

  def step(self, knobs, bytes_per_element, budget):
    config = self.options.config or {}
    return {k.name: _clamp(config[k.name], k) for k in knobs if k.name in config}


class ManualPolicy(Policy):
  """Changes nothing: the user sets knobs through `Session.set`."""

  def step(self, knobs, bytes_per_element, budget):
    return {}


_REGISTRY: dict[str, Callable[[IntuneOptions], Policy]] = {
    "even": EvenPolicy,
    "fixed": FixedPolicy,
    "manual": ManualPolicy,
}


def register(name: str, factory: Callable[[IntuneOptions], Policy]) -> None:
  """Makes `IntuneOptions(policy=name)` use policies made by `factory`."""
  _REGISTRY[name] = factory


def names() -> list[str]:
  return sorted(_REGISTRY)


def check_name(name: str) -> None:
  if name not in _REGISTRY:
    raise ValueError(f"Unknown InTune policy {name!r}. Valid policies: "
                     f"{names()}.")


def create(options: IntuneOptions) -> Policy:
  check_name(options.policy)
  return _REGISTRY[options.policy](options)
