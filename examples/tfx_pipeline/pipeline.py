"""Example TFX pipeline: Criteo -> ImportExampleGen -> IntuneTuner -> Trainer.

    .venv-compat/bin/python examples/tfx_pipeline/pipeline.py --out /tmp/x
    make tfx-example

Run it as a script: `python -m` from the checkout root would import the
source tree's `intune_tf` instead of the installed one.

Data: the real Criteo sample from ../shared/data/criteo when it is there
(`intune_tf.criteo.real_sample_files`), else rows from the synthetic
generator; `--rows` of them are written as `tf.train.Example` TFRecords
under `--out` (never into the source tree). The pipeline runs with TFX's
`LocalDagRunner` and an ML Metadata SQLite store at
`<out>/metadata.sqlite`; artifacts go under `<out>/pipeline_root`. At the
end it reads the `TunedInputConfig` artifact back from ML Metadata and
prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2
import tensorflow as tf
from tfx.components import ImportExampleGen
from tfx.orchestration import metadata
from tfx.orchestration import pipeline as tfx_pipeline
from tfx.orchestration.local.local_dag_runner import LocalDagRunner
from tfx.proto import trainer_pb2

from intune_tf import arguments
from intune_tf import criteo
from intune_tf import tfx as intune_tfx

PIPELINE_NAME = "intune_criteo"
MODULE_FILE = str(pathlib.Path(__file__).resolve().with_name(
    "criteo_module.py"))


def _example(dense, sparse, label) -> bytes:
  return tf.train.Example(features=tf.train.Features(feature={
      "label": tf.train.Feature(float_list=tf.train.FloatList(value=[label])),
      "dense": tf.train.Feature(float_list=tf.train.FloatList(value=dense)),
      "sparse": tf.train.Feature(int64_list=tf.train.Int64List(value=sparse)),
  })).SerializeToString()


def prepare_data(data_dir: str, rows: int, source: str = "auto") -> str:
  """Writes `rows` Criteo rows as TFRecords of `tf.train.Example`.

  Args:
    data_dir: output folder (ImportExampleGen's input_base).
    rows: rows to write (fewer if the real sample has fewer).
    source: "real" (the shared sample; fails without it), "synthetic", or
      "auto" (default: real when present).

  Returns:
    What the rows are ("real sample: <files>" or "synthetic").
  """
  files = criteo.real_sample_files() if source in ("auto", "real") else None
  if source == "real" and not files:
    raise FileNotFoundError("No real Criteo sample found (looked in "
                            "$INTUNE_CRITEO_DATA and ../shared/data/criteo).")
  tmp = None
  if files:
    described = "real sample: " + ", ".join(os.path.basename(f)
                                            for f in files)
  else:
    tmp = tempfile.TemporaryDirectory(prefix="intune-tfx-synthetic-")
    files = criteo.generate(rows, tmp.name, seed=0)
    described = "synthetic"
  tf.io.gfile.makedirs(data_dir)
  written = 0
  path = os.path.join(data_dir, "criteo.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    for features, label in criteo.read(files, batch_size=1024):
      dense, sparse = features["dense"].numpy(), features["sparse"].numpy()
      label = label.numpy()
      for i in range(min(len(label), rows - written)):
        writer.write(_example(dense[i], sparse[i], label[i]))
      written += min(len(label), rows - written)
      if written >= rows:
        break
  if tmp is not None:
    tmp.cleanup()
  return f"{written} rows, {described}"


def create_pipeline(pipeline_root: str,
                    data_root: str,
                    metadata_path: str,
                    *,
                    tune_seconds: float = 5.0,
                    policy: str | None = None,
                    batch_size: int = 256,
                    benchmark_repeats: int = 2,
                    benchmark_seconds: float = 1.5,
                    train_steps: int = 200,
                    eval_steps: int = 5) -> tfx_pipeline.Pipeline:
  """The pipeline: ImportExampleGen -> IntuneTuner -> Trainer (DLRM).

  Args:
    pipeline_root: artifact root.
    data_root: folder of TFRecords of `tf.train.Example`.
    metadata_path: the ML Metadata SQLite file.
    tune_seconds: IntuneTuner's tuning run (default 5).
    policy: InTune policy (default None: IntuneOptions' default).
    batch_size: rows per batch when tuning and training (default 256).
    benchmark_repeats: interleaved tuned/AUTOTUNE rounds (default 2).
    benchmark_seconds: seconds per variant and round (default 1.5).
    train_steps: training steps (default 200).
    eval_steps: evaluation steps (default 5).

  Returns:
    The `tfx_pipeline.Pipeline`.
  """
  example_gen = ImportExampleGen(input_base=data_root)
  tuner = intune_tfx.IntuneTuner(
      examples=example_gen.outputs["examples"], module_file=MODULE_FILE,
      tune_seconds=tune_seconds, policy=policy, batch_size=batch_size,
      split="train", benchmark_repeats=benchmark_repeats,
      benchmark_seconds=benchmark_seconds, warmup_seconds=0.5)
  trainer = intune_tfx.Trainer(
      examples=example_gen.outputs["examples"],
      tuned_input_config=tuner.outputs["tuned_input_config"],
      module_file=MODULE_FILE,
      train_args=trainer_pb2.TrainArgs(num_steps=train_steps),
      eval_args=trainer_pb2.EvalArgs(num_steps=eval_steps),
      custom_config={"batch_size": batch_size})
  return tfx_pipeline.Pipeline(
      pipeline_name=PIPELINE_NAME,
      pipeline_root=pipeline_root,
      components=[example_gen, tuner, trainer],
      metadata_connection_config=(
          metadata.sqlite_metadata_connection_config(metadata_path)),
      enable_cache=False)


def read_tuned_configs(metadata_path: str) -> list[dict]:
  """The `TunedInputConfig` artifacts recorded in an ML Metadata store.

  Args:
    metadata_path: the SQLite file.

  Returns:
    One dict per artifact, oldest first: `uri`, `properties`, and the
    contents of its `config.json` and `benchmark.json`.
  """
  config = metadata_store_pb2.ConnectionConfig()
  config.sqlite.filename_uri = metadata_path
  config.sqlite.connection_mode = (
      metadata_store_pb2.SqliteMetadataSourceConfig.READONLY)
  store = metadata_store.MetadataStore(config)
  result = []
  for artifact in sorted(
      store.get_artifacts_by_type(intune_tfx.TunedInputConfig.TYPE_NAME),
      key=lambda a: a.id):
    props = {}
    for name, value in artifact.properties.items():
      props[name] = getattr(value, value.WhichOneof("value"))
    entry = {"id": artifact.id, "uri": artifact.uri, "properties": props,
             "state": artifact.state}
    for key, name in (("config", "config.json"),
                      ("benchmark", "benchmark.json")):
      with tf.io.gfile.GFile(os.path.join(artifact.uri, name)) as f:
        entry[key] = json.load(f)
    result.append(entry)
  return result


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True,
                      help="folder for data, artifacts and the metadata store")
  parser.add_argument("--rows", type=arguments.positive_int, default=6000,
                      help="Criteo rows to use (default 6000)")
  parser.add_argument("--data", choices=("auto", "real", "synthetic"),
                      default="auto", help="where rows come from (default "
                      "auto: the real sample when present)")
  parser.add_argument("--tune-seconds", type=arguments.duration, default=5.0)
  parser.add_argument("--policy", default=None,
                      help="InTune policy (default: IntuneOptions' default)")
  parser.add_argument("--batch-size", type=arguments.positive_int, default=256)
  parser.add_argument("--benchmark-repeats",
                      type=arguments.positive_int, default=2)
  parser.add_argument("--benchmark-seconds",
                      type=arguments.duration, default=1.5)
  parser.add_argument("--train-steps", type=arguments.positive_int, default=200)
  args = parser.parse_args(argv)

  out = os.path.abspath(args.out)
  data_root = os.path.join(out, "data")
  metadata_path = os.path.join(out, "metadata.sqlite")
  if tf.io.gfile.exists(metadata_path):
    tf.io.gfile.remove(metadata_path)
  if tf.io.gfile.exists(data_root):
    tf.io.gfile.rmtree(data_root)
  print(f"data: {prepare_data(data_root, args.rows, args.data)}", flush=True)
  pipeline = create_pipeline(
      os.path.join(out, "pipeline_root"), data_root, metadata_path,
      tune_seconds=args.tune_seconds, policy=args.policy,
      batch_size=args.batch_size, benchmark_repeats=args.benchmark_repeats,
      benchmark_seconds=args.benchmark_seconds, train_steps=args.train_steps)
  LocalDagRunner().run(pipeline)
  for entry in read_tuned_configs(metadata_path):
    bench = entry["benchmark"]
    print(f"TunedInputConfig {entry['uri']}")
    print(f"  properties: {entry['properties']}")
    print(f"  knobs: {entry['config']['knobs']}")
    print(f"  rows/s tuned {bench['rows_per_s']:,.0f}, AUTOTUNE "
          f"{bench['autotune_rows_per_s']:,.0f} ({bench['speedup']:.2f}x, "
          f"median of {bench['benchmark_repeats']} interleaved rounds of "
          f"{bench['benchmark_seconds']:g} s)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
