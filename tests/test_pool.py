"""Tests of intune_tf.service.controllers: the pool controllers, by hand."""

import dataclasses
import functools
import math

import numpy as np
import pytest

from intune_tf.service import controllers


@pytest.mark.parametrize("values,expected", [
    # mean 4, sd sqrt((9 + 4 + 1 + 36) / 3) = 4.08: 10 is outside
    # [-0.08, 8.08] and becomes the upper median sorted[2] = 3.
    ([1, 2, 3, 10], [1, 2, 3, 3]),
    # mean 325, sd sqrt((3 x 225^2 + 675^2) / 3) = 450: 1000 > 775 -> 100.
    ([100, 100, 100, 1000], [100, 100, 100, 100]),
    ([5], [5]),
    ([7, 7, 7], [7, 7, 7]),  # sd 0: every value is the mean
])
def test_replace_outliers_by_hand(values, expected):
  assert controllers.replace_outliers(values) == pytest.approx(expected)


@pytest.mark.parametrize("consumers,workers,expected", [
    ([1000], [300, 300, 290], 4),  # ceil(1000 / 296.67) = ceil(3.37)
    # The 1000 rows/s worker is an outlier (previous test): mean 100.
    ([1000], [100, 100, 100, 1000], 10),
    ([600, 400], [250, 250], 4),  # ceil(1000 / 250)
    ([10], [1000], 1),  # at least 1
    ([], [100], None),
    ([100], [], None),
])
def test_tf_formula_estimate_by_hand(consumers, workers, expected):
  assert controllers.tf_formula_estimate(consumers, workers) == expected


@pytest.mark.parametrize("estimate,current,expected", [
    (50, 15, 50),  # 50 <= 4 x 15 = 60
    (100, 15, 60),  # 4 x 15
    (2000, 300, 800),  # 300 + 500 < 4 x 300
    (3, 10, 3),  # shrinking is not capped
])
def test_cap_growth_by_hand(estimate, current, expected):
  assert controllers.cap_growth(estimate, current) == expected


@pytest.mark.parametrize("demand,per_worker,headroom,expected", [
    (1000, 300, 0.1, 4),  # ceil(1100 / 300) = ceil(3.67)
    (900, 300, 0.0, 3),  # exactly 3
    (1, 300, 0.0, 1),
])
def test_workers_needed_by_hand(demand, per_worker, headroom, expected):
  assert controllers.workers_needed(demand, per_worker, headroom) == expected


@pytest.mark.parametrize("bounds,message", [
    ((0, 4), "MIN must be at least 1"),
    ((-1, 3), "MIN must be at least 1"),
    ((5, 4), r"MIN \(5\) is above its MAX \(4\)"),
    ((2, 0), "MAX must be at least 1"),
    ((2.5, 4), "MIN must be an integer"),
])
def test_bad_bounds_raise(bounds, message):
  with pytest.raises(ValueError, match=message):
    controllers.check_bounds(*bounds)
  for name in controllers.CONTROLLERS:
    with pytest.raises(ValueError, match=message):
      controllers.make_controller(name, *bounds)


@pytest.mark.parametrize("name", controllers.CONTROLLERS)
def test_numpy_bounds_are_taken_as_ints(name):
  controller = controllers.make_controller(name, np.int64(2), np.int32(6))
  assert (controller.min_workers, controller.max_workers) == (2, 6)
  assert type(controller.min_workers) is int
  assert type(controller.max_workers) is int


class _ToyPool:
  """A pool of workers of `capacity` rows/s each (the tuners report
  `reported`), behind a host that takes at most `ceiling` rows/s; a worker
  asked for at reading i serves from reading i + `startup` on, and
  delivers rows from `warmup` readings after that."""

  def __init__(self, size, capacity=100.0, reported=None, ceiling=math.inf,
               startup=1, warmup=0):
    self.serving = size
    self.warming = []  # reading index from which each serving one delivers
    self.warmup = warmup
    self.starting = []  # reading index at which each starting one serves
    self.capacity = capacity
    self.reported = capacity if reported is None else reported
    self.ceiling = ceiling
    self.startup = startup
    self.i = 0
    self.sizes = []
    self.changes = 0
    self.reasons = []

  def reading(self, pace):
    joined = [r for r in self.starting if r <= self.i]
    self.starting = [r for r in self.starting if r > self.i]
    self.serving += len(joined)
    self.warming += [r + self.warmup for r in joined]
    self.warming = [r for r in self.warming if r > self.i]
    delivering = self.serving - len(self.warming)
    supply = min(delivering * self.capacity, self.ceiling)
    wait = max(0.0, 1.0 - supply / pace)
    got = pace * (1 - wait)
    rates = ((got / delivering,) * delivering if delivering else ()) + (
        (0.0,) * len(self.warming))
    return controllers.PoolReading(
        time_s=10.0 * (self.i + 1), workers=self.serving,
        starting=len(self.starting), wait_share=wait, consumer_rate=pace,
        worker_rates=rates,
        worker_capacities=(self.reported,) * self.serving)

  def apply(self, decision):
    asked = self.serving + len(self.starting)
    if decision.size > asked:
      self.starting += [self.i + self.startup] * (decision.size - asked)
    elif decision.size < asked:
      drop = asked - decision.size
      from_starting = min(drop, len(self.starting))
      self.starting = self.starting[:len(self.starting) - from_starting]
      self.serving -= drop - from_starting
      # The newest go first: those still warming up.
      self.warming = self.warming[:max(
          0, len(self.warming) - (drop - from_starting))]
    self.changes += decision.change
    self.sizes.append(decision.size)
    self.reasons.append(decision.reason)
    self.i += 1

  def drive(self, controller, paces):
    for pace in paces:
      self.apply(controller.decide(self.reading(pace)))
    return self


def test_intune_grows_once_to_the_model_size_and_confirms():
  # 2 workers of 100 rows/s, a consumer of 500 rows/s: the trainer waits
  # 60%; the model asks ceil(500 x 1.05 / 100) = 6 at once, and the next
  # readings (no wait) confirm it.
  toy = _ToyPool(2).drive(controllers.IntuneController(1, 64), [500.0] * 20)
  assert toy.sizes[0] == 6
  assert set(toy.sizes) == {6}
  assert toy.changes == 1
  assert any("2 -> 6 confirmed" in r for r in toy.reasons), toy.reasons


@pytest.mark.parametrize("waits,grown_at", [
    # One round of 8% wait (left over from a growth) then none: no growth.
    ([0.08, 0.0, 0.08, 0.0, 0.0], None),
    # 8% twice in a row: one more worker is measured at the second.
    ([0.08, 0.08, 0.0], 1),
    ([0.0, 0.08, 0.0, 0.08, 0.08], 4),
    # 4% (under the 5% borne) persists: a third worker would be used
    # 190 x 0.04 / 100 = 8%, so it is never measured.
    ([0.04] * 5, None),
])
def test_intune_measures_one_more_only_once_an_unexplained_wait_persists(
    waits, grown_at):
  # 2 workers reporting 100 rows/s each, a consumer of 190 rows/s: the
  # model says ceil(190 x 1.05 / 100) = 2 suffice.
  c = controllers.IntuneController(1, 4, min_interval_s=0.0)
  sizes = [c.decide(controllers.PoolReading(
      time_s=10.0 * i, workers=2, wait_share=w, consumer_rate=190.0,
      worker_rates=(95.0 * (1 - w),) * 2,
      worker_capacities=(100.0, 100.0))).size for i, w in enumerate(waits)]
  if grown_at is None:
    assert sizes == [2] * len(waits)
  else:
    assert sizes[:grown_at] == [2] * grown_at and sizes[grown_at] == 3


@pytest.mark.parametrize("wait,grows", [(0.035, False), (0.06, True)])
def test_intune_bears_a_small_wait_one_more_worker_would_barely_use(
    wait, grows):
  # The live run's 2 saturated workers of 7.15 rows/s against a pace of
  # 14.3: the model's headroom asks ceil(14.3 x 1.05 / 7.15) = 3, but the
  # shortfall is max(14.3 - 2 x 7.15, 14.3 x 0.035) = 0.50 rows/s, 7% of a
  # third worker; a 3.5% wait is borne, a 6% one (over 5%) is not.
  c = controllers.IntuneController(1, 4, min_interval_s=0.0)
  sizes = []
  while len(sizes) < 5 and 3 not in sizes:
    sizes.append(c.decide(controllers.PoolReading(
        time_s=10.0 * len(sizes), workers=2, wait_share=wait,
        consumer_rate=14.3, worker_capacities=(7.15, 7.15))).size)
  assert sizes == ([3] if grows else [2] * 5)


@pytest.mark.parametrize("after,keep", [
    # 4 -> 9 at a 50% wait on 800 rows/s predicts min(5 x 100, 400) = 400
    # rows/s, 80 per added worker. A wait of 30% after: +160 = 2 workers'
    # worth, 4 + floor(2 + 0.5) = 6; 45% after: +40, 4 + floor(0.5 + 0.5)
    # = 5 (the one worker delivered half its part).
    (0.30, 6), (0.45, 5), (0.50, 4)])
def test_intune_keeps_the_added_workers_that_delivered_their_part(
    after, keep):
  c = controllers.IntuneController(1, 64, min_interval_s=0.0)
  reading = functools.partial(controllers.PoolReading, consumer_rate=800.0,
                              worker_capacities=(100.0,) * 4)
  assert c.decide(reading(time_s=0.0, workers=4, wait_share=0.5)).size == 9
  c.decide(reading(time_s=10.0, workers=9, wait_share=after))  # measuring
  doubt = c.decide(reading(time_s=20.0, workers=9, wait_share=after))
  assert doubt.size == 9 and doubt.reason.endswith("measuring once more")
  back = c.decide(reading(time_s=30.0, workers=9, wait_share=after))
  assert back.size == keep and c.ceiling[0] == keep, back.reason


def test_intune_takes_back_a_third_worker_that_removed_a_fraction_of_wait():
  # The live case: 2 workers of 7.15 rows/s, a pace of 14.3, a 6% wait:
  # 2 -> 3 predicts min(7.15, 14.3 x 0.06) = 0.86 rows/s. The wait falls to
  # 4.5%: +0.21 rows/s, under half, and 0.21 / 0.86 + 0.5 < 1 keeps none:
  # back to 2. (A ceil of 0.21 / 7.15 kept the third.)
  c = controllers.IntuneController(1, 4, min_interval_s=0.0)
  reading = functools.partial(controllers.PoolReading, consumer_rate=14.3,
                              worker_capacities=(7.15,) * 2)
  assert c.decide(reading(time_s=0.0, workers=2, wait_share=0.06)).size == 3
  c.decide(reading(time_s=10.0, workers=3, wait_share=0.045))
  c.decide(reading(time_s=20.0, workers=3, wait_share=0.045))  # once more
  back = c.decide(reading(time_s=30.0, workers=3, wait_share=0.045))
  assert back.size == 2
  assert "(wait 6.0% -> 4.5%): back to 2 (ceiling)" in back.reason


@pytest.mark.parametrize("second,size,reason", [
    # The backlog is won back: judged on the better period, +(0.231 - 0.05)
    # x 12 = +2.2 of the +min(6, 12 x 0.231) = +2.8 predicted, over half.
    (0.05, 2, "1 -> 2 confirmed: +2 rows/s"),
    # Still no gain: back to 1 under a ceiling.
    (0.259, 1, "(wait 23.1% -> 25.9%): back to 1 (ceiling)"),
])
def test_intune_measures_a_growth_that_fell_short_once_more(second, size,
                                                            reason):
  # The zero-spare case of the live benchmark: 1 worker of 6 rows/s starts
  # a fast phase of 12 rows/s with a buffer, so the trainer waits only
  # 23.1%; 2 workers match the pace with nothing to spare and the first
  # period after the growth still waits 25.9% (+-0 of +2.8 predicted). One
  # period decides nothing: the second is measured before the verdict.
  c = controllers.IntuneController(1, 2, min_interval_s=0.0)
  reading = functools.partial(controllers.PoolReading, consumer_rate=12.0)
  grown = c.decide(reading(time_s=0.0, workers=1, wait_share=0.231,
                           worker_rates=(6.0,)))
  assert grown.size == 2
  waits = [0.3, 0.259, second, second]  # the first: measuring the change
  sizes, reasons = [], []
  for i, wait in enumerate(waits):
    d = c.decide(reading(time_s=10.0 * (i + 1), workers=2, wait_share=wait,
                         worker_rates=(5.0, 4.0)))
    sizes.append(d.size)
    reasons.append(d.reason)
  assert sizes[:2] == [2, 2] and sizes[2] == size, reasons
  assert reasons[1].endswith("measuring once more")
  assert reason in reasons[2]


def test_intune_learns_nothing_from_a_period_the_pace_moved_in():
  # One worker delivers a pace of 8 rows/s without a wait (it can do at
  # least 8), then a slow pace of 3.6. The pace jumps to 14.3 and the
  # trainer waits 46%: the worker's rate over that period (6 rows/s)
  # straddles both paces and is not learned, so the model asks
  # ceil(14.3 x 1.05 / 8) = 2, not ceil(15.0 / 7) = 3 as the mean of 8 and
  # 6 would.
  c = controllers.IntuneController(1, 4, min_interval_s=0.0)
  reading = functools.partial(controllers.PoolReading, workers=1)
  c.decide(reading(time_s=0.0, consumer_rate=8.0, worker_rates=(8.0,)))
  c.decide(reading(time_s=10.0, consumer_rate=3.6, worker_rates=(3.6,)))
  assert c.per_worker == 8.0
  grown = c.decide(reading(time_s=20.0, wait_share=0.46,
                           consumer_rate=14.3, worker_rates=(6.0,)))
  assert (grown.size, c.per_worker) == (2, 8.0)


def test_intune_grows_at_once_where_the_model_asks_for_more():
  # Same workers, a consumer of 250 rows/s waiting 4%: ceil(262.5 / 100) =
  # 3, asked at the first reading.
  c = controllers.IntuneController(1, 4, min_interval_s=0.0)
  assert c.decide(controllers.PoolReading(
      time_s=0.0, workers=2, wait_share=0.04, consumer_rate=250.0,
      worker_capacities=(100.0, 100.0))).size == 3


def test_intune_takes_back_a_growth_that_does_not_deliver():
  # The host takes at most 400 rows/s: 4 workers already reach it. The
  # trainer (800 rows/s) waits 50%; the model asks ceil(840 / 100) = 9; the
  # 5 more workers deliver +0 of the +400 predicted, so the controller goes
  # back to 4 and holds there (a ceiling), though the trainer still waits.
  toy = _ToyPool(4, ceiling=400.0).drive(controllers.IntuneController(1, 64),
                                         [800.0] * 50)
  # 0: grow; 1: the workers serve, measuring; 2: the measurement, short:
  # measured once more; 3: the judgement.
  assert toy.sizes[:4] == [9, 9, 9, 4]
  assert set(toy.sizes[4:]) == {4}
  assert toy.changes == 2
  assert toy.reasons[2].endswith("(wait 50.0% -> 50.0%): measuring once more")
  assert ("gave +0 rows/s of +400 predicted (wait 50.0% -> 50.0%): back to 4"
          in toy.reasons[3])


@pytest.mark.parametrize("warmup", [2, 3])
def test_intune_judges_a_growth_once_its_workers_deliver(warmup):
  # 2 workers, a consumer of 500 rows/s; the 4 more workers the model asks
  # serve a reading later and deliver `warmup` readings after that. Judged
  # while they deliver nothing, the growth would look like +0 of +300
  # predicted and be taken back; it is held until they deliver, for one
  # reading more, then confirmed.
  toy = _ToyPool(2, warmup=warmup).drive(
      controllers.IntuneController(1, 64, first_rows_s=60.0), [500.0] * 20)
  assert set(toy.sizes) == {6}, toy.reasons
  assert toy.changes == 1
  # 0: grow; 1: serving, measuring (no rows yet); 2 .. warmup: no rows;
  # then one reading measuring with them, then the judgement.
  waiting = warmup - 1
  assert toy.reasons[2:2 + waiting] == [
      "waiting for the new workers' first rows"] * waiting
  assert toy.reasons[2 + waiting] == "measuring the change"
  assert toy.reasons[3 + waiting] == "2 -> 6 confirmed: +300 rows/s"


def test_intune_judges_a_growth_whose_workers_never_deliver_in_time():
  # The new workers never deliver: once `first_rows_s` (20 s, 2 readings
  # 10 s apart) has passed since they registered (reading 1), the growth
  # is judged (reading 3), measured once more and taken back (reading 4).
  toy = _ToyPool(2, warmup=100).drive(
      controllers.IntuneController(1, 64, first_rows_s=20.0), [500.0] * 8)
  assert toy.sizes == [6, 6, 6, 6, 2, 2, 2, 2], toy.reasons
  assert toy.reasons[2] == "waiting for the new workers' first rows"
  assert ("gave +0 rows/s of +300 predicted (wait 60.0% -> 60.0%): back to 2"
          in toy.reasons[4])


def test_intune_shrinks_after_patience_to_the_largest_need():
  # 10 workers, the consumer needs 300 rows/s: no wait. Three calm rounds
  # propose ceil(315 / 100) = 4, ceil(105 / 100) = 2 and 4: the largest, 4.
  toy = _ToyPool(10).drive(controllers.IntuneController(1, 64),
                           [300.0, 100.0, 300.0] + [300.0] * 10)
  assert toy.sizes[:3] == [10, 10, 4]
  assert set(toy.sizes[3:]) == {4}
  assert toy.changes == 1


def test_intune_takes_back_a_shrink_after_which_the_trainer_waits():
  # The tuners report 100 rows/s but a worker delivers 60: the model's 4
  # workers give 240 of the 300 rows/s asked (wait 20%), so the shrink is
  # taken back to 10, which then holds as a floor.
  toy = _ToyPool(10, capacity=60.0, reported=100.0).drive(
      controllers.IntuneController(1, 64), [300.0] * 40)
  assert toy.sizes[:5] == [10, 10, 4, 4, 10]
  assert set(toy.sizes[4:]) == {10}
  assert toy.changes == 2
  assert "trainer waits 20%; back to 10 (floor)" in toy.reasons[4]


@pytest.mark.parametrize("wait,delivering,regrows", [
    (1.0, False, True),   # stalled: the epoch waits for a stopped worker
    (0.5, True, False),   # short of rows: the usual rules decide
])
def test_intune_undoes_a_shrink_the_trainer_stalls_after(wait, delivering,
                                                       regrows):
  # 4 workers that could each give 100 rows/s, a consumer of 150 rows/s:
  # three calm rounds propose ceil(157.5 / 100) = 2; the pool shrinks to 2.
  controller = controllers.IntuneController(1, 4, min_interval_s=0.0)
  for i in range(3):
    decision = controller.decide(controllers.PoolReading(
        time_s=10.0 * i, workers=4, consumer_rate=150.0,
        worker_rates=(37.5,) * 4, worker_capacities=(100.0,) * 4))
  assert (decision.size, decision.change) == (2, True)
  # The shrink takes effect (measuring), then the reading under test.
  controller.decide(controllers.PoolReading(
      time_s=30.0, workers=2, consumer_rate=150.0, worker_rates=(75.0,) * 2,
      worker_capacities=(100.0,) * 2))
  decision = controller.decide(controllers.PoolReading(
      time_s=40.0, workers=2, wait_share=wait, consumer_rate=150.0,
      worker_rates=(37.5,) * 2 if delivering else (0.0, 0.0),
      worker_capacities=(100.0,) * 2))
  if regrows:
    assert (decision.size, decision.change) == (4, True)
    assert decision.reason.startswith(
        "trainer gets nothing since the pool shrank to 2: back to 4")
  else:
    assert "trainer gets nothing" not in decision.reason


def test_intune_waits_for_starting_workers_and_the_minimum_interval():
  # Workers take 3 readings to start: no decision meanwhile; after the
  # change is confirmed, a new need waits out 30 s (3 readings).
  controller = controllers.IntuneController(1, 64, min_interval_s=30.0)
  toy = _ToyPool(2, startup=3).drive(controller, [500.0] * 8 + [900.0] * 8)
  # 0: ask 6; 1, 2: starting; 3: serving (measuring); 4: confirmed.
  assert toy.sizes[:8] == [6] * 8
  assert toy.changes >= 2
  first_regrow = next(i for i, s in enumerate(toy.sizes) if s > 6)
  assert toy.reasons[1] == "waiting for 4 worker(s) to start"
  # 900 rows/s from reading 8 on; the change took effect at reading 3, so
  # the interval is over: it grows at once to ceil(945 / 100) = 10.
  assert first_regrow == 8 and toy.sizes[8] == 10


@pytest.mark.parametrize("name", ["intune", "tf-formula", "cachew"])
@pytest.mark.parametrize("bounds", [(1, 1), (2, 5), (3, 64)])
def test_pool_never_leaves_min_max(name, bounds):
  rng = np.random.default_rng(0)
  controller = controllers.make_controller(name, *bounds)
  lo, hi = bounds
  for i in range(400):
    workers = int(rng.integers(0, hi + 3))
    reading = controllers.PoolReading(
        time_s=10.0 * i, workers=workers,
        starting=int(rng.integers(0, 3)) * int(rng.random() < 0.2),
        wait_share=float(rng.choice([0.0, 0.005, 0.2, 0.9])),
        consumer_rate=float(rng.choice([0.0, 10.0, 1e3, 1e6])),
        worker_rates=tuple(rng.uniform(1, 500, workers).tolist()),
        worker_capacities=tuple(rng.uniform(1, 500, workers).tolist()))
    decision = controller.decide(reading)
    assert lo <= decision.size <= hi, (i, reading, decision)


def test_intune_grows_no_further_than_the_cpus_its_workers_can_use():
  # 2 workers of 100 rows/s, a consumer of 500 rows/s: the model asks
  # ceil(500 x 1.05 / 100) = 6, but the host gives 3 CPUs; after 10
  # readings it gives 8 (CPUs that arrived), and the pool grows to the 6.
  cpus = [3]
  controller = controllers.IntuneController(1, 64, cpu_cap=lambda: cpus[0])
  toy = _ToyPool(2).drive(controller, [500.0] * 10)
  assert max(toy.sizes) == 3, toy.sizes
  assert "at the 3 CPUs its workers can use (3)" in toy.reasons[-1]
  cpus[0] = 8
  toy.drive(controller, [500.0] * 10)
  assert toy.sizes[-1] == 6, toy.sizes


@pytest.mark.parametrize("cpus,bounds,size", [
    (1, (2, 4), 2),  # MIN holds above the cap
    (16, (1, 4), 4),  # MAX holds below it
])
def test_intune_cpu_cap_keeps_min_and_max(cpus, bounds, size):
  controller = controllers.IntuneController(*bounds, cpu_cap=lambda: cpus)
  toy = _ToyPool(bounds[0]).drive(controller, [5000.0] * 10)
  assert max(toy.sizes) == size and min(toy.sizes) >= bounds[0], toy.sizes


def test_a_flapping_consumer_does_not_make_intune_flap():
  # The consumer's pace flips between 500 and 100 rows/s every reading,
  # faster than workers start (2 readings). intune grows once to cover the
  # fast pace and stays; TF's formula, applied as if it scaled, follows
  # every flip.
  paces = [500.0, 100.0] * 100
  toy = _ToyPool(3, startup=2).drive(controllers.IntuneController(1, 64), paces)
  assert toy.changes <= 2, toy.reasons
  assert min(toy.sizes[10:]) >= 5  # the fast pace needs 5
  formula = _ToyPool(3, startup=2).drive(controllers.TfFormulaController(1, 64),
                                         paces)
  assert formula.changes >= 50


def test_cachew_climbs_one_worker_at_a_time_by_hand():
  # 100 rows/s per worker, a consumer of 350 rows/s, from 1 worker: the
  # batch time (s per row) 1/100, 1/200, 1/300, 1/350 improves > 7% at each
  # +1; 1/350 again at 5 does not: back to 4; then -1 (probe) to 3 costs
  # 1/300 vs 1/350 = +16.7% >= 3%: back to 4, stable.
  toy = _ToyPool(1).drive(controllers.CachewController(1, 64), [350.0] * 40)
  changes = [s for i, s in enumerate(toy.sizes)
             if i == 0 or s != toy.sizes[i - 1]]
  assert changes == [2, 3, 4, 5, 4, 3, 4]
  assert toy.sizes[-1] == 4
  assert toy.changes == 7


def test_cachew_stops_climbing_where_one_worker_is_under_7_percent():
  # n -> n + 1 workers cuts the batch time by 1 / (n + 1): 12 -> 13 by
  # 7.7%, 13 -> 14 by 7.1%, 14 -> 15 by 6.7% < 7% (taken back). Cachew's
  # rule stops at 14 although the consumer asks for 30 workers.
  toy = _ToyPool(12).drive(controllers.CachewController(1, 64), [3000.0] * 40)
  assert toy.sizes[:3] == [13, 14, 15]
  assert toy.sizes[-1] == 14


def test_tf_formula_caps_growth_and_follows_the_estimate():
  controller = controllers.TfFormulaController(1, 64)
  # ceil(1000 / 100) = 10, capped at 4 x 2 = 8.
  decision = controller.decide(controllers.PoolReading(
      time_s=0, workers=2, consumer_rate=1000.0,
      worker_capacities=(100.0, 100.0)))
  assert (decision.size, decision.change) == (8, True)
  # Without reports it holds.
  decision = controller.decide(controllers.PoolReading(time_s=1, workers=3))
  assert (decision.size, decision.change) == (3, False)


def test_unknown_controller_raises():
  with pytest.raises(ValueError, match="unknown pool controller 'x'"):
    controllers.make_controller("x", 1, 2)


def test_intune_asks_again_after_a_rejected_change():
  controller = controllers.IntuneController(1, 64)
  reading = controllers.PoolReading(time_s=10, workers=2, wait_share=0.6,
                             consumer_rate=500.0,
                             worker_capacities=(100.0, 100.0))
  decision = controller.decide(reading)
  assert decision.size == 6
  controller.rejected(decision)
  # The pool is still 2 and the trainer still waits: it asks for 6 again.
  again = controller.decide(dataclasses.replace(reading, time_s=20))
  assert (again.size, again.change) == (6, True)
