"""Tests of intune_tf.sim.pretrain: schedule, guided moves, CLI."""

import json
import pathlib
import subprocess
import sys

from _observations import knob
from _observations import obs
import numpy as np
import pytest

from intune_tf.agent import dqn
from intune_tf.sim import pretrain
from intune_tf.tuning import mdp

_INTUNE = str(pathlib.Path(sys.executable).with_name("intune"))


@pytest.mark.parametrize("step,expected", [
    (0, 1.0),
    (25, 0.525),   # 1 - 0.95 * 25 / 50
    (50, 0.05),
    (99, 0.05),
])
def test_epsilon_schedule(step, expected):
  assert pretrain.epsilon_at(step, 100) == pytest.approx(expected)


def test_guided_action_moves_towards_the_proportional_share():
  knobs = [knob("A/parallelism", "parallelism", 1, hi=8),
           knob("B/parallelism", "parallelism", 3, hi=8)]
  o = obs(knobs, cpu_budget=8, costs={"A": 0.03, "B": 0.01})
  # Shares of 8 CPUs at costs 3:1 are 6 and 2: A's gap +5 is the largest:
  # A +5 is flat action 3 (knob 0, move index 3).
  a = pretrain.guided_action(o, mdp.action_mask(o), np.random.default_rng(0))
  assert a == 3


@pytest.mark.slow
def test_pretrain_and_score_run():
  agent, stats = pretrain.pretrain(seed=0, steps=300, progress=False)
  assert stats["steps"] == 300 and stats["gradient_steps"] > 0
  pipes = pretrain.evaluation_pipelines(count=3, seed=5)
  ratios = pretrain.score(
      lambda: pretrain.policies.EvenPolicy(pretrain.IntuneOptions()), pipes)
  assert (ratios.shape == (3,) and (ratios > 0).all() and
          (ratios <= 1 + 1e-9).all())


@pytest.mark.slow
def test_cli_pretrain_then_simulate(tmp_path):
  out = tmp_path / "w.npz"
  # The installed command, run outside the checkout: `python -m` from the
  # checkout would import the source tree, which on the compat stack is not
  # what is installed.
  subprocess.run([_INTUNE, "pretrain", "--seed", "3", "--steps", "200",
                  "--out", str(out)], check=True, capture_output=True,
                 cwd=tmp_path)
  weights, metadata = dqn.load_weights(str(out))
  assert metadata["seed"] == 3 and "intune pretrain --seed 3" in metadata[
      "command"]
  result = subprocess.run(
      [_INTUNE, "simulate", "--weights", str(out), "--pipelines", "3",
       "--steps", "20", "--json", str(tmp_path / "s.json"), "--policies",
       ",".join(pretrain.POLICIES + ("intune-dqn",))], check=True,
      capture_output=True, text=True, cwd=tmp_path)
  for name in pretrain.POLICIES + ("intune-dqn",):
    assert f"\n{name} " in result.stdout
  assert "Where the low cases come from" in result.stdout
  scores = json.loads((tmp_path / "s.json").read_text())
  assert scores["pipelines"] == 3
  assert 0 < scores["policies"]["even"]["median"] <= 1
  assert scores["best_baseline"] in pretrain.BASELINES
  best = scores["policies"][scores["best_baseline"]]
  # Every baseline's mean is at most the best's; the best's paired
  # difference to itself is 0.
  for name in pretrain.BASELINES:
    assert scores["policies"][name]["mean"] <= best["mean"]
  assert best["vs_best"]["mean"] == 0.0
  for summary in scores["policies"].values():
    assert {"median", "p10", "steps_to_95", "tail_changes"} <= set(summary)


class _Toggle(pretrain.policies.Policy):
  """Moves the first knob between its value and one more, every step."""

  def step(self, obs):
    k = obs.knobs[0]
    return {k.name: k.value + (1 if obs.time % 1.0 == 0 else -1)}


class _Optimal(pretrain.policies.Policy):
  """Sets the simulator's optimum at the first step, then stays."""

  def __init__(self, sim):
    super().__init__(pretrain.IntuneOptions())
    _, par, buf = sim.optimum()
    self.values = {}
    for name, kind, i in sim.pipeline.knob_names():
      self.values[name] = float(par[i] if kind == "parallelism" else buf[i])

  def step(self, obs):
    values, self.values = self.values, {}
    return values


def test_run_episode_counts_changes_and_time_to_the_optimum():
  (pipe, params), = pretrain.evaluation_pipelines(count=1, seed=3)
  pipe = pretrain.dataclasses.replace(pipe, drift=0.0)
  make = lambda: pretrain.sim_lib.Simulator(pipe, seed=0, params=params)
  # Toggling every step: 30 changes in 30 steps, 10 in the last 10.
  e = pretrain.run_episode(_Toggle(pretrain.IntuneOptions()), make(), 30, 10)
  assert (e.changes, e.tail_changes) == (30, 10)
  # The optimum set at the first step: one change, at 95% of the optimum
  # (the optimum itself) after the first step, the score 1.
  sim = make()
  e = pretrain.run_episode(_Optimal(sim), sim, 30, 10)
  assert (e.changes, e.tail_changes, e.steps_to_95) == (1, 0, 1)
  assert e.of_optimum == pytest.approx(1.0)
  # Nothing moved from one thread each: never near the optimum of a
  # pipeline that has CPUs for more.
  e = pretrain.run_episode(pretrain.policies.ManualPolicy(
      pretrain.IntuneOptions()), make(), 30, 10)
  assert e.changes == 0 and e.steps_to_95 is None and e.of_optimum < 0.95


def test_paired_difference():
  # Differences 1, 0, 1: mean 2/3; every resample's mean is in [0, 1].
  mean, low, high = pretrain.paired_difference(
      np.array([1.0, 2.0, 3.0]), np.array([0.0, 2.0, 2.0]))
  assert mean == pytest.approx(2 / 3)
  assert 0.0 <= low < mean < high <= 1.0
  # Identical pairs: no difference, an interval of width 0.
  assert pretrain.paired_difference(np.ones(5), np.ones(5)) == (0.0, 0.0, 0.0)


def _bad_weights(tmp_path, kind: str) -> str:
  """A path that is not an agent weights file, of the given kind."""
  path = tmp_path / "w.npz"
  if kind == "random bytes":
    path.write_bytes(np.random.default_rng(0).bytes(3000))
  elif kind == "empty":
    path.write_bytes(b"")
  elif kind == "folder":
    path.mkdir()
  elif kind == "pickle":  # Never unpickled: refused from its header.
    np.savez(path, w0=np.array([{"a": 1}], dtype=object))
  return str(path)


_NOT_WEIGHTS = {
    "random bytes": "{path} is not an InTune agent weights file (File is not "
                    "a zip file). ",
    "empty": "{path} is not an InTune agent weights file (File is not a zip "
             "file). ",
    "folder": "cannot read {path}: Is a directory. ",
    "missing": "cannot read {path}: No such file or directory. ",
    "pickle": "{path} is not an InTune agent weights file (w0.npy holds "
              "object, not float32). ",
}


@pytest.mark.parametrize("argv", [
    ["simulate", "--weights"], ["simulate", "--search-weights"],
    ["simulate", "--jump-weights"],
    ["pretrain", "--ranker", "--out", "x.npz", "--init"]])
@pytest.mark.parametrize("kind", sorted(_NOT_WEIGHTS))
def test_a_bad_weights_file_is_a_usage_error(tmp_path, capsys, argv, kind):
  from intune_tf import cli  # noqa: PLC0415  loads every command
  path = _bad_weights(tmp_path, kind)
  with pytest.raises(SystemExit) as exit_info:
    cli.parser().parse_args([*argv, path])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert (f"error: argument {argv[-1]}: "
          + _NOT_WEIGHTS[kind].format(path=path)
          + "Pass an .npz written by `intune pretrain --out`.") in err
  assert "Traceback" not in err


@pytest.mark.parametrize("argv", [["pretrain", "--out"],
                                  ["simulate", "--json"]])
def test_an_output_file_that_is_a_folder_is_a_usage_error(tmp_path, capsys,
                                                          argv):
  from intune_tf import cli  # noqa: PLC0415  loads every command
  with pytest.raises(SystemExit) as exit_info:
    cli.parser().parse_args([*argv, str(tmp_path)])
  assert exit_info.value.code == 2
  assert (f"error: argument {argv[-1]}: {tmp_path} is a folder: pass the "
          "path of a file to write.") in capsys.readouterr().err


@pytest.mark.slow
def test_pretrain_ranker_runs_the_jump_search_and_trains():
  weights, stats = pretrain.pretrain_ranker(
      seed=0, steps=40, jumps=pretrain.search.JUMP_FRACTIONS, batch_size=8,
      capacity=100, progress=False)
  start = dqn.load_weights(pretrain.ranked.AGENT_WEIGHTS)[0]
  assert [w.shape for w in weights] == [w.shape for w in start]
  assert all(np.isfinite(w).all() for w in weights)
  # 40 steps, 2 gradient steps each once 8 states are stored: the weights
  # moved away from the start.
  assert stats["steps"] == 40 and stats["gradient_steps"] > 0
  assert any(not np.array_equal(a, b) for a, b in zip(weights, start))


def test_event_steps_and_dynamic_pipelines():
  # 400 x (0.15, 0.3, 0.45, 0.6, 0.75, 0.875).
  assert pretrain.event_steps(400) == [60, 120, 180, 240, 300, 350]
  (pipe, _), = pretrain.dynamic_pipelines(count=1, seed=3, steps=400)
  c = pipe.cpus
  assert pipe.drift == 0.0
  assert pipe.resize == ((60, max(2, c // 2)), (120, c))
  assert pipe.cotenant_events == ((180, max(1, c // 2)), (240, 0))
  (step, stage, factor), = pipe.cost_events
  costliest = max((s.cost_s, i) for i, s in enumerate(pipe.stages)
                  if s.tunable)[1]
  assert (step, stage, factor) == (300, costliest, 2.0)
  assert pipe.pressure_events == ((350, pipe.ram_budget / 4),)


def test_recovery_by_hand():
  rates = np.array([1.0, 5.0, 10.0, 10.0])
  # From index 1: 5 < 9.5, then 10 >= 9.5 at the second step.
  assert pretrain.recovery(rates, 10.0, 1, 4) == 2
  assert pretrain.recovery(rates, 10.0, 2, 4) == 1
  assert pretrain.recovery(rates, 100.0, 0, 4) is None


class _Oracle(pretrain.policies.Policy):
  """Sets the simulator's optimum for its state in force, every step."""

  def __init__(self, sim):
    super().__init__(pretrain.IntuneOptions())
    self.sim = sim

  def step(self, obs):
    _, par, buf = self.sim.optimum()
    return {name: float(par[i] if kind == "parallelism" else buf[i])
            for name, kind, i in self.sim.pipeline.knob_names()}


def test_run_dynamic_episode_scores_against_each_phase():
  (pipe, params), = pretrain.dynamic_pipelines(count=1, seed=3, steps=40)
  make = lambda: pretrain.sim_lib.Simulator(pipe, seed=0, params=params)
  # The oracle follows each event one step late: it reaches 95% at the
  # first step of the run and never later than the second after an event;
  # its regret is what those late steps lose.
  sim = make()
  e = pretrain.run_dynamic_episode(_Oracle(sim), sim, 40)
  assert e.steps_to_95 == 1
  assert all(r is not None and r <= 2 for r in e.recovery_steps)
  assert 0.0 <= e.regret < 0.1
  # Never moving from one thread each: it loses most rows, and it never
  # recovers when the CPUs double back.
  e = pretrain.run_dynamic_episode(
      pretrain.policies.ManualPolicy(pretrain.IntuneOptions()), make(), 40)
  assert e.regret > 0.3 and e.changes == 0
  assert e.recovery_steps[1] is None and len(e.recovery_steps) == 6


def test_compare_dynamic_reports_regret_recovery_and_intune_vs_each():
  result = pretrain.compare(count=2, seed=5, steps=24, dynamic=True,
                            names=("intune", "intune-ablated", "climb",
                                   "even"))
  for name, summary in result["policies"].items():
    for key in ("median", "p10", "steps_to_95", "tail_changes", "regret",
                "recovery_steps", "regret_max", "changes_after_recovery"):
      assert key in summary, (name, key)
    assert summary["regret"] == pytest.approx(1 - summary["mean"])
  vs = result["policies"]["intune"]["vs"]
  assert sorted(vs) == ["climb", "even", "intune-ablated"]
  text = pretrain.format_comparison(result)
  assert "vs intune-ablated" in text and "regret" in text


@pytest.mark.parametrize("argv,message", [
    (["simulate", "--pipelines", "0"],
     "argument --pipelines: '0' is not a positive integer; pass 1 or more."),
    (["simulate", "--steps", "-5"],
     "argument --steps: '-5' is not a positive integer; pass 1 or more."),
    (["pretrain", "--out", "w.npz", "--steps", "-5"],
     "argument --steps: '-5' is not a positive integer; pass 1 or more."),
])
def test_counts_below_one_are_usage_errors(capsys, argv, message):
  from intune_tf import cli  # noqa: PLC0415  loads every command
  with pytest.raises(SystemExit) as exit_info:
    cli.parser().parse_args(argv)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert message in err and "Traceback" not in err


def test_pretrain_with_negative_steps_writes_no_weights(tmp_path):
  # Used to exit 0 and write the untrained network as a valid weights file.
  out = tmp_path / "w.npz"
  done = subprocess.run(
      [sys.executable, "-m", "intune_tf", "pretrain", "--out", str(out),
       "--steps", "-5"], capture_output=True, text=True, check=False)
  assert done.returncode == 2
  assert ("intune pretrain: error: argument --steps: '-5' is not a positive "
          "integer; pass 1 or more.") in done.stderr, done.stderr
  assert not out.exists()


def test_a_dynamic_run_too_short_for_its_events_is_refused(capsys):
  from intune_tf import cli  # noqa: PLC0415  loads every command
  args = cli.parser().parse_args(["simulate", "--dynamic", "--steps", "6"])
  with pytest.raises(SystemExit, match="cannot hold its 6 events"):
    args.func(args)


def test_allocation_samples_are_each_states_optimum():
  rows, shares = pretrain.allocation_samples(count=1, seed=5, every=50)
  # 400 steps, every 50th: 8 states, each with a row per parallel knob.
  (pipe, params), = pretrain.dynamic_pipelines(count=1, seed=5)
  parallel = sum(st.tunable for st in pipe.stages)
  assert rows.shape == (8 * parallel, mdp.NUM_FEATURES)
  assert np.all(rows[:, mdp.FEATURE_NAMES.index("is_parallelism")] == 1)
  # The first state (the even split, before any event): the optimum of
  # the pipeline as generated, per CPU.
  _, optimum, _ = pretrain.sim_lib.optimum(pipe, params=params)
  tunable = [i for i, st in enumerate(pipe.stages) if st.tunable]
  np.testing.assert_allclose(
      shares[:parallel], [optimum[i] / pipe.cpus for i in tunable],
      rtol=1e-6)


@pytest.mark.slow
def test_cli_pretrain_allocator_writes_a_network_the_policy_loads(tmp_path):
  out = tmp_path / "allocator.npz"
  subprocess.run([_INTUNE, "pretrain", "--allocator", "--pipelines", "2",
                  "--out", str(out)], check=True, capture_output=True,
                 cwd=tmp_path)
  weights, metadata = dqn.load_weights(str(out))
  assert metadata["command"] == (
      f"intune pretrain --allocator --seed 0 --pipelines 2 --out {out}")
  assert metadata["pipelines"] == 2 and metadata["samples"] > 0
  assert np.isfinite(metadata["held_out_error"])
  proposer = pretrain.allocator_lib.Allocator(str(out))
  assert [w.shape for w in proposer.weights] == [w.shape for w in weights]
