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
  assert ratios.shape == (3,) and (ratios > 0).all() and (ratios <= 1 + 1e-9).all()


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
  assert "intune" in result.stdout and "analytic" in result.stdout
  scores = json.loads((tmp_path / "s.json").read_text())
  assert scores["pipelines"] == 3 and 0 < scores["even"]["median"] <= 1
