"""Tests of intune_tf.agent.dqn: TD targets, the network, the replay buffer,
learning, persistence."""

import dataclasses
import io
import resource
import zipfile

import _observations as observations
import numpy as np
import pytest

from intune_tf.agent import dqn
from intune_tf.tuning import mdp


def test_td_targets_by_hand():
  rewards = np.array([1.0, 0.5, 0.2])
  next_q = np.array([[1.0, 3.0, 2.0], [4.0, 0.0, 1.0], [7.0, 1.0, 0.0]])
  mask = np.array([[True, False, True], [True, True, True],
                   [False, True, True]])
  dones = np.array([0.0, 1.0, 0.0])
  # Row 0: best valid is index 2 (3.0 is masked): 1 + 0.9 * 2 = 2.8.
  # Row 1: done: 0.5. Row 2: best valid of (1, 0) is 1: 0.2 + 0.9 = 1.1.
  y = dqn.td_targets(rewards, next_q, mask, dones, 0.9)
  np.testing.assert_allclose(y, [2.8, 0.5, 1.1])
  # Double DQN: the online net picks index 0 in row 0 -> target's 1.0:
  # 1 + 0.9 * 1 = 1.9; row 2 it picks index 2 -> 0.0: 0.2.
  online = np.array([[9.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 5.0]])
  y = dqn.td_targets(rewards, next_q, mask, dones, 0.9, online)
  np.testing.assert_allclose(y, [1.9, 0.5, 0.2])


def test_flat_q_layout():
  per_knob = np.array([[0., 1., 2., 3., 4.], [10., 11., 12., 13., 14.]])
  # Moves of knob 0, moves of knob 1, then the no-op: mean(2, 12) = 7.
  np.testing.assert_allclose(dqn.flat_q(per_knob),
                             [0, 1, 3, 4, 10, 11, 13, 14, 7])
  # With knob 1 padded out, the no-op is knob 0's stay value alone.
  np.testing.assert_allclose(
      dqn.flat_q(per_knob[None], np.array([[1.0, 0.0]]))[0, -1], 2.0)


def test_select_only_valid_actions():
  rng = np.random.default_rng(0)
  q = np.array([5.0, 1.0, 0.0])
  mask = np.array([False, True, True])
  assert dqn.select(q, mask, 0.0, rng) == 1
  picks = {dqn.select(q, mask, 1.0, rng) for _ in range(50)}
  assert picks == {1, 2}


@pytest.mark.parametrize("margin,expected", [
    (0.0, 1),    # 1.0 > 0.7 + 0: the best valid move
    (0.25, 1),   # 1.0 > 0.7 + 0.25 = 0.95
    (0.3, 2),    # 1.0 is not above 0.7 + 0.3 = 1.0: the no-op
    (0.5, 2),
])
def test_select_moves_only_beyond_the_margin(margin, expected):
  rng = np.random.default_rng(0)
  q = np.array([5.0, 1.0, 0.7])  # index 0 is masked; 2 is the no-op
  mask = np.array([False, True, True])
  assert dqn.select(q, mask, 0.0, rng, margin) == expected


def test_replay_pads_and_refuses_too_many_knobs():
  replay = dqn.Replay(4)
  state = np.ones((2, mdp.NUM_FEATURES), np.float32)
  assert replay.add(state, 8, 1.0, state, np.ones(9, bool), False)
  # The no-op of a 2-knob pipeline (8) is the padded no-op.
  assert replay.action[0] == mdp.MOVES_PER_KNOB * dqn.MAX_KNOBS
  assert replay.knobs[0, :3].tolist() == [1, 1, 0]
  # Moves of the 2 knobs (8), then padding, then the no-op.
  assert replay.next_mask[0, :8].all() and replay.next_mask[0, -1]
  assert not replay.next_mask[0, 8:-1].any()
  big = np.ones((dqn.MAX_KNOBS + 1, mdp.NUM_FEATURES), np.float32)
  assert not replay.add(big, 0, 0.0, big,
                        np.ones(mdp.MOVES_PER_KNOB * len(big) + 1, bool),
                        False)
  assert replay.size == 1


def test_replay_counts_the_rows_it_has_written():
  replay = dqn.Replay(4)
  assert replay.nbytes == 0
  state = np.ones((2, mdp.NUM_FEATURES), np.float32)
  for _ in range(6):  # wraps round: 4 rows at most
    replay.add(state, 0, 1.0, state, np.ones(9, bool), False)
  # One row, at 32 knobs x 18 features: state and next_state 2 x 2304,
  # knobs and next_knobs 2 x 128, action 8, reward 4, done 4, next_mask
  # 4 x 32 + 1 = 129 bools: 4608 + 256 + 16 + 129 = 5,009 bytes; 4 rows:
  # 20,036.
  assert replay.nbytes == 4 * 5009


def test_weights_round_trip_and_bad_files(tmp_path):
  agent = dqn.Agent(seed=1)
  path = str(tmp_path / "w.npz")
  agent.save(path, {"seed": 1})
  other = dqn.Agent(seed=2)
  assert other.load(path) == {"seed": 1}
  for a, b in zip(agent.get_weights(), other.get_weights()):
    np.testing.assert_array_equal(a, b)
  x = np.random.default_rng(0).random((3, mdp.NUM_FEATURES), np.float32)
  np.testing.assert_allclose(dqn.forward(other.weights, x),
                             other.network(x[None]).numpy()[0], rtol=1e-4,
                             atol=1e-5)

  garbage = tmp_path / "garbage.npz"
  garbage.write_bytes(b"not a zip")
  with pytest.raises(ValueError, match="not an InTune agent weights file"):
    dqn.load_weights(str(garbage))
  pickled = tmp_path / "pickled.npz"
  np.savez(pickled, w0=np.array([{"evil": 1}], dtype=object))
  with pytest.raises(ValueError, match="not an InTune agent weights file"):
    dqn.load_weights(str(pickled))
  wrong = tmp_path / "wrong.npz"
  dqn.save_weights(str(wrong), [np.zeros((3, 3))])
  with pytest.raises(ValueError, match="holds 1 arrays"):
    dqn.load_weights(str(wrong))


def _npz_with(tmp_path, name, members: dict[str, bytes]) -> str:
  path = str(tmp_path / name)
  with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
    for member, data in members.items():
      archive.writestr(member, data)
  return path


def _npy_header(shape, dtype="<f4") -> bytes:
  stream = io.BytesIO()
  np.lib.format.write_array_header_1_0(
      stream, {"descr": dtype, "fortran_order": False, "shape": shape})
  return stream.getvalue()  # the magic string, then the header


@pytest.mark.parametrize("members,message", [
    # A header that declares 4 GB of float32, with no data behind it.
    ({"w0.npy": _npy_header((10**9,))}, "declares shape"),
    # 64 MB of zeros: a file of about 64 KB.
    ({"w0.npy": _npy_header((16 << 20,)) + bytes(64 << 20)}, "unpacks to"),
    ({"w0.npy": _npy_header((4,), "<f8") + bytes(32)}, "not float32"),
    ({"evil.pkl": b"x"}, "unexpected member"),
])
def test_weights_files_are_checked_before_any_array_is_read(
    tmp_path, members, message):
  path = _npz_with(tmp_path, "bad.npz", members)
  before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  with pytest.raises(ValueError, match=message):
    dqn.load_weights(path)
  # ru_maxrss is in KiB: nothing near the declared sizes was allocated.
  assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 32 << 10


def test_weights_that_are_not_finite_or_do_not_chain_are_refused(tmp_path):
  weights = dqn.Agent(seed=0).get_weights()
  nan = [w.copy() for w in weights]
  nan[2][0, 0] = np.nan
  dqn.save_weights(str(tmp_path / "nan.npz"), nan)
  with pytest.raises(ValueError, match="NaN or infinite"):
    dqn.load_weights(str(tmp_path / "nan.npz"))
  broken = [w.copy() for w in weights]
  broken[3] = np.zeros(broken[3].shape[0] + 1, np.float32)
  dqn.save_weights(str(tmp_path / "broken.npz"), broken)
  with pytest.raises(ValueError, match="layer 1 has shapes"):
    dqn.load_weights(str(tmp_path / "broken.npz"))


def _done_transitions(agent: dqn.Agent, count: int, reward: float = 1.0):
  state = np.ones((1, mdp.NUM_FEATURES), np.float32)
  mask = np.array([False, False, False, False, True])
  for _ in range(count):
    agent.replay.add(state, 2, reward, state, mask, True)  # target = reward
  return state


@pytest.mark.slow
def test_learn_moves_q_towards_target():
  agent = dqn.Agent(seed=0, batch_size=8, learning_rate=1e-2)
  state = _done_transitions(agent, 8)
  before = agent.q_values(state)[2]
  for _ in range(100):
    agent.learn()
  after = agent.q_values(state)[2]
  assert abs(after - 1.0) < abs(before - 1.0)
  assert abs(after - 1.0) < 0.1


def test_weights_of_scalar_arrays_are_refused_before_loading(tmp_path):
  # Six float32 scalars: the right count and dtype, no layer shapes.
  path = tmp_path / "scalars.npz"
  np.savez(path, **{f"w{i}": np.float32(i) for i in range(6)})
  with pytest.raises(ValueError) as error:
    dqn.load_weights(str(path))
  assert str(error.value).startswith(
      f"{path} is not an InTune agent weights file (w0.npy has shape (); "
      "an agent's w0, w2, w4 are 2-D kernels and w1, w3, w5 1-D biases)")


@pytest.mark.slow
def test_learn_returns_a_typed_loss_record():
  agent = dqn.Agent(seed=0, batch_size=8, learning_rate=1e-2,
                    target_period=3)
  assert agent.learn() is None  # no batch stored yet
  state = _done_transitions(agent, 8)
  q = agent.q_values(state)[2]
  first = agent.learn()
  assert isinstance(first, dqn.LossInfo)
  # Every target is 1 (done) and every Q(s, a) the same q: |1 - q|.
  assert first.td_error == pytest.approx(abs(1.0 - q), rel=1e-5)
  assert (first.gradient_step, first.target_updated) == (1, False)
  infos = [agent.learn() for _ in range(50)]
  assert [i.target_updated for i in infos[:3]] == [False, True, False]
  assert infos[-1].gradient_step == 51
  # Traced once: the agent builds its optimizer's slots before the trace, so
  # the first step does not trace a second time to create them.
  assert agent._train_fn.experimental_get_tracing_count() == 1  # noqa: SLF001
  assert infos[-1].td_error < first.td_error
  assert infos[-1].loss < first.loss


def test_the_agent_trains_with_the_optimizer_and_loss_it_is_given():
  import keras  # noqa: PLC0415 (the test module loads no Keras otherwise)
  # Plain SGD at rate 0: the network does not move; mean squared error:
  # the loss is (1 - q)^2 where the default Huber (delta 1) gives
  # 0.5 (1 - q)^2 for |1 - q| <= 1.
  agent = dqn.Agent(seed=0, batch_size=8,
                    optimizer=keras.optimizers.SGD(0.0),
                    loss=keras.losses.MeanSquaredError())
  state = _done_transitions(agent, 8, reward=0.5)
  q = agent.q_values(state)[2]
  info = agent.learn()
  assert info.loss == pytest.approx((0.5 - q) ** 2, rel=1e-4)
  assert agent.q_values(state)[2] == pytest.approx(q)
  # A network of its own (narrower): acting runs its weights.
  network = dqn.build_network(hidden=8, seed=1)
  small = dqn.Agent(seed=0, network=network)
  assert small.network is network
  assert [w.shape for w in small.weights][0] == (mdp.NUM_FEATURES, 8)


@pytest.mark.slow
def test_the_collect_step_stores_the_reward_of_the_action_before_it():
  agent = dqn.Agent(seed=0, batch_size=2)
  collector = dqn.Collector(agent, learn_every=2)
  # A and B cost 0.01 and 0.03 CPU-s per element on 8 CPUs: work ceiling
  # 8 / 0.04 = 200/s; at 100/s the reward is 100 / 200 = 0.5.
  start = observations.two_stages()
  first = collector.collect(start)
  assert first.reward == pytest.approx(0.5)
  assert agent.replay.size == 0 and first.loss is None  # nothing was acted
  collector.acted(first.state, 3)
  # The action halved the rate: 50 / 200 = 0.25, stored with the action.
  second = collector.collect(observations.at(start, 50.0))
  assert second.reward == pytest.approx(0.25)
  assert (agent.replay.size, agent.replay.action[0]) == (1, 3)
  assert agent.replay.reward[0] == pytest.approx(0.25)
  assert second.loss is None  # step 2 of learn_every=2, but no batch yet
  # A hold or revert is no action of the agent's: nothing stored.
  collector.acted(second.state, 0)
  collector.forget()
  third = collector.collect(start)
  assert agent.replay.size == 1 and third.loss is None
  collector.acted(third.state, 0)
  fourth = collector.collect(start)  # step 4: a gradient step on 2 stored
  assert agent.replay.size == 2 and isinstance(fourth.loss, dqn.LossInfo)
  # Half the CPUs: the reference starts over at 4 / 0.04 = 100/s, so 100/s
  # scores 1.0 (not 100 / 200, the best seen on 8 CPUs).
  fewer = dataclasses.replace(start, usable_cpus=4)
  assert collector.collect(fewer).reward == pytest.approx(1.0)
  # A new episode forgets the reference and any pending action.
  collector.acted(third.state, 0)
  collector.begin()
  assert collector.collect(observations.at(start, 50.0)).reward == (
      pytest.approx(0.25))
  assert agent.replay.size == 2
