"""The tuner loop: observe, decide, apply, for every live session.

One background thread per process steps every live session at the period of
its options (default 0.5 s). A training loop can instead call `step()` itself.
"""

from __future__ import annotations

import atexit
import contextlib
import re
import threading
import time
from typing import Any, Mapping, Sequence

from absl import logging
import numpy as np
from tensorflow.python.eager import context

from intune_tf import arbiter as arbiter_lib
from intune_tf import host
from intune_tf import options as options_lib
from intune_tf.live import observation as observation_lib
from intune_tf.live import registry
from intune_tf.observe import status
from intune_tf.ops import session as session_lib
from intune_tf.records import CacheState
from intune_tf.records import StageStats
from intune_tf.tuning import env as env_lib
from intune_tf.tuning import policies

# Longest wait for the tuner thread's current step at interpreter exit.
_EXIT_JOIN_S = 10.0
# Longest wait of the tuner thread: a new iterator is seen within this time.
# Each wake lists the sessions (an op call), so shorter costs CPU.
_DISCOVERY_S = 0.25
# How long a step of a session that another thread is stepping waits for
# that step to end (it stands for both); a step stuck longer holds up no one.
_STEP_WAIT_S = 10.0
# How often a static policy's session is observed while its knobs and
# listeners leave nothing to apply or report: enough for the warnings and
# the host share to see a buffer filled after its first step.
_HELD_OBSERVE_S = 1.0
# Distinct errors a session logs; later ones are not told.
_MAX_REPORTS = 5
# What the guard cannot lower (shuffle and cache buffers, buffers of fixed
# size) is warned about when a stage holds at least this share of its
# session's RAM budget: from there the buffers InTune tunes have at most
# three quarters of the budget left. Smaller holdings only show in
# `intune inspect` and `TuningSession.counters()["unlowerable_bytes"]`.
UNLOWERABLE_WARN_SHARE = 0.25
# How often the default RAM budgets are shared out again.
_BUDGET_PERIOD_S = 1.0
# A share is written only when it moves by more than this fraction.
_BUDGET_TOLERANCE = 0.05
# A map above a shuffle that the row-wise proof refuses is told (INFO, once
# per pipeline) when it takes at least this share of the pipeline's CPU,
# measured over at least `_ROW_WISE_MIN_ELEMENTS` of its elements.
ROW_WISE_TELL_SHARE = 0.10
_ROW_WISE_MIN_ELEMENTS = 8
# The cache's reason for a refused map (rewrites/row_wise.h,
# RowWiseChain::Describe): the map, its op, the shuffle, the batch, the
# row-wise maps below it, and the proof's refusal.
_REFUSED_MAP = re.compile(
    r"the map (\S+) \((\w+)\) after shuffle (\S+) and batch (\S+) is not "
    r"row-wise(?: \(([^)]*) below it is\))?: (.*?)(?:; |$)")
# Refusals that no move of the map changes: its output differs every epoch.
_NOT_DETERMINISTIC = (" is random", " reads a variable")
_MAP_NODES = ("Map", "ParallelMap", "ParallelMapV2")
_BATCH_NODES = ("Batch", "BatchV2", "ParallelBatch")


def default_budget_shares(available: int, held: list[int],
                          share: float) -> list[int]:
  """RAM budgets of the sessions of a process that left `ram_budget` at None:
  `share` of the memory they could use (available now, plus what they hold,
  which `available` no longer counts), split evenly among them.

  Example: available 800, held [100, 100], share 0.5:
  (800 + 200) * 0.5 / 2 = 250 each.

  Returns:
    One budget (bytes, at least 1) per entry of `held`.
  """
  if not held:
    return []
  total = share * (max(0, available) + sum(held))
  return [max(1, int(total / len(held)))] * len(held)


def even_split(total: int, count: int) -> list[int]:
  """`total` bytes split evenly over `count` sessions, at least 1 each.

  Example: 1000 bytes over 3 sessions -> [333, 333, 333].
  """
  return [max(1, int(total) // count)] * count if count > 0 else []


def process_demand(observations: list, buffered: int) -> arbiter_lib.Demand:
  """What this process publishes to the host arbiter, from the last
  observation of each of its host-sharing sessions: its rows/s, the CPUs its
  pipelines keep busy (each stage's rate x CPU-seconds per element), the
  CPUs it can use (`arbiter.cpus_wanted`: any number when a session is
  input-bound, its consumer waiting longer in GetNext than between calls),
  and the `buffered` bytes of its sessions and policies.

  Example: two sessions at 100 and 50 rows/s, busy 0.4 and 0.4 CPUs, both
  consumer-bound -> rate 150, busy 0.8, wanted 1.25 x 0.8 = 1.0.
  """
  rate = sum(max(0.0, float(o.output_rate)) for o in observations)
  busy = sum(max(0.0, float(st.cpu_per_element_s * st.rate))
             for o in observations for st in o.stages)
  input_bound = not observations or any(
      o.output_latency_s > o.consumer_wait_s for o in observations)
  return arbiter_lib.Demand(
      rate=rate, busy_cpus=busy,
      cpus_wanted=arbiter_lib.cpus_wanted(busy, input_bound),
      buffered_bytes=max(0, int(buffered)))


# Elements read past an empty cache before the tuner says the budget left it
# no room (`Tuner._tell_cache`).
CACHE_EMPTY_AFTER = 64


def unlowerable_matters(held: int, budget: int) -> bool:
  """Whether `held` bytes that the guard cannot lower are a real share of a
  `budget` of bytes: at least `UNLOWERABLE_WARN_SHARE` of it (any amount
  when the budget is not positive).

  Examples: 4.4 MB of an 11 GB budget -> False (0.04%); 6 MB of 24 MB ->
  True (6 / 24 = 0.25); 5 MB of 24 MB -> False (0.21).
  """
  if held <= 0:
    return False
  return budget <= 0 or held >= UNLOWERABLE_WARN_SHARE * budget


def buffer_budget(budget: int, policy_bytes: int) -> int:
  """What the guard enforces on a pipeline's buffers: its session's RAM
  `budget` less the memory its policy holds, at least 1 byte.

  Examples: budget 48 MiB, policy 16 MiB -> 32 MiB; budget 8, policy 10 -> 1.
  """
  return max(1, int(budget) - max(0, int(policy_bytes)))


def refused_map_share(reason: str, stats: Sequence[StageStats]
                      ) -> tuple[str, str, float] | None:
  """The share of the pipeline's CPU that the map the row-wise proof refused
  takes, from the cache's `reason` and the session's stage statistics.

  The map is found from the batch that reads the shuffle, up: the
  `k + 1`-th map stage above it, `k` the row-wise maps the reason names
  below the refused one.

  Args:
    reason: `TuningSession.cache()["reason"]`.
    stats: `TuningSession.stats()`.

  Returns:
    `(stage name, the proof's refusal, share of all stages' processing
    time)`, or None when the reason refuses no map, the refusal is one no
    move changes (random ops, variables), the stage is not found, or it has
    produced fewer than `_ROW_WISE_MIN_ELEMENTS` elements.
  """
  match = _REFUSED_MAP.search(reason)
  if match is None:
    return None
  below, refusal = match.group(5), match.group(6)
  if any(word in refusal for word in _NOT_DETERMINISTIC):
    return None
  skip = len(below.split(", ")) if below else 0
  by_name = {s.name: s for s in stats}
  for stage in stats:
    parts = stage.name.split(".")
    shuffled = any(i.split(".")[-1].startswith("Shuffle")
                   for i in stage.inputs)
    if parts[-1] not in _BATCH_NODES or not shuffled:
      continue
    for end in range(len(parts) - 1, 0, -1):
      if parts[end - 1] not in _MAP_NODES:
        continue
      if skip > 0:
        skip -= 1
        continue
      found = by_name.get(".".join(parts[:end]))
      total = sum(s.processing_time_ns for s in stats)
      if (found is None or found.elements < _ROW_WISE_MIN_ELEMENTS or
          total <= 0):
        return None
      return found.name, refusal, found.processing_time_ns / total
  return None


class _Tuned:
  """Per-session state of the tuner."""

  def __init__(self, session: session_lib.TuningSession):
    self.session = session
    if session.options_error is not None:
      raise ValueError(
          f"its options could not be read ({session.options_error})")
    self.policy = registry.create(session.options)
    try:
      self.policy.bind(session)
    except Exception as e:  # noqa: BLE001
      logging.warning("InTune: %s.bind(%r) failed (tuning goes on): %r",
                      type(self.policy).__name__, session, e)
    self.env = observation_lib.LiveEnv(session)
    self.last_good: dict[str, float] | None = None
    self.reported: set[tuple[str, str]] = set()  # see `first_report`
    self.next_step = 0.0
    self.observed_at = 0.0  # when `last_obs` was taken (monotonic)
    self.static_knobs: tuple[str, ...] | None = None
    self.policy_memory_told = False  # see `Tuner._apply_budgets`
    self.last_obs = None  # the last observation (`process_demand`)
    self.knobs_seen = False  # see `Tuner._tell_nothing_to_do`
    self.told: set[str] = set()  # what `_tell_nothing_to_do` said
    # Held while this session is stepped: the background thread, a training
    # loop's `step_session` and a caller's `Tuner.step` may reach it at once;
    # the step under way stands for the others, which wait for it (up to
    # `_STEP_WAIT_S`: a stuck session holds up the sessions after it no
    # longer) and do not interleave with it (its listeners would see a held
    # step before the one that applied).
    self.stepping = threading.Lock()

  def first_report(self, where: str, error: Exception) -> bool:
    """Whether `error` in `where` ("policy" or "step") is new for this
    session: each distinct error is logged once, and at most
    `_MAX_REPORTS` of them."""
    key = (where, f"{type(error).__name__}: {error}")
    if key in self.reported or len(self.reported) >= _MAX_REPORTS:
      return False
    self.reported.add(key)
    return True


class Tuner:
  """Steps the policy of every live session."""

  def __init__(self):
    self._lock = threading.Lock()
    self._tuned: dict[int, _Tuned] = {}
    self._untunable: set[int] = set()  # sessions whose policy failed to make
    self._thread: threading.Thread | None = None
    self._stop = threading.Event()
    self._listeners = []
    self._driven: set[int] = set()
    self._failed_listeners: set[int] = set()
    self._budgets_shared_at = -float("inf")
    self._budget_failure_reported = False
    self._host_failure_reported = False
    self._budget_logged: set[int] = set()
    self._unlowerable_told: set[str] = set()  # see `_tell_unlowerable`
    self._cache_told: set[tuple[str, str]] = set()  # see `_tell_cache`
    self._row_wise_told: set[tuple[str, str]] = set()  # `_tell_row_wise`
    self._stops_at_exit = False

  def drive(self, session_id: int) -> None:
    """The caller steps this session itself (`step_session`); the background
    thread leaves it alone until `release`."""
    with self._lock:
      self._driven.add(session_id)

  def release(self, session_id: int) -> None:
    with self._lock:
      self._driven.discard(session_id)

  def step_session(self, session_id: int) -> None:
    """One tuning step of one session, now (for training loops)."""
    with self._lock:
      t = self._tuned.get(session_id)
    if t is None:
      self.step()  # registers new sessions
      with self._lock:
        t = self._tuned.get(session_id)
    if t is not None:
      self._step_one(t)

  def add_listener(self, fn) -> None:
    """Calls `fn(session, observation, applied)` after every tuning step."""
    self._listeners.append(fn)

  def policy(self, session_id: int) -> policies.Policy | None:
    """The policy instance tuning `session_id` (None before its first step)."""
    with self._lock:
      t = self._tuned.get(session_id)
    return t.policy if t is not None else None

  def remove_listener(self, fn) -> None:
    if fn in self._listeners:
      self._listeners.remove(fn)

  def start(self) -> None:
    """Starts the background thread (once), after publishing the default
    RAM budget (`publish_default_budget`): the iterator about to be made
    takes it."""
    self.publish_default_budget()
    with self._lock:
      if self._thread is None or not self._thread.is_alive():
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="intune_tuner",
                                        daemon=True)
        self._thread.start()
    if self is _TUNER:
      # status file, decision log (see intune_tf.observe.status)
      status.install(self)
      # The sessions' host counters (`TuningSession.counters()`) read the share
      # of the arbiter this tuner drives; the sessions sit below it, and are
      # told.
      session_lib.set_host_share_source(arbiter_lib.current_share)
    with self._lock:
      # Registered after the listeners' own exit handlers, so it runs first
      # (atexit is last in, first out): no step writes to a closed log.
      if not self._stops_at_exit:
        atexit.register(self._stop_at_exit)
        self._stops_at_exit = True

  def stop(self) -> None:
    self._stop.set()

  def _stop_at_exit(self) -> None:
    """Stops and joins the thread before the interpreter finalizes.

    A daemon thread that is inside an op call when finalization begins is
    ended mid-call as it takes the GIL back, unwinding TensorFlow's frames:
    the process may abort ("terminate called without an active exception")
    or hang at exit. atexit runs while daemon threads still run normally.
    """
    self._stop.set()
    thread = self._thread
    if thread is not None and thread is not threading.current_thread():
      thread.join(timeout=_EXIT_JOIN_S)
    arbiter_lib.arbiter().withdraw()

  def _run(self) -> None:
    # Eager in this thread also where the program turned eager execution off
    # (TF1 style): the policies' networks and the control ops run eagerly.
    with context.eager_mode():
      self._loop()

  def _loop(self) -> None:
    while not self._stop.is_set():
      try:
        self.step(only_due=True)
      except Exception:  # noqa: BLE001
        logging.exception("InTune tuner step failed; will retry.")
      wait = min([t.next_step for t in self._tuned.values()] or
                 [time.monotonic() + _DISCOVERY_S]) - time.monotonic()
      self._stop.wait(min(max(wait, 0.005), _DISCOVERY_S))

  def step(self, only_due: bool = False) -> None:
    """Runs one tuning step on every live session (or only on those due)."""
    live = session_lib.sessions()
    with self._lock:
      ids = {s.id for s in live}
      for gone in set(self._tuned) - ids:
        del self._tuned[gone]
      self._untunable &= ids
      for s in live:
        if s.id not in self._tuned and s.id not in self._untunable:
          try:
            self._tuned[s.id] = _Tuned(s)
          except Exception as e:  # noqa: BLE001
            # An unknown policy in a foreign tag (ValueError), or a bug or an
            # unreadable file in a policy's constructor: this session runs
            # with the knob values it has; the others are still tuned.
            logging.error(
                "InTune session %d cannot be tuned: its policy %r could not "
                "be made: %r. Its pipeline runs with the values it has.",
                s.id, s.options.policy, e,
                exc_info=not isinstance(e, ValueError))
            self._untunable.add(s.id)
      tuned = list(self._tuned.values())
    now = time.monotonic()
    if now - self._budgets_shared_at >= _BUDGET_PERIOD_S:
      self._budgets_shared_at = now
      self.publish_default_budget()
      self._apply_budgets(tuned)
    for t in tuned:
      if only_due and (now < t.next_step or t.session.id in self._driven):
        continue
      t.next_step = now + t.session.options.period_s
      self._step_one(t)

  def publish_default_budget(self) -> None:
    """Resolves, on this machine and now, the RAM budget of the sessions
    made from now on that leave `ram_budget` unset:
    `options.DEFAULT_RAM_SHARE` of the available memory and of what the
    process's caches and buffers hold (a new session's share is re-split
    with the others at the next budget round). It is also the budget that
    all the process's caches and buffers stay under, with an iterator or
    without one (`session.process_caches`)."""
    try:
      # What the caches and buffers hold is no longer available: it is
      # added back, so that a filling cache does not lower its own budget.
      held = session_lib.process_caches()
      session_lib.set_default_ram_budget(int(
          options_lib.DEFAULT_RAM_SHARE *
          (host.available_memory() + held["bytes"] + held["buffered"])))
    except Exception as e:  # noqa: BLE001
      self._budget_failed(None, e)

  def _apply_budgets(self, tuned: list[_Tuned]) -> None:
    """Writes each session's buffer budget (`buffer_budget`): its RAM budget
    (the user's `ram_budget`, the value given to `TuningSession.set_ram_budget`,
    or its share of this process's default budget) less what its policy
    holds.

    The default budget is this process's share of the host
    (`arbiter.HostArbiter.update`, which renews its lease) for sessions
    with `host_share` on, split evenly among them; for the others (and for
    all when the lease folder cannot be used), `default_budget_shares` of
    the host's memory, re-read now: a training and a validation iterator
    share it instead of taking half each, and a tf.data service worker
    budgets from its own memory."""
    counters, held = {}, {}
    for t in tuned:
      try:
        counters[t.session.id] = t.session.counters()
        held[t.session.id] = self._policy_bytes(t)
      except Exception as e:  # noqa: BLE001
        self._budget_failed(t, e)  # this session's budget stays as it is
    tuned = [t for t in tuned if t.session.id in counters]
    budgets = {}
    default = []
    for t in tuned:
      s = t.session
      user = (counters[s.id]["pinned_ram_budget"] or s.options.ram_budget)
      if user is not None:
        budgets[s.id] = user
      else:
        default.append(s.id)
    sharing = [t for t in tuned if t.session.options.host_share]
    share = self._host_share(sharing, counters, held,
                             whole_process=len(sharing) == len(tuned))
    alone = default
    if share is not None:
      on_host = [t.session.id for t in sharing if t.session.id in default]
      budgets.update(zip(on_host, even_split(share.ram, len(on_host))))
      alone = [i for i in default if i not in budgets]
    if alone:
      try:
        # The caches' bytes count as the buffers' do: held, not gone.
        available = (host.available_memory() +
                     session_lib.process_caches()["bytes"])
      except Exception as e:  # noqa: BLE001
        self._budget_failed(None, e)
        tuned = [t for t in tuned if t.session.id in budgets]
        default = [i for i in default if i in budgets]
      else:
        budgets.update(zip(alone, default_budget_shares(
            available,
            [counters[i]["buffered_bytes"] + held[i] for i in alone],
            options_lib.DEFAULT_RAM_SHARE)))
    for t in tuned:
      try:
        self._apply_budget(t, budgets[t.session.id], held[t.session.id],
                           counters[t.session.id])
      except Exception as e:  # noqa: BLE001
        self._budget_failed(t, e)  # the other sessions' budgets go on
    for sid in default:
      if sid not in self._budget_logged:
        self._budget_logged.add(sid)
        logging.debug("InTune session %d: RAM budget %d MB, its share of "
                      "this process's default budget.", sid,
                      budgets[sid] >> 20)
    self._budget_logged &= set(default)

  def _host_share(self, sharing: list[_Tuned], counters: Mapping[int, Any],
                  held: Mapping[int, int],
                  whole_process: bool) -> arbiter_lib.Share | None:
    """Renews this process's lease with the host arbiter and returns its
    share, or withdraws the lease (None) when no session shares the host.
    The process's weight is the largest `host_weight` of `sharing`; it runs
    on the CPUs its share is confined to (`arbiter.confine_to`;
    `whole_process`: every session of it shares the host)."""
    arbiter = arbiter_lib.arbiter()
    if not sharing:
      if arbiter.share() is not None:
        arbiter.withdraw()
        host.place_process(None)
      return None
    try:
      total, available = host.memory()
      demand = process_demand(
          [t.last_obs for t in sharing if t.last_obs is not None],
          sum(counters[t.session.id]["buffered_bytes"] + held[t.session.id]
              for t in sharing))
      share = arbiter.update(
          weight=max(t.session.options.host_weight for t in sharing),
          demand=demand, cpus=host.usable_cpus(), available=available,
          limit=total, ram_share=options_lib.DEFAULT_RAM_SHARE,
          cpu_ids=host.cpu_ids(), whole_process=whole_process)
      host.place_process(None if share is None else share.confined)
      return share
    except Exception as e:  # noqa: BLE001
      if not self._host_failure_reported:
        self._host_failure_reported = True
        logging.error("InTune: the host arbiter failed: %r (reported once; "
                      "this process budgets as if alone).", e, exc_info=True)
      with contextlib.suppress(Exception):
        host.place_process(None)  # alone: on every CPU given to it
      return None

  def _apply_budget(self, t: _Tuned, budget: int, held: int,
                    counters: Mapping[str, int]) -> None:
    """Writes one session's buffer budget (`buffer_budget`) if it moved by
    more than `_BUDGET_TOLERANCE`; warns once if its policy holds more than
    half of `budget`."""
    target = buffer_budget(budget, held)
    if abs(target - counters["ram_budget"]) > _BUDGET_TOLERANCE * target:
      t.session._apply_ram_budget(target)  # noqa: SLF001
    if held * 2 > budget and not t.policy_memory_told:
      t.policy_memory_told = True
      logging.warning(
          "InTune session %d: its policy %r holds %d MB of its %d MB RAM "
          "budget, which leaves %d MB for the pipeline's buffers. Give "
          "it a larger ram_budget, or use a policy without a replay "
          "buffer (policy='climb').", t.session.id, t.session.options.policy,
          held >> 20, budget >> 20, target >> 20)

  def _budget_failed(self, t: _Tuned | None, error: Exception) -> None:
    """Reports a failure of the budget pass for one session (`t`), or for
    every session that shares the default budget (None): once per session
    and distinct error (`_Tuned.first_report`), once per process for the
    default budget. A session that is gone is not reported."""
    if isinstance(error, session_lib.SessionGoneError):
      return  # its entry goes at the next step
    if t is None:
      if self._budget_failure_reported:
        return
      self._budget_failure_reported = True
      logging.error("InTune could not read the memory available for the "
                    "default RAM budgets: %r (reported once; those budgets "
                    "stay as they are, budgets set by the user still apply).",
                    error, exc_info=True)
    elif t.first_report("budget", error):
      logging.error("InTune could not apply the RAM budget of %r: %r "
                    "(reported once; its budget stays as it is, the other "
                    "sessions' budgets are still applied).", t.session, error,
                    exc_info=True)

  def _policy_bytes(self, t: _Tuned) -> int:
    """`t.policy.held_bytes()`; 0 (the failure reported once) if it fails."""
    try:
      held = t.policy.held_bytes()
      if isinstance(held, bool) or not isinstance(held, (int, np.integer)):
        raise TypeError(f"held_bytes() returned {held!r}, not an int")
      return max(0, int(held))
    except Exception as e:  # noqa: BLE001
      if t.first_report("policy", e):
        logging.error("InTune session %d: held_bytes() of its policy %r "
                      "failed: %r (its memory is not taken from the budget).",
                      t.session.id, t.session.options.policy, e)
      return 0

  def _step_one(self, t: _Tuned) -> None:
    """One step of one session. Never raises: a failure is logged once per
    session and the session keeps its last configuration, so that neither
    the other sessions nor a training loop that drives the step stop. While
    another thread steps the session (`_Tuned.stepping`), waits up to
    `_STEP_WAIT_S` for that step, which stands for this one, and returns:
    the caller sees a step done, and the listeners each step once."""
    if not t.stepping.acquire(blocking=False):
      if t.stepping.acquire(timeout=_STEP_WAIT_S):
        t.stepping.release()
      return
    try:
      self._step_one_unguarded(t)
    except session_lib.SessionGoneError:
      pass
    except Exception as e:  # noqa: BLE001
      if t.first_report("step", e):
        logging.error("InTune tuning step of %r failed: %r. Its pipeline "
                      "keeps its configuration; reported once.", t.session,
                      e, exc_info=True)
    finally:
      t.stepping.release()

  def _call_listeners(self, t: _Tuned, obs, applied) -> None:
    for listener in list(self._listeners):
      try:
        listener(t.session, obs, applied)
      except Exception as e:  # noqa: BLE001
        if id(listener) not in self._failed_listeners:
          self._failed_listeners.add(id(listener))
          logging.error("InTune step listener %r failed: %r (reported once; "
                        "tuning goes on).", listener, e, exc_info=True)

  def _tell_unlowerable(self, t: _Tuned, obs) -> None:
    """Warns, once per stage name in the process (however many sessions
    run that pipeline), of a stage whose buffer the guard cannot lower when
    it holds a real share of the budget (`unlowerable_matters`)."""
    for stage, held in obs.unlowerable_bytes.items():
      if (stage not in self._unlowerable_told and
          unlowerable_matters(held, obs.ram_budget)):
        self._unlowerable_told.add(stage)
        logging.warning(
            "InTune %r: stage %s holds %.1f MB that the RAM budget guard "
            "cannot lower (a shuffle or cache buffer, or a buffer of fixed "
            "size), %.0f%% of the budget (%.0f MB); the buffers and threads "
            "InTune tunes share the rest. Give it a larger ram_budget or "
            "make that buffer smaller. Reported once per stage; `intune "
            "inspect` and TuningSession.counters()['unlowerable_bytes'] show "
            "every such stage.", t.session, stage, held / (1 << 20),
            100 * held / max(1, obs.ram_budget), obs.ram_budget / (1 << 20))

  def _tell_nothing_to_do(self, t: _Tuned, obs) -> None:
    """Says, once per session, when the option can do nothing: at INFO, a
    pipeline that returned elements with no stage to tune; at WARNING, a
    buffer whose one element is larger than the RAM budget (a buffer keeps
    at least one element, so the guard cannot hold the budget)."""
    t.knobs_seen = t.knobs_seen or bool(obs.knobs)
    if (not t.knobs_seen and obs.output_rate > 0 and obs.stages and
        "no knobs" not in t.told):
      t.told.add("no knobs")
      logging.info(
          "InTune %r: the pipeline has no stage to tune (no parallel map, "
          "interleave, batch or prefetch left on tf.data.AUTOTUNE), so the "
          "option does nothing for it. Leave the stages to tune on "
          "AUTOTUNE, or set IntuneOptions(include_fixed=True) to tune fixed "
          "ones.", t.session)
    if obs.ram_budget <= 0:
      return
    for st in obs.stages:
      if ((st.buffer_size is not None or st.buffered_bytes > 0) and
          st.bytes_per_element > obs.ram_budget and st.name not in t.told):
        t.told.add(st.name)
        logging.warning(
            "InTune %r: one element of stage %s holds %d bytes (%.1f MB), "
            "more than the RAM budget of %d bytes (%.1f MB). A buffer keeps "
            "at least one element, so the pipeline holds more than the "
            "budget. Give it a ram_budget of at least a few elements, or "
            "make the elements smaller. Reported once per stage.",
            t.session, st.name, int(st.bytes_per_element),
            st.bytes_per_element / (1 << 20), obs.ram_budget,
            obs.ram_budget / (1 << 20))

  def _tell_cache(self, t: _Tuned) -> None:
    """Says, once per pipeline in the process (its cache point and
    options: `model.fit` makes a session per epoch), where InTune cached
    (INFO, once the cache served elements), why the cache gave up where it
    was placed (INFO: too little room for an epoch, files too costly to
    check, elements it cannot count), or that the RAM budget left it no room
    for one element (one WARNING line). A session stops reading once it is
    decided. A pipeline given no place for a cache is not told here:
    `TuningSession.cache()` and the status file say why."""
    if "cache" in t.told:
      return
    cache = t.session.cache()
    key = (cache["point"], t.session.options.to_json())
    if not cache["point"] or key in self._cache_told:
      t.told.add("cache")
      return
    if cache["state"] is CacheState.DECLINED:
      # The cache's own decision, at its first element (its point is kept).
      t.told.add("cache")
      self._cache_told.add(key)
      logging.info("InTune %r: no cache: %s (its point: after %s); every "
                   "epoch recomputes it.", t.session, cache["reason"],
                   cache["point"])
    elif cache["hits"] > 0:
      t.told.add("cache")
      self._cache_told.add(key)
      logging.info(
          "InTune %r: cached after %s (%s): %d elements, %.1f MB; %.0f%% of "
          "this epoch served from the cache so far, %.2f s of upstream time "
          "saved.", t.session, cache["point"], cache["reason"],
          cache["elements"], cache["bytes"] / (1 << 20),
          100 * cache["served"], cache["saved_s"])
    elif cache["misses"] >= CACHE_EMPTY_AFTER and cache["elements"] == 0:
      t.told.add("cache")
      self._cache_told.add(key)
      logging.warning(
          "InTune %r: no cache: the RAM budget leaves the cache %d bytes, "
          "less than one element of %s; every epoch recomputes it. Give it "
          "a larger ram_budget, or IntuneOptions(cache=False) to say so.",
          t.session, cache["limit"], cache["point"])

  def _tell_row_wise(self, t: _Tuned) -> None:
    """Says (INFO, once per pipeline in the process) what the cache misses
    where a map above the shuffle that the row-wise proof refuses takes at
    least `ROW_WISE_TELL_SHARE` of the pipeline's CPU: its share, measured,
    and the op that stops it, so that the user can change the map. Told in
    an epoch the cache serves (the second on), where the map runs again."""
    if "row_wise" in t.told:
      return
    cache = t.session.cache()
    if "is not row-wise" not in cache["reason"]:
      t.told.add("row_wise")
      return
    if cache["hits"] == 0:
      return
    found = refused_map_share(cache["reason"], t.session.stats())
    if found is None:
      return
    t.told.add("row_wise")
    key = (cache["point"], t.session.options.to_json())
    stage, refusal, share = found
    if share < ROW_WISE_TELL_SHARE or key in self._row_wise_told:
      return
    self._row_wise_told.add(key)
    logging.info(
        "InTune %r: the map %s takes %.0f%% of the pipeline's CPU, and every "
        "epoch computes it again: it comes after a shuffle, and InTune keeps "
        "a map's rows across epochs only when it proves the map row-wise, "
        "which it does not: %s. A map that computes each row from that row "
        "alone (or the same map put before the shuffle, where the cache "
        "holds its output) would save about that share from the second "
        "epoch on.", t.session, stage, 100 * share, refusal)

  def _step_one_unguarded(self, t: _Tuned) -> None:
    self._tell_cache(t)
    self._tell_row_wise(t)
    # A static policy is stepped again only when the set of knobs changes;
    # listeners (the status file, the Keras logs) still see every step, and
    # with none the session is still observed every `_HELD_OBSERVE_S`.
    held = False
    if t.policy.static:
      names = tuple(k.name for k in t.session.knobs())
      held, t.static_knobs = names == t.static_knobs, names
      if (held and not self._listeners and
          time.monotonic() - t.observed_at < _HELD_OBSERVE_S):
        return
    obs = t.env.observe()
    t.last_obs, t.observed_at = obs, time.monotonic()
    self._tell_unlowerable(t, obs)
    self._tell_nothing_to_do(t, obs)
    if not obs.knobs:
      return
    if held:
      self._call_listeners(t, obs, {})
      return
    try:
      step = env_lib.policy_step(t.env, t.policy, obs)
    except env_lib.PolicyError as e:
      cause = e.__cause__ if e.__cause__ is not None else e
      if t.first_report("policy", cause):
        logging.error("InTune policy %r failed on %r: %r. The pipeline "
                      "keeps its last good configuration (reported once).",
                      t.session.options.policy, t.session, cause)
      if t.last_good:
        names = {k.name for k in obs.knobs}
        t.env.set({k: v for k, v in t.last_good.items() if k in names})
      return
    t.last_good = step.in_force
    self._call_listeners(t, obs, step.applied)


_TUNER = Tuner()


def global_tuner() -> Tuner:
  """The process's tuner (its thread starts with the first tuned iterator)."""
  return _TUNER
