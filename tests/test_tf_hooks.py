"""The experimental_intune option: survives merges, tunes every iteration."""

import gc

import keras
import numpy as np
import pytest
import tensorflow as tf

import intune_tf
from intune_tf.live import registry
from intune_tf.tfdata import hooks as _tf_hooks


def _live():
  gc.collect()
  return {s.id for s in intune_tf.sessions()}


def _tuned(ds, value=True):
  options = tf.data.Options()
  options.experimental_intune = value
  return ds.with_options(options)


def _pipeline():
  return tf.data.Dataset.range(64).map(
      lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE)


def test_hook_points_exist_in_this_tf():
  _tf_hooks.check()
  assert tf.__version__.rsplit(".", 1)[0] in _tf_hooks.TESTED_TF


def test_option_exists_and_is_type_checked():
  options = tf.data.Options()
  assert options.experimental_intune is None
  with pytest.raises(TypeError, match="experimental_intune takes True"):
    options.experimental_intune = "on"


@pytest.mark.parametrize("value", [True, intune_tf.IntuneOptions(name="x")])
def test_option_survives_merges_and_transformations(value):
  ds = _tuned(_pipeline(), value)
  other = tf.data.Options()
  other.deterministic = True
  ds = ds.map(lambda x: x + 1).with_options(other).batch(4).prefetch(1)
  assert ds.options().experimental_intune == value
  assert ds.options().deterministic is True


@pytest.mark.parametrize("tuned", [False, True])
def test_a_pipeline_deeper_than_the_recursion_limit_is_walked(tuned):
  # 1 + 1500 concatenates: the hooks' walk of the inputs recursed into a
  # RecursionError at `iter` and at `options()` with intune_tf imported.
  ds = tf.data.Dataset.from_tensors(0)
  if tuned:
    ds = _tuned(ds)
  for _ in range(1500):
    ds = ds.concatenate(tf.data.Dataset.from_tensors(0))
  assert ds.options().experimental_intune == (True if tuned else None)
  assert _tf_hooks.find(ds) == (True if tuned else None, False)
  if not tuned:  # a tuned one is the rewrite's, not the walk's
    assert sum(1 for _ in ds) == 1501


def test_later_false_turns_it_off():
  ds = _tuned(_tuned(_pipeline()).map(lambda x: x), False)
  before = _live()
  it = iter(ds)
  next(it)
  assert _live() == before


@pytest.mark.parametrize("args, fields, expected", [
    ((), {}, True),
    ((), {"cpu_budget": 2}, intune_tf.IntuneOptions(cpu_budget=2)),
    ((intune_tf.IntuneOptions(name="n"),), {},
     intune_tf.IntuneOptions(name="n")),
    ((False,), {}, False),
])
def test_tune_sets_the_option_as_tf_data_options_would(args, fields, expected):
  assert intune_tf.tune(_pipeline(), *args, **fields).options() == (
      _tuned(_pipeline(), expected).options())



def test_tune_sets_no_other_option(monkeypatch):
  # TF's test mode (its own tf.data tests) gives a new tf.data.Options()
  # experimental_warm_start=True: applied with it, a map whose table was
  # not yet initialized ran when the iterator was made.
  from tensorflow.python.data.ops import test_mode  # noqa: PLC0415
  monkeypatch.setattr(test_mode, "TEST_MODE", True)
  assert tf.data.Options().experimental_warm_start
  options = tf.data.Options()
  options.experimental_warm_start = False
  ds = intune_tf.tune(_pipeline().with_options(options), name="only")
  assert ds.options().experimental_warm_start is False
  assert ds.options().experimental_intune == intune_tf.IntuneOptions(
      name="only")


@pytest.mark.parametrize("value", [False, intune_tf.IntuneOptions()])
def test_tune_refuses_options_and_fields_together(value):
  with pytest.raises(TypeError, match="either an IntuneOptions or its fields"):
    intune_tf.tune(_pipeline(), value, policy="even")


def test_the_policy_name_is_checked_where_the_option_meets_a_dataset():
  options = tf.data.Options()
  options.experimental_intune = intune_tf.IntuneOptions(policy="nope")
  with pytest.raises(ValueError, match=(
      r"^IntuneOptions\.policy: Unknown InTune policy 'nope'\. Valid "
      r"policies: \[.*'even'.*\]\. A policy of your own must be registered "
      r"\(intune_tf\.register_policy\) before its option is set on a "
      r"dataset\.$")):
    _pipeline().with_options(options)
  with pytest.raises(ValueError, match="Unknown InTune policy 'nope'"):
    intune_tf.tune(_pipeline(), policy="nope")


def test_options_made_before_their_policy_is_registered_work():
  # IntuneOptions is a value: what was imported when it was made is moot.
  options = intune_tf.IntuneOptions(policy="later-test")

  class Later(intune_tf.Policy):
    def step(self, obs):
      return {}

  intune_tf.register_policy("later-test", Later)
  try:
    ds = intune_tf.tune(tf.data.Dataset.range(5).map(
        lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE), options)
    assert list(ds.as_numpy_iterator()) == [0, 2, 4, 6, 8]
  finally:
    registry.unregister("later-test")


def test_options_merge_keeps_it():
  a = tf.data.Options()
  a.experimental_intune = True
  b = tf.data.Options()
  b.deterministic = False
  assert a.merge(b).experimental_intune is True
  assert b.merge(a).experimental_intune is True


@pytest.mark.slow
def test_iter_and_for_are_tuned():
  ds = _tuned(_pipeline())
  before = _live()
  it = iter(ds)
  next(it)
  assert len(_live() - before) == 1
  assert [int(x) for x in ds] == [2 * i for i in range(64)]
  del it
  assert _live() == before


@pytest.mark.skipif(not hasattr(tf.data.experimental, "get_model_proto"),
                    reason="TensorFlow before 2.17 has no get_model_proto")
@pytest.mark.parametrize("numpy", [False, True])
def test_get_model_proto_gives_the_sessions_model(numpy):
  # TF's autotuner is off under the root, so TF's iterator holds no model:
  # the session's answers, unless the user turned autotune off.
  def pipeline(autotune):
    options = tf.data.Options()
    options.autotune.enabled = autotune
    return intune_tf.tune(tf.data.Dataset.range(100).map(
        lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE).prefetch(
            tf.data.AUTOTUNE).with_options(options), cache=False)

  def made(ds):
    return ds.as_numpy_iterator() if numpy else iter(ds)

  it = made(pipeline(True))
  next(it)
  proto = tf.data.experimental.get_model_proto(it)
  names = {node.name for node in proto.nodes.values()}
  assert {"Prefetch", "ParallelMapV2"} <= names
  with pytest.raises(tf.errors.NotFoundError, match="disable autotune"):
    tf.data.experimental.get_model_proto(made(pipeline(False)))
  plain = made(tf.data.Dataset.range(3).map(lambda x: x))
  assert tf.data.experimental.get_model_proto(plain).nodes


def test_tf_function_loop_is_tuned():
  ds = _tuned(_pipeline())
  seen = []

  def count():
    seen.append(len(intune_tf.sessions()))
    return np.int64(0)

  @tf.function
  def total():
    t = tf.constant(0, tf.int64)
    for x in ds:
      t += x + tf.numpy_function(count, [], tf.int64)
    return t

  assert int(total()) == sum(2 * i for i in range(64))
  assert seen and min(seen) >= 1


@pytest.mark.slow
def test_model_fit_is_tuned():
  x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
  y = (x.sum(axis=1) > 0).astype("float32")
  ds = _tuned(tf.data.Dataset.from_tensor_slices((x, y)).map(
      lambda a, b: (a * 1.0, b), num_parallel_calls=tf.data.AUTOTUNE).batch(32))
  counts = []

  class Probe(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
      counts.append(len(intune_tf.sessions()))

  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
  model.compile("sgd", "mse")
  model.fit(ds, epochs=2, verbose=0, callbacks=[Probe()])
  assert counts and min(counts) >= 1
