"""Live tuning sessions: the public handle on a tuned pipeline's knobs.

There is one session per live iterator of a dataset with
`experimental_intune` on. Sessions are created by the kernel library when the
iterator is created and disappear when it is destroyed.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import math
import re
from typing import Any, Mapping

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import model_pb2

from intune_tf import _kernels
from intune_tf.options import IntuneOptions

KINDS = ("parallelism", "buffer_size")
_CONFIG_FORMAT = "intune_tf.config/1"
# Order of the counters returned by the IntuneSessionStats op.
_COUNTERS = ("elements", "gap_time_us", "gap_count", "get_next_time_us",
             "buffered_bytes", "peak_buffered_bytes", "ram_budget",
             "guard_shrinks", "guard_over_budget", "created_us")
# Columns of the per-node statistics returned by the IntuneObserve op.
_STAGE_COLUMNS = ("elements", "processing_time_ns", "buffered_bytes",
                  "buffered_elements", "bytes_produced", "bytes_consumed")
# Most tuples of (knob name, value) pairs a session keeps as tensors for
# `Session.set`.
_SET_TENSORS = 256


class SessionGoneError(RuntimeError):
  """The session's iterator was destroyed; its knobs no longer exist."""


@dataclasses.dataclass(frozen=True)
class Knob:
  """A tunable parameter of one pipeline stage.

  Attributes:
    name: stable readable name, "<Stage>(id:<n>)/<parameter>", for example
      "ParallelMapV2(id:2)/parallelism".
    kind: "parallelism" (threads of a parallel stage) or "buffer_size"
      (elements a prefetch may hold).
    value: the value in force.
    min: smallest allowed value.
    max: largest allowed value.
  """
  name: str
  kind: str
  value: float
  min: float
  max: float

  @property
  def stage(self) -> str:
    return self.name.rpartition("/")[0]


@dataclasses.dataclass(frozen=True)
class StageStats:
  """Cumulative statistics of one stage, from the pipeline's model.

  Attributes:
    name: stage name as in knob names, e.g. "ParallelMapV2(id:2)".
    elements: elements produced so far.
    processing_time_ns: CPU-side time spent producing them (summed over
      threads), nanoseconds.
    buffered_bytes: bytes held in the stage's buffer now.
    buffered_elements: elements held in the stage's buffer now.
    bytes_produced: bytes produced so far.
    bytes_consumed: bytes consumed so far.
    parameters: current parameter values, by parameter name.
    inputs: names of the stages that feed this one.
  """
  name: str
  elements: int
  processing_time_ns: int
  buffered_bytes: int
  buffered_elements: int
  bytes_produced: int
  bytes_consumed: int
  parameters: dict[str, float]
  inputs: tuple[str, ...]

  @property
  def time_per_element_ns(self) -> float:
    return self.processing_time_ns / self.elements if self.elements else 0.0


@dataclasses.dataclass(frozen=True)
class _Snapshot:
  """One `IntuneObserve` reading: knobs, nodes breadth first from the output
  with columns `_STAGE_COLUMNS`, and the counters."""
  knobs: tuple[Knob, ...]
  stage_names: tuple[str, ...]
  stage_stats: Any  # np.ndarray [nodes, len(_STAGE_COLUMNS)], int64
  counters: dict[str, int]


def _make_knobs(names, values, mins, maxs) -> list[Knob]:
  """Knobs of the kinds we tune, from the input stage to the output stage."""
  values, mins, maxs = (np.asarray(a, np.float64).tolist()
                        for a in (values, mins, maxs))
  return [Knob(name, kind, values[i], mins[i], maxs[i])
          for i, name, kind in _knob_layout(tuple(names))]


@functools.lru_cache(maxsize=64)
def _knob_layout(names: tuple[bytes, ...]) -> tuple[tuple[int, str, str], ...]:
  """(index in `names`, name, kind) of the knobs of the kinds we tune, from
  the input stage to the output stage."""
  layout = []
  for i, n in enumerate(names):
    name = n.decode()
    kind = name.rpartition("/")[2]
    if kind in KINDS:
      layout.append((i, name, kind))
  layout.sort(key=lambda k: (-_stage_id(k[1].rpartition("/")[0]), k[1]))
  return tuple(layout)


def _clean(message: str) -> str:
  """Strips TF's op-wrapper decoration from a kernel error message."""
  message = re.sub(r"^\{\{[^}]*\}\}\s*", "", message.strip())
  return re.sub(r"\s*\[Op:[^\]]*\].*$", "", message)


def _stage_id(stage: str) -> int:
  """The model's node id in "Name(id:N)": deeper stages have larger ids."""
  match = re.search(r"\(id:(\d+)\)$", stage)
  return int(match.group(1)) if match else 0


class Session:
  """A live tuned pipeline: list, read and set its knobs."""

  def __init__(self, session_id: int, tag: str):
    self._id = int(session_id)
    self._id_tensor: tf.Tensor | None = None
    self._last_knobs: tuple[tuple, tuple[Knob, ...]] | None = None
    self._set_tensors: dict[tuple, tuple[tf.Tensor, tf.Tensor]] = {}
    self._tag = tag
    try:
      self._options = IntuneOptions.from_json(tag) if tag else IntuneOptions()
    except (ValueError, TypeError):
      self._options = IntuneOptions()
    try:
      self._fingerprint = str(json.loads(tag).get("fingerprint") or "")
    except (ValueError, TypeError, AttributeError):
      self._fingerprint = ""

  def __repr__(self) -> str:
    name = f" {self._options.name!r}" if self._options.name else ""
    return f"<intune_tf.Session {self._id}{name}>"

  def __eq__(self, other: Any) -> bool:
    return isinstance(other, Session) and other._id == self._id

  def __hash__(self) -> int:
    return hash(self._id)

  @property
  def id(self) -> int:
    return self._id

  @property
  def options(self) -> IntuneOptions:
    """The `IntuneOptions` the dataset was tuned with."""
    return self._options

  @property
  def fingerprint(self) -> str:
    """The pipeline graph's warm-start fingerprint ("" when unknown)."""
    return self._fingerprint

  @property
  def alive(self) -> bool:
    return self._id in _live_ids()

  def _call(self, fn, *args):
    try:
      with tf.device("/cpu:0"):
        if self._id_tensor is None:
          self._id_tensor = tf.constant(self._id, tf.int64)
        return fn(self._id_tensor, *args)
    except tf.errors.NotFoundError as e:
      if "is gone" in e.message:
        raise SessionGoneError(_clean(e.message)) from None
      raise

  def knobs(self) -> list[Knob]:
    """The pipeline's knobs, from the input stage to the output stage."""
    names, values, mins, maxs = self._call(_kernels.ops().intune_list_knobs)
    return _make_knobs(names.numpy(), values.numpy(), mins.numpy(),
                       maxs.numpy())

  def _snapshot(self) -> "_Snapshot":
    """Knobs, per-node statistics and counters in one op call: the tuner's
    reading each step (`stats()` parses a whole ModelProto instead)."""
    knob_names, knob_values, stage_names, stage_stats, counters = self._call(
        _kernels.ops().intune_observe)
    names, kv = tuple(knob_names.numpy().tolist()), knob_values.numpy()
    key = (names, kv.tobytes())
    cached = self._last_knobs
    if cached is None or cached[0] != key:
      cached = (key, tuple(_make_knobs(names, kv[:, 0], kv[:, 1], kv[:, 2])))
      self._last_knobs = cached
    return _Snapshot(
        knobs=cached[1],
        stage_names=tuple(map(bytes.decode, stage_names.numpy().tolist())),
        stage_stats=stage_stats.numpy(),
        counters=dict(zip(_COUNTERS, counters.numpy().tolist())))

  def set(self, values: Mapping[str, float]) -> dict[str, float]:
    """Sets several knobs at once: all of them, or none if one is invalid.

    Args:
      values: `{knob name: value}`; values are rounded to integers.

    Returns:
      The values in force afterwards. The budget guard may have lowered
      memory knobs below what was asked.

    Raises:
      KeyError: a name is not a knob of this session (the message lists the
        valid names).
      ValueError: a value is outside the knob's [min, max].
      SessionGoneError: the iterator is gone.
    """
    if not values:
      return {}
    # Names and ranges are checked by the kernel, which applies nothing
    # unless every pair is valid (one op call: `set` is in the tuning step).
    for name, value in values.items():
      if (isinstance(value, bool) or not isinstance(value, (int, float)) or
          not math.isfinite(value)):
        raise ValueError(f"Value {value!r} for knob {name!r} is not a finite "
                         "number.")
    items = tuple(values.items())
    try:
      applied = self._call(_kernels.ops().intune_set_knobs,
                           *self._set_inputs(items))
    except tf.errors.NotFoundError as e:  # a knob vanished meanwhile
      raise KeyError(_clean(e.message)) from None
    except tf.errors.OutOfRangeError as e:
      raise ValueError(_clean(e.message)) from None
    return dict(zip((name for name, _ in items), applied.numpy().tolist()))

  def _set_inputs(self, items: tuple[tuple[str, float], ...]
                  ) -> tuple[tf.Tensor, tf.Tensor]:
    """The names and values tensors of `IntuneSetKnobs` for `items`, made
    once per tuple of (name, value) pairs (the tuner moves the same few
    knobs among a few values)."""
    inputs = self._set_tensors.get(items)
    if inputs is None:
      if len(self._set_tensors) >= _SET_TENSORS:
        self._set_tensors.clear()
      with tf.device("/cpu:0"):
        inputs = (tf.constant([name for name, _ in items], tf.string),
                  tf.constant([float(value) for _, value in items],
                              tf.float64))
      self._set_tensors[items] = inputs
    return inputs

  def model_proto(self) -> model_pb2.ModelProto:
    """A snapshot of the pipeline's tf.data model (`ModelProto`)."""
    serialized = self._call(_kernels.ops().intune_model_proto)
    return model_pb2.ModelProto.FromString(serialized.numpy())

  def stats(self) -> list[StageStats]:
    """Per-stage statistics, output stage first."""
    proto = self.model_proto()
    nodes = dict(proto.nodes.items())  # one pass over the proto map
    names = {nid: f"{node.name}(id:{nid})" for nid, node in nodes.items()}
    order, seen = [], set()
    todo = collections.deque([proto.output] if proto.output in nodes else [])
    while todo:
      nid = todo.popleft()
      if nid in seen or nid not in nodes:
        continue
      seen.add(nid)
      order.append(nid)
      todo.extend(nodes[nid].inputs)
    result = []
    for nid in order:
      node = nodes[nid]
      result.append(StageStats(
          name=names[nid], elements=node.num_elements,
          processing_time_ns=node.processing_time,
          buffered_bytes=node.buffered_bytes,
          buffered_elements=node.buffered_elements,
          bytes_produced=node.bytes_produced,
          bytes_consumed=node.bytes_consumed,
          parameters={p.name: p.value for p in node.parameters},
          inputs=tuple(names[i] for i in node.inputs if i in names)))
    return result

  def counters(self) -> dict[str, int]:
    """Session counters: elements returned, consumer gap time (us), time in
    GetNext (us), buffered and peak buffered bytes, RAM budget, guard
    actions."""
    values = self._call(_kernels.ops().intune_session_stats).numpy()
    return dict(zip(_COUNTERS, (int(v) for v in values)))

  def set_ram_budget(self, ram_budget: int) -> None:
    """Changes the RAM budget that the guard enforces, in bytes (> 0)."""
    if isinstance(ram_budget, bool) or not isinstance(ram_budget, int) or (
        ram_budget <= 0):
      raise ValueError(f"ram_budget must be a positive int of bytes, got "
                       f"{ram_budget!r}.")
    self._call(_kernels.ops().intune_set_ram_budget,
               tf.constant(ram_budget, tf.int64))

  def config(self) -> dict[str, Any]:
    """The knob values in force, as a JSON-serializable configuration."""
    return {"format": _CONFIG_FORMAT,
            "knobs": {k.name: k.value for k in self.knobs()}}

  def apply_config(self, config: Mapping[str, Any]) -> dict[str, float]:
    """Applies a configuration from `config()` (or a JSON string of one).

    Knobs of the configuration that this pipeline lacks are ignored; values
    are clamped to each knob's range.
    """
    if isinstance(config, str):
      config = json.loads(config)
    if (not isinstance(config, Mapping) or
        config.get("format") != _CONFIG_FORMAT or
        not isinstance(config.get("knobs"), Mapping)):
      raise ValueError("Not an intune_tf configuration: expected a mapping "
                       f"with format {_CONFIG_FORMAT!r} and 'knobs', as "
                       "returned by Session.config().")
    knobs = {k.name: k for k in self.knobs()}
    values = {}
    for name, value in config["knobs"].items():
      if name in knobs:
        k = knobs[name]
        values[name] = float(min(max(float(value), k.min), k.max))
    return self.set(values)


def _live_ids() -> set[int]:
  ids, _ = _kernels.ops().intune_list_sessions()
  return {int(i) for i in ids.numpy()}


# Live sessions by id: a session's tag never changes, so the tuner's frequent
# listings parse each tag once.
_known: dict[int, Session] = {}


def sessions() -> list[Session]:
  """The live tuning sessions of this process, oldest first."""
  with tf.device("/cpu:0"):
    ids, tags = _kernels.ops().intune_list_sessions()
  ids = [int(i) for i in ids.numpy()]
  result = []
  for i, tag in zip(ids, tags.numpy()):
    known = _known.get(i)
    result.append(known if known is not None else Session(i, tag.decode()))
  _known.clear()
  _known.update((s.id, s) for s in result)
  return result
