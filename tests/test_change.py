"""The change detector (intune_tf.tuning.change) on hand-built streams."""

import math

import numpy as np
import pytest

from intune_tf.tuning import change


def test_noise_sigma_from_successive_differences():
  # |3 - 1| = |1 - 3| = 2; mean 2; x sqrt(pi) / 2 = 1.7725.
  assert change.noise_sigma([1.0, 3.0, 1.0]) == pytest.approx(
      2 * math.sqrt(math.pi) / 2)
  # A level shift is one difference among many: [0] * 5 + [1] * 5 has one
  # difference of 1 in 9: 1/9 x 0.886 = 0.098 (its standard deviation is
  # 0.5).
  assert change.noise_sigma([0.0] * 5 + [1.0] * 5) == pytest.approx(
      math.sqrt(math.pi) / 2 / 9)
  assert change.noise_sigma([4.0]) == 0.0


@pytest.mark.parametrize("high,low,z,expected", [
    (0.0, 0.0, 3.0, (1.5, 0.0)),     # 0 + 3 - 1.5; 0 - 3 - 1.5 < 0
    (1.5, 0.0, -0.5, (0.0, 0.0)),    # 1.5 - 0.5 - 1.5 = -0.5 -> 0
    (0.0, 2.0, -4.0, (0.0, 4.5)),    # 2 + 4 - 1.5
])
def test_cusum_step(high, low, z, expected):
  assert change.cusum_step(high, low, z, 1.5) == pytest.approx(expected)


def test_alternating_3_percent_noise_never_alarms():
  # +-3% in turn: the warm-up's differences are all 0.06, so sigma =
  # 0.06 x 0.886 = 0.053 and |z| <= 0.03 / 0.053 = 0.56 < k = 1.5: both
  # sums stay at 0 for all 300 values.
  detector = change.Cusum()
  stream = [0.03 * (-1) ** t for t in range(300)]
  assert not any(detector.update(x) for x in stream)
  assert detector.high == 0 and detector.low == 0


def test_a_20_percent_drop_alarms_at_its_fourth_value():
  # Warm-up: 8 values at +-0.03 around 0 (mean 0, sigma 0.06 x 0.886 =
  # 0.0532, n = 8). Then log(0.8) = -0.223: z = -0.223 / (0.0532 x
  # sqrt(1 + 1/8)) = -3.96, beyond 3 sigma so it teaches nothing; the low
  # sum grows by 3.96 - 1.5 = 2.46 per value: 2.46, 4.91, 7.37, 9.83 > 8.
  detector = change.Cusum()
  for t in range(8):
    assert not detector.update(0.03 * (-1) ** t)
  alarms = [detector.update(math.log(0.8)) for _ in range(5)]
  assert alarms[:4] == [False, False, False, True]
  # It reset itself: a new warm-up.
  assert detector.mean is None


def test_one_outlier_alone_does_not_alarm():
  # A single value 50 sigma off adds at most clip - k = 3 to a sum.
  detector = change.Cusum()
  stream = [0.03 * (-1) ** t for t in range(20)]
  stream[12] = 2.5
  assert not any(detector.update(x) for x in stream)


@pytest.mark.parametrize("seed", range(20))
def test_random_3_percent_noise_no_alarm_and_a_20_percent_shift_found(seed):
  rng = np.random.default_rng(seed)
  detector = change.Cusum()
  assert not any(detector.update(x) for x in rng.normal(0, 0.03, 300))
  detector = change.Cusum()
  quiet = rng.normal(0, 0.03, 100)
  assert not any(detector.update(x) for x in quiet)
  up = np.log(1.2) + rng.normal(0, 0.03, 10)
  alarms = [detector.update(x) for x in up]
  assert True in alarms[:4], alarms  # within 4 values


def test_a_constant_stream_alarms_on_a_small_move_by_the_noise_floor():
  # 16 CPUs for 10 values: sigma 0, floored at 0.01. 12 CPUs: log(12/16)
  # = -0.288, far beyond: clipped z -4.5, the low sum 3, 6, 9 > 8.
  detector = change.Cusum()
  for _ in range(10):
    assert not detector.update(math.log(16))
  assert [detector.update(math.log(12)) for _ in range(3)] == [
      False, False, True]


def test_the_monitor_names_what_moved_and_starts_over():
  monitor = change.ChangeMonitor()
  for t in range(10):
    assert monitor.update({"rate": 0.03 * (-1) ** t, "memory": 0.5,
                           "consumer": None}) == []
  moved = []
  for t in range(3):
    moved = monitor.update({"rate": 0.03 * (-1) ** t, "memory": 0.7})
  # memory: 0.2 above a constant 0.5 (sigma floor 0.01): alarms at its
  # third value; the rate did not move.
  assert moved == ["memory"]
  # Every stream warms up again.
  assert monitor.update({"rate": 5.0, "memory": 0.0}) == []


def test_a_warmup_shorter_than_two_is_refused():
  with pytest.raises(ValueError, match="at least 2"):
    change.Cusum(warmup=1)
