"""TFX components: `IntuneTuner`, and a `Trainer` that takes its output.

    tuner = intune_tf.tfx.IntuneTuner(
        examples=example_gen.outputs["examples"], module_file=MODULE,
        tune_seconds=60, batch_size=4096)
    trainer = intune_tf.tfx.Trainer(
        examples=example_gen.outputs["examples"],
        tuned_input_config=tuner.outputs["tuned_input_config"],
        module_file=MODULE, train_args=..., eval_args=...)
"""

from __future__ import annotations

from typing import Any

from tfx.dsl.components.base import base_component
from tfx.dsl.components.base import executor_spec
from tfx.proto import trainer_pb2
from tfx.types import channel as channel_types
from tfx.types import component_spec
from tfx.types import standard_artifacts
from tfx.types import standard_component_specs
from tfx.utils import json_utils

from intune_tf.tfx import executor
from intune_tf.tfx.artifacts import TunedInputConfig


class IntuneTunerSpec(component_spec.ComponentSpec):
  """Spec of `IntuneTuner`."""

  PARAMETERS = {
      executor.MODULE_FILE_KEY:
          component_spec.ExecutionParameter(type=str, optional=True),
      executor.INPUT_FN_KEY:
          component_spec.ExecutionParameter(type=str, optional=True),
      executor.TUNE_SECONDS_KEY:
          component_spec.ExecutionParameter(type=float),
      executor.POLICY_KEY:
          component_spec.ExecutionParameter(type=str, optional=True),
      executor.BATCH_SIZE_KEY:
          component_spec.ExecutionParameter(type=int),
      executor.SPLIT_KEY:
          component_spec.ExecutionParameter(type=str),
      executor.BENCHMARK_REPEATS_KEY:
          component_spec.ExecutionParameter(type=int),
      executor.BENCHMARK_SECONDS_KEY:
          component_spec.ExecutionParameter(type=float),
      executor.WARMUP_SECONDS_KEY:
          component_spec.ExecutionParameter(type=float),
  }
  INPUTS = {
      executor.EXAMPLES_KEY:
          component_spec.ChannelParameter(type=standard_artifacts.Examples),
  }
  OUTPUTS = {
      executor.TUNED_INPUT_CONFIG_CHANNEL:
          component_spec.ChannelParameter(type=TunedInputConfig),
  }


class IntuneTuner(base_component.BaseComponent):
  """Tunes the input pipeline of the user's `input_fn` with InTune.

  Output `tuned_input_config`: a `TunedInputConfig` artifact (see
  `intune_tf.tfx.artifacts`): the tuned knob configuration, the agent's
  warm-start files when the policy has any, and the benchmark figures of
  the run (tuned vs AUTOTUNE rows/s), also set as artifact properties.

  Args:
    examples: channel of `Examples` (TFRecords of serialized records, as
      ExampleGen writes them; one folder `Split-<name>` per split).
    module_file: path of a Python module file defining
      `input_fn(records: tf.data.Dataset, batch_size: int) ->
      tf.data.Dataset`: it maps the dataset of serialized records of the
      split to the training batches (`(features, label)`), with the stages
      to tune left on `tf.data.AUTOTUNE`. Default None: then `input_fn` must
      be a dotted path.
    input_fn: the function's name in `module_file`, or its dotted path
      ("package.module.function") without a module file. Default
      "input_fn".
    tune_seconds: length of the tuning run. Default 60.
    policy: the InTune policy that tunes. Default None: the default policy
      of `intune_tf.IntuneOptions()` where the executor runs.
    batch_size: passed to `input_fn`. Default 4096.
    split: the split to tune on. Default "train".
    benchmark_repeats: interleaved rounds (tuned, AUTOTUNE) of the benchmark
      after tuning. Default 3.
    benchmark_seconds: measured seconds per variant and round. Default 5.
    warmup_seconds: unmeasured seconds before each measurement. Default 1.
  """

  SPEC_CLASS = IntuneTunerSpec
  EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

  def __init__(self,
               examples: channel_types.BaseChannel,
               module_file: str | None = None,
               input_fn: str = executor.DEFAULT_INPUT_FN,
               tune_seconds: float = executor.DEFAULT_TUNE_SECONDS,
               policy: str | None = None,
               batch_size: int = executor.DEFAULT_BATCH_SIZE,
               split: str = executor.DEFAULT_SPLIT,
               benchmark_repeats: int = executor.DEFAULT_BENCHMARK_REPEATS,
               benchmark_seconds: float = executor.DEFAULT_BENCHMARK_SECONDS,
               warmup_seconds: float = executor.DEFAULT_WARMUP_SECONDS):
    if not module_file and "." not in (input_fn or ""):
      raise ValueError("IntuneTuner needs module_file=, or input_fn= as a "
                       "dotted path 'package.module.function'.")
    for name, value in (("tune_seconds", tune_seconds),
                        ("batch_size", batch_size),
                        ("benchmark_repeats", benchmark_repeats),
                        ("benchmark_seconds", benchmark_seconds)):
      if isinstance(value, bool) or not isinstance(value, (int, float)) or (
          value <= 0):
        raise ValueError(f"IntuneTuner: {name} must be a positive number, got "
                         f"{value!r}.")
    if warmup_seconds < 0:
      raise ValueError(f"IntuneTuner: warmup_seconds must be >= 0, got "
                       f"{warmup_seconds!r}.")
    spec = IntuneTunerSpec(
        examples=examples,
        module_file=module_file,
        input_fn=input_fn,
        tune_seconds=float(tune_seconds),
        policy=policy,
        batch_size=int(batch_size),
        split=split,
        benchmark_repeats=int(benchmark_repeats),
        benchmark_seconds=float(benchmark_seconds),
        warmup_seconds=float(warmup_seconds),
        tuned_input_config=channel_types.Channel(type=TunedInputConfig))
    super().__init__(spec=spec)


class TrainerSpec(standard_component_specs.TrainerSpec):
  """TFX's Trainer spec plus an optional `tuned_input_config` input."""

  INPUTS = {
      **standard_component_specs.TrainerSpec.INPUTS,
      executor.TUNED_INPUT_CONFIG_CHANNEL:
          component_spec.ChannelParameter(type=TunedInputConfig,
                                          optional=True),
  }


class Trainer(base_component.BaseComponent):
  """TFX's Trainer (generic executor) that also takes a `TunedInputConfig`.

  The artifact's uri reaches `run_fn` as
  `fn_args.custom_config["intune_tuned_input_config"]`;
  `intune_tf.tfx.apply_tuned_config(dataset, fn_args)` applies it.

  Unlike TFX's Trainer, the module file is imported from its path where the
  executor runs (no wheel is built and pip-installed), as `IntuneTuner`
  does; this suits `LocalDagRunner`. Use `run_fn=` with a dotted path for
  code installed as a package.

  Args:
    examples: channel of `Examples` to train on.
    tuned_input_config: channel of `TunedInputConfig` (the output of an
      `IntuneTuner`). Default None: plain TFX Trainer behaviour.
    module_file: a Python module file defining `run_fn(fn_args)`. Exactly
      one of `module_file` and `run_fn`.
    run_fn: dotted path of the `run_fn`.
    train_args: `trainer_pb2.TrainArgs` (splits, num_steps). Default: empty.
    eval_args: `trainer_pb2.EvalArgs`. Default: empty.
    custom_config: dict passed to `run_fn` as `fn_args.custom_config`.
      Default None.
    schema: optional channel of `Schema`.
    transform_graph: optional channel of `TransformGraph`.
    base_model: optional channel of `Model` to warm-start from.
    hyperparameters: optional channel of `HyperParameters`.
  """

  SPEC_CLASS = TrainerSpec
  EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.TrainerExecutor)

  def __init__(self,
               examples: channel_types.BaseChannel,
               tuned_input_config: channel_types.BaseChannel | None = None,
               module_file: str | None = None,
               run_fn: str | None = None,
               train_args: trainer_pb2.TrainArgs | None = None,
               eval_args: trainer_pb2.EvalArgs | None = None,
               custom_config: dict[str, Any] | None = None,
               schema: channel_types.BaseChannel | None = None,
               transform_graph: channel_types.BaseChannel | None = None,
               base_model: channel_types.BaseChannel | None = None,
               hyperparameters: channel_types.BaseChannel | None = None):
    if bool(module_file) == bool(run_fn):
      raise ValueError("intune_tf.tfx.Trainer needs exactly one of "
                       "module_file= and run_fn=.")
    spec = TrainerSpec(
        examples=examples,
        tuned_input_config=tuned_input_config,
        transform_graph=transform_graph,
        schema=schema,
        base_model=base_model,
        hyperparameters=hyperparameters,
        train_args=train_args or trainer_pb2.TrainArgs(),
        eval_args=eval_args or trainer_pb2.EvalArgs(),
        module_file=module_file,
        run_fn=run_fn,
        custom_config=json_utils.dumps(custom_config),
        model=channel_types.Channel(type=standard_artifacts.Model),
        model_run=channel_types.Channel(type=standard_artifacts.ModelRun))
    super().__init__(spec=spec)
