"""Tests of intune_tf.calibration: traces in, fitted simulator out."""

import itertools
import json

import pytest

from intune_tf import calibration
from intune_tf import simulator as sim


def _write_trace(path, pipeline, params, cpus=4):
  """A trace as the harness writes it, from a simulator with known
  constants: observations and a measurement per configuration."""
  with open(path, "w") as f:
    s = sim.Simulator(pipeline, params=params)
    names = [k.name for k in s.knobs()]
    for values in itertools.product((1, 2, 3), repeat=len(names)):
      config = dict(zip(names, map(float, values)))
      s.set(config)
      for _ in range(3):
        s.advance()
        f.write(json.dumps({"scenario": "toy", "policy": "oracle-search",
                            "config": config,
                            "observation": s.observe().to_json()},
                           default=float) + "\n")
      f.write(json.dumps({"kind": "measurement", "scenario": "toy",
                          "config": config, "cpus": cpus,
                          "rows_per_s": s.true_rate() * 10,
                          "rows_per_element": 10}) + "\n")


def test_fit_recovers_the_simulator_it_was_traced_from(tmp_path):
  params = sim.SimParams(oversubscription=0.3, handoff_s=0.0)
  pipeline = sim.SimPipeline(
      (sim.SimStage("A(id:3)", 0.004), sim.SimStage("B(id:2)", 0.002),
       sim.SimStage("C(id:1)", 0.001)), cpus=4, memory_limit=1e15,
      ram_budget=1e15, noise=0.0)
  path = str(tmp_path / "trace.jsonl")
  _write_trace(path, pipeline, params)
  points = calibration.load_trace(path)
  assert len(points["toy"]) == 27 and points["toy"][0].observations
  fitted, scale, rows = calibration.fit(points)
  assert fitted.oversubscription == pytest.approx(0.3)
  assert scale == pytest.approx(1.0)
  assert max(abs(r["error"]) for r in rows) < 1e-6


def test_stages_without_knobs_run_in_their_consumer():
  knobs = [{"name": "A(id:3)/parallelism", "kind": "parallelism"},
           {"name": "B(id:2)/parallelism", "kind": "parallelism"},
           {"name": "P(id:1)/buffer_size", "kind": "buffer_size"}]
  def stage(name, cost):
    return {"name": name, "rate": 10.0, "cpu_per_element_s": cost}
  obs = {"knobs": knobs, "output_rate": 10.0, "stages": [
      stage("P(id:1)", 0.001), stage("B(id:2)", 0.002),
      stage("A(id:3)", 0.003), stage("Shuffle(id:4)", 0.004),
      stage("TextLine(id:9)", 0.005)]}
  point = calibration.Point("toy", {}, 2, 1.0, 1.0, [obs, obs])
  pipeline, index = calibration.build_pipeline(
      point, sim.SimParams(oversubscription=0.0))
  costs = {st.name: st.cost_s for st in pipeline.stages}
  # A(id:3) owns Shuffle(id:4) and TextLine(id:9): .003 + .004 + .005.
  assert costs == pytest.approx({"A(id:3)": 0.012, "B(id:2)": 0.002,
                                 "P(id:1)": 0.001})
  assert [st.tunable for st in pipeline.stages] == [True, True, False]
  assert pipeline.stages[index["P(id:1)"]].buffer


@pytest.mark.parametrize("content,match", [
    ("{not json\n", r"trace.jsonl:1: not a JSON line"),
    ('{"policy": "even"}\n', "holds no oracle-search measurements"),
    ("[1, 2]\n", "trace.jsonl:1: not a JSON object"),
])
def test_bad_traces(tmp_path, content, match):
  path = tmp_path / "trace.jsonl"
  path.write_text(content)
  with pytest.raises(ValueError, match=match):
    calibration.load_trace(str(path))


@pytest.mark.slow
def test_recorded_criteo_trace_is_predicted_within_15_percent():
  """The trace `intune bench --scenarios criteo-l3-b4096,criteo-l4-b4096,
  criteo-l5-b4096 --policies oracle --oracle_seconds 4 --trace` recorded on
  this machine (65 configurations): median |error| <= 15%."""
  import os  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks",
                      "calibration-trace.jsonl.gz")
  points = calibration.load_trace(path)
  assert set(points) == {"criteo-l3-b4096", "criteo-l4-b4096",
                         "criteo-l5-b4096"}
  _, _, rows = calibration.fit(points)
  assert len(rows) >= 30
  assert np.median([abs(r["error"]) for r in rows]) <= 0.15
