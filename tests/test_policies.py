"""Policies: the pure allocation maths and the two baseline policies."""

import pytest

from intune_tf import policies
from intune_tf.options import IntuneOptions
from intune_tf.session import Knob


@pytest.mark.parametrize("total,parts,expected", [
    (4, 2, [2, 2]),
    (5, 2, [3, 2]),       # 5 = 2*2 + 1: the remainder goes to the first
    (7, 3, [3, 2, 2]),    # 7 = 3*2 + 1
    (1, 3, [1, 1, 1]),    # fewer CPUs than stages: each still gets 1
    (8, 0, []),
])
def test_even_split(total, parts, expected):
  assert policies.even_split(total, parts) == expected


@pytest.mark.parametrize("ram,bpe,cap,expected", [
    (64e6, 8e6, 16, 8),    # 64 MB / 8 MB = 8 elements
    (64e6, 8e6, 4, 4),     # capped
    (10e6, 8e6, 16, 1),    # 10 / 8 = 1.25 -> 1
    (1e6, 8e6, 16, 1),     # never below 1
    (64e6, 0.0, 16, 1),    # unknown size: safe start
])
def test_buffer_elements(ram, bpe, cap, expected):
  assert policies.buffer_elements(ram, bpe, cap) == expected


def _knobs():
  return [
      Knob("ParallelMapV2(id:2)/parallelism", "parallelism", 1, 1, 8),
      Knob("ParallelMapV2(id:4)/parallelism", "parallelism", 1, 1, 8),
      Knob("ParallelInterleaveDatasetV4(id:6)/parallelism", "parallelism", 1,
           1, 2),
      Knob("Prefetch(id:1)/buffer_size", "buffer_size", 0, 0, 1e9),
  ]


def test_even_policy_splits_cpus_and_memory():
  policy = policies.create(IntuneOptions(policy="even"))
  values = policy.step(_knobs(), {"Prefetch(id:1)": 4e6},
                       policies.Budget(cpus=7, ram_bytes=20_000_000))
  # 7 CPUs over 3 stages -> 3, 2, 2; the interleave's max is 2.
  assert values["ParallelMapV2(id:2)/parallelism"] == 3
  assert values["ParallelMapV2(id:4)/parallelism"] == 2
  assert values["ParallelInterleaveDatasetV4(id:6)/parallelism"] == 2
  # One buffer: 20 MB / 4 MB = 5 elements (under the cap of 8).
  assert values["Prefetch(id:1)/buffer_size"] == 5


def test_fixed_policy_applies_its_config_clamped():
  options = IntuneOptions(policy="fixed", config={
      "ParallelMapV2(id:2)/parallelism": 3,
      "ParallelInterleaveDatasetV4(id:6)/parallelism": 5,  # max is 2
      "NotHere(id:9)/parallelism": 1})
  values = policies.create(options).step(_knobs(), {},
                                         policies.Budget(2, 10**9))
  assert values == {"ParallelMapV2(id:2)/parallelism": 3,
                    "ParallelInterleaveDatasetV4(id:6)/parallelism": 2}


def test_unknown_policy_lists_valid_names():
  with pytest.raises(ValueError, match=r"Unknown InTune policy 'best'.*even"):
    IntuneOptions(policy="best")


def test_registered_policy_is_selectable():
  class Ones(policies.Policy):
    def step(self, knobs, bytes_per_element, budget):
      return {k.name: 1 for k in knobs}

  policies.register("ones-test", Ones)
  try:
    policy = policies.create(IntuneOptions(policy="ones-test"))
    assert isinstance(policy, Ones)
  finally:
    del policies._REGISTRY["ones-test"]


def test_manual_policy_changes_nothing():
  policy = policies.create(IntuneOptions(policy="manual"))
  assert policy.step(_knobs(), {}, policies.Budget(8, 10**9)) == {}
