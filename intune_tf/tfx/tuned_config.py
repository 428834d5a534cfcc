"""Applying a `TunedInputConfig` to a training input pipeline.

    def run_fn(fn_args):                       # the Trainer's module file
      ds = my_input_fn(intune_tf.tfx.read_records(fn_args.train_files,
                                                  repeat=True), 1024)
      ds = intune_tf.tfx.apply_tuned_config(ds, fn_args)
      model.fit(ds, steps_per_epoch=fn_args.train_steps)

Knob names are places in the pipeline (for example
"Prefetch.ParallelMapV2/parallelism", see `intune_tf.records.parse_knob`).
The same pipeline built the same way gets the same names, but a training
loop may add or drop stages around it (a `repeat`, Keras' own wrapping),
which changes the path above the tuned stages; configurations saved by
earlier versions name knobs by node id ("ParallelMapV2(id:5)/parallelism").
A configuration is therefore matched by name when every name exists in the
running pipeline, and otherwise by position: the i-th stage of a kind
counted from the input (the i-th `ParallelMapV2` parallelism, the i-th
`Prefetch` buffer size, ...).

Nothing here imports tfx: the helpers take a `TunedInputConfig` artifact,
its uri, its `config.json`, the Trainer's `FnArgs` or a configuration dict.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
from typing import Any, Iterable, Mapping, Sequence

import tensorflow as tf

from intune_tf import records
from intune_tf.live import registry
from intune_tf.options import IntuneOptions
from intune_tf.records import Knob
from intune_tf.tfdata import hooks
from intune_tf.tuning import policies

CONFIG_FILE = "config.json"
CONFIG_FORMAT = "intune_tf.config/1"
# Key of `FnArgs.custom_config` under which `intune_tf.tfx.Trainer` passes the
# uri of its `tuned_input_config` input.
TUNED_INPUT_CONFIG_KEY = "intune_tuned_input_config"
# The policy that holds the tuned configuration; "tuned+<name>" starts at it
# and hands over to policy <name>.
TUNED_POLICY = "tuned"


def _config_path(source: str | os.PathLike) -> str:
  path = os.fspath(source)
  if tf.io.gfile.isdir(path):
    path = os.path.join(path, CONFIG_FILE)
  return path


def load_tuned_config(source: Any) -> dict[str, Any]:
  """Reads a tuned configuration.

  Args:
    source: a `TunedInputConfig` artifact (anything with a `uri`), its uri
      directory, the path of its `config.json`, the Trainer's `FnArgs` (its
      `custom_config` carries the uri when the Trainer is
      `intune_tf.tfx.Trainer`), or a configuration mapping as
      `TuningSession.config()` returns it.

  Returns:
    `{"format": "intune_tf.config/1", "knobs": {knob name: value}}`.

  Raises:
    FileNotFoundError: there is no `config.json` where `source` points.
    ValueError: the file or mapping is not an intune_tf configuration, or
      `FnArgs` carry no tuned configuration.
  """
  where = "the given mapping"
  if isinstance(source, Mapping):
    config = source
  else:
    if hasattr(source, "custom_config") and not hasattr(source, "uri"):
      custom = source.custom_config or {}
      if TUNED_INPUT_CONFIG_KEY not in custom:
        raise ValueError(
            "These Trainer FnArgs carry no tuned input configuration: "
            f"custom_config has no {TUNED_INPUT_CONFIG_KEY!r} key. Use "
            "intune_tf.tfx.Trainer(..., tuned_input_config=tuner.outputs["
            "'tuned_input_config']) instead of the plain TFX Trainer, or "
            "pass the artifact's uri.")
      source = custom[TUNED_INPUT_CONFIG_KEY]
    if hasattr(source, "uri"):
      source = source.uri
    if not isinstance(source, (str, os.PathLike)):
      raise TypeError("A tuned input configuration comes from a "
                      "TunedInputConfig artifact, its uri, a config.json path, "
                      "Trainer FnArgs or a mapping, got "
                      f"{type(source).__name__}.")
    where = _config_path(source)
    if not tf.io.gfile.exists(where):
      raise FileNotFoundError(f"No tuned input configuration at {where!r} "
                              f"(expected the {CONFIG_FILE} of a "
                              "TunedInputConfig artifact).")
    with tf.io.gfile.GFile(where, "r") as f:
      try:
        config = json.loads(f.read())
      except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not JSON: {e}") from None
  if (not isinstance(config, Mapping) or
      config.get("format") != CONFIG_FORMAT or
      not isinstance(config.get("knobs"), Mapping)):
    raise ValueError(f"{where} is not an intune_tf configuration: expected "
                     f"an object with format {CONFIG_FORMAT!r} and 'knobs', "
                     "as TuningSession.config() returns it.")
  knobs = {}
  for name, value in config["knobs"].items():
    if not records.is_knob_name(str(name)) or isinstance(value, bool) or (
        not isinstance(value, (int, float))):
      raise ValueError(f"{where}: bad knob entry {name!r}: {value!r} "
                       "(expected '<stage>/<parameter>': number, e.g. "
                       "'Prefetch.ParallelMapV2/parallelism': 2).")
    knobs[str(name)] = float(value)
  return {"format": CONFIG_FORMAT, "knobs": knobs}


def _positions(names: Iterable[str]) -> dict[str, tuple[str, str, int]]:
  """`name -> (stage op, parameter, rank from the input end)`."""
  groups = collections.defaultdict(list)
  for name in names:
    try:
      stage, kind = records.parse_knob(name)
    except ValueError:
      continue
    groups[(stage.op, kind)].append(name)
  result = {}
  for (op, kind), members in groups.items():
    for rank, name in enumerate(sorted(members, key=records.input_first)):
      result[name] = (op, kind, rank)
  return result


def map_config(knobs: Mapping[str, float],
               live: Sequence[Knob]) -> dict[str, float]:
  """Maps a configuration onto the knobs of a running pipeline.

  Args:
    knobs: `{knob name: value}` of the tuned configuration.
    live: the running pipeline's knobs (`TuningSession.knobs()`).

  Returns:
    `{live knob name: value clamped to its range}`: by name when every
    configured name is live, else by position (see the module docstring).
    Knobs with no counterpart are left out.
  """
  by_name = {k.name: k for k in live}
  if set(knobs) <= set(by_name):
    pairs = [(by_name[n], v) for n, v in knobs.items()]
  else:
    live_at = {pos: by_name[n] for n, pos in _positions(by_name).items()}
    pairs = [(live_at[pos], knobs[n])
             for n, pos in _positions(knobs).items() if pos in live_at]
  return {k.name: float(min(max(float(v), k.min), k.max)) for k, v in pairs}


class TunedConfigPolicy(policies.Policy):
  """Starts every session at `IntuneOptions.config`, matched by
  `map_config`; then holds it, or hands over to another policy.

  Registered as "tuned" (hold) and, by `apply_tuned_config(then=NAME)`, as
  "tuned+NAME".
  """

  def __init__(self, options: IntuneOptions, then: str | None = None):
    super().__init__(options)
    self._then = None
    if then:
      self._then = registry.create(dataclasses.replace(options, policy=then))
    self.static = self._then is None or self._then.static
    self._started_with: tuple[str, ...] | None = None

  def bind(self, session) -> None:
    """Passes the live session on to the next policy (warm start)."""
    bind = getattr(self._then, "bind", None)
    if bind is not None:
      bind(session)

  def step(self, obs):
    names = tuple(sorted(k.name for k in obs.knobs))
    if names != self._started_with:
      # First step, or stages came or went (an inner iterator's knobs).
      self._started_with = names
      return map_config(self.options.config or {}, obs.knobs)
    return self._then.step(obs) if self._then is not None else {}


registry.register(TUNED_POLICY, TunedConfigPolicy)


def _register_then(then: str) -> str:
  registry.check_name(then)
  if then == TUNED_POLICY or then.startswith(TUNED_POLICY + "+"):
    raise ValueError(f"then={then!r}: the tuned configuration is already "
                     "where the session starts; name the policy to continue "
                     "with (e.g. 'even'), or None to hold it.")
  name = f"{TUNED_POLICY}+{then}"
  registry.register(name, lambda options: TunedConfigPolicy(options, then))
  return name


def apply_tuned_config(dataset: tf.data.Dataset,
                       source: Any,
                       *,
                       then: str | None = None,
                       **option_fields: Any) -> tf.data.Dataset:
  """Turns InTune on for `dataset`, starting at a tuned configuration.

  Every iterator of the returned dataset (every `model.fit` epoch) starts
  with its knobs at the tuned values, matched by `map_config`.

  Args:
    dataset: the training input pipeline, built as the tuned one was (the
      same `input_fn`; stages left on `tf.data.AUTOTUNE`).
    source: the tuned configuration: a `TunedInputConfig` artifact, its uri,
      its `config.json`, the Trainer's `FnArgs`, or a mapping (see
      `load_tuned_config`).
    then: the policy that tunes on from there. Default None: hold the tuned
      configuration (TF's autotuner stays off for this dataset).
    **option_fields: other `IntuneOptions` fields (`ram_budget`,
      `cpu_budget`, `period_s`, `name`, ...). Default: `IntuneOptions`'
      defaults.

  Returns:
    `dataset` with `experimental_intune` set.
  """
  config = load_tuned_config(source)
  for field in ("policy", "config"):
    if field in option_fields:
      raise TypeError(f"apply_tuned_config sets IntuneOptions.{field} itself; "
                      "use then= to name the policy to continue with.")
  policy = _register_then(then) if then else TUNED_POLICY
  return hooks.tune(dataset, policy=policy, config=config["knobs"],
                    **option_fields)


def read_records(file_pattern: str | Sequence[str],
                 *,
                 repeat: bool = False,
                 compression: str | None = None) -> tf.data.Dataset:
  """Serialized records of an `Examples` split, as ExampleGen writes them.

  Files are read by a parallel interleave left on `tf.data.AUTOTUNE` (a
  knob). Build the tuned pipeline and the training pipeline both from this,
  so that their stages correspond.

  Args:
    file_pattern: glob pattern(s), e.g. `FnArgs.train_files`
      (`<uri>/Split-train/*`).
    repeat: repeat the files forever (the tuning run and a Trainer that
      counts steps). Default False: one pass.
    compression: "GZIP", "" or None. Default None: "GZIP" for files ending
      in ".gz" (ExampleGen's default), else none.

  Returns:
    A dataset of serialized records (scalar `tf.string`).

  Raises:
    FileNotFoundError: no file matches.
    ValueError: compressed and plain files are mixed and `compression` is
      None.
  """
  patterns = [file_pattern] if isinstance(file_pattern, str) else list(
      file_pattern)
  files = sorted(f for p in patterns for f in tf.io.gfile.glob(p)
                 if not tf.io.gfile.isdir(f))
  if not files:
    raise FileNotFoundError(f"No record files match {patterns}.")
  if compression is None:
    kinds = {f.endswith(".gz") for f in files}
    if len(kinds) > 1:
      raise ValueError(f"Compressed and plain files are mixed in {patterns}: "
                       "pass compression=.")
    compression = "GZIP" if kinds.pop() else ""
  ds = tf.data.Dataset.from_tensor_slices(files)
  if repeat:
    ds = ds.repeat()
  return ds.interleave(
      lambda f: tf.data.TFRecordDataset(f, compression_type=compression),
      cycle_length=min(len(files), 4) if len(files) > 1 else 1,
      num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=False)
