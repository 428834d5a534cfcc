"""IntuneOptions: validation, defaults, JSON."""

import pytest

import intune_tf
from intune_tf import options as options_lib
from intune_tf.tuning import host


@pytest.mark.parametrize("kwargs,error,match", [
    ({"cpu_budget": 0}, ValueError, "cpu_budget must be positive"),
    ({"cpu_budget": -2}, ValueError, "cpu_budget must be positive"),
    ({"ram_budget": 0}, ValueError, "ram_budget must be positive"),
    ({"ram_budget": -1}, ValueError, "ram_budget must be positive"),
    ({"ram_budget": 1.5e9}, TypeError, "ram_budget must be an int"),
    ({"cpu_budget": True}, TypeError, "cpu_budget must be an int"),
    ({"max_cpus": "4"}, TypeError, "max_cpus must be an int"),
    ({"policy": 3}, TypeError, "policy must be a policy name"),
    ({"policy": "nope"}, ValueError, "Valid policies"),
    ({"period_s": 0}, ValueError, "period_s must be a positive"),
    ({"policy": "fixed"}, ValueError, "needs a `config`"),
    ({"config": {"a/parallelism": "2"}}, TypeError, "knob names"),
    ({"config": [1, 2]}, TypeError, "must be a mapping"),
    ({"inner_stats": 1}, TypeError, "inner_stats must be True or False"),
    ({"warm_start": "no"}, TypeError, "warm_start must be True or False"),
    ({"interleave_buffer": 0}, ValueError, "None keeps TF's default"),
    ({"interleave_buffer": 2.5}, TypeError, "interleave_buffer must be an int"),
    ({"interleave_buffer": 10**6}, ValueError, "cannot lower this buffer"),
])
def test_bad_options_raise_clear_errors(kwargs, error, match):
  with pytest.raises(error, match=match):
    intune_tf.IntuneOptions(**kwargs)


def test_defaults_are_measured_from_the_machine():
  opts = intune_tf.IntuneOptions()
  assert opts.policy == "intune" and opts.warm_start
  assert opts.resolved_cpu_budget() == host.usable_cpus()
  assert 0 < opts.resolved_ram_budget() <= host.available_memory()
  assert opts.resolved_max_cpus() == 0  # TF's own runner
  assert intune_tf.IntuneOptions(max_cpus=64).resolved_max_cpus() == 64


def test_cpu_budget_is_capped_by_usable_cpus():
  assert intune_tf.IntuneOptions(cpu_budget=10_000).resolved_cpu_budget() == (
      host.usable_cpus())
  assert intune_tf.IntuneOptions(cpu_budget=1).resolved_cpu_budget() == 1
  # A reading already taken is used as given: min(4, 3) = 3; no budget
  # given -> the reading itself, 3.
  assert intune_tf.IntuneOptions(cpu_budget=4).resolved_cpu_budget(3) == 3
  assert intune_tf.IntuneOptions().resolved_cpu_budget(3) == 3


def test_json_round_trip():
  opts = intune_tf.IntuneOptions(ram_budget=64 << 20, policy="fixed",
                                 config={"Prefetch(id:1)/buffer_size": 2},
                                 name="criteo")
  assert intune_tf.IntuneOptions.from_json(opts.to_json()) == opts


@pytest.mark.parametrize("value,expected", [
    (None, None), (False, None), (True, intune_tf.IntuneOptions())])
def test_coerce(value, expected):
  assert options_lib.coerce(value) == expected


def test_coerce_rejects_other_types():
  with pytest.raises(TypeError, match="takes True, False or an"):
    options_lib.coerce("yes")
