"""IntuneOptions: validation, defaults, JSON."""

import json

import numpy as np
import pytest

import intune_tf
from intune_tf import host
from intune_tf import options as options_lib


@pytest.mark.parametrize("kwargs,error,match", [
    ({"cpu_budget": 0}, ValueError, "cpu_budget must be positive"),
    ({"cpu_budget": -2}, ValueError, "cpu_budget must be positive"),
    ({"ram_budget": 0}, ValueError, "ram_budget must be positive"),
    ({"ram_budget": -1}, ValueError, "ram_budget must be positive"),
    ({"ram_budget": 1.5e9}, TypeError, "ram_budget must be an int"),
    ({"cpu_budget": True}, TypeError, "cpu_budget must be an int"),
    ({"max_cpus": "4"}, TypeError, "max_cpus must be an int"),
    ({"policy": 3}, TypeError, "policy must be a policy name"),
    ({"period_s": 0}, ValueError, "period_s must be a positive"),
    ({"policy": "fixed"}, ValueError, "needs a `config`"),
    ({"config": {"a/parallelism": "2"}}, TypeError, "knob names"),
    ({"config": [1, 2]}, TypeError, "must be a mapping"),
    ({"inner_stats": 1}, TypeError, "inner_stats must be True or False"),
    ({"warm_start": "no"}, TypeError, "warm_start must be True or False"),
    ({"interleave_buffer": 0}, ValueError, "None for TF's default"),
    ({"interleave_buffer": 2.5}, TypeError, "interleave_buffer must be an int"),
    ({"interleave_buffer": 10**6}, ValueError,
     r"interleave_buffer is 1000000, out of its range 1\.\.256\. Pass at "
     "most 256, or None for TF's default"),
    # Used to abort the process (an int32 thread count gone negative).
    ({"max_cpus": 2**31}, ValueError, r"max_cpus is 2147483648, out of its "
     r"range 1\.\.8192\. Pass at most 8192, or None for TF's own runner"),
    # Used to wrap silently to a pool of 2 threads.
    ({"max_cpus": 2**32 + 2}, ValueError, r"max_cpus is 4294967298, out of"),
    ({"cpu_budget": 2**64}, ValueError,
     r"cpu_budget is 18446744073709551616, out of its range "
     r"1\.\.9223372036854775807\. .*None for the CPUs the process may use"),
    # Used to fail at iterator creation, from the kernel, as "got -1".
    ({"ram_budget": 2**70}, ValueError,
     r"ram_budget is \d+, out of its range 1\.\.9223372036854775807\. .*"
     "None for half of the available memory"),
    ({"period_s": float("nan")}, ValueError,
     r"period_s must be a positive, finite number of seconds, got nan"),
    ({"period_s": float("inf")}, ValueError,
     r"period_s must be a positive, finite number of seconds, got inf"),
    ({"period_s": -0.5}, ValueError, "period_s must be a positive"),
    # Used to fail late, at iterator creation, as "not JSON serializable".
    ({"name": object()}, TypeError,
     r"IntuneOptions\.name must be a str \(a label for the pipeline\), "
     r"got <object object at .*> \(object\)"),
    ({"name": 3}, TypeError, r"IntuneOptions\.name must be a str"),
    # Used to be accepted, a tuning step every nanosecond.
    ({"period_s": 1e-9}, ValueError,
     r"IntuneOptions\.period_s is 1e-09 s, below its range \[0\.005, any "
     r"finite number of seconds\].*Pass at least 0\.005"),
    # Used to be accepted and reach the kernel as inf.
    ({"policy": "fixed", "config": {"a/parallelism": float("inf")}},
     ValueError, r"IntuneOptions\.config\['a/parallelism'\] is inf: a knob "
     r"value must be a finite number"),
    ({"config": {"a/buffer_size": float("nan")}}, ValueError,
     r"config\['a/buffer_size'\] is nan"),
    ({"host_share": "yes"}, TypeError, "host_share must be True or False"),
    ({"host_weight": 0}, ValueError,
     r"host_weight is 0, out of its range \(0, 1e\+06\]"),
    ({"host_weight": -1.0}, ValueError, "host_weight is -1.0, out of"),
    ({"host_weight": float("nan")}, ValueError, "host_weight is nan"),
    ({"host_weight": 1e7}, ValueError, "host_weight is 10000000.0, out of"),
    ({"host_weight": True}, ValueError, "host_weight is True"),
    ({"host_weight": "2"}, ValueError, "host_weight is '2'"),
])
def test_bad_options_raise_clear_errors(kwargs, error, match):
  with pytest.raises(error, match=match):
    intune_tf.IntuneOptions(**kwargs)


def test_defaults_are_measured_from_the_machine():
  opts = intune_tf.IntuneOptions()
  assert opts.policy == "intune" and opts.warm_start
  assert opts.host_share and opts.host_weight == 1.0
  assert opts.resolved_cpu_budget() == host.usable_cpus()
  assert opts.ram_budget is None  # resolved where the iterator is made
  assert opts.resolved_max_cpus() == 0  # TF's own runner
  limit = options_lib.max_cpus_limit(host.machine_cpus())
  assert intune_tf.IntuneOptions(max_cpus=limit).resolved_max_cpus() == limit


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


@pytest.mark.parametrize("cpus,expected", [
    (2, 8),         # 4 x 2
    (64, 256),      # 4 x 64
    (4096, 8192),   # 4 x 4096 = 16384, capped at MAX_CPUS
])
def test_max_cpus_limit_is_a_multiple_of_the_machine_cpus(cpus, expected):
  assert options_lib.max_cpus_limit(cpus) == expected


def test_max_cpus_far_above_the_machine_cpus_is_refused_naming_the_limit():
  # Used to be accepted on 2 CPUs: 8,207 threads, +711 MB, `del it` 48 s.
  limit = options_lib.max_cpus_limit(host.machine_cpus())
  assert limit == min(8192, 4 * host.machine_cpus())
  with pytest.raises(ValueError, match=(
      rf"IntuneOptions\.max_cpus is {limit + 1}, more than 4 x the "
      rf"{host.machine_cpus()} CPU\(s\) of this machine: its range here is "
      rf"1\.\.{limit}\..*or None for TF's own runner")):
    intune_tf.IntuneOptions(max_cpus=limit + 1)
  assert intune_tf.IntuneOptions(max_cpus=limit).max_cpus == limit


def test_the_shortest_period_is_accepted():
  period = options_lib.MIN_PERIOD_S
  assert intune_tf.IntuneOptions(period_s=period).period_s == period


def test_numpy_numbers_are_taken_as_python_ones():
  # ram_budget=np.int64(...) was accepted, then failed at with_options with
  # an unnamed JSON TypeError.
  opts = intune_tf.IntuneOptions(
      ram_budget=np.int64(1 << 30), cpu_budget=np.int32(2),
      period_s=np.float32(0.5), host_weight=np.float64(2.0),
      config={"a/parallelism": np.int64(3)})
  data = json.loads(opts.to_json())
  assert (data["ram_budget"], data["cpu_budget"]) == (1 << 30, 2)
  assert (data["period_s"], data["host_weight"]) == (0.5, 2.0)
  assert data["config"] == {"a/parallelism": 3}
  assert options_lib.IntuneOptions.from_json(opts.to_json()) == opts
