"""What the tuner is doing, for `intune inspect`: status files and a decision
log.

Status files. Every process whose tuner runs writes one small JSON file,
`<status dir>/<pid>@<host>.json`, rewritten atomically (temporary file,
then rename) at most every `WRITE_PERIOD_S` while its sessions step (and at
least every `HEARTBEAT_S`), and removed when the process exits. The status dir
is `$INTUNE_STATUS_DIR`, else `~/.cache/intune_tf/status`. `INTUNE_STATUS=off`
(or `0`, `false`, `no`) turns the files off. A file whose process is gone
(killed before it could remove it; detected by pid and process start time on
the same host, by a last update older than `REMOTE_STALE_S` for another host's
file in a shared directory) is ignored by readers; the next writer that starts
on the same host deletes it.

The file (format `intune_tf.status/1`) holds the process (pid, host, start
time, command line, `role` and, for tf.data service workers, `service`) and
one entry per session: options, steps, knob values (first seen and now),
output rate, budgets, `unlowerable_bytes` (`{stage: bytes}` of the stages
whose buffers the RAM budget guard cannot lower,
`records.unlowerable_bytes`), with the `cache` option on, `cache` (whether
InTune placed a cache or declined one, where, why, and what it gave,
`cache_fields`), and one row per pipeline
stage:

| field | unit | meaning |
|---|---|---|
| `stage` | | stage name as in knob names, e.g. "Prefetch.ParallelMapV2" (the instances of a stage inside an interleave are one row) |
| `parallelism`, `buffer` | threads, elements | the stage's knobs (None when it has none) |
| `buffer_fill` | 0..1 | buffered elements / buffer size |
| `rate` | elements/s | elements the stage produced per second in the last step |
| `cpus` | CPUs | CPU-seconds the stage spent per second (`rate` x CPU-seconds per element) |
| `cpu_share` | 0..1 | the stage's share of the pipeline's CPU time in the step |
| `utilization` | 0..1+ | `cpus / threads`: how busy the stage's threads are (threads = parallelism, or 1 for a stage without that knob; `records.stage_utilization`, what the agent's state calls "busy") |
| `bottleneck` | bool | the stage with the highest utilization (the least headroom: its threads are the closest to saturated; giving it more parallelism is what can raise throughput). Ties go to the larger CPU share; no stage is flagged in a step where no stage did work |

A session is `input-bound` when the consumer waits longer inside `GetNext`
than it spends between calls (`output_latency_s > consumer_wait_s`), else
`consumer-bound`.

Decision log. With `INTUNE_DECISION_LOG=PATH` the tuner appends one JSON line
per tuning step to PATH: time, pid, session, step, policy, knob values in
force after the step, the values applied in it, output rate, buffered bytes,
the fields of the policy's `last_decision` (an `intune_tf.records.Decision`)
when it has one (for example the agent's action and reward), and with the
`cache` option on, `cache` (`cache_fields`).
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import errno
import json
import math
import numbers
import os
import pathlib
import socket
import stat
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Mapping

from absl import logging
import psutil

from intune_tf import files
from intune_tf import host
from intune_tf import records

if TYPE_CHECKING:
  from intune_tf.ops import session as session_lib

FORMAT = "intune_tf.status/1"
ENV_DIR = "INTUNE_STATUS_DIR"
ENV_SWITCH = "INTUNE_STATUS"
ENV_DECISION_LOG = "INTUNE_DECISION_LOG"
# Seconds between rewrites of a status file (when something changed).
WRITE_PERIOD_S = 0.5
# Ended sessions kept in a status file (most recent first), marked ended.
KEEP_ENDED = 4
# Largest difference (s) between a file's process start time and the live
# process's for the file to be that process's (pids are reused).
_START_TOLERANCE_S = 1.0
# A writer rewrites its file at least this often, even when nothing changed,
# so that readers on other hosts (shared status dir) can tell it is alive.
HEARTBEAT_S = 10.0
# A file written on another host is stale when older than this (seconds).
REMOTE_STALE_S = 30.0
_OFF = ("0", "off", "false", "no")


def file_name(pid: int, host: str | None = None) -> str:
  """The status file's name: "<pid>@<host>.json" (hosts may share a dir)."""
  return f"{pid}@{host or socket.gethostname()}.json"


def default_dir() -> pathlib.Path:
  """`$INTUNE_STATUS_DIR`, else `~/.cache/intune_tf/status`."""
  env = os.environ.get(ENV_DIR)
  if env:
    return pathlib.Path(env).expanduser()
  return pathlib.Path.home() / ".cache" / "intune_tf" / "status"


def enabled() -> bool:
  """False when `INTUNE_STATUS` turns status files off."""
  return os.environ.get(ENV_SWITCH, "").strip().lower() not in _OFF


def _finite(value: float | None) -> float | None:
  if value is None:
    return None
  value = float(value)
  return value if math.isfinite(value) else None


def stage_rows(obs) -> list[dict[str, Any]]:
  """One row per stage of an `Observation`, output stage first, with the
  bottleneck flagged (see the module doc for each field)."""
  rows = []
  for st in obs.stages:
    cpus = st.cpu_per_element_s * st.rate
    rows.append({
        "stage": st.name,
        "parallelism": _finite(st.parallelism),
        "buffer": _finite(st.buffer_size),
        "buffer_fill": _finite(st.buffer_fill),
        "rate": _finite(st.rate),
        "cpus": _finite(cpus),
        "cpu_share": _finite(st.time_share),
        "utilization": _finite(records.stage_utilization(
            st.cpu_per_element_s, st.rate, st.parallelism)),
        "buffered_bytes": int(st.buffered_bytes),
        "bottleneck": False,
    })
  busy = [r for r in rows if (r["rate"] or 0) > 0 and (r["cpus"] or 0) > 0]
  if busy:
    top = max(busy, key=lambda r: (r["utilization"] or 0, r["cpu_share"] or 0))
    top["bottleneck"] = True
  return rows


# What the status file and the decision log keep of `TuningSession.cache`.
CACHE_FIELDS = ("state", "point", "reason", "bytes", "limit", "elements",
                "complete", "served", "saved_s")


def cache_fields(session: session_lib.TuningSession) -> dict[str, Any] | None:
  """What became of `session`'s cache and what it gave, the `CACHE_FIELDS`
  of `TuningSession.cache`: its state (a `records.CacheState` value,
  "placed" or "declined"), where and why, bytes held and allowed, elements,
  whether it holds a whole epoch, the fraction of this session's reads it
  served, the upstream seconds that saved; None when the session's `cache`
  option is off or the session is gone (a listener may see its last step
  after its iterator went away)."""
  if not session.options.cache:
    return None
  # Deferred: the sessions load TensorFlow, which readers of status files
  # (`intune inspect`) do not.
  from intune_tf.ops import session as session_lib  # noqa: PLC0415
  try:
    cache = session.cache()
  except session_lib.SessionGoneError:
    return None
  fields = {k: cache[k] for k in CACHE_FIELDS}
  fields["state"] = records.CacheState(fields["state"]).value
  return fields


def _json_safe(value: Any) -> Any:
  """Numbers, strings, lists and dicts only: numpy scalars and arrays become
  Python numbers and lists, non-finite floats None, anything else its str."""
  if value is None or isinstance(value, (bool, str, int)):
    return value
  if isinstance(value, float):
    return value if math.isfinite(value) else None
  if isinstance(value, Mapping):
    return {str(k): _json_safe(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_json_safe(v) for v in value]
  if hasattr(value, "tolist"):  # numpy scalar or array
    return _json_safe(value.tolist())
  if isinstance(value, numbers.Real):
    return _json_safe(float(value))
  return str(value)


def _process_start(pid: int) -> float | None:
  if not host.is_pid(pid):
    return None
  try:
    return psutil.Process(pid).create_time()
  except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
    return None


def _is_live(data: Mapping[str, Any]) -> bool:
  """Whether the file's process runs: on this host by pid and start time, on
  another (a shared status dir) by the age of the file's last update. The
  file's fields are checked (`format_problem`) before this is asked."""
  if data.get("host") != socket.gethostname():
    updated = data.get("updated")
    return (isinstance(updated, (int, float)) and
            time.time() - updated <= REMOTE_STALE_S)
  pid, started = data.get("pid"), data.get("process_start")
  if not host.is_pid(pid) or not isinstance(started, (int, float)):
    return False
  actual = _process_start(pid)
  return actual is not None and abs(actual - started) <= _START_TOLERANCE_S


@dataclasses.dataclass
class _SessionRecord:
  """What the writer keeps of one session between writes."""
  session_id: int
  name: str
  policy: str
  period_s: float
  started: float
  steps: int = 0
  changes: int = 0
  initial_knobs: dict[str, float] = dataclasses.field(default_factory=dict)
  knobs: dict[str, float] = dataclasses.field(default_factory=dict)
  last: dict[str, Any] = dataclasses.field(default_factory=dict)
  ended: float | None = None

  def to_json(self) -> dict[str, Any]:
    return {"id": self.session_id, "name": self.name, "policy": self.policy,
            "period_s": self.period_s, "started": self.started,
            "steps": self.steps, "changes": self.changes,
            "alive": self.ended is None, "ended": self.ended,
            "initial_knobs": dict(self.initial_knobs),
            "knobs": dict(self.knobs), **self.last}


class StatusWriter:
  """A tuner listener that keeps this process's status file up to date.

  Args:
    directory: where to write `<pid>@<host>.json`. Default None:
      `default_dir()`.
    period_s: seconds between rewrites. Default `WRITE_PERIOD_S`.
  """

  def __init__(self, directory: str | os.PathLike | None = None,
               period_s: float = WRITE_PERIOD_S):
    self.directory = pathlib.Path(directory) if directory else default_dir()
    self.path = self.directory / file_name(os.getpid())
    self._period_s = period_s
    self._lock = threading.Lock()
    self._sessions: dict[int, _SessionRecord] = {}
    self._ended: collections.deque[_SessionRecord] = collections.deque(
        maxlen=KEEP_ENDED)
    self._info: dict[str, Any] = {"role": "process"}
    self._dirty = True
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self._write_failed = False
    self._process = {"pid": os.getpid(), "host": socket.gethostname(),
                     "process_start": _process_start(os.getpid()),
                     "argv": list(sys.argv)}

  def set_info(self, **fields: Any) -> None:
    """Adds process-level fields to the file (e.g. role="worker")."""
    with self._lock:
      self._info.update(_json_safe(fields))
      self._dirty = True

  def __call__(self, session: session_lib.TuningSession, obs, applied) -> None:
    """The tuner listener: records one step of `session`."""
    after = {k.name: float(applied.get(k.name, k.value)) for k in obs.knobs}
    last = {
        "updated": obs.time,
        "output_rate": _finite(obs.output_rate),
        "output_latency_s": _finite(obs.output_latency_s),
        "consumer_wait_s": _finite(obs.consumer_wait_s),
        "bound": ("input" if obs.output_latency_s > obs.consumer_wait_s
                  else "consumer"),
        "usable_cpus": obs.usable_cpus, "cpu_budget": obs.cpu_budget,
        "ram_budget": obs.ram_budget, "buffered_bytes": obs.buffered_bytes,
        "free_memory": obs.free_memory,
        "unlowerable_bytes": obs.unlowerable_bytes,
        "cache": cache_fields(session),
        "stages": stage_rows(obs),
    }
    with self._lock:
      rec = self._sessions.get(session.id)
      if rec is None:
        options = session.options
        rec = _SessionRecord(
            session_id=session.id, name=options.name, policy=options.policy,
            period_s=float(options.period_s), started=obs.time,
            initial_knobs={k.name: float(k.value) for k in obs.knobs})
        self._sessions[session.id] = rec
      rec.steps += 1
      if applied:
        rec.changes += 1
      rec.knobs = after
      rec.last = last
      self._dirty = True

  def snapshot(self) -> dict[str, Any]:
    """The file's contents now."""
    with self._lock:
      live = sorted(self._sessions.values(), key=lambda r: r.session_id)
      return {
          "format": FORMAT, **self._process, "updated": time.time(),
          **self._info,
          "sessions": [r.to_json() for r in live],
          "ended_sessions": [r.to_json() for r in self._ended],
      }

  def _forget_gone_sessions(self) -> None:
    with self._lock:
      if not self._sessions:
        return
    # Deferred: the sessions load TensorFlow, which readers of status files
    # (`intune inspect`) do not.
    from intune_tf.ops import session as session_lib  # noqa: PLC0415
    live = {s.id for s in session_lib.sessions()}
    with self._lock:
      for sid in [s for s in self._sessions if s not in live]:
        rec = self._sessions.pop(sid)
        rec.ended = time.time()
        self._ended.appendleft(rec)
        self._dirty = True

  def write_now(self) -> None:
    """Writes the file now (logs once and carries on if it cannot)."""
    try:
      files.write_json(self.path, self.snapshot())
      with self._lock:
        self._dirty = False
    except OSError as e:
      if not self._write_failed:
        logging.warning("InTune: cannot write the status file %s (%s); "
                        "`intune inspect` will not see this process. Set %s "
                        "to a writable directory or %s=off.", self.path, e,
                        ENV_DIR, ENV_SWITCH)
        self._write_failed = True

  def _run(self) -> None:
    last_write = time.monotonic()
    while not self._stop.wait(self._period_s):
      try:
        self._forget_gone_sessions()
        with self._lock:
          dirty = self._dirty
        if dirty or time.monotonic() - last_write >= HEARTBEAT_S:
          self.write_now()
          last_write = time.monotonic()
      except Exception:  # noqa: BLE001
        logging.exception("InTune status writer failed; will retry.")

  def start(self) -> None:
    """Removes stale files of dead processes, writes the file and keeps
    rewriting it from a background thread; removes it at exit."""
    remove_stale(self.directory)
    self.write_now()
    self._thread = threading.Thread(target=self._run,
                                    name="intune_status", daemon=True)
    self._thread.start()
    atexit.register(self.close)

  def close(self) -> None:
    """Stops rewriting (joins the thread: see `Tuner._stop_at_exit`) and
    removes the file."""
    self._stop.set()
    thread = self._thread
    if thread is not None and thread is not threading.current_thread():
      thread.join(timeout=10.0)
    try:
      self.path.unlink()
    except OSError:
      pass


class DecisionLog:
  """A tuner listener appending one JSON line per tuning step to a file.

  The file is private to the user (mode 0600), never opened through a
  symlink, opened without blocking (a FIFO, a socket or a folder is refused
  at once; a device such as /dev/null is taken), and rotated once it passes `max_bytes` (the previous lines move to
  `<path>.1`, replacing what was there): about two files of `max_bytes` at
  most. A write that fails (a full disk) drops the line; the failure is
  logged once, and again only after writing has worked in between.

  Args:
    path: the log file (appended to; created with its directory).
    tuner: the tuner whose policies' `last_decision` to record. Default None:
      no policy fields.
    max_bytes: size at which the file is rotated. Default 64 MiB (about a
      day of one session stepping every 0.5 s).

  Raises:
    OSError: the file cannot be opened, `path` is a symlink, or neither a
      regular file nor a device.
  """

  def __init__(self, path: str | os.PathLike, tuner=None,
               max_bytes: int = 64 << 20):
    self.path = pathlib.Path(path).expanduser()
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._tuner = tuner
    self._max_bytes = max_bytes
    self._lock = threading.Lock()
    self._steps: dict[int, int] = {}
    self._failing = False
    self._file = self._open()
    atexit.register(self.close)

  def _open(self):
    # Non-blocking: a FIFO with no reader must not hang the tuner's start.
    try:
      fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT |
                   os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as e:
      if os.path.islink(self.path):
        raise OSError(e.errno, f"InTune decision log {self.path} is a "
                      "symlink; give the path of a regular file") from e
      if not self.path.is_file() and self.path.exists():
        raise OSError(e.errno, f"InTune decision log {self.path} is not a "
                      "regular file (a FIFO, a device or a folder); give "
                      "the path of a regular file") from e
      raise
    mode = os.fstat(fd).st_mode
    # A regular file, or a device such as /dev/null that never blocks.
    if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode)):
      os.close(fd)
      raise OSError(errno.EINVAL, f"InTune decision log {self.path} is not "
                    "a regular file (a FIFO, a device or a folder); give the "
                    "path of a regular file")
    os.set_blocking(fd, True)
    # Unbuffered: a failed write leaves nothing behind to grow.
    return os.fdopen(fd, "ab", buffering=0)

  def _rotate_if_full(self) -> None:
    if self._file.tell() < self._max_bytes or not self.path.is_file():
      return
    self._file.close()
    os.replace(self.path, f"{self.path}.1")
    self._file = self._open()

  def __call__(self, session: session_lib.TuningSession, obs, applied) -> None:
    with self._lock:
      step = self._steps.get(session.id, 0) + 1
      self._steps[session.id] = step
    record: dict[str, Any] = {
        "time": obs.time, "pid": os.getpid(), "session": session.id,
        "name": session.options.name, "step": step,
        "policy": session.options.policy,
        "knobs": {k.name: float(applied.get(k.name, k.value))
                  for k in obs.knobs},
        "applied": dict(applied), "output_rate": obs.output_rate,
        "buffered_bytes": obs.buffered_bytes, "cpu_budget": obs.cpu_budget,
    }
    cache = cache_fields(session)
    if cache is not None:
      record["cache"] = cache
    policy = self._tuner.policy(session.id) if self._tuner else None
    decision = getattr(policy, "last_decision", None)
    if isinstance(decision, records.Decision):
      for key, value in decision.fields().items():
        record.setdefault(key, value)
    line = json.dumps(_json_safe(record), sort_keys=True)
    with self._lock:
      if self._file.closed:
        return
      try:
        self._file.write((line + "\n").encode("utf-8"))
        self._rotate_if_full()
      except OSError as e:
        if not self._failing:
          logging.warning("InTune: cannot write the decision log %s (%s); "
                          "its lines are dropped until writing works again.",
                          self.path, e)
        self._failing = True
        return
      self._failing = False

  def close(self) -> None:
    with self._lock:
      self._file.close()


_installed: dict[str, Any] = {}
_install_lock = threading.Lock()


def install(tuner) -> StatusWriter | None:
  """Adds the status writer (unless `INTUNE_STATUS` is off) and, with
  `INTUNE_DECISION_LOG` set, the decision log to `tuner`. Idempotent.

  Returns:
    The process's status writer, or None when status files are off.
  """
  with _install_lock:
    if "done" in _installed:
      return _installed.get("writer")
    _installed["done"] = True
    if enabled():
      writer = StatusWriter()
      try:
        writer.start()
      except OSError as e:
        logging.warning("InTune: status files off: cannot use %s (%s).",
                        writer.directory, e)
      else:
        tuner.add_listener(writer)
        _installed["writer"] = writer
    log_path = os.environ.get(ENV_DECISION_LOG)
    if log_path:
      try:
        log = DecisionLog(log_path, tuner)
      except OSError as e:
        logging.error("InTune: cannot open the decision log %s=%s: %s",
                      ENV_DECISION_LOG, log_path, e)
      else:
        tuner.add_listener(log)
        _installed["decision_log"] = log
    return _installed.get("writer")


def writer() -> StatusWriter | None:
  """This process's status writer, once the tuner has started (else None)."""
  return _installed.get("writer")


def remove_stale(directory: str | os.PathLike) -> list[pathlib.Path]:
  """Deletes status files of this host's processes that are gone (files of
  other hosts are left to them); returns their paths. A file that is not a
  valid status file is left alone, with one warning naming it (`_read`)."""
  removed = []
  here = socket.gethostname()
  for path in pathlib.Path(directory).glob("*.json"):
    data = _read(path)
    if data is not None and data.get("host") == here and not _is_live(data):
      try:
        path.unlink()
        removed.append(path)
      except OSError:
        pass
  return removed


def read_json_file(path: str | os.PathLike, max_bytes: int = 4 << 20) -> Any:
  """The JSON value in a regular file of this user of at most `max_bytes`
  (default 4 MiB), checked before anything is read: a FIFO, a device, a
  folder, another user's file or a huge file is refused at once (opened
  non-blocking, so a FIFO cannot hang the reader).

  Raises:
    OSError: the file cannot be opened.
    ValueError: not a regular file, another user's, too large, not UTF-8,
      not JSON, or nested too deeply to parse.
  """
  fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
  with os.fdopen(fd, "rb") as f:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
      raise ValueError(f"{path} is not a regular file")
    if info.st_uid != os.getuid():
      raise ValueError(f"{path} belongs to uid {info.st_uid}, not this "
                       f"user's {os.getuid()}")
    if info.st_size > max_bytes:
      raise ValueError(f"{path} has {info.st_size} bytes, more than the "
                       f"{max_bytes} such a file may hold")
    text = f.read(max_bytes + 1)
  if len(text) > max_bytes:
    raise ValueError(f"{path} grew past {max_bytes} bytes while read")
  try:
    return json.loads(text.decode("utf-8"))
  except RecursionError:
    raise ValueError(f"{path} nests its JSON too deeply") from None


_NUMBER = (int, float)
_OPTIONAL_NUMBER = (int, float, type(None))
# The fields of a session entry that `intune inspect` reads, and their types
# (bool is an int: a flag passes as a number, which prints as one).
_SESSION_FIELDS = {
    "id": (int,), "name": (str, type(None)), "alive": (bool,),
    "steps": (int,), "changes": (int,), "output_rate": _OPTIONAL_NUMBER,
    "output_latency_s": _OPTIONAL_NUMBER, "consumer_wait_s": _OPTIONAL_NUMBER,
    "buffered_bytes": _OPTIONAL_NUMBER, "ram_budget": _OPTIONAL_NUMBER,
    "unlowerable_bytes": (dict, type(None)), "cache": (dict, type(None)),
    "stages": (list,),
}
# The fields of a session's `cache` (`cache_fields`).
_CACHE_FIELDS = {
    "state": (str,), "point": (str,), "reason": (str,), "bytes": _NUMBER, "limit": _NUMBER,
    "elements": _NUMBER, "complete": (bool,), "served": _NUMBER,
    "saved_s": _NUMBER,
}
_STAGE_FIELDS = {
    "stage": (str,), "parallelism": _OPTIONAL_NUMBER,
    "buffer": _OPTIONAL_NUMBER, "buffer_fill": _OPTIONAL_NUMBER,
    "rate": _OPTIONAL_NUMBER, "cpus": _OPTIONAL_NUMBER,
    "cpu_share": _OPTIONAL_NUMBER, "utilization": _OPTIONAL_NUMBER,
}

# The fields of a dispatcher's worker pool (`service.manager.PoolManager.report`)
# that `intune inspect` reads, and of each of its last decisions.
_POOL_FIELDS = {
    "kind": (str,), "min": (int,), "max": (int,), "size": (int,),
    "serving": (int,), "standby": (int,), "lost": (int,),
    "failures": (int,), "reason": (str, type(None)), "decisions": (list,),
}
_DECISION_FIELDS = {
    "before": (int,), "size": (int,), "reason": (str,),
    "error": (str, type(None)),
}


def _wrong(where: str, value: Any, expected: str) -> str:
  return (f"{where} is {value!r:.40} ({type(value).__name__}), expected "
          f"{expected}")


def _type_names(types: tuple[type, ...]) -> str:
  return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def _out_of_range(value: Any) -> bool:
  """A number a status file may not hold: not finite, or below 0 (every
  number the writer puts there is a count, a rate, a time or a size)."""
  return (isinstance(value, _NUMBER) and not isinstance(value, bool) and
          not (math.isfinite(value) and value >= 0))


def _field_problem(where: str, value: Any,
                   types: tuple[type, ...]) -> str | None:
  if not isinstance(value, types):
    return _wrong(where, value, _type_names(types))
  if _out_of_range(value):
    return _wrong(where, value, "a finite number >= 0")
  return None


def _fields_problem(where: str, entry: Mapping[str, Any],
                    fields: Mapping[str, Any]) -> str | None:
  """The first of `fields` (name: accepted types) present in `entry` whose
  value is of a wrong type or out of range, as `_field_problem` says it,
  named "<where>.<field>"; None when there is none."""
  for field, types in fields.items():
    if field in entry and (problem := _field_problem(
        f"{where}.{field}", entry[field], types)):
      return problem
  return None


def _pool_problem(pool: Any) -> str | None:
  """What makes a dispatcher's `pool` unusable (`format_problem`)."""
  if pool is None:
    return None
  if not isinstance(pool, dict):
    return _wrong("pool", pool, "an object")
  if (problem := _fields_problem("pool", pool, _POOL_FIELDS)):
    return problem
  for i, entry in enumerate(pool.get("decisions", [])):
    if not isinstance(entry, dict):
      return _wrong(f"pool.decisions[{i}]", entry, "a decision object")
    if (problem := _fields_problem(f"pool.decisions[{i}]", entry,
                                   _DECISION_FIELDS)):
      return problem
  return None


def format_problem(data: Mapping[str, Any]) -> str | None:
  """What makes a status file's contents (format `FORMAT`) unusable: the
  first field of a wrong type or out of its range, as "<field> is <value>
  (<type>), expected <what>"; None when every field read has its type and
  range: `pid` a process id (`host.is_pid`), `host` a string,
  `updated` and `process_start` (or null) finite times >= 0, every number of a
  session or stage row finite and >= 0, a dispatcher's `pool` (or null) an
  object whose counts are integers >= 0 and whose reasons are strings. A
  field left out is fine (it prints as "?" or "-"; a file of this host
  without `process_start` is stale)."""
  if not host.is_pid(data.get("pid")):
    return _wrong("pid", data.get("pid"),
                  f"a process id from 1 to {host.PID_MAX}")
  if not isinstance(data.get("host", ""), str):
    return _wrong("host", data["host"], "a host name")
  for field, types in (("updated", _NUMBER),
                       ("process_start", _OPTIONAL_NUMBER)):
    if field in data and (problem := _field_problem(
        field, data[field], types)):
      return problem
  if not isinstance(data.get("service") or {}, dict):
    return _wrong("service", data["service"], "an object")
  if (problem := _pool_problem(data.get("pool"))):
    return problem
  for group in ("sessions", "ended_sessions"):
    sessions = data.get(group, [])
    if not isinstance(sessions, list):
      return _wrong(group, sessions, "a list of session objects")
    for i, entry in enumerate(sessions):
      where = f"{group}[{i}]"
      if not isinstance(entry, dict):
        return _wrong(where, entry, "a session object")
      if (problem := _fields_problem(where, entry, _SESSION_FIELDS)):
        return problem
      if "id" not in entry:
        return f"{where} has no id"
      for stage, held in (entry.get("unlowerable_bytes") or {}).items():
        if not isinstance(held, _NUMBER) or _out_of_range(held):
          return _wrong(f"{where}.unlowerable_bytes[{stage!r}]", held,
                        "a number of bytes")
      if entry.get("cache") and (problem := _fields_problem(
          f"{where}.cache", entry["cache"], _CACHE_FIELDS)):
        return problem
      for j, row in enumerate(entry.get("stages", [])):
        if not isinstance(row, dict) or "stage" not in row:
          return _wrong(f"{where}.stages[{j}]", row, "a stage row object")
        if (problem := _fields_problem(f"{where}.stages[{j}]", row,
                                       _STAGE_FIELDS)):
          return problem
  return None


# Status files found unusable by `_read`, each warned about once.
_warned_unreadable: set[str] = set()
_warned_lock = threading.Lock()


def _read(path: pathlib.Path) -> dict[str, Any] | None:
  """The status in `path`, or None: a file removed since it was listed
  (silently), or one that is not a valid status file of this user (not a
  regular file, too large, not JSON, another format, a field of a wrong type
  or range: `format_problem`), skipped with one warning naming it (once per
  process)."""
  try:
    data = read_json_file(path)
  except FileNotFoundError as e:
    if not os.path.lexists(path):
      return None  # removed since it was listed
    problem = f"it is a link to nothing ({e})"
  except (OSError, ValueError) as e:
    problem = str(e)
  else:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
      problem = f"it is not a {FORMAT} object"
    else:
      problem = format_problem(data)
  if problem is None:
    return data
  with _warned_lock:
    told = str(path) in _warned_unreadable
    _warned_unreadable.add(str(path))
  if not told:
    logging.warning(
        "InTune: skipped the status file %s: %s. The other processes' "
        "files are still read; delete this one if its process is gone, or "
        "update the intune_tf of the process that wrote it.", path, problem)
  return None


def read_all(
    directory: str | os.PathLike | None = None) -> list[dict[str, Any]]:
  """Status of every live process in `directory` (default `default_dir()`),
  by pid. Files of processes that are gone are ignored; a file that is not
  a valid status file (`_read`) is skipped with one warning naming it (once
  per process)."""
  directory = pathlib.Path(directory) if directory else default_dir()
  result = []
  for path in sorted(directory.glob("*.json")):
    data = _read(path)
    if data is not None and _is_live(data):
      result.append(data)
  return sorted(result, key=lambda d: d["pid"])
