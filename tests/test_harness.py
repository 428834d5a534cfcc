"""The benchmark harness: measurements, reports, errors."""

import json
import types

import pytest
import tensorflow as tf

import intune_tf
from intune_tf import records
from intune_tf.bench import harness
from intune_tf.bench import scenarios
from intune_tf.live import registry


def test_ceiling_arithmetic():
  # 2 CPUs / (1.27 + 1.86 + 0.50) us per row = 2 / 3.63e-6 = 550,964 rows/s.
  assert harness.work_estimate_rows_per_s(2, [1.27e-6, 1.86e-6, 0.50e-6]) == (
      pytest.approx(550_964, rel=1e-5))
  assert harness.work_estimate_rows_per_s(2, []) == float("inf")


# Windows (t, rows/s) of a run with CPU changes at 0 s (start, 1 CPU),
# 10 s (-> 2) and 20 s (-> 1); the run ends at 30 s.
_EVENTS = [(0.0, 1), (10.0, 2), (20.0, 1)]
_WINDOWS = ([(t, 100.0) for t in range(0, 10)] +
            [(10.0, 90.0), (11.0, 150.0), (12.0, 200.0), (13.0, 210.0),
             (14.0, 190.0)] + [(float(t), 200.0) for t in range(15, 20)] +
            [(float(t), 60.0) for t in range(20, 30)])


@pytest.mark.parametrize("values, expected", [
    ([{"a": 1}, {"a": 1}, {"a": 2}, {"a": 2, "b": 1}, {"a": 3}], 2),
    ([{"a": 1}, {"b": 4}, {"a": 1, "b": 4}], 0),  # no shared knob changed
    ([{}], 0),
    ([], 0),
])
def test_churn_counts_samples_that_changed_a_knob(values, expected):
  assert harness.churn([(0.5 * i, v) for i, v in enumerate(values)]) == (
      expected)


@pytest.mark.parametrize("rate, best, expected", [
    (90.0, 100.0, 0.1),    # 10 rows of 100 lost
    (110.0, 100.0, -0.1),  # 10 more than the best static configuration
    (90.0, None, None),    # no oracle in the run
])
def test_regret_against_the_best_static_configuration(rate, best, expected):
  assert harness.regret(rate, best) == (
      None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize("runs, expected", [
    ([(2, 10e-6), (2, 8e-6)], 250_000.0),   # 2 / 8e-6
    ([(1, 4e-6), (2, 10e-6)], 500_000.0),   # the most CPUs, the least CPU
    ([(2, 0.0), (0, 5e-6)], None),          # nothing measured both
    ([], None),
])
def test_cpu_ceiling_by_hand(runs, expected):
  got = harness.cpu_ceiling(runs)
  assert got == (None if expected is None else pytest.approx(expected))


def test_phase_targets_take_the_second_half_of_each_phase():
  run = harness.Run("oracle", "resize", 0, windows=_WINDOWS,
                    resize_events=_EVENTS)
  # 1 CPU: t in [5, 10) -> 100 x 5, and t in [24.5, 30) -> 60 x 5
  #   (the last phase ends at its last window, 29: half = 24.5);
  #   median of five 100s and five 60s = (60 + 100) / 2 = 80.
  # 2 CPUs: t in [15, 20) -> 200 x 5 -> 200.
  assert harness.phase_targets([run]) == {1: 80.0, 2: 200.0}


@pytest.mark.parametrize("resize, cotenant, expected", [
    (_EVENTS, [], _EVENTS),
    # A co-tenant schedule starts with none running.
    ([], [(10.0, 2), (20.0, 0)], [(0.0, 0), (10.0, 2), (20.0, 0)]),
    ([], [], []),
])
def test_phase_events_of_a_resize_or_a_cotenant_run(resize, cotenant,
                                                      expected):
  run = harness.Run("intune", "s", 0, resize_events=resize,
                    cotenant_events=cotenant)
  assert harness.phase_events(run) == expected


def test_cotenant_runs_are_scored_for_recovery_against_the_oracle():
  h = harness.Harness(seconds=1.0, warmup=0.3)
  # The _WINDOWS run with two co-tenants from 10 s to 20 s, as oracle and
  # as intune.
  h.runs = [harness.Run(p, "cotenant", 0, rows_per_s=100.0,
                        whole_run_rows_per_s=100.0, windows=_WINDOWS,
                        cotenant_events=[(10.0, 2), (20.0, 0)])
            for p in ("oracle", "intune")]
  summary = h.summary()
  entry = summary["scenarios"]["cotenant"]
  # As in test_phase_targets_...: 0 running -> 80, 2 running -> 200.
  assert entry["recovery_targets"] == {"0": 80.0, "2": 200.0}
  # 2 co-tenants, 95% of 200 = 190; means of 4 windows from 10 s: 162.5 at
  # 13 s, 187.5 at 14 s, (200+210+190+200)/4 = 200 at 15 s -> 5 s. None
  # running again, 95% of 80 = 76: every window is 60 -> never.
  assert entry["policies"]["intune"]["recovery_s"] == [[5.0, None]]
  assert "after each change of co-tenant processes" in h.markdown(summary)


@pytest.mark.parametrize("smooth,expected", [
    # 2 CPUs, target 200: 95% = 190. smooth 1: 200 at t=12 -> 2 s.
    # 1 CPU, target 60 (given): 95% = 57; 60 at t=20 -> 0 s.
    (1, [2.0, 0.0]),
    # smooth 2: (90+150)/2 = 120 at t=11, (150+200)/2 = 175 at t=12,
    # (200+210)/2 = 205 >= 190 at t=13 -> 3 s; 1 CPU: (60+60)/2 at t=21 -> 1 s.
    (2, [3.0, 1.0]),
])
def test_recovery_seconds_by_hand(smooth, expected):
  targets = {1: 60.0, 2: 200.0}
  assert harness.recovery_seconds(_WINDOWS, _EVENTS, targets,
                                  smooth=smooth) == expected


def test_recovery_never_reached_or_without_target_is_none():
  # 2 CPUs never reach 95% of 1000 before the next change; no target for 1.
  assert harness.recovery_seconds(_WINDOWS, _EVENTS, {2: 1000.0}) == [
      None, None]


@pytest.mark.parametrize("name,period", [
    ("memory-cap", harness.MEMORY_SAMPLE_S),  # the cap is the point: 10 ms
    ("criteo-l4-b4096", harness.SAMPLE_S),
    ("resize", harness.SAMPLE_S),
])
def test_buffered_bytes_are_sampled_finely_only_under_a_memory_cap(name,
                                                                   period):
  assert harness.sample_period_s(scenarios.get(name)) == period


def test_unknown_policy_and_scenario_list_valid_names():
  with pytest.raises(ValueError, match=r"Unknown policy 'best'.*autotune"):
    harness.check_policies(["even", "best"])
  with pytest.raises(ValueError, match=r"Unknown scenario 'x'.*memory-cap"):
    scenarios.get("x")


def _tiny(calls=None, prefetch=False):
  def make(parallelism=None):
    if calls is not None:
      calls.append(1)
      if len(calls) > 3:
        raise KeyboardInterrupt
    ds = tf.data.Dataset.range(10**9).map(
        lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE).batch(16)
    return ds.prefetch(tf.data.AUTOTUNE) if prefetch else ds
  return scenarios.Scenario("tiny", "test pipeline", make, 16)


@pytest.mark.slow
def test_runs_summary_and_markdown(tmp_path):
  h = harness.Harness(seconds=1.0, warmup=0.3,
                      trace_path=str(tmp_path / "trace.jsonl"))
  scenario = _tiny()
  h.measure_work_estimate(scenario, seconds=0.5)
  policies = ("autotune", "autotune-stage-based", "even", "unoptimized")
  for policy in policies:
    run = h.run(scenario, policy, 0)
    assert run.rows_per_s > 0 and run.windows and run.knobs
  h.close()
  summary = h.summary()
  entry = summary["scenarios"]["tiny"]
  assert entry["ceiling_rows_per_s"] > 0
  assert entry["policies"]["autotune"]["vs_autotune"] == 1.0
  assert entry["work_estimate_rows_per_s"] > 0
  for p in entry["policies"].values():
    assert p["whole_run_rows_per_s"] > 0 and p["changes"] >= 0
    # A bound by construction: no policy's median exceeds it.
    assert 0 < p["of_ceiling"] <= 1 and p["cpu_seconds_per_row"] > 0
    assert p["regret"] is None  # no oracle in this run
  assert set(entry["policies"]) == set(policies)
  # The best live baseline: the fastest of all but "unoptimized".
  rates = {p: e["rows_per_s"] for p, e in entry["policies"].items()}
  best = max(("autotune", "autotune-stage-based", "even"), key=rates.get)
  assert entry["best_baseline"] == best
  assert entry["policies"][best]["vs_best_baseline"] == 1.0
  assert entry["policies"]["unoptimized"]["vs_best_baseline"] == (
      rates["unoptimized"] / rates[best])
  text = h.markdown(summary)
  assert "| even |" in text and "ceiling" in text
  assert "| whole run rows/s | regret vs oracle | changes |" in text
  assert f"best baseline (live, no learning): {best}" in text
  lines = (tmp_path / "trace.jsonl").read_text().splitlines()
  assert lines and json.loads(lines[0])["policy"] in ("even", "unoptimized")
  paths = h.plot(str(tmp_path / "plots"))
  assert all(p.endswith(".png") for p in paths) and len(paths) == 2


def test_each_scenarios_oracle_steps_to_its_own_table():
  h = harness.Harness()
  # Tables as two oracle searches leave them: scenario "a" found 2 threads
  # best on 1 CPU and 3 on 2 CPUs; "b" found 5 on 1 CPU.
  h.oracle = {"a": {"table": {1: {"Map/parallelism": 2.0},
                              2: {"Map/parallelism": 3.0}}},
              "b": {"table": {1: {"Map/parallelism": 5.0}}}}
  oracle_a = registry.create(intune_tf.IntuneOptions(policy="oracle",
                                                     name="a"))
  oracle_b = registry.create(intune_tf.IntuneOptions(policy="oracle",
                                                     name="b"))
  knob = records.Knob("Map/parallelism", "parallelism", 1.0, 1.0, 6.0)
  obs = types.SimpleNamespace(usable_cpus=2, knobs=(knob,))
  # 2 usable CPUs: "a" has a row for 2; "b" falls back to its largest row
  # at most 2, the 1-CPU row.
  assert oracle_a.step(obs) == {"Map/parallelism": 3.0}
  assert oracle_b.step(obs) == {"Map/parallelism": 5.0}
  # A later search of "b" changes neither the oracle already made for "a"
  # nor the table it steps to.
  h.oracle["b"] = {"table": {2: {"Map/parallelism": 9.0}}}
  assert oracle_a.step(obs) == {"Map/parallelism": 3.0}
  # The oracle made for "b" after its new search steps to the new table,
  # clamped to the knob's range (9 -> 6); the one made before keeps its own.
  assert registry.create(intune_tf.IntuneOptions(
      policy="oracle", name="b")).step(obs) == {"Map/parallelism": 6.0}
  assert oracle_b.step(obs) == {"Map/parallelism": 5.0}
  # A scenario never searched has an oracle that changes nothing.
  assert registry.create(intune_tf.IntuneOptions(
      policy="oracle", name="c")).step(obs) == {}


def test_oracle_runs_need_the_scenarios_search_first():
  h = harness.Harness()
  with pytest.raises(ValueError, match=r"No oracle table for scenario "
                     r"'tiny': run search_oracle on it"):
    h.run(_tiny(), "oracle", 0)


@pytest.mark.slow
def test_oracle_search_counts_configurations():
  h = harness.Harness(seconds=0.5, warmup=0.2)
  table = h.search_oracle(_tiny(), settle=0.05, measure=0.1)
  tried = h.oracle["tiny"]["configurations_tried"]
  assert tried >= 2 and table and all(table.values())
  # Regret is measured against the oracle's whole run in the same bench.
  runs = {p: h.run(_tiny(), p, 0) for p in ("oracle", "even")}
  entry = h.summary()["scenarios"]["tiny"]["policies"]
  assert entry["oracle"]["regret"] == pytest.approx(0.0)
  assert entry["even"]["regret"] == pytest.approx(
      1 - runs["even"].whole_run_rows_per_s
      / runs["oracle"].whole_run_rows_per_s)


@pytest.mark.slow
def test_oracle_repeats_measure_each_configuration_in_passes(tmp_path):
  from intune_tf.sim import calibration  # noqa: PLC0415  reads the trace
  trace = tmp_path / "trace.jsonl"
  h = harness.Harness(trace_path=str(trace))
  cpus_before = harness.resize_lib.machine_cpu_ids()
  table = h.search_oracle(_tiny(prefetch=True), settle=0.05, measure=0.1,
                          repeats=2, cpu_counts=(1,))
  h.close()
  # On one CPU the map is tried at 1 and 2 threads (the buffer at 2), then
  # the buffer at 1, 4 and 8 from the better of those: 5 configurations.
  assert h.oracle["tiny"]["configurations_tried"] == 5
  assert list(table) == [1]
  lines = [json.loads(line) for line in trace.read_text().splitlines()]
  measured = [r for r in lines if r.get("kind") == "measurement"]
  assert len(measured) == 10 and {r["cpus"] for r in measured} == {1}
  configs = [json.dumps(r["config"], sort_keys=True) for r in measured]
  buffers = [r["config"][next(k for k in r["config"] if "buffer" in k)]
             for r in measured]
  assert buffers[:5] == [2.0, 2.0, 1.0, 4.0, 8.0]
  # The second pass measures the grid and the buffers together, in its own
  # order, so neither is always measured first.
  assert configs[5:] == [configs[j] for j in harness.pass_order(5, 1)]
  points = calibration.load_trace(str(trace))["tiny"]
  assert len(points) == 5
  assert all(len(p.measurements) == 2 for p in points)
  assert harness.resize_lib.machine_cpu_ids() == cpus_before


def test_pass_order():
  assert harness.pass_order(3, 0) == [0, 1, 2]
  later = [harness.pass_order(10, i) for i in (1, 2, 3)]
  # Each later pass measures every configuration once, in an order of its
  # own that is the same on every call.
  assert all(sorted(order) == list(range(10)) for order in later)
  assert len({tuple(order) for order in later}) == 3
  assert list(range(10)) not in later
  assert harness.pass_order(10, 2) == later[1]


def test_repeats_run_the_policies_in_varying_orders(monkeypatch):
  h = harness.Harness(seconds=1.0, warmup=0.3)
  order = []
  monkeypatch.setattr(h, "measure_work_estimate", lambda scenario: None)
  monkeypatch.setattr(h, "run", lambda scenario, policy, repeat: order.append(
      (repeat, policy)))
  names = ["even", "unoptimized", "autotune"]
  h.run_all(["criteo-l4-b4096"], names, repeats=4)
  by_repeat = [[p for r, p in order if r == i] for i in range(4)]
  assert by_repeat[0] == names  # the first repeat in the order given
  for i, ran in enumerate(by_repeat):
    assert ran == [names[j] for j in harness.pass_order(3, i)]
  # pass_order(3, 2) = [2, 0, 1]: autotune no longer runs last.
  assert by_repeat[2] == ["autotune", "even", "unoptimized"]


@pytest.mark.parametrize("flag,value,match", [
    ("--oracle-repeats", "0", "'0' is not a positive integer; pass 1 or more."),
    ("--oracle-repeats", "two",
     "'two' is not a positive integer; pass 1 or more."),
    ("--oracle-cpus", "1,x", "must be comma-separated CPU counts such as "
     "1,2, got '1,x'"),
    ("--oracle-cpus", "0", "must be comma-separated CPU counts"),
])
def test_bad_oracle_flags_are_usage_errors(flag, value, match, capsys):
  from intune_tf import cli  # noqa: PLC0415  loads every command
  with pytest.raises(SystemExit) as exit_info:
    cli.parser().parse_args(["bench", flag, value])
  assert exit_info.value.code == 2
  assert f"argument {flag}: {match}" in capsys.readouterr().err


def test_more_oracle_cpus_than_usable_is_an_error():
  h = harness.Harness()
  too_many = len(harness.resize_lib.machine_cpu_ids()) + 1
  with pytest.raises(ValueError, match=f"cannot search {too_many} CPUs"):
    h.search_oracle(_tiny(), cpu_counts=(too_many,))


def _args(tmp_path, **kw):
  base = dict(policies="even", scenarios="memory-cap", repeats=1, seconds=0.5,
              warmup=0.1, cpu_budget=None, ram_budget=None,
              json=str(tmp_path / "out.json"), plots=None, trace=None,
              oracle_seconds=1.5, oracle_repeats=1, oracle_cpus=None,
              warm_start=False)
  base.update(kw)
  return types.SimpleNamespace(**base)


def test_cli_rejects_unknown_names(tmp_path, capsys):
  assert harness.main(_args(tmp_path, policies="even,nope")) == 2
  assert "Valid policies" in capsys.readouterr().out
  assert harness.main(_args(tmp_path, scenarios="nope")) == 2
  assert "Valid scenarios" in capsys.readouterr().out


def test_budget_larger_than_the_machine_warns(caplog):
  from intune_tf import host  # noqa: PLC0415
  with caplog.at_level("WARNING"):
    harness.Harness(cpu_budget=host.usable_cpus() + 64,
                    ram_budget=host.total_memory() * 4)
  text = caplog.text
  assert "larger than the" in text and "cannot prevent an OOM" in text


@pytest.mark.slow
def test_interrupted_run_still_writes_what_it_measured(tmp_path, monkeypatch):
  calls = []
  tiny = _tiny(calls)
  monkeypatch.setitem(scenarios.all_scenarios(), "tiny", tiny)
  code = harness.main(_args(tmp_path, scenarios="tiny", repeats=3,
                            policies="unoptimized"))
  assert code == 130
  written = json.loads((tmp_path / "out.json").read_text())
  assert written["interrupted"] is True
  runs = written["scenarios"]["tiny"]["policies"]["unoptimized"]["runs"]
  assert len(runs) >= 1


@pytest.mark.slow
@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2,
                    reason="needs 2 CPUs to resize")
def test_autotune_restart_rebuilds_on_resize_even_with_stateful_ops():
  def make(parallelism=None):
    return tf.data.Dataset.range(10**9).map(
        lambda x: x + tf.cast(tf.random.normal([]) * 0, tf.int64),
        num_parallel_calls=tf.data.AUTOTUNE).batch(16)

  scenario = scenarios.Scenario("tiny-resize", "test", make, 16,
                                resize=((0.0, 1), (0.5, 2)))
  h = harness.Harness(seconds=1.6, warmup=0.2)
  run = h.run(scenario, "autotune-restart", 0)
  assert run.rows_per_s > 0
  assert [n for _, n in run.resize_events] == [1, 2]


@pytest.mark.slow
def test_a_cotenant_scenario_runs_its_burners_during_the_run():
  scenario = scenarios.Scenario("tiny-cotenant", "test", lambda p=None: (
      tf.data.Dataset.range(10**9).map(lambda x: x + 1).batch(16)), 16,
      cotenant=((0.25, 0.75, 1),))
  h = harness.Harness(seconds=1.6, warmup=0.4)
  run = h.run(scenario, "unoptimized", 0)
  assert run.rows_per_s > 0
  # One burner from 0.5 s to 1.5 s of the 2 s run, ended by the run's end.
  assert [n for _, n in run.cotenant_events] == [1, 0]
  assert scenarios.get("cotenant").cotenant == ((1 / 3, 2 / 3, 2),)


@pytest.mark.parametrize("policy,algorithm", [
    ("autotune", "DEFAULT"),
    ("autotune-hill-climb", "HILL_CLIMB"),
    ("autotune-gradient-descent", "GRADIENT_DESCENT"),
    ("autotune-max-parallelism", "MAX_PARALLELISM"),
    ("autotune-stage-based", "STAGE_BASED"),
])
def test_autotune_variants_run_each_algorithm_with_the_option_off(policy,
                                                                  algorithm):
  ds = harness.autotune_dataset(_tiny(), policy)
  options = ds.options()
  assert not options.experimental_intune
  # An unset algorithm is TF's DEFAULT.
  assert (options.autotune.autotune_algorithm or
          tf.data.experimental.AutotuneAlgorithm.DEFAULT) == getattr(
              tf.data.experimental.AutotuneAlgorithm, algorithm)
  assert policy in harness.valid_policies()


@pytest.mark.parametrize("flag", ["--json", "--trace"])
def test_an_output_file_that_is_a_folder_is_a_usage_error(tmp_path, capsys,
                                                          flag):
  from intune_tf import cli  # noqa: PLC0415  loads every command
  with pytest.raises(SystemExit) as exit_info:
    cli.parser().parse_args(["bench", flag, str(tmp_path)])
  assert exit_info.value.code == 2
  assert (f"error: argument {flag}: {tmp_path} is a folder: pass the path of "
          "a file to write.") in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(tf.raw_ops, "IteratorGetModelProto"),
                    reason="TF AUTOTUNE's model is readable from TF 2.17 "
                    f"(IteratorGetModelProto); this is {tf.__version__}")
def test_autotune_knobs_are_named_as_intune_names_its_own():
  # TF's model of a plain AUTOTUNE pipeline (map and batch fused by TF's
  # own optimization), named by the kernel's grammar with TF's "Root" left
  # out: the names InTune gives the same stages.
  ds = tf.data.Dataset.range(10**6).map(
      lambda x: x + 1, num_parallel_calls=tf.data.AUTOTUNE).batch(4).prefetch(
          tf.data.AUTOTUNE)
  it = iter(ds)
  for _ in range(50):
    next(it)
  knobs = harness._autotune_knobs(harness._autotune_model(it))  # noqa: SLF001
  assert set(knobs) == {"Prefetch/buffer_size",
                        "Prefetch.MapAndBatch/parallelism"}
  assert all(value >= 1 for value in knobs.values())
