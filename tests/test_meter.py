"""Tests of intune_tf.bench.meter with a hand-driven clock."""

from _waiting import wait_for
import pytest

from intune_tf.bench import meter as meter_lib


class _Clock:

  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def test_the_window_opens_at_the_first_count_after_the_warmup():
  clock = _Clock()
  meter = meter_lib.Meter(seconds=4.0, warmup=1.0, clock=clock,
                          cpu_clock=lambda: 2 * clock.now)  # 2 busy CPUs
  for t, rows in [(0.5, 10), (1.5, 10), (2.5, 20), (4.5, 30)]:
    clock.now = 100.0 + t
    assert meter.running()
    meter.count(rows)
  # 0.5: warm-up; 1.5 opens the window (its rows finished before it); then
  # 20 + 30 rows over 4.5 - 1.5 = 3 s.
  assert meter.rows == 50 and meter.counts == 4
  assert meter.rows_per_s == pytest.approx(50 / 3.0)
  # CPU over the window: 2 x (4.5 - 1.5) = 6 s for 50 rows.
  assert meter.cpu_seconds_per_row == pytest.approx(6.0 / 50)
  # The whole run: all 70 rows over the 4.5 s to the last count.
  assert meter.whole_run_rows_per_s == pytest.approx(70 / 4.5)
  clock.now = 105.0  # warm-up + seconds = 5 s
  assert not meter.running()


def test_no_rate_before_two_counts_in_the_window():
  clock = _Clock()
  meter = meter_lib.Meter(seconds=1.0, clock=clock)
  assert meter.rows_per_s == 0.0 and meter.whole_run_rows_per_s == 0.0
  assert meter.cpu_seconds_per_row == 0.0
  meter.count(5)
  assert meter.rows_per_s == 0.0 and meter.measured_s == 0.0


def test_windows_report_the_rate_of_each_closed_window():
  clock = _Clock()
  meter = meter_lib.Meter(seconds=10.0, window_s=1.0, clock=clock)
  closed = []
  for t in (0.4, 0.8, 1.2, 1.6, 2.0, 2.4):
    clock.now = 100.0 + t
    closed.append(meter.count(4))
  # Window 1 closes at 1.2 with 3 counts x 4 rows over 1.2 s = 10 rows/s;
  # window 2 at 2.4 with 3 x 4 rows over 1.2 s = 10 rows/s.
  assert [w is not None for w in closed] == [False, False, True] * 2
  assert closed[2] == pytest.approx((1.2, 10.0))
  assert closed[5] == pytest.approx((2.4, 10.0))


@pytest.mark.parametrize("rows_of, expected_rows", [(None, 2), (len, 6)])
def test_pull_stops_when_the_iterator_ends(rows_of, expected_rows):
  clock = _Clock()

  def tick():  # one second per reading
    clock.now += 1.0
    return clock.now

  elements = iter([[1, 2, 3]] * 3)  # 3 elements of 3 rows, then the end
  meter = meter_lib.pull(elements, seconds=100.0, rows_of=rows_of, clock=tick)
  # The first element opens the window; the other two are measured.
  assert meter.counts == 3 and meter.rows == expected_rows


def test_peak_sampler_keeps_the_first_and_the_largest_reading():
  readings = iter([5, 9, RuntimeError("gone"), 7])

  def read():
    value = next(readings, 3)
    if isinstance(value, Exception):
      raise value
    return value

  with meter_lib.PeakSampler(read, period_s=0.001) as sampler:
    assert wait_for(lambda: sampler.peak == 9)
  # 5 first, 9 the largest; the failed reading was skipped.
  assert (sampler.start, sampler.peak) == (5, 9)
