"""The policy registry (intune_tf.live.registry)."""

import re

import pytest

import intune_tf
from intune_tf.live import registry
from intune_tf.options import IntuneOptions
from intune_tf.tuning import policies
from intune_tf.tuning import search


class _Ones(policies.Policy):
  def step(self, obs):
    return {k.name: 1 for k in obs.knobs}


@pytest.fixture(autouse=True)
def _own_tables(monkeypatch):
  # Each test registers into copies: the process's registry stays as it was.
  monkeypatch.setattr(registry, "_REGISTERED", dict(registry._REGISTERED))  # noqa: SLF001
  monkeypatch.setattr(registry, "_HIDDEN", set(registry._HIDDEN))  # noqa: SLF001


def test_unknown_policy_lists_valid_names():
  with pytest.raises(ValueError, match=r"Unknown InTune policy 'best'.*even"):
    registry.create(IntuneOptions(policy="best"))


def test_a_built_in_is_made_from_its_listed_class():
  assert type(registry.create(IntuneOptions(policy="climb"))) is (
      search.ClimbPolicy)


def test_registered_policy_is_selectable_then_forgotten():
  registry.register("ones-test", _Ones)
  assert "ones-test" in registry.names()
  assert isinstance(registry.create(IntuneOptions(policy="ones-test")), _Ones)
  registry.unregister("ones-test")
  assert "ones-test" not in registry.names()
  with pytest.raises(ValueError, match="Unknown InTune policy 'ones-test'"):
    registry.create(IntuneOptions(policy="ones-test"))


def test_a_registered_name_replaces_the_built_in_until_forgotten():
  registry.register("climb", _Ones)
  assert type(registry.create(IntuneOptions(policy="climb"))) is _Ones
  registry.unregister("climb")
  with pytest.raises(ValueError, match="Unknown InTune policy 'climb'"):
    registry.check_name("climb")
  # Registered again, the name is valid again.
  registry.register("climb", search.ClimbPolicy)
  assert "climb" in registry.names()


@pytest.mark.parametrize("name,error,message", [
    (123, TypeError, "register_policy: the name must be a string, got 123 "
     "(int)."),
    (None, TypeError, "register_policy: the name must be a string, got None "
     "(NoneType)."),
    ("", ValueError, "register_policy: the name must be a non-empty string "
     "without surrounding spaces, got ''."),
    ("  ", ValueError, "register_policy: the name must be a non-empty string "
     "without surrounding spaces, got '  '."),
    (" even ", ValueError, "register_policy: the name must be a non-empty "
     "string without surrounding spaces, got ' even '."),
])
def test_a_name_that_is_not_a_non_empty_string_is_refused(name, error,
                                                          message):
  # `register_policy(123, Policy)` used to be accepted; a later typo
  # (`policy="evn"`) then raised `TypeError: '<' not supported between
  # instances of 'int' and 'str'` instead of listing the valid names.
  before = registry.names()
  with pytest.raises(error, match="^" + re.escape(message) + "$"):
    intune_tf.register_policy(name, policies.Policy)
  assert registry.names() == before
  with pytest.raises(ValueError, match=r"^Unknown InTune policy 'evn'\. "
                     r"Valid policies: \[.*'even'.*\]\.$"):
    registry.check_name("evn")  # what `tune(ds, policy="evn")` runs


def test_a_factory_that_cannot_make_policies_is_refused():
  with pytest.raises(TypeError, match="^" + re.escape(
      "register_policy: the factory of 'x' must be callable (a Policy "
      "subclass), got 'not callable'.") + "$"):
    intune_tf.register_policy("x", "not callable")
  assert "x" not in registry.names()
