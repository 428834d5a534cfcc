"""The demo (the README's first command): real model.fit runs, fast mode."""

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import types

import pytest

from intune_tf.bench import demo
from intune_tf.criteo import models

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _warm_start_dir(tmp_path, monkeypatch):
  monkeypatch.setenv("INTUNE_WARMSTART_DIR", str(tmp_path / "warmstart"))


def _args(tmp_path, **overrides):
  values = dict(minutes=0.3, repeats=1, policy=None, level=4,
                batch_size=1024, rows=20_000, ceiling_seconds=0.3,
                out=str(tmp_path / "demo"))
  values.update(overrides)
  return argparse.Namespace(**values)


@pytest.mark.parametrize("override,message", [
    ({"policy": "no-such-policy"}, "no-such-policy"),
    ({"minutes": 0.0}, "minutes must be > 0"),
    ({"repeats": 0}, "repeats must be a positive int"),
    ({"level": 2}, "level must be 3, 4 or 5"),
])
def test_bad_arguments_exit_2_with_a_message(tmp_path, capsys, override,
                                             message):
  assert demo.main(_args(tmp_path, **override)) == 2
  assert message in capsys.readouterr().out


def test_legacy_keras_exits_2_saying_what_to_do(tmp_path, capsys,
                                              monkeypatch):
  # tf.keras as tf_keras makes (TF_USE_LEGACY_KERAS=1): another Model class.
  monkeypatch.setattr(models, "keras",
                      types.SimpleNamespace(Model=type("Model", (), {})))
  monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
  assert demo.main(_args(tmp_path)) == 2
  assert capsys.readouterr().out.strip() == (
      "intune demo: it trains with Keras 3, but tf.keras is the legacy "
      "tf_keras in this process (TF_USE_LEGACY_KERAS='1'). Run it where "
      "TF_USE_LEGACY_KERAS is unset, e.g. `env -u TF_USE_LEGACY_KERAS intune "
      "demo`.")


def test_knob_labels_name_criteo_stages():
  features = "Prefetch.ParallelMapV2"
  parse = f"{features}.ParallelMapV2"
  batch = f"{parse}.ParallelBatch"
  names = [f"{batch}/parallelism", f"{parse}/parallelism",
           f"{features}/parallelism", "Prefetch/buffer_size",
           f"{batch}.Shuffle.ParallelInterleaveV4/parallelism",
           "Zip[1].Foo/parallelism"]
  assert demo.knob_labels(names, 4) == {
      f"{batch}/parallelism": "batch threads",
      f"{parse}/parallelism": "parse threads",
      f"{features}/parallelism": "features threads",
      "Prefetch/buffer_size": "prefetch buffer",
      f"{batch}.Shuffle.ParallelInterleaveV4/parallelism": "read threads",
      "Zip[1].Foo/parallelism": "Zip-1.Foo/parallelism"}


# A log line of absl/glog ("W1127 05:56:04.442933 1397 status.py:612] ...")
# or of Python's default format ("WARNING:absl:..."): its level, file, text.
# Not anchored: a line logged while a progress bar is drawn follows the bar.
_LOG_LINE = re.compile(
    r"(?:\b([IWEF])\d{4} [\d:.]+ +\d+ ([^:\s]+):\d+\] (.*)"
    r"|\b(DEBUG|INFO|WARNING|ERROR|CRITICAL):[^:\s]*:(.*))$")
# The kernel's C++ files: a log line from one is ours (a Python file's name
# is not: TF has a session.py too).
# The checkout's, not the package's: the compat stack installs the package,
# which carries no C++ sources.
_ROOT = pathlib.Path(__file__).resolve().parents[1]
_OWN_FILES = frozenset(
    p.name for folder in (_ROOT / "intune_tf" / "cc", _ROOT / "rewrites")
    for pattern in ("**/*.cc", "**/*.h") for p in folder.glob(pattern))


def intune_log_lines(output: str) -> list[str]:
  """The log lines of `output` (progress bars' carriage returns as line
  ends) written by InTune: from one of its C++ files, or naming InTune or
  Criteo (every message of its Python code does)."""
  ours = []
  for line in output.replace("\r", "\n").splitlines():
    match = _LOG_LINE.search(line.strip())
    text = match and (match.group(3) or match.group(5)).lower()
    if match and (match.group(2) in _OWN_FILES or "intune" in text or
                  "criteo" in text):
      ours.append(line)
  return ours


@pytest.mark.parametrize("output,expected", [
    ("W1127 05:56:04.442933 1397 status.py:612] InTune: skipped", 1),
    ("I0000 00:00:1795.98 9567 cpu_feature_guard.cc:227] This TensorFlow", 0),
    ("bar 50%|##  | 1/2\rW0000 00:00:17.1 96 root_dataset_op.cc:66] x", 1),
    ("WARNING:absl:InTune <intune_tf.TuningSession 1>: stage Shuffle holds", 1),
    # As `make demo` printed it: after a progress bar, on its line.
    ("fits:  50%|#####     | 1/2 [00:23<00:23, 23.33s/fit]W1127 "
     "06:12:53.525304 1398 tuner.py:461] InTune <intune_tf.TuningSession 1 "
     "'demo'>: stage Prefetch.Shuffle holds 4.4 MB", 1),
    ("InTune demo: model.fit of a tiny DLRM", 0),  # the demo's own text
    ("I1127 05:56:04.1 7 session.py:9] TF's own session.py", 0),
])
def test_intune_log_lines(output, expected):
  assert len(intune_log_lines(output)) == expected


@pytest.mark.slow
def test_the_demo_command_table_png_knobs_and_no_intune_log_line(tmp_path):
  # `make demo` runs `intune demo`: its whole output, the kernel's C++ log
  # and TF's included, as a user sees it between the progress bars (it
  # printed the RAM budget of every session at INFO, and a 4.4 MB shuffle
  # buffer "that cannot be lowered" against an 11 GB budget); then its
  # table, plot and JSON. The climber always tries a move once its base is
  # measured; the agent may rightly hold its start for a 9 s run on a
  # loaded machine.
  env = {**os.environ, "INTUNE_WARMSTART_DIR": str(tmp_path / "warmstart"),
         "INTUNE_STATUS_DIR": str(tmp_path / "status")}
  # As a shell runs it: tensorflow_transform, which the compat stack's TFX
  # tests import, sets TF_USE_LEGACY_KERAS=1 in this process.
  env.pop("TF_USE_LEGACY_KERAS", None)
  out = tmp_path / "demo"
  done = subprocess.run(
      [sys.executable, "-m", "intune_tf", "demo", "--minutes", "0.3",
       "--repeats", "1", "--rows", "20000", "--batch-size", "1024",
       "--ceiling-seconds", "0.3", "--policy", "climb", "--out", str(out)],
      capture_output=True, text=True, env=env, timeout=1200, check=False,
      cwd=tmp_path)  # outside the checkout: the package as installed
  assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
  assert "interleaved runs: 100%" in done.stderr  # the progress bars
  assert intune_log_lines(done.stdout + done.stderr) == []

  rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
  assert rows[0].startswith("| tuner | rows/s (median) |")
  assert rows[1].startswith("| autotune |") and " 1.00x |" in rows[1]
  assert rows[2].startswith("| intune (climb")
  assert "n/a (not exposed)" in rows[1]  # AUTOTUNE's buffers are not visible
  png = out / "demo.png"
  assert png.read_bytes()[:8] == _PNG_SIGNATURE
  assert png.stat().st_size > 10_000
  with open(out / "demo.json") as f:
    saved = json.load(f)
  summary = saved["summary"]
  for tuner in ("autotune", "intune"):
    assert summary[tuner]["rows_per_s"] > 0
  # What the cache did, in the JSON and on its own line after the table.
  assert {"point", "reason", "bytes", "served", "saved_s"} <= set(
      summary["intune"]["cache"])
  assert demo.cache_line(summary["intune"]["cache"]) in done.stdout
  assert summary["intune"]["peak_buffered_bytes"] > 0
  assert summary["autotune"]["peak_buffered_bytes"] is None
  # Knobs moved: the tuner changed values during the InTune run.
  assert summary["intune"]["knob_changes"] > 0
  intune_runs = [r for r in saved["runs"] if r["tuner"] == "intune"]
  assert intune_runs[0]["knobs"] and intune_runs[0]["windows"]
  # A 0.3 minute demo with one run per tuner: 9 s each (2.25 s warm-up).
  assert saved["seconds"] == pytest.approx(6.75)


def _run_with_knobs(*knobs):
  return demo.DemoRun(tuner="intune", repeat=0,
                      knobs=[(t, k) for t, k in enumerate(knobs)])


def test_constant_knobs_are_those_with_one_value_in_every_run():
  # a: 2 in both runs; b: 1 then 3; c: 4 in one run, 5 in the other.
  runs = [_run_with_knobs({"a": 2, "b": 1, "c": 4}, {"a": 2, "b": 3}),
          _run_with_knobs({"a": 2, "c": 5})]
  assert demo.constant_knobs(runs) == {"a": 2}


@pytest.mark.parametrize("cache, line", [
    ({"state": "placed", "point": "ParallelMapDatasetV2/_5",
      "reason": "above it: a shuffle",
      "bytes": 3 * 2**20, "served": 0.5, "saved_s": 1.25},
     "InTune's cache: after ParallelMapDatasetV2/_5, held 3.0 MB, served "
     "50% of the elements read there, saved 1.2 s of input work (above it: "
     "a shuffle)"),
    ({"state": "declined", "point": "", "reason": "the input never ends"},
     "InTune's cache: none (the input never ends)"),
    ({}, "InTune's cache: none (no reading)"),
])
def test_cache_line(cache, line):
  assert demo.cache_line(cache) == line
