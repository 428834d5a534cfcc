"""Live tuning sessions: the public handle on a tuned pipeline's knobs.

There is one session per live iterator of a dataset with
`experimental_intune` on. Sessions are created by the kernel library when the
iterator is created and disappear when it is destroyed.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import json
import math
import re
import threading
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import model_pb2
from tensorflow.python.eager import context

from intune_tf.ops import loader as _kernels
from intune_tf.options import IntuneOptions
from intune_tf.records import KINDS
from intune_tf.records import CacheState
from intune_tf.records import Knob
from intune_tf.records import StageStats
from intune_tf.records import input_first
from intune_tf.records import split_knob

_CONFIG_FORMAT = "intune_tf.config/1"
# The control ops' table layout, as intune_tf/cc/layout.h defines it (the
# IntuneLayout op returns the C++ names; tests/test_session.py compares).
# The counters of IntuneSessionCounters and IntuneObserve, in order.
COUNTERS = ("elements", "gap_time_us", "gap_count", "get_next_time_us",
            "buffered_bytes", "peak_buffered_bytes", "ram_budget",
            "guard_shrinks", "guard_over_budget", "created_us",
            "unlowerable_bytes", "pinned_ram_budget", "cache_bytes",
            "cache_limit", "cache_elements", "cache_complete", "cache_hits",
            "cache_misses", "cache_saved_us", "cache_shrinks",
            "row_store_rows", "row_store_bytes", "row_store_gathered")
# The counters `TuningSession.counters()` adds: this process's share of the
# host.
HOST_COUNTERS = ("host_cpu_share", "host_ram_share", "host_processes")
# Reads this process's share of the host: set by the tuner, which owns the
# host arbiter (`intune_tf.arbiter`, a layer above this module).
_host_share: list[Callable[[], Any] | None] = [None]


def set_host_share_source(source: Callable[[], Any] | None) -> None:
  """Sets where `TuningSession.counters()` reads this process's share of the
  host.

  Args:
    source: returns the share (with `cpus`, `ram` and `processes`), or None
      while the process shares nothing. None, the value until the tuner is
      imported: the host counters are 0.
  """
  _host_share[0] = source


# The columns of IntuneObserve's per-node statistics; the node id tells two
# instances of one stage apart. `StageStats` starts with the same fields.
STAGE_COLUMNS = ("elements", "processing_time_ns", "buffered_bytes",
                 "buffered_elements", "bytes_produced", "bytes_consumed",
                 "node_id")
STAGE_COLUMN = {name: i for i, name in enumerate(STAGE_COLUMNS)}
NODE_ID_COLUMN = STAGE_COLUMN["node_id"]
# The columns of IntuneObserve's knob values.
KNOB_COLUMNS = ("value", "min", "max")
# Most tuples of (knob name, value) pairs a session keeps as tensors for
# `TuningSession.set`.
_SET_TENSORS = 256


class SessionGoneError(RuntimeError):
  """The session's iterator was destroyed; its knobs no longer exist."""


# The root dataset's model node, left out of the stage names below it
# (intune_tf/cc/kernels/stage_names.h kRootName).
ROOT_NODE = "Intune"


@dataclasses.dataclass(frozen=True)
class _NamedNode:
  """A model node named by the kernel's grammar (the IntuneStageNames op)."""
  node_id: int
  stage: str
  parent: int  # the node it was reached from, past release nodes; -1: output
  bounded: bool  # an interleave whose records a release node bounds


def _stage_names(proto: model_pb2.ModelProto, root: str) -> list[_NamedNode]:
  """The nodes of `proto` reachable from its output, named."""
  with _on_host():
    columns = _kernels.ops().intune_stage_names(
        tf.constant(proto.SerializeToString()), tf.constant(root))
  ids, names, parents, bounded = (c.numpy().tolist() for c in columns)
  return [_NamedNode(i, n.decode(), p, b)
          for i, n, p, b in zip(ids, names, parents, bounded)]


def proto_stage_names(proto: model_pb2.ModelProto,
                      root: str = ROOT_NODE) -> dict[int, str]:
  """Stage names of the nodes of a `ModelProto`, by node id, as a live
  session names them (for models no session names, such as TF AUTOTUNE's).

  Args:
    proto: the model.
    root: a top node of this name is left out of the names below it.
      Default: `ROOT_NODE`, the root dataset's node.

  A live session fixes a node's index among several inputs when it first
  sees the node; from one proto the index is the node's position now.
  """
  return {n.node_id: n.stage for n in _stage_names(proto, root)}


def bounded_stage_names(proto: model_pb2.ModelProto,
                        root: str = ROOT_NODE) -> frozenset[str]:
  """Stage names of the bounded interleaves of a `ModelProto`: the nodes
  right below a buffer release node. The budget guard lowers the records
  such an interleave holds through its per-input limits
  (intune_tf/cc/kernels/bounded_buffers.h), though the interleave has no
  buffer knob of its own.

  Example: Prefetch <- IntuneBufferRelease <- ParallelInterleaveV4 <- Range
  -> {"Prefetch.ParallelInterleaveV4"}.

  Args:
    proto: the model.
    root: as for `proto_stage_names`. Default: `ROOT_NODE`.
  """
  return frozenset(n.stage for n in _stage_names(proto, root) if n.bounded)


@dataclasses.dataclass(frozen=True)
class _Snapshot:
  """One `IntuneObserve` reading: knobs, nodes breadth first from the output
  (stage names; columns `STAGE_COLUMNS`), and the
  counters."""
  knobs: tuple[Knob, ...]
  stage_names: tuple[str, ...]
  stage_stats: Any  # np.ndarray [nodes, len(STAGE_COLUMNS)], int64
  counters: dict[str, int]


@contextlib.contextmanager
def _on_host():
  """Runs the control ops eagerly on the host CPU, also where eager execution
  is off (a TF1-style program, the tuner thread in it), in which they would
  only be added to a graph."""
  with context.eager_mode(), tf.device("/cpu:0"):
    yield


def _make_knobs(names, values, mins, maxs, displays=None) -> list[Knob]:
  """Knobs of the kinds we tune, from the input stage to the output stage."""
  values, mins, maxs = (np.asarray(a, np.float64).tolist()
                        for a in (values, mins, maxs))
  listed = displays is not None
  displays = ([d.decode() for d in displays] if listed
              else [""] * len(values))
  # A listed knob with no live instance is idle (below the cache, which
  # serves the epoch): the kernel lists it with no display.
  return [Knob(name, kind, values[i], mins[i], maxs[i], displays[i],
               listed and not displays[i])
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


# The largest RAM budget: it travels to the kernel as an int64.
MAX_RAM_BUDGET = 2**63 - 1


class TuningSession:
  """A live tuned pipeline: list, read and set its knobs."""

  def __init__(self, session_id: int, tag: str):
    self._id = int(session_id)
    self._id_tensor: tf.Tensor | None = None
    self._last_knobs: tuple[tuple, tuple[Knob, ...]] | None = None
    # The last value seen of every knob, live or not (`_known_values`),
    # and the names of the last listing (`_listed_names`).
    self._values: dict[str, float] = {}
    self._listed: frozenset[str] = frozenset()
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
    return f"<intune_tf.TuningSession {self._id}{name}>"

  def __eq__(self, other: Any) -> bool:
    return isinstance(other, TuningSession) and other._id == self._id

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

  def _call(self, fn, *args, **attrs):
    """Runs the session op `fn`: its outputs but the last (`found`), one
    tensor unpacked; raises SessionGoneError if the session is gone."""
    with _on_host():
      if self._id_tensor is None:
        self._id_tensor = tf.constant(self._id, tf.int64)
      outputs = fn(self._id_tensor, *args, **attrs)
    *outputs, found = outputs if isinstance(outputs, (list, tuple)) else (
        outputs,)
    if not found.numpy():
      raise SessionGoneError(
          f"InTune session {self._id} is gone: its iterator was destroyed or "
          "exhausted and released. List live sessions with "
          "intune_tf.sessions().")
    return outputs[0] if len(outputs) == 1 else tuple(outputs)

  def knobs(self) -> list[Knob]:
    """The pipeline's knobs, from the input stage to the output stage."""
    names, values, mins, maxs, displays = self._call(
        _kernels.ops().intune_list_knobs)
    knobs = _make_knobs(names.numpy(), values.numpy(), mins.numpy(),
                        maxs.numpy(), displays.numpy())
    self._remember(knobs)
    return knobs

  def _remember(self, knobs: Sequence[Knob]) -> None:
    """Records a listing for `_known_values` and `_listed_names`."""
    self._values.update((k.name, k.value) for k in knobs)
    self._listed = frozenset(k.name for k in knobs if not k.idle)

  def _known_values(self) -> dict[str, float]:
    """The last value seen (`knobs`, `set`, each tuning step) of every knob
    this session has had, whether its stage runs now or not: the stages
    below a cache that serves the epoch, or between two epochs, keep their
    names and values while they do not run, and come back at them."""
    return dict(self._values)

  def _listed_names(self) -> frozenset[str]:
    """The knobs of the last listing (`knobs`, each tuning step) that were
    live then (not idle), known without an op call, so also once the
    session is gone."""
    return self._listed

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
      cached = (key, tuple(_make_knobs(names, *kv.T, displays)))  # KNOB_COLUMNS
      self._last_knobs = cached
      self._remember(cached[1])
    return _Snapshot(
        knobs=cached[1],
        stage_names=tuple(map(bytes.decode, stage_names.numpy().tolist())),
        stage_stats=stage_stats.numpy(),
        counters=dict(zip(COUNTERS, counters.numpy().tolist())))

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
    applied = dict(zip((name for name, _ in items), applied.numpy().tolist()))
    self._values.update(applied)
    return applied

  def _set_inputs(self, items: tuple[tuple[str, float], ...]
                  ) -> tuple[tf.Tensor, tf.Tensor]:
    """The names and values tensors of `IntuneSetKnobs` for `items`, made
    once per tuple of (name, value) pairs (the tuner moves the same few
    knobs among a few values)."""
    inputs = self._set_tensors.get(items)
    if inputs is None:
      if len(self._set_tensors) >= _SET_TENSORS:
        self._set_tensors.clear()
      with _on_host():
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
    ids = snap.stage_stats[:, NODE_ID_COLUMN].tolist()
    names = dict(zip(ids, snap.stage_names))
    # Each node's inputs in the walk, past release nodes, in input order.
    below = collections.defaultdict(list)
    for named in _stage_names(proto, ROOT_NODE):
      below[named.parent].append(named.node_id)
    result = []
    for nid, name, row in zip(ids, snap.stage_names,
                              snap.stage_stats.tolist()):
      node = nodes.get(nid)
      result.append(StageStats(
          name, *row[:NODE_ID_COLUMN],
          parameters=({p.name: p.value for p in node.parameters}
                      if node is not None else {}),
          inputs=tuple(names[j] for j in below[nid] if j in names),
          display=f"{node.name}(id:{nid})" if node is not None else ""))
    return result

  def counters(self) -> dict[str, int]:
    """The session's counters: elements returned, consumer gap time (us),
    time in GetNext (us), buffered and peak buffered bytes, RAM budget, guard
    actions (`COUNTERS`, from the kernel); then this process's share of the
    host (`HOST_COUNTERS`, from `set_host_share_source`): `host_cpu_share`
    (CPUs), `host_ram_share` (bytes) and `host_processes` (the InTune
    processes sharing the host, this one included), all 0 while this
    process does not share the host."""
    values = self._call(_kernels.ops().intune_session_counters).numpy()
    result = dict(zip(COUNTERS, (int(v) for v in values)))
    source = _host_share[0]
    share = source() if source is not None else None
    result.update(zip(HOST_COUNTERS, (
        (share.cpus, share.ram, share.processes) if share is not None
        else (0, 0, 0))))
    return result

  def cache(self) -> dict[str, Any]:
    """Where InTune cached this session's pipeline, and what it gave.

    Returns:
      `state`: a `CacheState`, `PLACED` while the pipeline has a cache,
      `DECLINED` when it has none, `OFF` when the `cache` option is off;
      `point`: the node the cache holds the elements of (for a declined
      cache, where it was placed before it gave up; "" when no place was
      found); `reason`: why there, or why no cache ("" when off); `bytes`,
      `limit` and `elements`: what the cache holds now and may hold (the
      RAM budget the buffers leave it); `complete`: whether it holds a whole
      epoch; `hits` and `misses`: elements this session read from it and
      from its input; `served`: the fraction read from it;
      `saved_s`: the upstream seconds the hits saved, at the rate measured
      as the cache filled (time between two elements read from the input,
      so wall time seen by the consumer, not CPU time); `shrunk_bytes`:
      bytes the guard dropped from it; `row_store_rows`,
      `row_store_bytes`: the rows of a row-wise map above a shuffle that the
      cache's row store holds (positions carried through the shuffle, the
      map skipped for a batch whose rows it holds), and their bytes;
      `row_store_gathered`: the batches it gave in place of the map.
    """
    state, point, reason = self._call(_kernels.ops().intune_session_cache)
    c = self._call(_kernels.ops().intune_session_counters).numpy()
    c = dict(zip(COUNTERS, (int(v) for v in c)))
    reads = c["cache_hits"] + c["cache_misses"]
    return {"state": CacheState(state.numpy().decode()),
            "point": point.numpy().decode(), "reason": reason.numpy().decode(),
            "bytes": c["cache_bytes"], "limit": c["cache_limit"],
            "elements": c["cache_elements"],
            "complete": bool(c["cache_complete"]), "hits": c["cache_hits"],
            "misses": c["cache_misses"],
            "served": c["cache_hits"] / reads if reads else 0.0,
            "saved_s": c["cache_saved_us"] / 1e6,
            "shrunk_bytes": c["cache_shrinks"],
            "row_store_rows": c["row_store_rows"],
            "row_store_bytes": c["row_store_bytes"],
            "row_store_gathered": c["row_store_gathered"]}

  def set_ram_budget(self, ram_budget: int) -> None:
    """Changes the RAM budget that the guard enforces, in bytes (> 0). From
    then on the tuner no longer gives this session its share of the default
    budget. The memory the session's policy holds (`Policy.held_bytes`) is
    taken from it: `counters()["ram_budget"]` is what is left for the
    pipeline's buffers."""
    if isinstance(ram_budget, bool) or not isinstance(ram_budget, int) or (
        ram_budget <= 0):
      raise ValueError(f"ram_budget must be a positive int of bytes, got "
                       f"{ram_budget!r}.")
    if ram_budget > MAX_RAM_BUDGET:
      raise ValueError(
          f"TuningSession.set_ram_budget: ram_budget {ram_budget} is out of "
          f"its range 1..{MAX_RAM_BUDGET} (bytes, an int64). Pass at most "
          f"{MAX_RAM_BUDGET}; nothing was changed.")
    self._apply_ram_budget(ram_budget, pin=True)

  @property
  def pinned_ram_budget(self) -> int | None:
    """The budget last given to `set_ram_budget` for this session (kept by
    the session itself: every handle of it sees it); None if it was never
    called."""
    return self.counters()["pinned_ram_budget"] or None

  def _apply_ram_budget(self, ram_budget: int, pin: bool = False) -> None:
    """Writes the budget in force; with `pin`, as the user's (the tuner's
    budget service then keeps it instead of giving a share)."""
    self._call(_kernels.ops().intune_set_ram_budget,
               tf.constant(ram_budget, tf.int64), pin=pin)

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
      try:
        config = json.loads(config)
      except ValueError as e:
        raise ValueError(
            f"TuningSession.apply_config: the string is not JSON ({e}): "
            "pass the dict from TuningSession.config() or json.dumps of "
            "it.") from None
    if (not isinstance(config, Mapping) or
        config.get("format") != _CONFIG_FORMAT or
        not isinstance(config.get("knobs"), Mapping)):
      raise ValueError("Not an intune_tf configuration: expected a mapping "
                       f"with format {_CONFIG_FORMAT!r} and 'knobs', as "
                       "returned by TuningSession.config().")
    knobs = {k.name: k for k in self.knobs()}
    values = {}
    for name, value in config["knobs"].items():
      if name in knobs:
        k = knobs[name]
        if (isinstance(value, bool) or
            not isinstance(value, (int, float, np.integer, np.floating)) or
            not math.isfinite(value)):
          raise ValueError(
              f"TuningSession.apply_config: knob {name!r} has value "
              f"{value!r}, not a finite number. Give each knob a number (as "
              "TuningSession.config() does); nothing was changed.")
        values[name] = float(min(max(float(value), k.min), k.max))
    return self.set(values)


def set_default_ram_budget(ram_budget: int) -> None:
  """Sets the RAM budget, in bytes (>= 1), of the sessions made from now on
  in this process whose options leave `ram_budget` unset: it is resolved
  where the iterator is made, never carried in the graph. The tuner's
  budget service sets it (`Tuner.publish_default_budget`)."""
  with _on_host():
    _kernels.ops().intune_set_default_ram_budget(
        tf.constant(min(max(1, int(ram_budget)), MAX_RAM_BUDGET), tf.int64))


def process_caches() -> dict[str, int]:
  """InTune's caches in this process, whichever iterator made them and
  whether one is alive.

  Returns:
    `entries`: caches alive (one per pipeline whose dataset is alive);
    `bytes`: what they hold, with the rows of the row stores (which live
    as long as the process); `room`: the most they may hold now, the
    process's budget less what the live pipelines' buffers hold (-1 with no
    budget); `budget`: the process's budget for its caches and buffers (0
    before the tuner resolved one); `buffered`: bytes the live pipelines'
    buffers hold.
  """
  with _on_host():
    figures = _kernels.ops().intune_process_caches().numpy()
  return dict(zip(("entries", "bytes", "room", "budget", "buffered"),
                  (int(v) for v in figures)))


def _live_ids() -> set[int]:
  with _on_host():
    ids, _, _ = _kernels.ops().intune_list_sessions()
  return {int(i) for i in ids.numpy()}


def sessions_made_by_this_thread(after: int) -> list[int]:
  """Ids above `after` of the live sessions that this OS thread made."""
  with _on_host():
    ids, _, threads = _kernels.ops().intune_list_sessions()
  me = threading.get_native_id()
  return [int(i) for i, t in zip(ids.numpy(), threads.numpy())
          if int(i) > after and int(t) == me]


def newest_session_id() -> int:
  """The id of the newest live session, or 0 (ids start at 1 and only
  grow)."""
  ids = _live_ids()
  return max(ids) if ids else 0


# The iterator attribute holding the ids of the sessions its creation (or
# its latest checkpoint restore) made.
SESSION_IDS_ATTR = "_intune_session_ids"


def session_of(iterator: Any) -> TuningSession:
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
    SessionGoneError: its session ended (the iterator was exhausted). After a
      checkpoint is restored into the iterator, its new session is returned.
  """
  ids = getattr(iterator, SESSION_IDS_ATTR, None)
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
  object.__setattr__(iterator, SESSION_IDS_ATTR,
                     sessions_made_by_this_thread(after))


# Live sessions by id: a session's tag never changes, so the tuner's frequent
# listings parse each tag once.
_known: dict[int, TuningSession] = {}


def sessions() -> list[TuningSession]:
  """The live tuning sessions of this process, oldest first."""
  with _on_host():
    ids, tags, _ = _kernels.ops().intune_list_sessions()
  ids = [int(i) for i in ids.numpy()]
  result = []
  for i, tag in zip(ids, tags.numpy()):
    known = _known.get(i)
    result.append(known if known is not None
                  else TuningSession(i, tag.decode()))
  _known.clear()
  _known.update((s.id, s) for s in result)
  return result
