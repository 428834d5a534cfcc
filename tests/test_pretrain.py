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
  a = pretrain.guided_action(o, dqn.action_mask(o), np.random.default_rng(0))
  assert a == 3


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
       "--steps", "20", "--json", str(tmp_path / "s.json")], check=True,
      capture_output=True, text=True, cwd=tmp_path)
  for name in pretrain.POLICIES:
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
