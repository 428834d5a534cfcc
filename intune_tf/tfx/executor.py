"""Executors: `IntuneTuner`'s tuning run and the Trainer that passes its
artifact on to `run_fn`.

The tuning run, in the executor's process:

1. reads the chosen split of the `Examples` artifact with `read_records`
   (repeated), and builds the user's pipeline with `input_fn(records,
   batch_size)` from the module file;
2. iterates it with InTune on (`IntuneOptions(policy=...)`) for
   `tune_seconds`, and takes the best configuration the policy measured
   (the agent's guard), else the knob values in force at the end
   (`tuned_configuration`); saves the warm-start state and the fine-tuned
   agent's weights when there are any (`export_agent`);
3. measures the same pipeline under the tuned configuration and under plain
   AUTOTUNE, `benchmark_repeats` interleaved rounds (A B, B A, ...) of
   `benchmark_seconds` each after `warmup_seconds`, in rows/s at the
   pipeline's output;
4. writes `config.json` and `benchmark.json` into the `TunedInputConfig`
   artifact and sets its properties.
"""

from __future__ import annotations

import gc
import hashlib
import importlib
import importlib.util
import json
import os
import statistics
import sys
from typing import Any, Callable

from absl import logging
import tensorflow as tf
from tfx.components.trainer import executor as trainer_executor
from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils
from tfx.types import standard_artifact_utils

import intune_tf
from intune_tf import host
from intune_tf.agent import warmstart
from intune_tf.bench import meter as meter_lib
from intune_tf.live import registry
from intune_tf.live import tuner as tuner_lib
from intune_tf.tfx import artifacts
from intune_tf.tfx import tuned_config

# Keys of the component spec.
EXAMPLES_KEY = "examples"
# The channel the tuner writes and the trainer reads; the trainer passes its
# uri to `run_fn` under `tuned_config.TUNED_INPUT_CONFIG_KEY`.
TUNED_INPUT_CONFIG_CHANNEL = "tuned_input_config"
MODULE_FILE_KEY = "module_file"
INPUT_FN_KEY = "input_fn"
TUNE_SECONDS_KEY = "tune_seconds"
POLICY_KEY = "policy"
BATCH_SIZE_KEY = "batch_size"
SPLIT_KEY = "split"
BENCHMARK_REPEATS_KEY = "benchmark_repeats"
BENCHMARK_SECONDS_KEY = "benchmark_seconds"
WARMUP_SECONDS_KEY = "warmup_seconds"

DEFAULT_INPUT_FN = "input_fn"
DEFAULT_SPLIT = "train"
DEFAULT_TUNE_SECONDS = 60.0
DEFAULT_BATCH_SIZE = 4096
DEFAULT_BENCHMARK_REPEATS = 3
DEFAULT_BENCHMARK_SECONDS = 5.0
DEFAULT_WARMUP_SECONDS = 1.0

_SPLIT_PREFIX = "Split-"


def split_files(examples: Any, split: str) -> list[str]:
  """The data files of one split of an `Examples` artifact.

  Args:
    examples: the `Examples` artifact.
    split: the split name, e.g. "train".

  Returns:
    The split's files, sorted.

  Raises:
    ValueError: the artifact has no such split, or the split holds no file.
      The message names the uri and the splits found (in the artifact's
      `split_names` and on disk).
  """
  uri = examples.uri
  declared = []
  if examples.has_property("split_names") and examples.split_names:
    declared = standard_artifact_utils.decode_split_names(examples.split_names)
  on_disk = []
  if tf.io.gfile.isdir(uri):
    on_disk = sorted(d.rstrip("/")[len(_SPLIT_PREFIX):]
                     for d in tf.io.gfile.listdir(uri)
                     if d.startswith(_SPLIT_PREFIX))
  if split not in declared:
    found = (f"its split_names list {declared}" if declared else
             "its split_names property lists none")
    raise ValueError(
        f"IntuneTuner: the Examples artifact at {uri} has no split "
        f"{split!r}: {found}, and its directory holds split folders "
        f"{on_disk} ({_SPLIT_PREFIX}<name>). Set IntuneTuner(split=...) to "
        "one of its splits, or give it the output of an ExampleGen.")
  split_uri = os.path.join(uri, _SPLIT_PREFIX + split)
  files = []
  if tf.io.gfile.isdir(split_uri):
    files = sorted(os.path.join(split_uri, f)
                   for f in tf.io.gfile.listdir(split_uri)
                   if not tf.io.gfile.isdir(os.path.join(split_uri, f)))
  if not files:
    raise ValueError(f"IntuneTuner: split {split!r} of the Examples artifact "
                     f"at {uri} holds no data file (looked in {split_uri}; "
                     f"split folders there: {on_disk}).")
  return files


def load_input_fn(module_file: str | None, input_fn: str) -> Callable:
  """Loads the user's `input_fn(records, batch_size) -> tf.data.Dataset`.

  Args:
    module_file: path of the user's Python module file, or None when
      `input_fn` is a dotted path ("package.module.function").
    input_fn: the function's name in `module_file`, or its dotted path.

  Returns:
    The function.

  Raises:
    FileNotFoundError: `module_file` does not exist.
    ImportError: the module fails to import (the message names the module
      and the original error, which is chained).
    AttributeError: the module has no such function.
  """
  if module_file:
    if not tf.io.gfile.exists(module_file):
      raise FileNotFoundError(f"IntuneTuner: module file {module_file!r} does "
                              "not exist.")
    digest = hashlib.sha256(os.path.abspath(module_file).encode()).hexdigest()
    name = ("intune_user_module_" +
            os.path.splitext(os.path.basename(module_file))[0] + "_" +
            digest[:8])
    described = f"module file {module_file!r}"
    spec = importlib.util.spec_from_file_location(name, module_file)
    if spec is None or spec.loader is None:
      raise ImportError(f"IntuneTuner: cannot load {described}: not a Python "
                        "source file (.py).")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
      spec.loader.exec_module(module)
    except BaseException as e:
      sys.modules.pop(name, None)
      if isinstance(e, (KeyboardInterrupt, SystemExit)):
        raise
      raise ImportError(f"IntuneTuner: the {described} failed to import: "
                        f"{type(e).__name__}: {e}") from e
    fn_name = input_fn
  else:
    module_name, _, fn_name = input_fn.rpartition(".")
    if not module_name:
      raise ValueError("IntuneTuner needs module_file, or input_fn as a dotted "
                       f"path 'package.module.function'; got {input_fn!r}.")
    described = f"module {module_name!r}"
    try:
      module = importlib.import_module(module_name)
    except Exception as e:
      raise ImportError(f"IntuneTuner: the {described} failed to import: "
                        f"{type(e).__name__}: {e}") from e
  fn = getattr(module, fn_name, None)
  if not callable(fn):
    public = sorted(n for n, v in vars(module).items()
                    if callable(v) and not n.startswith("_"))
    raise AttributeError(f"IntuneTuner: the {described} has no function "
                         f"{fn_name!r} (it defines {public}). It should define "
                         f"{fn_name}(records, batch_size) -> tf.data.Dataset.")
  return fn


def _policy_of(session: "intune_tf.TuningSession") -> Any:
  """The policy instance tuning `session` (None if the tuner has none)."""
  get = getattr(tuner_lib.global_tuner(), "policy", None)
  return get(session.id) if get is not None else None


def tuned_configuration(session: "intune_tf.TuningSession"
                        ) -> tuple[dict[str, Any], str, float]:
  """The configuration a tuning run found.

  A policy with a no-regression guard (the "intune" agent) remembers the
  best configuration it measured: that one, when every knob of it is live.
  Otherwise the knob values in force now.

  Args:
    session: the live tuning session.

  Returns:
    (configuration as `TuningSession.config()` returns it, where it came from,
    the rows/s the policy measured for it or 0.0).
  """
  guard = getattr(_policy_of(session), "guard", None)
  if guard is not None and callable(getattr(guard, "best", None)):
    best, rate = guard.best()
    live = {k.name for k in session.knobs()}
    if best and set(best) <= live:
      config = {"format": tuned_config.CONFIG_FORMAT,
                "knobs": {k: float(v) for k, v in sorted(best.items())}}
      return config, "best configuration measured by the policy", float(rate)
  return session.config(), "knobs in force at the end of the run", 0.0


def export_agent(session: "intune_tf.TuningSession", config: dict[str, Any],
                 rows_per_s: float, directory: str) -> list[str]:
  """Saves the warm-start state of the tuning run into the artifact.

  The hook: with `intune_tf.agent.warmstart` present, the tuned configuration
  and, when the policy has a fine-tuned agent (`policy.agent.get_weights()`
  after gradient steps), its weights are saved with `warmstart.save` (into the
  machine's warm-start folder, so the next run of this pipeline here starts
  from them) and the files it wrote (`<key>.json`, `<key>.npz`) are copied into
  `directory`. Copy them into `$INTUNE_WARMSTART_DIR` of another machine of the
  same kind to warm-start there. Without `intune_tf.agent.warmstart`, or for a
  session with no graph fingerprint, nothing is written.

  Args:
    session: the live tuning session.
    config: the tuned configuration (`TuningSession.config()` format).
    rows_per_s: its measured rows/s (0.0 if unknown).
    directory: where the files go (the artifact's `agent/`).

  Returns:
    The files written, relative to the artifact's uri.
  """
  weights = warmstart.fine_tuned_weights(_policy_of(session))
  saved = warmstart.save(session, config["knobs"], rows_per_s, weights)
  if not saved:
    return []
  tf.io.gfile.makedirs(directory)
  written = []
  for path in (saved, os.path.splitext(saved)[0] + ".npz"):
    if weights is None and path.endswith(".npz"):
      continue
    if tf.io.gfile.exists(path):
      target = os.path.join(directory, os.path.basename(path))
      tf.io.gfile.copy(path, target, overwrite=True)
      written.append(os.path.join(artifacts.AGENT_DIR,
                                  os.path.basename(path)))
  return written


def _rows(element: Any) -> int:
  first = tf.nest.flatten(element)[0]
  return int(first.shape[0]) if first.shape.rank else 1


def _session_of(it: Any) -> "intune_tf.TuningSession | None":
  try:
    return intune_tf.session_of(it)
  except ValueError:  # InTune is off for this run (an AUTOTUNE baseline)
    return None


def _run(ds: tf.data.Dataset, seconds: float, warmup: float,
         on_end: Callable[["intune_tf.TuningSession | None"], Any] | None = None
         ) -> tuple[float, int, Any]:
  """Iterates `ds` for `warmup` then `seconds`; returns (rows/s over the
  measured window, rows measured, on_end(session) while it is alive)."""
  it = iter(ds)
  session = _session_of(it)
  meter = meter_lib.pull(it, seconds, warmup, _rows)
  extra = on_end(session) if on_end is not None else None
  del it
  gc.collect()
  return meter.rows_per_s, meter.rows, extra


def tune_and_benchmark(make_dataset: Callable[[], tf.data.Dataset],
                       *,
                       policy: str,
                       tune_seconds: float,
                       benchmark_repeats: int,
                       benchmark_seconds: float,
                       warmup_seconds: float,
                       agent_dir: str | None = None) -> dict[str, Any]:
  """Tunes a pipeline, then measures it tuned and under AUTOTUNE.

  Args:
    make_dataset: builds the pipeline (a new one per call, no InTune option).
    policy: the InTune policy that tunes.
    tune_seconds: length of the tuning run.
    benchmark_repeats: interleaved rounds of the two variants.
    benchmark_seconds: measured seconds per variant and round.
    warmup_seconds: unmeasured seconds before each measurement.
    agent_dir: where `export_agent` saves the agent; None: nowhere.

  Returns:
    `{"config": TuningSession.config(), "benchmark": figures}`.

  Raises:
    ValueError: the pipeline has no tunable stage, or yields nothing.
  """
  def finish_tuning(session):
    if session is None:
      return None, "", [], None
    config, source, rate = tuned_configuration(session)
    files, error = [], None
    if agent_dir and config["knobs"]:
      try:
        files = export_agent(session, config, rate, agent_dir)
      except Exception as e:  # noqa: BLE001
        # The configuration and figures are the artifact's main content.
        logging.warning("IntuneTuner: the agent's warm-start files were not "
                        "exported: %r", e)
        error = repr(e)
    return config, source, files, error

  tuning_rate, tuning_rows, (config, source, agent_files, agent_error) = _run(
      intune_tf.tune(make_dataset(), policy=policy), tune_seconds, 0.0,
      finish_tuning)
  if tuning_rows == 0:
    raise ValueError("IntuneTuner: the input pipeline yielded no element.")
  if config is None:
    raise RuntimeError(
        "IntuneTuner: iterating the pipeline started no InTune session: the "
        "experimental_intune option did not reach the iterator (a dataset "
        "rebuilt from a variant or serialized graph loses it).")
  if not config["knobs"]:
    raise ValueError(
        "IntuneTuner: the input pipeline has no tunable stage: leave "
        "parallelism and prefetch sizes of input_fn's stages on "
        "tf.data.AUTOTUNE (num_parallel_calls=tf.data.AUTOTUNE, "
        "prefetch(tf.data.AUTOTUNE)) so that InTune can tune them.")

  runs, in_force = [], None
  for r in range(benchmark_repeats):
    for variant in (("tuned", "autotune") if r % 2 == 0 else
                    ("autotune", "tuned")):
      ds = make_dataset()
      if variant == "tuned":
        ds = tuned_config.apply_tuned_config(ds, config)
      rate, _, knobs = _run(
          ds, benchmark_seconds, warmup_seconds,
          (lambda s: s.config()["knobs"] if s is not None else None)
          if variant == "tuned" else None)
      if variant == "tuned" and in_force is None:
        in_force = knobs
      runs.append({"round": r, "variant": variant, "rows_per_s": rate})
  tuned = statistics.median(x["rows_per_s"] for x in runs
                            if x["variant"] == "tuned")
  autotune = statistics.median(x["rows_per_s"] for x in runs
                               if x["variant"] == "autotune")
  return {
      "config": config,
      "benchmark": {
          "format": artifacts.BENCHMARK_FORMAT,
          "rows_per_s": tuned,
          "autotune_rows_per_s": autotune,
          "speedup": tuned / autotune if autotune > 0 else 0.0,
          "runs": runs,
          "tuned_knobs_in_force": in_force,
          "tuning": {"policy": policy, "seconds": tune_seconds,
                     "rows_per_s": tuning_rate, "config_source": source},
          "benchmark_repeats": benchmark_repeats,
          "benchmark_seconds": benchmark_seconds,
          "warmup_seconds": warmup_seconds,
          "agent_files": agent_files,
          "agent_export_error": agent_error,
          "usable_cpus": host.usable_cpus(),
          "tensorflow": tf.__version__,
          "intune_tf": intune_tf.__version__,
      },
  }


def _positive(exec_properties: dict[str, Any], key: str, default: Any,
              kind: type) -> Any:
  value = exec_properties.get(key)
  value = default if value is None else kind(value)
  if value <= 0:
    raise ValueError(f"IntuneTuner: {key} must be positive, got {value!r}.")
  return value


class Executor(base_executor.BaseExecutor):
  """Runs `IntuneTuner`: tunes the input pipeline, writes the artifact."""

  def Do(self, input_dict: dict[str, list[Any]],
         output_dict: dict[str, list[Any]],
         exec_properties: dict[str, Any]) -> None:
    """Tunes the user's pipeline on one split of the examples.

    Args:
      input_dict: `examples`: one `Examples` artifact.
      output_dict: `tuned_input_config`: one `TunedInputConfig` artifact.
      exec_properties: `module_file`, `input_fn` (default "input_fn"),
        `tune_seconds` (default 60), `policy` (default: `IntuneOptions()`'s
        default policy), `batch_size` (default 4096), `split` (default
        "train"), `benchmark_repeats` (default 3), `benchmark_seconds`
        (default 5), `warmup_seconds` (default 1).

    Raises:
      ValueError: no such split, a bad parameter, or a pipeline that cannot
        be tuned.
      ImportError: the module file fails to import.
    """
    self._log_startup(input_dict, output_dict, exec_properties)
    examples = artifact_utils.get_single_instance(input_dict[EXAMPLES_KEY])
    out = artifact_utils.get_single_instance(
        output_dict[TUNED_INPUT_CONFIG_CHANNEL])
    split = exec_properties.get(SPLIT_KEY) or DEFAULT_SPLIT
    policy = (exec_properties.get(POLICY_KEY) or
              intune_tf.IntuneOptions().policy)
    registry.check_name(policy)
    batch_size = _positive(exec_properties, BATCH_SIZE_KEY,
                           DEFAULT_BATCH_SIZE, int)
    tune_seconds = _positive(exec_properties, TUNE_SECONDS_KEY,
                             DEFAULT_TUNE_SECONDS, float)
    repeats = _positive(exec_properties, BENCHMARK_REPEATS_KEY,
                        DEFAULT_BENCHMARK_REPEATS, int)
    seconds = _positive(exec_properties, BENCHMARK_SECONDS_KEY,
                        DEFAULT_BENCHMARK_SECONDS, float)
    warmup = exec_properties.get(WARMUP_SECONDS_KEY)
    warmup = DEFAULT_WARMUP_SECONDS if warmup is None else float(warmup)

    files = split_files(examples, split)
    input_fn = load_input_fn(exec_properties.get(MODULE_FILE_KEY),
                             exec_properties.get(INPUT_FN_KEY) or
                             DEFAULT_INPUT_FN)

    def make_dataset() -> tf.data.Dataset:
      ds = input_fn(tuned_config.read_records(files, repeat=True), batch_size)
      if not isinstance(ds, tf.data.Dataset):
        raise TypeError(f"IntuneTuner: input_fn returned "
                        f"{type(ds).__name__}, not a tf.data.Dataset.")
      return ds

    logging.info("IntuneTuner: tuning %d file(s) of split %r with policy %r "
                 "for %.1f s.", len(files), split, policy, tune_seconds)
    result = tune_and_benchmark(
        make_dataset, policy=policy, tune_seconds=tune_seconds,
        benchmark_repeats=repeats, benchmark_seconds=seconds,
        warmup_seconds=warmup,
        agent_dir=os.path.join(out.uri, artifacts.AGENT_DIR))
    bench = result["benchmark"]
    bench.update({"split": split, "batch_size": batch_size, "files": files,
                  "examples_uri": examples.uri})
    tf.io.gfile.makedirs(out.uri)
    with tf.io.gfile.GFile(os.path.join(out.uri, artifacts.CONFIG_FILE),
                           "w") as f:
      f.write(json.dumps(result["config"], indent=1, sort_keys=True) + "\n")
    with tf.io.gfile.GFile(os.path.join(out.uri, artifacts.BENCHMARK_FILE),
                           "w") as f:
      f.write(json.dumps(bench, indent=1, sort_keys=True) + "\n")
    out.rows_per_s = float(bench["rows_per_s"])
    out.autotune_rows_per_s = float(bench["autotune_rows_per_s"])
    out.speedup = float(bench["speedup"])
    out.num_knobs = len(result["config"]["knobs"])
    out.policy = policy
    out.split = split
    logging.info("IntuneTuner: %d knobs tuned; %.0f rows/s tuned vs %.0f "
                 "under AUTOTUNE (%.2fx).", out.num_knobs, out.rows_per_s,
                 out.autotune_rows_per_s, out.speedup)


class TrainerExecutor(trainer_executor.GenericExecutor):
  """TFX's generic Trainer executor, which also hands the uri of the
  `tuned_input_config` input to `run_fn` as
  `fn_args.custom_config["intune_tuned_input_config"]`."""

  def _GetFnArgs(self, input_dict, output_dict, exec_properties):
    fn_args = super()._GetFnArgs(input_dict, output_dict, exec_properties)
    tuned = input_dict.get(TUNED_INPUT_CONFIG_CHANNEL)
    if tuned:
      fn_args.custom_config = dict(fn_args.custom_config or {})
      fn_args.custom_config[tuned_config.TUNED_INPUT_CONFIG_KEY] = (
          artifact_utils.get_single_uri(tuned))
    return fn_args
