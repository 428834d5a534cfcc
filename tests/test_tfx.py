"""The TFX component: IntuneTuner, its artifact, the Trainer helper, the
example pipeline (compat stack only: tfx 1.16 needs Python 3.10)."""

import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys
import textwrap
import time
import types

import pytest

pytest.importorskip("tfx", reason="tfx is on the compat stack only "
                    "(.venv-compat: Python 3.10, TF 2.16, tfx 1.16)")

import tensorflow as tf
from tfx.components.trainer import fn_args_utils
from tfx.types import standard_artifact_utils
from tfx.types import standard_artifacts

import intune_tf
from intune_tf import tfx as intune_tfx
from intune_tf.tfx import executor as executor_lib

pytestmark = pytest.mark.compat

ROOT = pathlib.Path(__file__).resolve().parents[1]

MODULE = textwrap.dedent('''
    import tensorflow as tf

    SPEC = {"x": tf.io.FixedLenFeature([4], tf.float32),
            "label": tf.io.FixedLenFeature([], tf.float32)}

    def _parse(serialized):
      parsed = tf.io.parse_example(serialized, SPEC)
      return {"x": parsed["x"]}, parsed["label"]

    def input_fn(records, batch_size):
      ds = records.batch(batch_size)
      ds = ds.map(_parse, num_parallel_calls=tf.data.AUTOTUNE)
      ds = ds.map(lambda f, y: ({"x": tf.math.log1p(tf.abs(f["x"]))}, y),
                  num_parallel_calls=tf.data.AUTOTUNE)
      return ds.prefetch(tf.data.AUTOTUNE)
    ''')


def _examples_artifact(root: pathlib.Path, splits=("train", "eval"),
                       declared=None, rows=2000):
  """A real Examples artifact: gzip TFRecords in Split-<name> folders."""
  uri = root / "examples"
  for split in splits:
    (uri / f"Split-{split}").mkdir(parents=True)
    path = uri / f"Split-{split}" / "data_tfrecord-00000-of-00001.gz"
    with tf.io.TFRecordWriter(str(path), options="GZIP") as w:
      for i in range(rows):
        w.write(tf.train.Example(features=tf.train.Features(feature={
            "x": tf.train.Feature(float_list=tf.train.FloatList(
                value=[i, i + 1, i + 2, i + 3])),
            "label": tf.train.Feature(float_list=tf.train.FloatList(
                value=[i % 2])),
        })).SerializeToString())
  examples = standard_artifacts.Examples()
  examples.uri = str(uri)
  examples.split_names = standard_artifact_utils.encode_split_names(
      list(splits if declared is None else declared))
  return examples


def _output(root: pathlib.Path):
  out = intune_tfx.TunedInputConfig()
  out.uri = str(root / "tuned_input_config")
  return out


def _props(module_file, **overrides):
  props = {"module_file": str(module_file), "input_fn": "input_fn",
           "tune_seconds": 1.5, "policy": "even", "batch_size": 64,
           "split": "train", "benchmark_repeats": 1,
           "benchmark_seconds": 0.5, "warmup_seconds": 0.2}
  props.update(overrides)
  return props


def _knob(name, lo=1.0, hi=2.0, value=1.0):
  return intune_tf.Knob(name, name.rpartition("/")[2], value, lo, hi)


# --- configuration helpers ---------------------------------------------------
_MAP1 = "Prefetch.ParallelMapV2"
_MAP2 = f"{_MAP1}.ParallelMapV2"
_READ = f"{_MAP2}.ParallelInterleaveV4"
_LIVE = [_knob(f"{_READ}/parallelism"),
         _knob(f"{_MAP2}/parallelism", hi=4),
         _knob(f"{_MAP1}/parallelism", hi=4),
         _knob("Prefetch/buffer_size", lo=0, hi=16)]


def test_map_config_by_name_then_by_position():
  same = {f"{_MAP2}/parallelism": 3.0, "Prefetch/buffer_size": 99.0}
  # Every name live: by name, clamped to the knob's range.
  assert intune_tfx.map_config(same, _LIVE) == {
      f"{_MAP2}/parallelism": 3.0, "Prefetch/buffer_size": 16.0}
  # Recorded under an extra stage (a repeat above): by position from the
  # input end.
  shifted = {f"Repeat.{_READ}/parallelism": 2.0,
             f"Repeat.{_MAP2}/parallelism": 4.0,
             f"Repeat.{_MAP1}/parallelism": 2.0,
             "Repeat.Prefetch/buffer_size": 4.0,
             f"Repeat.{_READ}.ParallelBatch/parallelism": 2.0}  # no match
  assert intune_tfx.map_config(shifted, _LIVE) == {
      f"{_READ}/parallelism": 2.0, f"{_MAP2}/parallelism": 4.0,
      f"{_MAP1}/parallelism": 2.0, "Prefetch/buffer_size": 4.0}


def test_map_config_of_an_earlier_version_by_position():
  # Configurations saved before knob names were places in the pipeline name
  # them by node id (deeper stages had larger ids).
  legacy = {"ParallelInterleaveV4(id:10)/parallelism": 2.0,
            "ParallelMapV2(id:5)/parallelism": 4.0,
            "ParallelMapV2(id:4)/parallelism": 2.0,
            "Prefetch(id:2)/buffer_size": 4.0}
  assert intune_tfx.load_tuned_config(
      {"format": "intune_tf.config/1", "knobs": legacy})["knobs"] == legacy
  assert intune_tfx.map_config(legacy, _LIVE) == {
      f"{_READ}/parallelism": 2.0, f"{_MAP2}/parallelism": 4.0,
      f"{_MAP1}/parallelism": 2.0, "Prefetch/buffer_size": 4.0}


def test_load_tuned_config_from_every_source(tmp_path):
  config = {"format": "intune_tf.config/1",
            "knobs": {"Prefetch.ParallelMapV2/parallelism": 2}}
  (tmp_path / "config.json").write_text(json.dumps(config))
  artifact = _output(tmp_path)
  artifact.uri = str(tmp_path)
  fn_args = fn_args_utils.FnArgs(custom_config={
      intune_tfx.TUNED_INPUT_CONFIG_KEY: str(tmp_path)})
  expected = {"format": "intune_tf.config/1",
              "knobs": {"Prefetch.ParallelMapV2/parallelism": 2.0}}
  for source in (str(tmp_path), tmp_path / "config.json", artifact, fn_args,
                 config):
    assert intune_tfx.load_tuned_config(source) == expected


def test_load_tuned_config_bad_sources(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"No tuned input configuration "
                     r"at .*config\.json"):
    intune_tfx.load_tuned_config(str(tmp_path))
  (tmp_path / "config.json").write_text('{"knobs": {}}')
  with pytest.raises(ValueError, match="not an intune_tf configuration"):
    intune_tfx.load_tuned_config(str(tmp_path))
  with pytest.raises(ValueError, match=r"custom_config has no "
                     r"'intune_tuned_input_config'.*intune_tf\.tfx\.Trainer"):
    intune_tfx.load_tuned_config(fn_args_utils.FnArgs(custom_config={}))
  with pytest.raises(ValueError, match="bad knob entry 'threads'"):
    intune_tfx.load_tuned_config({"format": "intune_tf.config/1",
                                  "knobs": {"threads": 2}})


def _pipeline():
  ds = tf.data.Dataset.range(10**9)
  ds = ds.map(lambda x: x + 1, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(16)  # fused with the map above (MapAndBatch)
  ds = ds.map(lambda x: x * 2, num_parallel_calls=tf.data.AUTOTUNE)
  return ds.prefetch(tf.data.AUTOTUNE)


def _session_of(it_factory):
  known = {s.id for s in intune_tf.sessions()}
  it = it_factory()
  next(it)
  new = [s for s in intune_tf.sessions() if s.id not in known]
  assert new, "no InTune session for the iterator"
  return it, new[-1]


def test_apply_tuned_config_starts_every_iterator_at_it():
  probe = tf.data.Options()
  probe.experimental_intune = intune_tf.IntuneOptions(policy="manual")
  it, session = _session_of(lambda: iter(_pipeline().with_options(probe)))
  maps = [k for k in session.knobs() if k.kind == "parallelism"]
  assert len(maps) == 2 and all(k.max >= 2 for k in maps)
  assert maps[0].value == maps[0].max
  del it
  # A configuration recorded on a pipeline with one more stage above.
  shift = lambda n: f"Take.{n}"
  config = {"format": "intune_tf.config/1",
            "knobs": {shift(maps[0].name): 1.0, shift(maps[1].name): 2.0}}
  # Without the cache, which would serve the second epoch from above the
  # stages (their knobs then leave the session, docs/options.md).
  ds = intune_tfx.apply_tuned_config(_pipeline(), config, cache=False)
  for _ in range(2):  # every iterator (every model.fit epoch)
    it, session = _session_of(lambda: iter(ds))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
      values = {k.name: k.value for k in session.knobs()}
      if values[maps[0].name] == 1.0:
        break
      next(it)
      time.sleep(0.02)
    # The input-side stage was at its AUTOTUNE start (the max) before.
    assert values[maps[0].name] == 1.0 and values[maps[1].name] == 2.0
    assert session.options.policy == "tuned"
    del it


def test_apply_tuned_config_then_another_policy_and_bad_fields():
  config = {"format": "intune_tf.config/1",
            "knobs": {"Prefetch.ParallelMapV2/parallelism": 1.0}}
  ds = intune_tfx.apply_tuned_config(_pipeline(), config, then="even",
                                     name="train")
  options = ds.options().experimental_intune
  assert options.policy == "tuned+even" and options.name == "train"
  with pytest.raises(TypeError, match="sets IntuneOptions.policy itself"):
    intune_tfx.apply_tuned_config(_pipeline(), config, policy="even")
  with pytest.raises(ValueError, match="Unknown InTune policy 'nope'"):
    intune_tfx.apply_tuned_config(_pipeline(), config, then="nope")


def test_tuned_policy_starts_at_the_config_then_hands_over():
  from intune_tf.live import registry  # noqa: PLC0415
  from intune_tf.tfx import tuned_config  # noqa: PLC0415
  knobs = (_knob("Prefetch.ParallelMapV2/parallelism", hi=4),
           _knob("Prefetch/buffer_size", lo=0, hi=8))
  obs = types.SimpleNamespace(knobs=knobs)
  config = {"Prefetch.ParallelMapV2/parallelism": 3.0,
            "Prefetch/buffer_size": 4.0}
  options = intune_tf.IntuneOptions(policy="tuned", config=config)
  held = registry.create(options)
  assert held.static and held.step(obs) == config and held.step(obs) == {}
  tuned_config.apply_tuned_config(_pipeline(), {
      "format": "intune_tf.config/1", "knobs": config}, then="unoptimized")
  handing = registry.create(dataclasses.replace(
      options, policy="tuned+unoptimized"))
  assert handing.step(obs) == config
  assert handing.step(obs) == {"Prefetch.ParallelMapV2/parallelism": 1.0,
                               "Prefetch/buffer_size": 1.0}
  # A stage that appears (or leaves) restarts from the configuration.
  obs.knobs = knobs[:1]
  assert handing.step(obs) == {"Prefetch.ParallelMapV2/parallelism": 3.0}


# --- the executor, with real artifacts ---------------------------------------
@pytest.mark.slow
def test_executor_tunes_and_writes_the_artifact(tmp_path):
  module = tmp_path / "user_module.py"
  module.write_text(MODULE)
  examples = _examples_artifact(tmp_path)
  out = _output(tmp_path)
  executor_lib.Executor().Do({"examples": [examples]},
                             {"tuned_input_config": [out]}, _props(module))
  config = json.loads((tmp_path / "tuned_input_config" / "config.json")
                      .read_text())
  assert intune_tfx.load_tuned_config(config) == config
  names = set(config["knobs"])
  assert sum(intune_tf.records.parse_knob(n)[0].op == "ParallelMapV2"
             for n in names) == 2
  bench = json.loads((tmp_path / "tuned_input_config" / "benchmark.json")
                     .read_text())
  assert [r["variant"] for r in bench["runs"]] == ["tuned", "autotune"]
  assert all(r["rows_per_s"] > 0 for r in bench["runs"])
  assert bench["tuned_knobs_in_force"] == config["knobs"]
  assert bench["split"] == "train" and bench["batch_size"] == 64
  assert out.rows_per_s == pytest.approx(bench["rows_per_s"])
  assert out.speedup == pytest.approx(bench["rows_per_s"] /
                                      bench["autotune_rows_per_s"])
  assert out.num_knobs == len(names) and out.policy == "even"


def test_executor_examples_without_the_split(tmp_path):
  module = tmp_path / "user_module.py"
  module.write_text(MODULE)
  examples = _examples_artifact(tmp_path, splits=("eval",), rows=10)
  with pytest.raises(ValueError) as e:
    executor_lib.Executor().Do({"examples": [examples]},
                               {"tuned_input_config": [_output(tmp_path)]},
                               _props(module))
  message = str(e.value)
  assert examples.uri in message and "no split 'train'" in message
  assert "split_names list ['eval']" in message
  assert "split folders ['eval']" in message
  assert not (tmp_path / "tuned_input_config" / "config.json").exists()


def test_executor_examples_with_no_split_at_all(tmp_path):
  module = tmp_path / "user_module.py"
  module.write_text(MODULE)
  examples = standard_artifacts.Examples()
  examples.uri = str(tmp_path / "empty_examples")
  (tmp_path / "empty_examples").mkdir()
  with pytest.raises(ValueError, match=(
      r"Examples artifact at .*empty_examples has no split 'train': its "
      r"split_names property lists none, and its directory holds split "
      r"folders \[\]")):
    executor_lib.Executor().Do({"examples": [examples]},
                               {"tuned_input_config": [_output(tmp_path)]},
                               _props(module))


def test_executor_module_that_fails_to_import(tmp_path):
  module = tmp_path / "broken_module.py"
  module.write_text("import intune_no_such_dependency\n" + MODULE)
  examples = _examples_artifact(tmp_path, rows=10)
  with pytest.raises(ImportError) as e:
    executor_lib.Executor().Do({"examples": [examples]},
                               {"tuned_input_config": [_output(tmp_path)]},
                               _props(module))
  message = str(e.value)
  assert str(module) in message
  assert ("ModuleNotFoundError: No module named "
          "'intune_no_such_dependency'") in message
  assert isinstance(e.value.__cause__, ModuleNotFoundError)
  # Nothing of the broken module stays registered.
  assert not [m for m in sys.modules if "broken_module" in m]


def test_executor_module_without_input_fn_and_bad_parameters(tmp_path):
  module = tmp_path / "other_module.py"
  module.write_text("def make_dataset(records, batch_size):\n"
                    "  return records\n")
  examples = _examples_artifact(tmp_path, rows=10)
  args = ({"examples": [examples]}, {"tuned_input_config": [_output(tmp_path)]})
  with pytest.raises(AttributeError, match=r"has no function 'input_fn' \(it "
                     r"defines \['make_dataset'\]\)"):
    executor_lib.Executor().Do(*args, _props(module))
  with pytest.raises(ValueError, match="Unknown InTune policy 'nope'"):
    executor_lib.Executor().Do(*args, _props(module, policy="nope"))
  with pytest.raises(ValueError, match="batch_size must be positive"):
    executor_lib.Executor().Do(*args, _props(module, batch_size=0))
  with pytest.raises(ValueError, match="needs module_file"):
    intune_tfx.IntuneTuner(examples=None, input_fn="input_fn")


# --- the example pipeline, end to end ----------------------------------------
def _mlmd(path):
  from ml_metadata.metadata_store import metadata_store  # noqa: PLC0415
  from ml_metadata.proto import metadata_store_pb2  # noqa: PLC0415
  config = metadata_store_pb2.ConnectionConfig()
  config.sqlite.filename_uri = str(path)
  config.sqlite.connection_mode = (
      metadata_store_pb2.SqliteMetadataSourceConfig.READONLY)
  return metadata_store.MetadataStore(config), metadata_store_pb2


def _value(v):
  return getattr(v, v.WhichOneof("value"))


@pytest.mark.slow
def test_example_pipeline_end_to_end_and_artifact_in_mlmd(tmp_path):
  out = tmp_path / "run"
  env = dict(os.environ, INTUNE_WARMSTART_DIR=str(tmp_path / "warmstart"))
  # tensorflow_transform, imported by tfx modules in this test process, sets
  # TF_USE_LEGACY_KERAS=1; run the example as it runs from a shell (Keras 3).
  env.pop("TF_USE_LEGACY_KERAS", None)
  start = time.monotonic()
  proc = subprocess.run(
      [sys.executable, str(ROOT / "examples" / "tfx_pipeline" / "pipeline.py"),
       "--out", str(out), "--rows", "3000", "--tune-seconds", "3",
       "--benchmark-repeats", "2", "--benchmark-seconds", "1",
       "--train-steps", "100"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
      check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
  print(f"pipeline ran in {time.monotonic() - start:.0f} s")
  assert "TunedInputConfig" in proc.stdout

  store, pb = _mlmd(out / "metadata.sqlite")
  [artifact] = store.get_artifacts_by_type("TunedInputConfig")
  assert artifact.state == pb.Artifact.LIVE
  props = {k: _value(v) for k, v in artifact.properties.items()}
  uri = pathlib.Path(artifact.uri)
  config = json.loads((uri / "config.json").read_text())
  bench = json.loads((uri / "benchmark.json").read_text())

  # config.json: TuningSession.config() format, valid knob names and values.
  assert config["format"] == "intune_tf.config/1" and config["knobs"]
  for name, value in config["knobs"].items():
    _, kind = intune_tf.records.parse_knob(name)
    assert kind in ("parallelism", "buffer_size"), name
    assert math.isfinite(value) and value == int(value)
    assert value >= (1 if kind == "parallelism" else 0), (name, value)
    assert value <= (os.cpu_count() if kind == "parallelism" else 1024)
  # The figures, in the file and as ML Metadata properties.
  assert len(bench["runs"]) == 4
  assert all(r["rows_per_s"] > 0 for r in bench["runs"])
  assert {r["variant"] for r in bench["runs"]} == {"tuned", "autotune"}
  assert props["rows_per_s"] == pytest.approx(bench["rows_per_s"])
  assert props["autotune_rows_per_s"] == pytest.approx(
      bench["autotune_rows_per_s"])
  assert props["rows_per_s"] > 0 and props["autotune_rows_per_s"] > 0
  assert props["speedup"] == pytest.approx(
      props["rows_per_s"] / props["autotune_rows_per_s"], rel=1e-4)
  assert props["num_knobs"] == len(config["knobs"])
  assert props["policy"] == intune_tf.IntuneOptions().policy
  assert props["split"] == "train"
  assert bench["tuned_knobs_in_force"] == config["knobs"]
  for path in bench["agent_files"]:
    assert (uri / path).is_file()
  assert bench["agent_export_error"] is None

  # Lineage: the Trainer consumed the artifact, and trained at its knobs.
  events = store.get_events_by_artifact_ids([artifact.id])
  inputs = [e.execution_id for e in events if e.type == pb.Event.INPUT]
  [execution] = store.get_executions_by_id(inputs)
  [trainer_type] = store.get_execution_types_by_id([execution.type_id])
  assert trainer_type.name.endswith("intune_tf.tfx.component.Trainer")
  [model] = store.get_artifacts_by_type("Model")
  assert (pathlib.Path(model.uri) / "Format-Serving" /
          "saved_model.pb").is_file()
  [run] = store.get_artifacts_by_type("ModelRun")
  history = json.loads((pathlib.Path(run.uri) /
                        "intune_history.json").read_text())
  assert history["intune/rows_per_s"][-1] > 0

  def by_stage(entries):  # (stage op, parameter) -> sorted values
    result = {}
    for name, value in entries:
      stage, kind = intune_tf.records.parse_knob(name)
      result.setdefault((stage.op, kind), []).append(value)
    return {k: sorted(v) for k, v in result.items()}

  # Log keys are knob names (`keras.short_name`; these have no brackets).
  trained = [(k[len("intune/"):], v[-1]) for k, v in history.items()
             if k.endswith(("/parallelism", "/buffer_size"))]
  assert by_stage(trained) == by_stage(config["knobs"].items())
