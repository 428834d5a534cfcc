"""Tests of intune_tf.sim.cluster: the worker-pool simulation, by hand."""

import json
import math

import numpy as np
import pytest

from intune_tf import cli
from intune_tf.service import controllers
from intune_tf.sim import cluster


def _job(capacities, phases, ceiling=math.inf, initial=1, startup=5.0,
         buffer_s=0.0, period_s=10.0):
  """A noise-free job with every start-up taking `startup` seconds."""
  return cluster.ClusterScenario(
      capacities=tuple(capacities),
      startup_s=np.full((len(capacities), 4), startup), phases=phases,
      ceiling=ceiling, initial=initial, buffer_s=buffer_s, noise=0.0,
      jitter=0.0, period_s=period_s)


def test_fixed_pool_by_hand():
  # One worker of 100 rows/s, a consumer of 150: every second the trainer
  # gets 100 rows and waits 1/3 s; 1000 rows take 10 s.
  r = cluster.run(_job([100.0, 100.0], ((1000.0, 150.0),)), None)
  assert r.run_time_s == 10
  assert r.stall_fraction == pytest.approx(1 / 3)
  assert r.worker_hours == pytest.approx(10 / 3600)
  assert (r.changes, r.finished) == (0, True)


def test_start_up_delay_is_paid_and_waited_for():
  # 1 worker of 100 rows/s, a consumer of 200 rows/s, 3000 rows. At 10 s
  # the controller asks for 2; the second serves from 15 s. Seconds 0-14:
  # 100 rows each (1500 rows, 0.5 s waits); then 200 rows/s: 1500 rows in
  # 8 s. Time 23 s, waits 7.5 s, worker-seconds 10 x 1 + 13 x 2 = 36.
  always_two = lambda reading: controllers.Decision(2, "two",
                                                   reading.asked != 2)
  r = cluster.run(_job([100.0, 100.0], ((3000.0, 200.0),)), always_two)
  assert r.run_time_s == 23
  assert r.stall_fraction == pytest.approx(7.5 / 23)
  assert r.worker_hours == pytest.approx(36 / 3600)
  assert r.changes == 1
  assert r.sizes == [(0.0, 1), (10.0, 2)]


def test_a_warm_standby_serves_at_once_by_hand():
  # As above with one standby: the second worker serves from 11 s
  # (WARM_START_S = 1). Seconds 0-10: 100 rows each (1100 rows, 0.5 s
  # waits: 5.5 s); then 200 rows/s: 1900 rows in 10 steps. Time 21 s,
  # worker-seconds 10 x 1 + 11 x 2 = 32; the standby is kept while the pool
  # is below its MAX of 2: 10 s.
  always_two = lambda reading: controllers.Decision(2, "two",
                                                   reading.asked != 2)
  r = cluster.run(_job([100.0, 100.0], ((3000.0, 200.0),)), always_two,
                  standby=1)
  assert r.run_time_s == 21
  assert r.stall_fraction == pytest.approx(5.5 / 21)
  assert r.worker_hours == pytest.approx(32 / 3600)
  assert r.standby_hours == pytest.approx(10 / 3600)


def test_standbys_are_not_kept_at_max_and_load_again_by_hand():
  # 2 workers of 100 rows/s at most, a consumer of 200, every start 15 s,
  # one standby. At 10 s the pool grows to 2 (the standby: up at 11); its
  # replacement would be warm at 10 + 10 + 15 = 35, but at MAX none is
  # kept, so after the shrink at 40 one loads again, warm at 40 + 15 = 55,
  # and the growth at 50 is up at 56. Rows: steps 0-10 100 each (1100),
  # 11-39 200 (5800), 40-55 100 (1600), then 200: 9300 rows are done after
  # step 59, at 60 s. (Had the standby been kept, up at 51: 58 s.)
  def decide(reading):
    size = 1 if 40 <= reading.time_s < 50 else 2
    return controllers.Decision(size, "schedule", size != reading.asked)
  r = cluster.run(_job([100.0, 100.0], ((9300.0, 200.0),), startup=15.0),
                  decide, standby=1)
  assert r.sizes == [(0.0, 1), (10.0, 2), (40.0, 1), (50.0, 2)]
  assert r.run_time_s == 60


@pytest.mark.parametrize("workers,expected", [(8, 1), (64, 4), (512, 32)])
def test_standby_count_by_hand(workers, expected):
  assert cluster.standby_count(workers) == expected


def test_host_ceiling_caps_the_pool():
  # 3 workers of 100 rows/s behind a host that takes 250 rows/s: 1000 rows
  # at a pace of 300 take 4 s (250 rows/s), whatever the third worker does.
  r = cluster.run(_job([100.0] * 3, ((1000.0, 300.0),), ceiling=250.0,
                       initial=3), None)
  assert r.run_time_s == 4
  assert r.stall_fraction == pytest.approx(1 - 250 / 300)


def test_fixed_run_times_by_hand():
  # 1000 rows at 200 rows/s: 1 worker 1000 / 100 = 10 s; 2 workers 5 s;
  # 3 workers 5 s (the pace, and the host's 250 rows/s, bound them).
  sc = _job([100.0] * 3, ((1000.0, 200.0),), ceiling=250.0)
  assert cluster.fixed_run_times(sc) == pytest.approx([10.0, 5.0, 5.0])
  # The fewest workers within 0.5% of the fastest run: 2.
  size, r = cluster.fixed_best(sc)
  assert size == 2 and r.run_time_s == 5


@pytest.mark.parametrize("diffs,expected", [
    # mean 2.5, sd sqrt(5/3) = 1.291, se 0.6455, t(3) = 3.182: +-2.054.
    ([1, 2, 3, 4], (2.5, 0.446, 4.554)),
    ([2, 2], (2.0, 2.0, 2.0)),  # sd 0
])
def test_paired_t_interval_by_hand(diffs, expected):
  assert cluster.paired_t_interval(diffs) == pytest.approx(expected,
                                                           abs=1e-3)


def test_one_pair_has_no_interval():
  mean, low, high = cluster.paired_t_interval([0.5])
  assert mean == 0.5 and math.isnan(low) and math.isnan(high)


@pytest.mark.parametrize("workers", [0, 513, -1])
def test_scenario_rejects_pools_out_of_range(workers):
  with pytest.raises(ValueError, match="--workers must be in 1..512"):
    cluster.scenario(workers, 0)


def test_scenario_is_seeded_and_shaped_as_documented():
  a, b = cluster.scenario(64, 3), cluster.scenario(64, 3)
  assert a.capacities == b.capacities
  assert a.capacities != cluster.scenario(64, 4).capacities
  fast, slow, again = (pace for _, pace in a.phases)
  assert slow == pytest.approx(fast / 4) and again == fast
  assert len({rows for rows, _ in a.phases}) == 1
  assert 0.5 * 64 * cluster.WORKER_RATE <= fast <= 0.8 * 64 * (
      cluster.WORKER_RATE)
  assert a.initial == 8


@pytest.mark.slow
def test_intune_beats_tf_formula_and_cachew_on_stall_at_64_workers():
  # One seed of the scored job: the controller stalls less than TF's
  # formula at no more than 5% more worker-hours, and far less than
  # Cachew's rule; fixed-best stalls least at far more worker-hours.
  r = cluster.run_controllers(64, 0)["policies"]
  assert r["intune"]["stall_fraction"] < r["tf-formula"]["stall_fraction"]
  assert r["intune"]["worker_hours"] <= 1.05 * r["tf-formula"][
      "worker_hours"]
  assert r["intune"]["stall_fraction"] < 0.2 * r["cachew"]["stall_fraction"]
  assert r["intune"]["changes"] < 0.1 * r["tf-formula"]["changes"]
  assert r["fixed-best"]["worker_hours"] > 1.5 * r["intune"]["worker_hours"]


def test_simulate_service_writes_every_controller(tmp_path):
  out = tmp_path / "service.json"
  args = cli.parse_args(["simulate", "--service", "--workers", "8", "--seed",
                         "5", "--json", str(out)])
  assert args.func(args) == 0
  result = json.loads(out.read_text())
  assert set(result["policies"]) == {"intune", "tf-formula", "cachew",
                                     "fixed-best", "intune-standby"}
  for p in result["policies"].values():
    assert {"stall_fraction", "worker_hours", "standby_hours",
            "changes"} <= set(p)
    assert 0 <= p["stall_fraction"] <= 1 and p["worker_hours"] > 0
  assert result["seeds"] == [5] and result["workers"] == 8


@pytest.mark.parametrize("flags,message", [
    (["--workers", "0"], "'0' is not a pool size"),
    (["--workers", "513"], "'513' is not a pool size"),
    (["--workers", "x"], "'x' is not a pool size"),
    (["--seeds", "0"], "'0' is not a positive integer"),
])
def test_simulate_service_rejects_bad_flags(flags, message, capsys):
  with pytest.raises(SystemExit):
    cli.parse_args(["simulate", "--service", *flags])
  assert message in capsys.readouterr().err
