"""Local workers: `intune service worker` processes on this host and their
warm standbys (`LocalWorkers`)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

from absl import logging

from intune_tf.service import controllers
from intune_tf.service.addresses import free_port
from intune_tf.service.addresses import port_is_free
from intune_tf.service.scalers import Scaler
from intune_tf.service.scalers import ScalerError

# `LocalWorkers`' defaults: `stop_timeout_s`, `standby` and
# `standby_delay_s` (loading TensorFlow takes a core for seconds: not while
# new workers start).
DEFAULT_STOP_TIMEOUT_S = 10.0
DEFAULT_STANDBY = 1
DEFAULT_STANDBY_DELAY_S = 60.0
# A worker in a process group of its own ends with the scaler's process
# even while paused: the kernel sends an orphaned process group that has a
# stopped member SIGHUP, then SIGCONT.
_OWN_GROUP = ({"process_group": 0} if sys.version_info >= (3, 11) else
              {"preexec_fn": os.setpgrp})


@dataclasses.dataclass
class _LocalWorker:
  """A local worker process: its stdin is held open (it exits when the
  scaler's process is gone), and it writes a line on the pipe `ready`
  once the dispatcher registered it (`intune service worker --ready-fd`)."""
  proc: subprocess.Popen
  port: int  # 0 for a standby
  log_path: pathlib.Path
  log: object
  ready: int  # the read end of its readiness pipe (non-blocking)
  said: bytes | None = None  # what it wrote there (b"": exited first)

  def registered(self) -> bool:
    """Whether the worker said it registered (reads what it wrote)."""
    if self.said is None:
      try:
        self.said = os.read(self.ready, 64)
      except OSError:  # nothing yet (BlockingIOError), or released
        return False
    return bool(self.said)

  def release(self) -> None:
    """Closes what the scaler holds of the worker (its log, its pipes)."""
    self.log.close()
    for close in (lambda: os.close(self.ready), self.proc.stdin.close):
      with contextlib.suppress(OSError):
        close()
    self.ready = -1


class LocalWorkers(Scaler):
  """`intune service worker` processes on this host, on free ports.

  Workers start in order and leave newest first. With `pause`, a shrink
  pauses a worker (SIGSTOP) and a growth resumes it (SIGCONT) before it
  starts any: it keeps its address, its tasks, its warm state and its RAM.
  A worker that died on its own leaves the pool, is counted in `lost`, and
  is replaced at the next `resize` or `replace_lost()`. A new worker takes
  the port of one that left, oldest first, when that port is free: the
  dispatcher hands it the unfinished tasks of the one that left there,
  which a `distributed_epoch` epoch needs to end (docs/service.md).

  While the pool is below MAX, `standby` processes are kept warm
  (`intune service worker --standby`: TensorFlow loaded, no port, no CPU
  used): a growth hands one its port on stdin, and it registers within a
  fraction of a second instead of the seconds of a cold start. Standbys
  and paused workers are not in `size()` or `serving()`.

  Args:
    dispatcher: the dispatcher's HOST:PORT.
    min_workers: MIN.
    max_workers: MAX.
    host: the address the workers advertise. Default "127.0.0.1".
    log_dir: the workers' log folder. Default None: a new temporary one.
    env: extra environment of the workers. Default None.
    worker_args: extra flags of `intune service worker`. Default none.
    stop_timeout_s: seconds between SIGTERM and SIGKILL when a worker
      stops. Default 10.
    standby: warm processes kept (0: every worker starts cold). Default 1.
    standby_delay_s: seconds after a standby was taken before a new one
      starts, unless the pool shrinks first. Default 60.
    pause: shrink by pausing workers, not stopping them. Default True.
    program: a worker's command line before its flags (`--dispatcher`,
      `--port` and `--exit-with-stdin` or `--standby`, `--host`,
      `--ready-fd`, then `worker_args`). Default None: `intune service
      worker` run by this Python.
  """

  kind = "local"

  def __init__(self, dispatcher: str, min_workers: int, max_workers: int,
               host: str = "127.0.0.1", log_dir: str | None = None,
               env: dict[str, str] | None = None,
               worker_args: tuple[str, ...] = (),
               stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
               standby: int = DEFAULT_STANDBY,
               standby_delay_s: float = DEFAULT_STANDBY_DELAY_S,
               pause: bool = True,
               program: tuple[str, ...] | None = None):
    super().__init__(min_workers, max_workers)
    if controllers.integer(standby) is None or standby < 0:
      raise ValueError(f"standby must be a count of 0 or more processes, "
                       f"got {standby!r}.")
    self.dispatcher = dispatcher
    self.host = host
    self.log_dir = pathlib.Path(log_dir or tempfile.mkdtemp(
        prefix="intune-workers-"))
    self.log_dir.mkdir(parents=True, exist_ok=True)
    self.env = {**os.environ, **(env or {})}
    self.worker_args = tuple(worker_args)
    self.program = tuple(program or (sys.executable, "-m", "intune_tf",
                                     "service", "worker"))
    self.stop_timeout_s = stop_timeout_s
    self.pause = pause
    self.standby = int(standby)
    self.standby_delay_s = standby_delay_s
    self.workers: list[_LocalWorker] = []
    self.paused: list[_LocalWorker] = []  # the last paused last
    self.standbys: list[_LocalWorker] = []
    self.lost = 0
    self._started = 0
    # Ports of the workers that left, oldest first: the next ones to use.
    self.vacated: list[int] = []
    self.asked = 0  # the size of the last resize
    self._taken_at: float | None = None  # when a standby was last taken

  def _reap(self) -> None:
    for group in (self.standbys, self.paused, self.workers):
      for w in [w for w in group if w.proc.poll() is not None]:
        group.remove(w)
        w.release()
        if group is not self.standbys:
          self.vacated.append(w.port)
        self.lost += group is self.workers
        logging.warning("Local worker pid %d (%s) exited with %s; see %s.",
                        w.proc.pid, "standby" if group is self.standbys else
                        f"port {w.port}", w.proc.returncode, w.log_path)

  def size(self) -> int:
    self._reap()
    return len(self.workers)

  def serving(self) -> int:
    self._reap()
    return sum(w.registered() for w in self.workers)

  def standby_count(self) -> int:
    self._reap()
    return len(self.standbys)

  def _resize(self, n: int) -> None:
    self.asked = n
    while len(self.workers) < n and self.paused:
      w = self.paused.pop()
      w.proc.send_signal(signal.SIGCONT)
      self.workers.append(w)
      logging.info("Resumed local worker pid %d on port %d.", w.proc.pid,
                   w.port)
    while len(self.workers) < n:
      self.workers.append(self._start())
    while len(self.workers) > n:
      w = self.workers.pop()
      if self.pause:
        w.proc.send_signal(signal.SIGSTOP)
        self.paused.append(w)
        logging.info("Paused local worker pid %d on port %d.", w.proc.pid,
                     w.port)
      else:
        self._stop(w)
      # A shrink frees the CPU a replacement standby needs to load: load
      # it now rather than later, when the pool may be busy again.
      self._taken_at = None
    self.refill()

  def refill(self) -> int:
    """Starts (and counts) standbys up to `standby` while the pool is below
    MAX, once `standby_delay_s` passed since one was last taken or at the
    first shrink after; one that cannot start is logged and tried again at
    the next call."""
    self._reap()
    if self._taken_at is not None and (
        time.monotonic() - self._taken_at < self.standby_delay_s):
      return 0
    started = 0
    while (len(self.standbys) < self.standby and
           len(self.workers) < self.max_workers):
      try:
        self.standbys.append(self._spawn(None))
      except ScalerError as e:
        logging.warning("%s", e)
        break
      started += 1
    return started

  def replace_lost(self) -> list[int]:
    """`Scaler.replace_lost`, on the dead ones' ports when free; raises
    ScalerError when a worker could not start (those started stay)."""
    self._reap()
    started = []
    while len(self.workers) < self.asked:
      w = self._start()
      self.workers.append(w)
      started.append(w.port)
    if started:
      logging.warning("Replaced %d lost local worker(s), on port(s) %s.",
                      len(started), ", ".join(map(str, started)))
    self.refill()
    return started

  def _start(self) -> _LocalWorker:
    """A worker on the oldest vacated port that is free (taken from
    `vacated`, as are the busy ones before it), else on a new free port: a
    standby told it, else a new process."""
    port = None
    while self.vacated and port is None:
      port = self.vacated.pop(0)
      if not port_is_free(port):
        logging.info("Port %d of a worker that left is taken; the new "
                     "worker gets another.", port)
        port = None
    port = port or free_port(self.host)
    while self.standbys:
      w = self.standbys.pop(0)
      try:
        # Held open after: the worker exits at its end.
        w.proc.stdin.write(f"{port}\n".encode())
        w.proc.stdin.flush()
      except OSError as e:  # it died since the reap: a broken pipe
        logging.warning("Standby local worker pid %d is gone (%s).",
                        w.proc.pid, e)
        w.release()
        continue
      self._taken_at = time.monotonic()
      self._started += 1
      log_path = self.log_dir / f"worker{self._started}-{port}.log"
      w.log_path.rename(log_path)
      logging.info("Standby local worker pid %d now serves on port %d.",
                   w.proc.pid, port)
      return dataclasses.replace(w, port=port, log_path=log_path)
    try:
      return self._spawn(port)
    except ScalerError:
      self.vacated.insert(0, port)
      raise

  def _spawn(self, port: int | None) -> _LocalWorker:
    """A new worker process on `port` (None: a standby)."""
    self._started += 1
    name = "standby" if port is None else str(port)
    log_path = self.log_dir / f"worker{self._started}-{name}.log"
    log = open(log_path, "wb")
    ready, said = os.pipe()
    os.set_blocking(ready, False)
    where = (["--standby"] if port is None else
             ["--port", str(port), "--exit-with-stdin"])
    args = [*self.program, "--dispatcher", self.dispatcher, *where,
            "--host", self.host, "--ready-fd", str(said), *self.worker_args]
    try:
      proc = subprocess.Popen(args, env=self.env, stdout=log,
                              stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
                              pass_fds=(said,), **_OWN_GROUP)
    except OSError as e:
      log.close()
      os.close(ready)
      raise ScalerError(f"cannot start a local worker ({name}): {e}; the "
                        f"pool stays at {len(self.workers)}.") from e
    finally:
      os.close(said)
    logging.info("Started local worker pid %d (%s).", proc.pid, name)
    return _LocalWorker(proc, port or 0, log_path, log, ready)

  def _stop(self, w: _LocalWorker) -> None:
    if w.proc.poll() is None:
      w.proc.send_signal(signal.SIGTERM)
      w.proc.send_signal(signal.SIGCONT)  # a paused one handles it
      try:
        w.proc.wait(self.stop_timeout_s)
      except subprocess.TimeoutExpired:
        w.proc.kill()
        w.proc.wait()
    w.release()
    if w.port:
      self.vacated.append(w.port)
    logging.info("Stopped local worker pid %d on port %d.", w.proc.pid,
                 w.port)

  def close(self) -> None:
    for group in (self.workers, self.paused, self.standbys):
      while group:
        self._stop(group.pop())
