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
import threading
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
# Columns of the per-node statistics returned by the IntuneObserve op (then
# the node's id, which tells two instances of one stage apart).
_STAGE_COLUMNS = ("elements", "processing_time_ns", "buffered_bytes",
                  "buffered_elements", "bytes_produced", "bytes_consumed")
_NODE_ID_COLUMN = len(_STAGE_COLUMNS)
# Most tuples of (knob name, value) pairs a session keeps as tensors for
# `Session.set`.
_SET_TENSORS = 256


class SessionGoneError(RuntimeError):
  """The session's iterator was destroyed; its knobs no longer exist."""


# --- Knob and stage names ---------------------------------------------------
#
# The kernel names a stage by its place in the pipeline (the format is defined
# in intune_tf/cc/kernels/session_registry.h), so that a name survives the
# re-creation of the stage (every epoch of a `repeat`, a new or restored
# iterator, each element of an interleave): the model's node names from the
# pipeline's output down to the stage, joined by ".". A node with several
# inputs is followed by the index of the one the path takes, "[i]"; an
# interleave-like node (interleave, flat_map, group_by_window) by "[*]" when
# the path goes into the datasets it makes per input element (all of them are
# one stage and share its knobs), by nothing for its own input. A knob is
# "<stage>/<parameter>":
#
#   "Prefetch.ParallelMapV2/parallelism"
#   "Zip[1].ParallelMapV2/parallelism"
#   "ParallelInterleaveV4[*].ParallelMapV2/parallelism"
#
# Node ids ("ParallelMapV2(id:3)") are for display only: `Knob.display`,
# `StageStats.display`. Names in the format before this one,
# "<Stage>(id:<n>)/<parameter>" (configurations and traces saved by earlier
# versions), still parse: their depth is the node id (ids grew from the output
# to the input). Everything that reads a knob or stage name goes through
# `parse_stage` / `parse_knob` below.

_STEP_RE = re.compile(r"([A-Za-z0-9_]+)(?:\[(\d+|\*)\])?\Z")
_LEGACY_RE = re.compile(r"([A-Za-z0-9_]+)\(id:(\d+)\)\Z")
_EACH = "*"


@dataclasses.dataclass(frozen=True)
class StageName:
  """A parsed stage name.

  Attributes:
    text: the name.
    steps: `(node name, input)` from the pipeline's output down to the stage;
      `input` is "" (the node's only or own input, and for the stage
      itself), a decimal index, or "*" (the per-element datasets of an
      interleave-like node).
    legacy_id: the node id of a name in the earlier "<Stage>(id:<n>)"
      format, else None.
  """
  text: str
  steps: tuple[tuple[str, str], ...]
  legacy_id: int | None = None

  @property
  def op(self) -> str:
    """The stage's own node name (its dataset type), e.g. "ParallelMapV2"."""
    return self.steps[-1][0]

  @property
  def depth(self) -> int:
    """Larger is nearer the input: the number of steps (the node id for an
    earlier-format name)."""
    return self.legacy_id if self.legacy_id is not None else len(self.steps)

  @property
  def per_element(self) -> bool:
    """Whether the stage is inside the datasets an interleave-like stage
    makes per input element (each live instance shares the knobs)."""
    return any(inp == _EACH for _, inp in self.steps)

  def encloses(self, other: "StageName") -> bool:
    """Whether `other` feeds this stage, directly or through other stages.

    For earlier-format names: whether `other` has the larger node id.
    """
    if self.legacy_id is not None or other.legacy_id is not None:
      return (self.legacy_id or 0) < (other.legacy_id or 0)
    n = len(self.steps)
    return (len(other.steps) > n and other.steps[:n - 1] == self.steps[:-1]
            and other.steps[n - 1][0] == self.op)


@functools.lru_cache(maxsize=4096)
def parse_stage(text: str) -> StageName:
  """Parses a stage name (see above). Raises ValueError if it is not one."""
  legacy = _LEGACY_RE.match(text)
  if legacy:
    return StageName(text, ((legacy[1], ""),), int(legacy[2]))
  steps = []
  parts = text.split(".")
  for i, part in enumerate(parts):
    match = _STEP_RE.match(part)
    if not match or (i == len(parts) - 1 and match[2] is not None):
      raise ValueError(f"Not a stage name: {text!r} (expected node names "
                       "joined by '.', e.g. 'Prefetch.ParallelMapV2').")
    steps.append((match[1], match[2] or ""))
  return StageName(text, tuple(steps))


def split_knob(name: str) -> tuple[str, str]:
  """`(stage name, parameter)` of a knob name "<stage>/<parameter>", as
  text, without checking them (`parse_knob` does)."""
  stage, _, parameter = name.rpartition("/")
  return stage, parameter


def parse_knob(name: str) -> tuple[StageName, str]:
  """`(stage, parameter)` of a knob name "<stage>/<parameter>". Raises
  ValueError if it is not one."""
  stage, parameter = split_knob(name)
  if "/" not in name or not re.fullmatch(r"[A-Za-z_]+", parameter):
    raise ValueError(f"Not a knob name: {name!r} (expected "
                     "'<stage>/<parameter>', e.g. "
                     "'Prefetch.ParallelMapV2/parallelism').")
  return parse_stage(stage), parameter


def is_knob_name(name: str) -> bool:
  try:
    parse_knob(name)
  except ValueError:
    return False
  return True


def input_first(name: str) -> tuple[int, str]:
  """Sort key of knob or stage names: from the input end to the output (the
  deepest first), then by name."""
  stage = split_knob(name)[0] if "/" in name else name
  try:
    return (-parse_stage(stage).depth, name)
  except ValueError:
    return (0, name)


def log_key(name: str) -> str:
  """A knob or stage name with only characters that summary and log names
  accept everywhere ([A-Za-z0-9_./-]): "[i]" becomes "-i", "[*]" "-each".

  Example: 'ParallelInterleaveV4[*].ParallelMapV2/parallelism' ->
  'ParallelInterleaveV4-each.ParallelMapV2/parallelism'.
  """
  name = name.replace("[*]", "-each")
  name = re.sub(r"\[(\d+)\]", r"-\1", name)
  return re.sub(r"\(id:(\d+)\)", r"-\1", name)


_INTERLEAVE_LIKE = ("FlatMap", "GroupByWindow")
_MULTI_INPUT = ("Zip", "Concatenate", "DirectedInterleave", "ChooseFastest",
                "ChooseFastestBranch", "WeightedFlatMap")


def proto_stage_names(proto: model_pb2.ModelProto,
                      root: str = "Intune") -> dict[int, str]:
  """Stage names of the nodes of a `ModelProto`, by node id, with the
  kernel's rules (for models the kernel does not name, such as TF
  AUTOTUNE's). A top node named `root` is left out of the names below it.

  The kernel fixes each node's index among several inputs when it first sees
  the node; from one proto the index is the node's position among its
  parent's inputs now.
  """
  nodes = dict(proto.nodes.items())
  if proto.output not in nodes:
    return {}
  clean = lambda n: re.sub(r"[^A-Za-z0-9_]", "_", n)  # pylint: disable=unnecessary-lambda-assignment
  names = {proto.output: clean(nodes[proto.output].name)}
  todo = collections.deque([proto.output])
  while todo:
    pid = todo.popleft()
    parent = nodes[pid]
    inputs = [i for i in parent.inputs if i in nodes]
    top = pid == proto.output and parent.name == root
    for position, cid in enumerate(inputs):
      if cid in names:
        continue
      first = cid == pid + 1
      ptype = parent.name
      if ptype != "DirectedInterleave" and (
          "Interleave" in ptype or ptype in _INTERLEAVE_LIKE):
        label = "" if first else f"[{_EACH}]"
      elif ptype == "Concatenate":
        label = "[0]" if first else "[1]"
      elif ptype in _MULTI_INPUT or len(inputs) > 1:
        label = f"[{position}]"
      else:
        label = ""
      own = clean(nodes[cid].name)
      names[cid] = own if top else f"{names[pid]}{label}.{own}"
      todo.append(cid)
  return names


@dataclasses.dataclass(frozen=True)
class Knob:
  """A tunable parameter of one pipeline stage.

  Attributes:
    name: the knob's place in the pipeline, "<stage>/<parameter>", for
      example "Prefetch.ParallelMapV2/parallelism" (see "Knob and stage
      names" above): the same across epochs, iterators and instances of the
      stage. `parse_knob` reads it.
    kind: "parallelism" (threads of a parallel stage) or "buffer_size"
      (elements a prefetch may hold).
    value: the value in force (on the first instance of the stage, when an
      interleave runs several).
    min: smallest allowed value (that every instance accepts).
    max: largest allowed value (that every instance accepts).
    display: the model nodes of the live instances, for display only:
      "ParallelMapV2(id:3)", comma-separated when there are several. Ids
      change whenever a stage is re-created.
  """
  name: str
  kind: str
  value: float
  min: float
  max: float
  display: str = ""

  @property
  def stage(self) -> str:
    """The knob's stage name (`parse_stage` reads it)."""
    return split_knob(self.name)[0]


@dataclasses.dataclass(frozen=True)
class StageStats:
  """Cumulative statistics of one stage, from the pipeline's model.

  Attributes:
    name: stage name as in knob names, e.g. "Prefetch.ParallelMapV2" (the
      instances of a stage inside an interleave share it).
    elements: elements produced so far.
    processing_time_ns: CPU-side time spent producing them (summed over
      threads), nanoseconds.
    buffered_bytes: bytes held in the stage's buffer now.
    buffered_elements: elements held in the stage's buffer now.
    bytes_produced: bytes produced so far.
    bytes_consumed: bytes consumed so far.
    parameters: current parameter values, by parameter name.
    inputs: names of the stages that feed this one.
    display: the model node, "ParallelMapV2(id:3)", for display only.
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
  display: str = ""

  @property
  def time_per_element_ns(self) -> float:
    return self.processing_time_ns / self.elements if self.elements else 0.0


@dataclasses.dataclass(frozen=True)
class _Snapshot:
  """One `IntuneObserve` reading: knobs, nodes breadth first from the output
  (stage names; columns `_STAGE_COLUMNS`, then the node id), and the
  counters."""
  knobs: tuple[Knob, ...]
  stage_names: tuple[str, ...]
  stage_stats: Any  # np.ndarray [nodes, len(_STAGE_COLUMNS) + 1], int64
  counters: dict[str, int]


def _make_knobs(names, values, mins, maxs, displays=None) -> list[Knob]:
  """Knobs of the kinds we tune, from the input stage to the output stage."""
  values, mins, maxs = (np.asarray(a, np.float64).tolist()
                        for a in (values, mins, maxs))
  displays = ([d.decode() for d in displays] if displays is not None
              else [""] * len(values))
  return [Knob(name, kind, values[i], mins[i], maxs[i], displays[i])
          for i, name, kind in _knob_layout(tuple(names))]


@functools.lru_cache(maxsize=64)
def _knob_layout(names: tuple[bytes, ...]) -> tuple[tuple[int, str, str], ...]:
  """(index in `names`, name, kind) of the knobs of the kinds we tune, from
  the input stage to the output stage."""
  layout = []
  for i, n in enumerate(names):
    name = n.decode()
    kind = split_knob(name)[1]
    if kind in KINDS:
      layout.append((i, name, kind))
  layout.sort(key=lambda k: input_first(k[1]))
  return tuple(layout)


def _clean(message: str) -> str:
  """Strips TF's op-wrapper decoration from a kernel error message."""
  message = re.sub(r"^\{\{[^}]*\}\}\s*", "", message.strip())
  return re.sub(r"\s*\[Op:[^\]]*\].*$", "", message)


# Sessions whose RAM budget a user set (Session.set_ram_budget): the tuner
# leaves their budget alone. Ids are never reused within a process.
_PINNED_RAM_BUDGETS: set[int] = set()


class Session:
  """A live tuned pipeline: list, read and set its knobs."""

  def __init__(self, session_id: int, tag: str):
    self._id = int(session_id)
    self._id_tensor: tf.Tensor | None = None
    self._last_knobs: tuple[tuple, tuple[Knob, ...]] | None = None
    self._set_tensors: dict[tuple, tuple[tf.Tensor, tf.Tensor]] = {}
    self._tag = tag
    # A tag this process cannot read (a tf.data service worker of another
    # intune_tf version) leaves the session untuned: tuning it with default
    # options would ignore what the user asked for.
    self._options_error: str | None = None
    try:
      self._options = IntuneOptions.from_json(tag) if tag else IntuneOptions()
    except (ValueError, TypeError) as e:
      self._options = IntuneOptions(policy="manual")
      self._options_error = str(e)
    try:
      self._fingerprint = str(json.loads(tag).get("fingerprint") or "")
    except (ValueError, TypeError, AttributeError):
      self._fingerprint = ""

  @property
  def options_error(self) -> str | None:
    """Why this process could not read the session's options (None: read)."""
    return self._options_error

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
    names, values, mins, maxs, displays = self._call(
        _kernels.ops().intune_list_knobs)
    return _make_knobs(names.numpy(), values.numpy(), mins.numpy(),
                       maxs.numpy(), displays.numpy())

  def _snapshot(self) -> "_Snapshot":
    """Knobs, per-node statistics and counters in one op call: the tuner's
    reading each step (`stats()` parses a whole ModelProto instead)."""
    (knob_names, knob_values, stage_names, stage_stats, counters,
     knob_displays) = self._call(_kernels.ops().intune_observe)
    names, kv = tuple(knob_names.numpy().tolist()), knob_values.numpy()
    displays = tuple(knob_displays.numpy().tolist())
    key = (names, kv.tobytes(), displays)
    cached = self._last_knobs
    if cached is None or cached[0] != key:
      cached = (key, tuple(_make_knobs(names, kv[:, 0], kv[:, 1], kv[:, 2],
                                       displays)))
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

    A knob whose stage is re-created (the next epoch of a `repeat`, a new
    instance inside an interleave) comes back at the value set last; setting
    a knob shared by several live instances sets every one.

    Raises:
      KeyError: a name is not a knob of this session (the message lists the
        valid names).
      ValueError: a value is not a finite number or is outside the knob's
        [min, max].
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
    except (tf.errors.OutOfRangeError, tf.errors.InvalidArgumentError) as e:
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
    """Per-stage statistics, output stage first (one per model node: the
    instances of a stage inside an interleave share its name)."""
    snap = self._snapshot()
    proto = self.model_proto()
    nodes = dict(proto.nodes.items())  # one pass over the proto map
    ids = snap.stage_stats[:, _NODE_ID_COLUMN].tolist()
    names = dict(zip(ids, snap.stage_names))
    result = []
    for nid, name, row in zip(ids, snap.stage_names,
                              snap.stage_stats.tolist()):
      node = nodes.get(nid)
      result.append(StageStats(
          name, *row[:_NODE_ID_COLUMN],
          parameters=({p.name: p.value for p in node.parameters}
                      if node is not None else {}),
          inputs=(tuple(names[i] for i in node.inputs if i in names)
                  if node is not None else ()),
          display=f"{node.name}(id:{nid})" if node is not None else ""))
    return result

  def counters(self) -> dict[str, int]:
    """Session counters: elements returned, consumer gap time (us), time in
    GetNext (us), buffered and peak buffered bytes, RAM budget, guard
    actions."""
    values = self._call(_kernels.ops().intune_session_stats).numpy()
    return dict(zip(_COUNTERS, (int(v) for v in values)))

  def set_ram_budget(self, ram_budget: int) -> None:
    """Changes the RAM budget that the guard enforces, in bytes (> 0). From
    then on the tuner no longer gives this session its share of the default
    budget."""
    if isinstance(ram_budget, bool) or not isinstance(ram_budget, int) or (
        ram_budget <= 0):
      raise ValueError(f"ram_budget must be a positive int of bytes, got "
                       f"{ram_budget!r}.")
    _PINNED_RAM_BUDGETS.add(self._id)
    self._apply_ram_budget(ram_budget)

  @property
  def ram_budget_pinned(self) -> bool:
    """Whether `set_ram_budget` was called for this session (in this
    process)."""
    return self._id in _PINNED_RAM_BUDGETS

  def _apply_ram_budget(self, ram_budget: int) -> None:
    self._call(_kernels.ops().intune_set_ram_budget,
               tf.constant(ram_budget, tf.int64))

  def config(self) -> dict[str, Any]:
    """The knob values in force, as a JSON-serializable configuration."""
    return {"format": _CONFIG_FORMAT,
            "knobs": {k.name: k.value for k in self.knobs()}}

  def apply_config(self, config: Mapping[str, Any]) -> dict[str, float]:
    """Applies a configuration from `config()` (or a JSON string of one).

    Knobs of the configuration that this pipeline lacks are ignored; values
    are clamped to each knob's range. Configurations saved by earlier
    versions name knobs "<Stage>(id:<n>)/<parameter>": those are ignored
    too (`intune_tf.tfx.map_config` matches them by position).
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
  ids, _, _ = _kernels.ops().intune_list_sessions()
  return {int(i) for i in ids.numpy()}


def sessions_made_by_this_thread(after: int) -> list[int]:
  """Ids above `after` of the live sessions that this OS thread made."""
  with tf.device("/cpu:0"):
    ids, _, threads = _kernels.ops().intune_list_sessions()
  me = threading.get_native_id()
  return [int(i) for i, t in zip(ids.numpy(), threads.numpy())
          if int(i) > after and int(t) == me]


def newest_session_id() -> int:
  """The id of the newest live session, or 0 (ids start at 1 and only
  grow)."""
  ids = _live_ids()
  return max(ids) if ids else 0


_SESSION_IDS_ATTR = "_intune_session_ids"


def session_of(iterator: Any) -> Session:
  """The tuning session of an iterator made by `iter(dataset)`.

  Args:
    iterator: what `iter()` returned for a dataset with
      `experimental_intune` on (eager mode).

  Returns:
    Its live session.

  Raises:
    ValueError: the iterator has no session (InTune is off for its dataset,
      or it was not made by `iter()` in eager mode: inside a `tf.function`,
      or by tf.data service, use `sessions()`).
    SessionGoneError: its session ended (the iterator was exhausted).
  """
  ids = getattr(iterator, _SESSION_IDS_ATTR, None)
  if not ids:
    raise ValueError(
        f"{type(iterator).__name__} has no InTune session: make it with "
        "iter() in eager mode from a dataset with experimental_intune on "
        "(intune_tf.sessions() lists every session of the process).")
  live = {s.id: s for s in sessions()}
  for i in ids:
    if i in live:
      return live[i]
  raise SessionGoneError(f"InTune session {ids[0]} of this iterator is gone: "
                         "the iterator was exhausted or released.")


def record_sessions(iterator: Any, after: int) -> None:
  """Remembers on `iterator` the sessions this thread made since `after`
  (called right after the iterator was made)."""
  object.__setattr__(iterator, _SESSION_IDS_ATTR,
                     sessions_made_by_this_thread(after))


# Live sessions by id: a session's tag never changes, so the tuner's frequent
# listings parse each tag once.
_known: dict[int, Session] = {}


def sessions() -> list[Session]:
  """The live tuning sessions of this process, oldest first."""
  with tf.device("/cpu:0"):
    ids, tags, _ = _kernels.ops().intune_list_sessions()
  ids = [int(i) for i in ids.numpy()]
  result = []
  for i, tag in zip(ids, tags.numpy()):
    known = _known.get(i)
    result.append(known if known is not None else Session(i, tag.decode()))
  _known.clear()
  _known.update((s.id, s) for s in result)
  return result
