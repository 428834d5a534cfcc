"""The installed package works on the installed TensorFlow: the smoke subset
that CI runs on every supported minor (`make smoke`, tools/matrix.py).

The option tunes a real pipeline (a policy is stepped and its knob value is
applied), the output equals plain TF's, and an iterator checkpoint
round-trips.
"""

from __future__ import annotations

import threading
import time

import tensorflow as tf

import intune_tf

_N = 200
# The knob the policy sets (a map's parallelism in [1, max]).
_PARALLELISM = 2


def _pipeline() -> tf.data.Dataset:
  return (tf.data.Dataset.range(_N)
          .map(lambda x: x * 3 + 1, num_parallel_calls=tf.data.AUTOTUNE)
          .batch(4)
          .prefetch(tf.data.AUTOTUNE))


def _with_intune(ds: tf.data.Dataset, value) -> tf.data.Dataset:
  options = tf.data.Options()
  options.experimental_intune = value
  return ds.with_options(options)


class _Recording(intune_tf.Policy):
  """Sets every parallelism knob to _PARALLELISM; records its steps."""

  stepped = threading.Event()

  def step(self, obs):
    _Recording.stepped.set()
    return {k.name: _PARALLELISM for k in obs.knobs
            if k.kind == "parallelism"}


def test_option_tunes_a_pipeline():
  intune_tf.register_policy("install-test", _Recording)
  _Recording.stepped.clear()
  ds = _with_intune(_pipeline().repeat(),
                    intune_tf.IntuneOptions(policy="install-test",
                                            period_s=0.05))
  it = iter(ds)
  next(it)
  session = max(intune_tf.sessions(), key=lambda s: s.id)
  deadline = time.monotonic() + 120  # a loaded machine steps late
  knobs = []
  while time.monotonic() < deadline:
    next(it)
    knobs = [k for k in session.knobs() if k.kind == "parallelism"]
    if (_Recording.stepped.is_set() and knobs and
        all(k.value == _PARALLELISM for k in knobs)):
      break
    time.sleep(0.01)
  assert _Recording.stepped.is_set(), "the tuner never stepped the policy"
  assert knobs and all(k.value == _PARALLELISM for k in knobs), knobs


def test_output_equals_plain_tensorflow():
  plain = [b.numpy().tolist() for b in _pipeline()]
  tuned = [b.numpy().tolist() for b in _with_intune(_pipeline(), True)]
  assert tuned == plain
  # 0..199 mapped to 3x+1, in batches of 4: 50 batches, the first [1, 4, 7,
  # 10], the last ends with 3 * 199 + 1 = 598.
  assert len(tuned) == 50 and tuned[0] == [1, 4, 7, 10]
  assert tuned[-1][-1] == 598


def test_iterator_checkpoint_round_trips(tmp_path):
  expected = [b.numpy().tolist() for b in _pipeline()]
  it = iter(_with_intune(_pipeline(), True))
  first = [next(it).numpy().tolist() for _ in range(7)]
  path = tf.train.Checkpoint(iterator=it).save(str(tmp_path / "ckpt"))
  del it
  restored = iter(_with_intune(_pipeline(), True))
  tf.train.Checkpoint(iterator=restored).restore(path).assert_consumed()
  rest = [b.numpy().tolist() for b in restored]
  assert first + rest == expected
