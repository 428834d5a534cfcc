"""The learned allocation (intune_tf.agent.allocator)."""

from _observations import at
from _observations import knob
from _observations import obs
from _observations import two_stages
import numpy as np
import pytest

from intune_tf.agent import allocator
from intune_tf.agent import dqn
from intune_tf.agent import ranked
from intune_tf.tuning import mdp


@pytest.mark.parametrize("shares,expected", [
    # 8 CPUs, A 2 and B 2 threads: A at 0.25 x 8 = 2 is unchanged, B goes
    # to 0.5 x 8 = 4.
    ([0.25, 0.5], {"B/parallelism": 4.0}),
    # Below the thread floor min(8, 2) = 2: raised to it; 0.9 x 8 = 7.2
    # rounds to 7.
    ([0.05, 0.9], {"B/parallelism": 7.0}),
    # A negative output counts as 0, raised to the floor: no change.
    ([-1.0, 0.25], {}),
    # Above a knob's max of 8: capped (2.0 x 8 = 16).
    ([0.25, 2.0], {"B/parallelism": 8.0}),
])
def test_allocation_by_hand(shares, expected):
  assert allocator.allocation(two_stages(), np.asarray(shares)) == expected


def test_buffers_are_left_as_they_are():
  o = obs([knob("A/parallelism", "parallelism", 2, hi=8),
           knob("A/buffer_size", "buffer_size", 3, lo=0, hi=64)],
          cpu_budget=8)
  # 0.5 x 8 = 4 threads; the buffer's output (0.9) is not used.
  assert allocator.allocation(o, np.asarray([0.5, 0.9])) == {
      "A/parallelism": 4.0}


def test_the_shipped_network_proposes_from_what_it_observes():
  learned = allocator.Allocator()
  shares = [learned.shares(at(two_stages(), rate)) for rate in (10.0, 500.0)]
  assert shares[0].shape == (2,) and not np.allclose(shares[0], shares[1])
  o = obs([knob("A/parallelism", "parallelism", 1, hi=64),
           knob("B/parallelism", "parallelism", 1, hi=64)],
          cpu_budget=32, costs={"A": 0.01, "B": 0.03}, output_rate=100.0)
  # One thread each of 32 CPUs, far below the work ceiling: it proposes
  # more threads, the costlier stage more.
  label, values = learned.propose(o)
  assert label == allocator.LABEL
  assert values == allocator.allocation(o, learned.shares(o))
  assert values["B/parallelism"] > values["A/parallelism"] > 1
  # Nothing measured yet (no output): no proposal.
  assert learned.propose(at(two_stages(), 0.0)) is None


def test_the_ablation_is_a_constant_whatever_it_observes():
  ablated = allocator.Allocator(constant=0.4)
  for o in (at(two_stages(), 10.0), at(two_stages(), 500.0, A=5)):
    assert np.all(ablated.shares(o) == np.float32(0.4))
  # 0.4 x 8 = 3.2: 3 threads each.
  assert ablated.propose(at(two_stages(), 100.0)) == (
      allocator.LABEL, {"A/parallelism": 3.0, "B/parallelism": 3.0})


def test_the_shipped_file_says_how_it_was_trained():
  weights, metadata = dqn.load_weights(allocator.ALLOCATOR_WEIGHTS)
  assert weights[0].shape == (mdp.NUM_FEATURES, allocator.HIDDEN)
  assert weights[-1].shape == (1,)
  assert metadata["command"].startswith("intune pretrain --allocator")
  assert metadata["samples"] > 0 and metadata["seconds"] > 0
  # Better than the threads in force, on states it was not trained on.
  assert (metadata["held_out_error"] <
          metadata["held_out_error_of_threads_in_force"])
  assert 0 < metadata["mean_share"] < 2


def test_a_network_of_another_shape_is_refused():
  # The Q-network's file: 5 outputs per knob, not 1.
  with pytest.raises(ValueError, match="its output layer has 5 units"):
    allocator.Allocator(ranked.JUMP_WEIGHTS)
