"""The trainer's side of pool sizing (`ConsumerMeter`) and the dispatcher's
reading of it and of its workers (`pool_reading`, `worker_status`)."""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import pathlib
import socket
import threading
import time
from typing import Any

from absl import logging
import psutil

from intune_tf import files
from intune_tf.observe import status
from intune_tf.service import controllers
from intune_tf.service.addresses import endpoints
from intune_tf.service.addresses import names_dispatcher
from intune_tf.service.addresses import parse_address

# Seconds between a consumer meter's reports, and the age beyond which the
# dispatcher ignores one.
CONSUMER_REPORT_PERIOD_S = 1.0
CONSUMER_REPORT_MAX_AGE_S = 30.0
# The largest consumer report read (a report is about 200 bytes).
_MAX_REPORT_BYTES = 64 << 10


def _pool_dir(status_dir: str | os.PathLike | None) -> pathlib.Path:
  return (pathlib.Path(status_dir) if status_dir else
          status.default_dir()) / "pool"


class ConsumerMeter:
  """The trainer's side of pool sizing: how long each step waits for input
  and computes, reported for the dispatcher every `CONSUMER_REPORT_PERIOD_S`
  (`<status dir>/pool/<pid>@<host>.json`), a wait under way included (a
  thread reports it while it lasts: docs/service.md).

      meter = service.ConsumerMeter("127.0.0.1:5050")
      for batch in meter.iterate(distributed_ds):
        train_step(batch)

  Args:
    dispatcher: the dispatcher's HOST:PORT.
    status_dir: the status dir the dispatcher reads. Default None: the
      default status dir.
    elements_per_item: elements (as the workers count them) per item the
      iterator yields. Default 1.

  Raises:
    ServiceError: a malformed dispatcher address.
    ValueError: `elements_per_item` is not a finite number above 0.
  """

  def __init__(self, dispatcher: str, status_dir: str | None = None,
               elements_per_item: float = 1):
    host, port = parse_address(dispatcher, "dispatcher")
    if (isinstance(elements_per_item, bool) or
        not isinstance(elements_per_item, numbers.Real) or
        not math.isfinite(elements_per_item) or elements_per_item <= 0):
      raise ValueError(
          f"ConsumerMeter's elements_per_item is the elements (as the "
          f"workers count them) in one item the iterator yields, a finite "
          f"number above 0 (default 1; the batch size for batched "
          f"elements), got {elements_per_item!r}.")
    self.dispatcher = f"{host}:{port}"
    self.path = _pool_dir(status_dir) / (
        f"{os.getpid()}@{socket.gethostname()}.json")
    self.elements_per_item = elements_per_item
    # The period's sums, the last pace measured, when the wait under way
    # began (or its part not yet reported; None while there is none), and
    # when the period began: all guarded by _lock.
    self._lock = threading.Lock()
    self._wait = self._compute = self._elements = self._pace = 0.0
    self._waiting_since: float | None = None
    self._last_report = time.monotonic()
    self._failing = False  # the last report could not be written

  def record(self, wait_s: float, compute_s: float, elements: int) -> None:
    """Counts one step: `wait_s` waiting for input, `compute_s` computing,
    `elements` consumed; reports when a period is over."""
    with self._lock:
      self._wait += wait_s
      self._compute += compute_s
      self._elements += elements
      now = time.monotonic()
      if now - self._last_report >= CONSUMER_REPORT_PERIOD_S:
        self._report_locked(now)

  def report(self, now: float | None = None) -> dict[str, Any]:
    """Writes the period's wait share and pace (the last pace measured
    when the period had no compute); starts a new period. A wait under way
    counts up to `now` (default None: the monotonic clock now), its rest
    in the next period."""
    with self._lock:
      return self._report_locked(time.monotonic() if now is None else now)

  def _report_locked(self, now: float) -> dict[str, Any]:
    if self._waiting_since is not None and now > self._waiting_since:
      self._wait += now - self._waiting_since
      self._waiting_since = now
    busy = self._wait + self._compute
    if self._compute > 0:
      self._pace = self._elements / self._compute
    data = {"dispatcher": self.dispatcher, "pid": os.getpid(),
            "time": time.time(),
            "wait_share": self._wait / busy if busy > 0 else 0.0,
            "consumer_rate": self._pace, "elements": self._elements}
    try:
      files.write_json(self.path, data)
    except OSError as e:
      if not self._failing:  # warned once, until writing works again
        logging.warning(
            "ConsumerMeter: cannot write its report %s (%s); the dispatcher "
            "sizes the pool without this trainer until it can (set "
            "INTUNE_STATUS_DIR or status_dir to a writable folder).",
            self.path, e)
      self._failing = True
    else:
      self._failing = False
    self._wait = self._compute = self._elements = 0.0
    self._last_report = now
    return data

  def iterate(self, iterable):
    """Yields from `iterable`, timing the wait in `next()` and the compute
    between two of them; a thread reports a long wait while it lasts."""
    it = iter(iterable)
    stop = threading.Event()

    def report_waits():
      while not stop.wait(CONSUMER_REPORT_PERIOD_S / 2):
        with self._lock:
          now = time.monotonic()
          if (self._waiting_since is not None and
              now - self._last_report >= CONSUMER_REPORT_PERIOD_S):
            self._report_locked(now)

    reporter = threading.Thread(target=report_waits, daemon=True,
                                name="intune-consumer-meter")
    reporter.start()
    try:
      while True:
        with self._lock:
          self._waiting_since = time.monotonic()
        try:
          item = next(it)
        except StopIteration:
          return
        got = time.monotonic()
        with self._lock:
          waited = got - self._waiting_since  # its unreported part
          self._waiting_since = None
        yield item
        self.record(waited, time.monotonic() - got, self.elements_per_item)
    finally:
      with self._lock:
        self._waiting_since = None
      stop.set()
      reporter.join()

  def close(self) -> None:
    """Removes the report (if it can)."""
    with contextlib.suppress(OSError):
      self.path.unlink(missing_ok=True)


def pool_reading(dispatcher: str, serving: int, starting: int,
                 status_dir: str | os.PathLike | None = None,
                 now: float | None = None,
                 consumer_addresses: tuple[str, ...] = ()
                 ) -> controllers.PoolReading | None:
  """The `controllers.PoolReading` of a dispatcher's pool from the status
  dir (default None: the default one) at `now` (default None: the time
  now): the consumers' fresh reports (paces summed, the largest wait share)
  and each worker's rows/s; None when no consumer reported within
  `CONSUMER_REPORT_MAX_AGE_S`. Consumers and workers that name the
  dispatcher by `dispatcher` or one of `consumer_addresses` (default none)
  count, host names resolved (`endpoints`); a report with anything but
  numbers where numbers go is skipped.
  """
  now = time.time() if now is None else now
  accepted = frozenset().union(
      *(endpoints(a) for a in (dispatcher, *consumer_addresses)))
  consumers = []
  directory = _pool_dir(status_dir)
  for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
    try:
      data = status.read_json_file(path, max_bytes=_MAX_REPORT_BYTES)
      fresh = now - float(data["time"]) <= CONSUMER_REPORT_MAX_AGE_S
      rate, wait = float(data["consumer_rate"]), float(data["wait_share"])
    except (OSError, ValueError, KeyError, TypeError):
      continue
    if (names_dispatcher(data.get("dispatcher"), accepted) and fresh and
        math.isfinite(rate) and rate >= 0 and 0 <= wait <= 1):
      consumers.append((rate, wait))
  if not consumers:
    return None
  rates = [sum(float(s.get("output_rate") or 0.0)
               for s in w.get("sessions", []))
           for w in worker_status(status_dir)
           if names_dispatcher((w.get("service") or {}).get("dispatcher"),
                               accepted)]
  return controllers.PoolReading(
      time_s=now, workers=serving, starting=starting,
      wait_share=max(w for _, w in consumers),
      consumer_rate=sum(r for r, _ in consumers),
      worker_rates=tuple(rates[:serving]))


def dispatcher_pool(dispatcher: str,
                    status_dir: str | os.PathLike | None = None
                    ) -> dict[str, Any] | None:
  """The worker pool that the live dispatcher at `dispatcher` (HOST:PORT,
  matched on the port) reports in its status file
  (`manager.PoolManager.report`), or None (no such dispatcher, or no pool);
  `status_dir` as in `worker_status`."""
  _, port = parse_address(dispatcher, "dispatcher")
  for data in status.read_all(status_dir):
    service = data.get("service") or {}
    if data.get("role") == "dispatcher" and service.get("port") == port:
      return data.get("pool")
  return None


def worker_status(status_dir: str | os.PathLike | None = None,
                  dispatcher: str | None = None) -> list[dict[str, Any]]:
  """Status of the live InTune tf.data service workers.

  Args:
    status_dir: where the workers write their status files. Default None:
      `status.default_dir()`; workers on other hosts are seen when all use
      one shared folder.
    dispatcher: only workers of this dispatcher (HOST:PORT). Default None:
      every worker.

  Returns:
    One status dict (`intune_tf.observe.status`; "service" is
    {"dispatcher", "worker_address", "port"}) per worker process that
    runs, a paused one (SIGSTOP on this host: it serves nothing) left out.
  """
  wanted = None
  if dispatcher is not None:
    parse_address(dispatcher, "dispatcher")
    wanted = endpoints(dispatcher)
  return [data for data in status.read_all(status_dir)
          if data.get("role") == "worker" and not _paused(data) and (
              wanted is None or names_dispatcher(
                  (data.get("service") or {}).get("dispatcher"), wanted))]


def _paused(data: dict[str, Any]) -> bool:
  try:
    return (data.get("host") == socket.gethostname() and
            psutil.Process(data["pid"]).status() == psutil.STATUS_STOPPED)
  except (psutil.Error, KeyError, TypeError, ValueError):
    return False
