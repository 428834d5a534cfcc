"""Local workers: `intune service worker` processes on this host, their
warm standbys and the keepers of their addresses (`LocalWorkers`)."""

from __future__ import annotations

from concurrent import futures
import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time

from absl import logging

from intune_tf.service.addresses import free_port
from intune_tf.service.addresses import port_is_free
from intune_tf.service.scalers import Scaler
from intune_tf.service.scalers import ScalerError

# Seconds a stopped local worker gets to exit after SIGTERM before SIGKILL.
DEFAULT_STOP_TIMEOUT_S = 10.0
# Warm local worker processes kept ready (TensorFlow loaded, no port yet).
DEFAULT_STANDBY = 1
# Seconds after a standby was taken before its replacement starts loading
# TensorFlow (which takes a core for seconds: not while new workers start).
DEFAULT_STANDBY_DELAY_S = 60.0
# After a port told to a standby (or as `--port-kept`): the pool's
# AddressKeeper holds it, and the worker binds beside it.
KEPT = "kept"
# Longest an AddressKeeper holds a call before it answers UNAVAILABLE.
KEEPER_HOLD_S = 30.0
# Seconds a closing keeper gives its held calls' answers to leave.
_KEEPER_GRACE_S = 0.5
# Longest a keeper waits for the worker that takes its address to register
# before it closes anyway.
_HANDOVER_TIMEOUT_S = 60.0


class AddressKeeper:
  """Answers at a stopped local worker's address until a worker serves there
  again: each call is held until the keeper closes (or `hold_s` passed),
  then answered UNAVAILABLE, which TensorFlow's data service client takes
  as "retry this task later".

  Without it the client's gRPC channel to that address has its connections
  refused and backs off exponentially, so a worker restarted there after a
  long shrink is reached only when the back-off ends (docs/service.md
  measures both). An answer at once would not do either: the client retries
  a task's GetElement with its own back-off (1.3^n ms, up to 10 s: TF 2.21),
  which grows with every answer. Held, a call costs the client one retry
  per `hold_s`, and the retry after the hand-over comes within
  milliseconds. The keeper binds beside the stopping worker, and the new
  worker beside the keeper (SO_REUSEPORT, which gRPC servers set); the
  keeper closes once that worker has registered.

  Args:
    host: the address it listens on (the workers' advertised host).
    port: the stopped worker's port.
    hold_s: the longest a call is held before its answer (default
      `KEEPER_HOLD_S`, 30 s).

  Raises:
    OSError: the port cannot be bound (taken by another program).
  """

  def __init__(self, host: str, port: int, hold_s: float = KEEPER_HOLD_S):
    import grpc  # noqa: PLC0415  TensorFlow's own dependency, only needed here

    closing = threading.Event()

    def unavailable(request, context):
      del request
      end = time.monotonic() + hold_s
      while not closing.is_set() and context.is_active():
        left = end - time.monotonic()
        if left <= 0:
          break
        closing.wait(min(left, 0.5))
      context.abort(grpc.StatusCode.UNAVAILABLE,
                    f"the local worker on port {port} was stopped by "
                    "InTune's pool; another worker will serve here")

    class _Handler(grpc.GenericRpcHandler):

      def service(self, handler_call_details):
        del handler_call_details
        return grpc.unary_unary_rpc_method_handler(unavailable)

    self.port = port
    self._closing = closing
    # A thread per held call: each reading client holds one or two.
    self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=32),
                               handlers=[_Handler()],
                               options=[("grpc.so_reuseport", 1)])
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if self._server.add_insecure_port(where) != port:
      self._server.stop(0)
      raise OSError(f"cannot listen on {where}")
    self._server.start()

  def close(self) -> None:
    """Answers the held calls, then stops listening."""
    self._closing.set()
    self._server.stop(_KEEPER_GRACE_S).wait()


def _hand_over(keeper: AddressKeeper, worker: _LocalWorker) -> None:
  """Closes `keeper` once `worker`, started on its port, has registered
  (or exited, or `_HANDOVER_TIMEOUT_S` passed)."""
  deadline = time.monotonic() + _HANDOVER_TIMEOUT_S
  while (time.monotonic() < deadline and worker.proc.poll() is None and
         not worker.registered()):
    time.sleep(0.05)
  keeper.close()


_OWN_GROUP = ({"process_group": 0} if sys.version_info >= (3, 11) else
              {"preexec_fn": os.setpgrp})

# Guards `_LocalWorker.registered`'s read of the pipe.
_READY_LOCK = threading.Lock()


@dataclasses.dataclass
class _LocalWorker:
  """A local worker process: its stdin is held open (it exits when the
  scaler's process is gone), and it writes a line on the pipe `ready`
  once the dispatcher registered it (`intune service worker --ready-fd`)."""
  proc: subprocess.Popen
  port: int  # 0 for a standby
  log_path: pathlib.Path
  log: object
  started_at: float
  ready: int  # the read end of its readiness pipe (non-blocking)
  said: list[bytes] = dataclasses.field(default_factory=list)

  def registered(self) -> bool:
    """Whether the worker said it registered (reads what it wrote)."""
    with _READY_LOCK:  # the hand-over thread asks too
      if not self.said:
        try:
          got = os.read(self.ready, 64)
        except OSError:  # nothing yet (BlockingIOError), or released
          return False
        self.said.append(got)  # b"": it exited without registering
      return bool(self.said[0])

  def release(self) -> None:
    """Closes what the scaler holds of the worker (its log, its pipes)."""
    self.log.close()
    for close in (lambda: os.close(self.ready), self.proc.stdin.close):
      try:
        close()
      except OSError:
        pass
    self.ready = -1


class LocalWorkers(Scaler):
  """`intune service worker` processes on this host, on free ports.

  Workers start in order and stop newest first (SIGTERM, then SIGKILL
  after `stop_timeout_s`). A worker that died on its own (killed, crashed)
  leaves the pool and is counted in `lost`; the next `resize`, or
  `replace_lost()` (which the dispatcher calls each pool period), replaces
  it. A new worker takes the port of one that left (died or stopped), oldest
  first, when that port is free, else a new free port: TensorFlow's
  dispatcher knows a worker by its address and hands the newcomer the
  unfinished tasks of the one that left there, which is what lets a
  `distributed_epoch` epoch that lost a worker end (docs/service.md).
  The port of a worker it stopped keeps answering (`AddressKeeper`) until a
  new worker takes it, so that the trainer's connection to it does not back
  off.

  `standby` processes are kept warm (`intune service worker --standby`:
  TensorFlow and InTune loaded, no port, not registered, no CPU used): a
  growth hands one its port on stdin, and it registers within a fraction
  of a second instead of the seconds a cold start takes to load
  TensorFlow. Its replacement loads at the first shrink after, else
  `standby_delay_s` after, not while the new workers start. A standby is
  not in `size()` or `serving()`; `standby_count()` counts it. Standbys
  exit when the scaler closes (or dies: end of stdin).

  Args:
    dispatcher: the dispatcher's HOST:PORT.
    min_workers: MIN.
    max_workers: MAX.
    host: the address the workers advertise. Default "127.0.0.1".
    log_dir: where each worker's log goes. Default None: a new temporary
      folder.
    env: extra environment of the workers (e.g. INTUNE_STATUS_DIR).
      Default None.
    worker_args: extra flags of `intune service worker`. Default none.
    stop_timeout_s: seconds between SIGTERM and SIGKILL. Default 10.
    standby: warm processes kept ready while the pool is below MAX (0:
      none, every worker starts cold). Default `DEFAULT_STANDBY` (1).
    standby_delay_s: seconds after a standby was taken before a new one
      starts, unless the pool shrinks first. Default
      `DEFAULT_STANDBY_DELAY_S` (60).
    keep_addresses: leave an `AddressKeeper` answering at each stopped
      worker's port until a worker takes it again (unless `pause`).
      Default True.
    pause: shrink by pausing the newest workers (SIGSTOP: each keeps its
      address, its tasks and its warm state, and its RAM) and grow by
      resuming them (SIGCONT) before starting any. Default False.
    program: the command line of a worker before its flags (`--dispatcher`,
      `--port` or `--standby`, `--port-kept`, `--exit-with-stdin`, `--host`,
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
               keep_addresses: bool = True, pause: bool = False,
               program: tuple[str, ...] | None = None):
    super().__init__(min_workers, max_workers)
    if isinstance(standby, bool) or not isinstance(standby, int) or (
        standby < 0):
      raise ValueError(f"standby must be a count of 0 or more processes, "
                       f"got {standby!r}.")
    self.dispatcher = dispatcher
    self.host = host
    self.log_dir = pathlib.Path(log_dir or tempfile.mkdtemp(
        prefix="intune-workers-"))
    self.log_dir.mkdir(parents=True, exist_ok=True)
    # A worker counts as serving once it says so on its readiness pipe.
    self.env = {**os.environ, **(env or {})}
    self.worker_args = tuple(worker_args)
    self.program = tuple(program or (sys.executable, "-m", "intune_tf",
                                     "service", "worker"))
    self.stop_timeout_s = stop_timeout_s
    self.workers: list[_LocalWorker] = []
    self.lost = 0
    self._started = 0
    # Ports of the workers that left, oldest first: the next ones to use.
    self.vacated: list[int] = []
    # The keepers of the stopped workers' ports not taken again yet.
    self.keepers: dict[int, AddressKeeper] = {}
    self.keep_addresses = keep_addresses
    self.pause = pause
    # The paused workers (`pause`), the last paused last.
    self.paused: list[_LocalWorker] = []
    self._closing = False
    # The size of the last resize.
    self.asked = 0
    self.standby = standby
    self.standby_delay_s = standby_delay_s
    self.standbys: list[_LocalWorker] = []
    self._taken_at: float | None = None  # when a standby was last taken

  def _reap(self) -> None:
    for w in [w for w in self.standbys if w.proc.poll() is not None]:
      self.standbys.remove(w)
      w.release()
      logging.warning("Standby local worker pid %d exited with %s; see %s.",
                      w.proc.pid, w.proc.returncode, w.log_path)
    for w in [w for w in self.paused if w.proc.poll() is not None]:
      self.paused.remove(w)
      self.vacated.append(w.port)
      w.release()
      logging.warning("Paused local worker on port %d (pid %d) exited with "
                      "%s.", w.port, w.proc.pid, w.proc.returncode)
    alive = []
    for w in self.workers:
      if w.proc.poll() is None:
        alive.append(w)
      else:
        self.lost += 1
        self.vacated.append(w.port)
        w.release()
        logging.warning("Local worker on port %d (pid %d) exited with %s; "
                        "it leaves the pool.", w.port, w.proc.pid,
                        w.proc.returncode)
    self.workers = alive

  def size(self) -> int:
    self._reap()
    return len(self.workers)

  def serving(self) -> int:
    self._reap()
    return sum(w.registered() for w in self.workers)

  def standby_count(self) -> int:
    self._reap()
    return len(self.standbys)

  def ports(self) -> list[int]:
    """The ports of the live workers, oldest first."""
    self._reap()
    return [w.port for w in self.workers]

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
        continue
      self._stop(w)
      # A shrink frees the CPU a replacement standby needs to load: load
      # it now rather than later, when the pool may be busy again.
      self._taken_at = None
    self.refill()

  def refill(self) -> int:
    """Starts standbys up to `standby` while the pool is below MAX, once
    `standby_delay_s` passed since one was last taken or at the first
    shrink after (the dispatcher calls it each pool period). A standby that
    cannot start is logged and tried again at the next call.

    Returns:
      The standbys started.
    """
    self._reap()
    if self._taken_at is not None and (
        time.monotonic() - self._taken_at < self.standby_delay_s):
      return 0
    started = 0
    while (len(self.standbys) < self.standby and
           len(self.workers) + len(self.paused) < self.max_workers):
      try:
        self.standbys.append(self._spawn(None))
      except ScalerError as e:
        logging.warning("%s", e)
        break
      started += 1
    return started

  def replace_lost(self) -> list[int]:
    """Starts a worker for each one that died on its own since the last
    resize, back to the size then asked (on the dead ones' ports when
    free): a `distributed_epoch` epoch that lost a worker ends only once a
    worker serves at its address again.

    Returns:
      The ports of the workers started (empty when none died).

    Raises:
      ScalerError: a worker could not be started (those started stay).
    """
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

  def _port(self) -> int:
    """The oldest vacated port that is free now or kept by an
    `AddressKeeper` (taken from `vacated`, as are the busy ones before it),
    else a new free port."""
    while self.vacated:
      port = self.vacated.pop(0)
      if port in self.keepers or port_is_free(port):
        return port
      logging.info("Port %d of a worker that left is taken; the new worker "
                   "gets another.", port)
    return free_port(self.host)

  def _start(self) -> _LocalWorker:
    """A worker on the next port (handed over by its keeper, if any)."""
    port = self._port()
    try:
      w = self._start_on(port, kept=port in self.keepers)
    except ScalerError:
      self.vacated.insert(0, port)
      raise
    keeper = self.keepers.pop(port, None)
    if keeper is not None:
      threading.Thread(target=_hand_over, args=(keeper, w), daemon=True,
                       name=f"intune-handover-{port}").start()
    return w

  def _start_on(self, port: int, kept: bool) -> _LocalWorker:
    """A worker on `port` (held by a keeper if `kept`): a standby told it,
    else a new process."""
    while self.standbys:
      w = self.standbys.pop(0)
      try:
        if w.proc.poll() is not None:
          raise OSError(f"exit status {w.proc.returncode}")
        # Held open after: the worker exits at its end.
        w.proc.stdin.write(f"{port}{' ' + KEPT if kept else ''}\n".encode())
        w.proc.stdin.flush()
      except OSError as e:  # it died since the reap
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
      return dataclasses.replace(w, port=port, log_path=log_path,
                                 started_at=time.monotonic())
    return self._spawn(port, kept)

  def _spawn(self, port: int | None, kept: bool = False) -> _LocalWorker:
    """A new `intune service worker` process on `port` (None: a
    standby)."""
    self._started += 1
    name = "standby" if port is None else str(port)
    log_path = self.log_dir / f"worker{self._started}-{name}.log"
    log = open(log_path, "wb")
    ready, said = os.pipe()
    os.set_blocking(ready, False)
    where = (["--standby"] if port is None else
             ["--port", str(port), *(["--port-kept"] if kept else []),
              "--exit-with-stdin"])
    args = [*self.program, "--dispatcher", self.dispatcher, *where,
            "--host", self.host,
            "--ready-fd", str(said), *self.worker_args]
    try:
      # In a process group of its own: paused, it still ends with this
      # process, however that dies (the kernel sends an orphaned process
      # group that has a stopped member SIGHUP, then SIGCONT).
      proc = subprocess.Popen(args, env=self.env, stdout=log,
                              stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
                              pass_fds=(said,), **_OWN_GROUP)
    except OSError as e:
      log.close()
      os.close(ready)
      what = "a standby local worker" if port is None else "a local worker"
      raise ScalerError(f"cannot start {what}: {e}; the pool stays at "
                        f"{len(self.workers)}.") from e
    finally:
      os.close(said)
    if port is None:
      logging.info("Started standby local worker pid %d.", proc.pid)
    else:
      logging.info("Started local worker pid %d on port %d.", proc.pid, port)
    return _LocalWorker(proc, port or 0, log_path, log, time.monotonic(),
                        ready)

  def _stop(self, w: _LocalWorker) -> None:
    # The keeper binds beside the worker before it stops, so that no
    # connection to the port is ever refused (each refusal lengthens the
    # client's back-off), however long the worker takes to exit.
    if w.port and self.keep_addresses and not self._closing:
      try:
        self.keepers[w.port] = AddressKeeper(self.host, w.port)
      except (OSError, RuntimeError) as e:  # nothing lost but the speed-up
        logging.warning("Cannot keep port %d answering after its worker "
                        "stops (%s): a worker restarted there is reached "
                        "after the client's reconnect back-off.", w.port, e)
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
    self._closing = True
    while self.keepers:
      self.keepers.popitem()[1].close()
    while self.workers or self.paused:
      self._stop((self.workers or self.paused).pop())
    while self.standbys:
      w = self.standbys.pop()
      try:
        w.proc.stdin.close()  # a standby exits at the end of stdin
      except OSError:
        pass
      self._stop(w)
