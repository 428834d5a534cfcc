"""`intune try FILE.py:FUNCTION` (intune_tf/bench/trial.py) on pipelines the
tests write: its JSON and its one-line refusals of bad input (exit 2). Its
speed-ups against `benchmarks/cache.py --pipeline` on the same pipeline are
a benchmark's figures (`benchmarks/try_agreement.py`)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from intune_tf import cli
from intune_tf.bench import trial

ROOT = pathlib.Path(__file__).resolve().parents[1]

# A deterministic map that costs CPU (about a millisecond an element): the
# part of the pipeline worth caching.
_HEAVY = '''
import tensorflow as tf

def heavy(x):
  v = tf.cast(tf.range(20000), tf.float32) * tf.cast(x, tf.float32)
  for _ in range(4):
    v = tf.math.cumsum(tf.sin(v)) / 20000.0
  return v[:8]
'''
PIPELINES = {
    # The map before the shuffle: InTune caches the map's output.
    "cached": _HEAVY + '''
def make():
  return (tf.data.Dataset.range(400)
          .map(heavy, num_parallel_calls=tf.data.AUTOTUNE)
          .shuffle(100).batch(8).prefetch(tf.data.AUTOTUNE))
''',
    # The shuffle before the parse: only the shuffle's input can be cached.
    "shuffled": _HEAVY + '''
def make():
  return (tf.data.Dataset.range(400).shuffle(100)
          .map(heavy, num_parallel_calls=tf.data.AUTOTUNE)
          .batch(8).prefetch(tf.data.AUTOTUNE))
''',
}


def _write(tmp_path, name: str, text: str) -> str:
  path = tmp_path / f"{name}.py"
  path.write_text(text)
  return str(path)


def _try(tmp_path, target: str, *flags: str) -> tuple[int, dict | None]:
  """Runs `intune try` in this process (its runs in processes of their
  own): (exit code, its JSON)."""
  out = tmp_path / "try.json"
  args = cli.parse_args(["try", target, "--json", str(out), *flags])
  code = trial.main(args)
  return code, json.loads(out.read_text()) if out.exists() else None


def _check_fields(result: dict, epochs: int, repeats: int) -> None:
  assert result["epochs"] == epochs
  assert set(result["variants"]) == {"autotune", "intune-no-cache", "intune"}
  for v in result["variants"].values():
    assert len(v["epoch_s"]) == repeats
    assert all(len(r) == epochs and min(r) > 0 for r in v["epoch_s"])
    assert v["peak_rss"] > 50e6  # a process that loaded TensorFlow
  assert set(result["speedup"]) == {"intune", "intune-no-cache"}
  assert all(x > 0 for x in result["speedup"].values())
  assert {"point", "reason", "bytes"} <= set(result["cache"])


@pytest.mark.slow
def test_a_multi_epoch_pipeline_is_served_from_the_cache(tmp_path):
  # Its agreement with benchmarks/cache.py is a benchmark's figure:
  # benchmarks/try_agreement.py.
  target = _write(tmp_path, "cached", PIPELINES["cached"]) + ":make"
  code, result = _try(tmp_path, target, "--repeats", "2")
  assert code == 0
  _check_fields(result, 3, 2)
  cache = result["cache"]
  assert cache["point"].startswith("ParallelMapDataset"), cache
  assert "Shuffle" in cache["reason"], cache
  assert cache["bytes"] >= 400 * 8 * 4  # every float the map made
  assert cache["served"][1:] == [1.0, 1.0], cache


@pytest.mark.slow
def test_one_epoch_is_served_by_no_cache(tmp_path):
  target = _write(tmp_path, "cached", PIPELINES["cached"]) + ":make"
  png = tmp_path / "try.png"
  code, result = _try(tmp_path, target, "--epochs", "1", "--repeats", "1",
                      "--plot", str(png))
  assert code == 0
  _check_fields(result, 1, 1)
  assert result["cache"]["served"] == [0.0]
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_shuffle_before_the_parse_keeps_the_cache_below_it(tmp_path):
  target = _write(tmp_path, "shuffled", PIPELINES["shuffled"]) + ":make"
  code, result = _try(tmp_path, target, "--repeats", "1", "--take", "20",
                      "--step-ms", "1")
  assert code == 0
  _check_fields(result, 3, 1)
  assert [len(r) for r in result["variants"]["autotune"]["epoch_s"]] == [3]
  assert result["variants"]["intune"]["elements"] == [20, 20, 20]
  # Nothing above the shuffle is cached: the map runs every epoch.
  assert not result["cache"]["point"].startswith("ParallelMap"), (
      result["cache"])
  assert result["cache"]["reason"], result["cache"]


_BAD = {
    "raises": "def make():\n  raise ValueError('no files under /data')\n",
    "not_a_dataset": "def make():\n  return [1, 2, 3]\n",
    "infinite": ("import tensorflow as tf\n\ndef make():\n"
                 "  return tf.data.Dataset.range(3).repeat()\n"),
    "broken": "def make(:\n",
}


@pytest.mark.parametrize("name, target, says", [
    ("raises", "{}:make", "raised ValueError: no files under /data"),
    ("not_a_dataset", "{}:make", "returned a list, not a tf.data.Dataset"),
    ("infinite", "{}:make", "infinite dataset; pass --take K"),
    ("raises", "{}:make_it", "has no function 'make_it' (it defines: make)"),
    ("broken", "{}:make", "raised SyntaxError when run"),
    ("raises", "{}", "is not FILE.py:FUNCTION"),
    ("raises", "{}:1x", "is not a Python function name"),
    (None, "{}/missing.py:make", "no such file"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, name, target,
                                         says):
  path = _write(tmp_path, name, _BAD[name]) if name else str(tmp_path)
  args = cli.parse_args(["try", target.format(path)])
  assert trial.main(args) == 2
  err = capsys.readouterr().err
  assert err.startswith("intune try: ") and says in err, err
  assert err.count("\n") == 1, err


def test_the_command_line_exits_2_on_a_missing_file(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "intune_tf", "try",
       str(tmp_path / "nowhere.py") + ":make"],
      capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert proc.stderr.strip().splitlines()[-1].endswith(
      "nowhere.py: no such file; pass FILE.py:FUNCTION with the path of "
      "your Python file.")


@pytest.mark.parametrize("base, other, expected", [
    ([4.0, 6.0], [2.0, 2.0], (2.5, 2.0, 3.0)),  # ratios 2 and 3
    ([3.0], [3.0], (1.0, 1.0, 1.0)),
])
def test_paired(base, other, expected):
  assert trial.paired(base, other) == expected


@pytest.mark.parametrize("n, text", [
    (512, "512 B"), (1536, "1.5 kB"), (2.5e6, "2.5 MB"), (3e9, "3.0 GB")])
def test_size(n, text):
  assert trial._size(n) == text  # noqa: SLF001  a pure helper


def test_the_readme_s_example_pipeline_is_a_finite_dataset():
  # The README's first `intune try` command runs on it as written.
  readme = (ROOT / "README.md").read_text()
  target = "examples/try_pipeline.py:make_dataset"
  assert f"intune try {target}\n" in readme
  ds = trial.make_dataset(str(ROOT / target), None)
  assert int(ds.cardinality()) > 0
