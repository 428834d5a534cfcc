"""Scalers: what carries out a pool controller's decision.

One small interface, `Scaler`: `size()` (workers asked for), `serving()`
(workers up), `resize(n)`. Three kinds:

- `LocalWorkers`: `intune service worker` processes on this host, started and
  stopped by InTune (`--workers local:MIN-MAX`), listening on loopback-chosen
  free ports;
- `CommandScaler`: a shell command with the count substituted for `{n}`, for
  example `kubectl scale deployment/tfdata-workers --replicas={n}`, run with a
  timeout (`--workers command:MIN-MAX --scale-command CMD`);
- `CallbackScaler`: a Python callable taking the count;
- `LocalFirst`: two of these as tiers, the trainer host's own workers
  filled first and remote ones only for what the host cannot supply.

`parse_pool_spec` reads the dispatcher's `--workers KIND:MIN-MAX`.

Every scaler keeps the pool within [MIN, MAX] (a request outside raises
ValueError before anything runs) and leaves it as it was when the change
fails: a command that exits nonzero or outlives its timeout, or a callback
that raises, gives one `ScalerError` naming the cause.

`PoolManager` joins a controller (`intune_tf.pool`) and a scaler: each
`step(reading)` decides, resizes on a change, and records the decision and
its reason (and a failure) in `history`; `report()` is the pool as a
dispatcher's status file carries it (`pool`), which `intune inspect` shows.
It logs each change with its reason and what it was decided on, and a hold
when its wording differs from the last hold's.
"""

from __future__ import annotations

from concurrent import futures
import dataclasses
import numbers
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

from absl import logging

from intune_tf import pool

# Seconds a scale command may run.
DEFAULT_COMMAND_TIMEOUT_S = 60.0
# Seconds a worker a scale command asked for may take to register before
# it is given up (`CommandScaler.give_up_unstarted`).
DEFAULT_START_TIMEOUT_S = 300.0
# Seconds a stopped local worker gets to exit after SIGTERM before SIGKILL.
DEFAULT_STOP_TIMEOUT_S = 10.0
# Warm local worker processes kept ready (TensorFlow loaded, no port yet).
DEFAULT_STANDBY = 1
# Seconds after a standby was taken before its replacement starts loading
# TensorFlow (which takes a core for seconds: not while new workers start).
DEFAULT_STANDBY_DELAY_S = 60.0
# The last decisions `PoolManager.report` includes.
REPORTED_DECISIONS = 10
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
# The kinds of pool `intune service dispatcher --workers KIND:MIN-MAX` sizes.
POOL_KINDS = ("local", "command")
_SPEC = re.compile(r"^([a-z]+):(-?\d+)-(-?\d+)$")


class ScalerError(RuntimeError):
  """A resize failed; the pool is as it was."""


def parse_pool_spec(text: str, kinds: tuple[str, ...] = POOL_KINDS
                    ) -> tuple[str, int, int]:
  """(KIND, MIN, MAX) of a "KIND:MIN-MAX" pool, KIND one of `kinds`.

  parse_pool_spec("command:2-64") = ("command", 2, 64).

  Args:
    text: the pool, e.g. "local:1-4".
    kinds: the kinds accepted. Default `POOL_KINDS` ("local", "command").

  Raises:
    ValueError: not of that form, another kind, a negative count, MIN below
      1 or above MAX; the message says what to pass.
  """
  forms = " or ".join(f"{k}:MIN-MAX" for k in kinds)
  match = _SPEC.match(text.strip()) if isinstance(text, str) else None
  if not match or match.group(1) not in kinds:
    raise ValueError(f"a worker pool must be {forms} with 1 <= MIN <= MAX "
                     f"(for example {kinds[0]}:1-4), got {text!r}.")
  low, high = int(match.group(2)), int(match.group(3))
  try:
    pool.check_bounds(low, high)
  except ValueError as e:
    raise ValueError(f"{text.strip()!r}: {str(e).rstrip('.')}; pass {forms} "
                     "with 1 <= MIN <= MAX.") from None
  return match.group(1), low, high


def parse_local_spec(text: str) -> tuple[int, int]:
  """(MIN, MAX) of a "local:MIN-MAX" pool (`parse_pool_spec`).

  parse_local_spec("local:1-4") = (1, 4).

  Raises:
    ValueError: not of that form, a negative count, MIN below 1 or above
      MAX.
  """
  _, low, high = parse_pool_spec(text, ("local",))
  return low, high


def check_template(template: str) -> str:
  """`template` when it is a scale command with `{n}` where the count goes.

  check_template("kubectl scale deployment/w --replicas={n}") returns it.

  Raises:
    ValueError: no `{n}` in it (or not a string).
  """
  if not isinstance(template, str) or "{n}" not in template:
    raise ValueError(
        f"the scale command must contain {{n}} where the count goes (for "
        f"example 'kubectl scale deployment/tfdata-workers --replicas={{n}}'"
        f"), got {template!r}.")
  return template


class Scaler:
  """A pool of workers that can be resized within [MIN, MAX].

  Args:
    min_workers: MIN, at least 1.
    max_workers: MAX, at least MIN.
  """

  kind = "scaler"
  # Workers that left the pool on their own (died, were killed); 0 for a
  # scaler that cannot tell.
  lost = 0

  def __init__(self, min_workers: int, max_workers: int):
    pool.check_bounds(min_workers, max_workers)
    self.min_workers = min_workers
    self.max_workers = max_workers

  def size(self) -> int:
    """Workers asked for (serving or starting)."""
    raise NotImplementedError

  def serving(self) -> int:
    """Workers up and serving (default: all asked for)."""
    return self.size()

  def standby_count(self) -> int:
    """Warm processes ready to join, not in `size()` (default: none)."""
    return 0

  def resize(self, n: int) -> None:
    """Makes the pool `n` workers.

    Raises:
      ValueError: `n` outside [MIN, MAX] (nothing changes).
      ScalerError: the change failed (the pool is as it was).
    """
    self._check_count(n)
    if n != self.size():
      self._resize(n)

  def _check_count(self, n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not (
        self.min_workers <= n <= self.max_workers):
      raise ValueError(f"cannot resize the pool to {n!r} workers: it must "
                       f"stay within MIN {self.min_workers} and MAX "
                       f"{self.max_workers}.")

  def _resize(self, n: int) -> None:
    raise NotImplementedError

  def give_up_unstarted(self) -> int:
    """Gives up the workers asked for that never started serving, where
    this scaler can tell (default: it cannot; 0).

    Returns:
      The workers given up.
    """
    return 0

  def replace_lost(self) -> list[int]:
    """Replaces the workers that died on their own since the last resize,
    where this scaler can (default: it cannot; nothing is done).

    Returns:
      The ports of the workers started (empty when none).
    """
    return []

  def close(self) -> None:
    """Releases what the scaler holds (default: nothing)."""


class CallbackScaler(Scaler):
  """Calls `callback(n)`; the pool is `n` once it returns.

  Args:
    callback: takes the new count; raising means the change failed.
    min_workers: MIN.
    max_workers: MAX.
    initial: the workers the pool has now. Default None: MIN.
  """

  kind = "callback"

  def __init__(self, callback: Callable[[int], object], min_workers: int,
               max_workers: int, initial: int | None = None):
    super().__init__(min_workers, max_workers)
    self._callback = callback
    self._size = min_workers if initial is None else initial

  def size(self) -> int:
    return self._size

  def _resize(self, n: int) -> None:
    try:
      self._callback(n)
    except Exception as e:  # any failure of user code, re-raised
      raise ScalerError(f"the scale callback failed for {n} workers: "
                        f"{type(e).__name__}: {e}; the pool stays at "
                        f"{self._size}.") from e
    self._size = n


class CommandScaler(Scaler):
  """Runs a shell command with `{n}` replaced by the count.

  Args:
    template: the command, with `{n}` where the count goes.
    min_workers: MIN.
    max_workers: MAX.
    initial: the workers the pool has now. Default None: MIN.
    timeout_s: seconds the command may run; then it (and its children) is
      killed and the resize fails. Default `DEFAULT_COMMAND_TIMEOUT_S` (60).
    serving: counts the workers up (for example the workers registered
      with the dispatcher); `serving()` is the smaller of it and `size()`.
      Default None: every worker asked for counts as serving once the
      command returns.

  Raises:
    ValueError: no `{n}` in the template, or a timeout that is not a finite
      positive number.
  """

  kind = "command"

  def __init__(self, template: str, min_workers: int, max_workers: int,
               initial: int | None = None,
               timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S,
               serving: Callable[[], int] | None = None,
               start_timeout_s: float = DEFAULT_START_TIMEOUT_S):
    super().__init__(min_workers, max_workers)
    check_template(template)
    for what, value in (("timeout", timeout_s),
                        ("start timeout", start_timeout_s)):
      if (isinstance(value, bool) or not isinstance(value, numbers.Real) or
          not 0 < value < 1e9):
        raise ValueError(f"the scale command's {what} must be finite "
                         f"seconds above 0, got {value!r}.")
    self.template = template
    self.timeout_s = float(timeout_s)
    self.start_timeout_s = float(start_timeout_s)
    self._size = min_workers if initial is None else initial
    self._serving = serving
    self._resized_at = time.monotonic()

  def size(self) -> int:
    return self._size

  def serving(self) -> int:
    if self._serving is None:
      return self._size
    return max(0, min(self._size, int(self._serving())))

  def give_up_unstarted(self) -> int:
    """Gives up the workers asked for that have not registered
    `start_timeout_s` after the command returned: the pool is what serves.

    Returns:
      The workers given up (0 while within the timeout).
    """
    serving = self.serving()
    if (serving >= self._size or
        time.monotonic() - self._resized_at < self.start_timeout_s):
      return 0
    missing, self._size = self._size - serving, serving
    self._resized_at = time.monotonic()
    return missing

  def command(self, n: int) -> str:
    """The command for `n` workers."""
    return self.template.replace("{n}", str(int(n)))

  def _resize(self, n: int) -> None:
    command = self.command(n)
    # Its output goes to files, not pipes: workers it starts in the
    # background keep them open, and the command is done when its shell is.
    with tempfile.TemporaryFile() as out:
      proc = subprocess.Popen(["/bin/sh", "-c", command],
                              stdin=subprocess.DEVNULL, stdout=out,
                              stderr=subprocess.STDOUT,
                              start_new_session=True)
      try:
        proc.wait(timeout=self.timeout_s)
      except subprocess.TimeoutExpired:
        try:
          os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
        proc.wait()
        raise ScalerError(
            f"the scale command `{command}` did not finish within "
            f"{self.timeout_s:g} s and was killed; the pool stays at "
            f"{self._size}.") from None
      if proc.returncode != 0:
        out.seek(max(0, out.seek(0, os.SEEK_END) - 300))
        tail = out.read().decode(errors="replace").strip()
        raise ScalerError(
            f"the scale command `{command}` failed (exit status "
            f"{proc.returncode}): {tail or 'no output'}; the pool stays at "
            f"{self._size}.")
    self._size = n
    self._resized_at = time.monotonic()


def free_port(host: str = "127.0.0.1") -> int:
  """A TCP port free on `host` now."""
  with socket.socket() as s:
    s.bind((host, 0))
    return s.getsockname()[1]


def port_is_free(port: int) -> bool:
  """Whether `port` can be bound on all interfaces now (as a worker binds
  it; connections of a previous server in TIME_WAIT do not count)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      s.bind(("0.0.0.0", port))
    except OSError:
      return False
  return True


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
      worker's port until a worker takes it again. Default True.
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
               keep_addresses: bool = True,
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
    while len(self.workers) < n:
      self.workers.append(self._start())
    while len(self.workers) > n:
      self._stop(self.workers.pop())
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
           len(self.workers) < self.max_workers):
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
      proc = subprocess.Popen(args, env=self.env, stdout=log,
                              stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
                              pass_fds=(said,))
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
    while self.workers:
      self._stop(self.workers.pop())
    while self.standbys:
      w = self.standbys.pop()
      try:
        w.proc.stdin.close()  # a standby exits at the end of stdin
      except OSError:
        pass
      self._stop(w)


class LocalFirst(Scaler):
  """The trainer host's own workers first, remote ones for the rest.

  A pool of n workers is `local` filled to its MAX (the workers the host's
  CPU budget allows beside the trainer) and `remote` holding what is left
  (0 while the host suffices, whatever `remote`'s own MIN: a remote tier
  that is not needed is not paid for). A shrink gives the remote workers
  back first. When one tier's change fails, the other is put back, so the
  pool stays as it was.

  Args:
    local: the host's workers, e.g. `LocalWorkers(..., 1, k)`.
    remote: the workers beyond it, e.g. a `CommandScaler` whose command
      scales a cluster's deployment; its MAX caps the remote tier. The
      pool's MIN is `local`'s, its MAX the sum of both MAXes.
  """

  kind = "local-first"

  def __init__(self, local: Scaler, remote: Scaler):
    super().__init__(local.min_workers,
                     local.max_workers + remote.max_workers)
    self.local = local
    self.remote = remote

  @property
  def lost(self) -> int:  # the Scaler attribute, summed over the tiers
    return self.local.lost + self.remote.lost

  def split(self, n: int) -> tuple[int, int]:
    """(local, remote) workers of a pool of `n`: local first.
    split(5) with local 1-3 = (3, 2); split(2) = (2, 0)."""
    local = min(n, self.local.max_workers)
    return local, n - local

  def size(self) -> int:
    return self.local.size() + self.remote.size()

  def serving(self) -> int:
    return self.local.serving() + self.remote.serving()

  def standby_count(self) -> int:
    return self.local.standby_count() + self.remote.standby_count()

  def _resize(self, n: int) -> None:
    local, remote = self.split(n)
    before = (self.local.size(), self.remote.size())
    # Growing: the host first; shrinking: the remote tier first.
    steps = ([(self.local, local), (self.remote, remote)] if n > sum(before)
             else [(self.remote, remote), (self.local, local)])
    done = []
    for scaler, count in steps:
      was = before[0] if scaler is self.local else before[1]
      if count == was:
        continue
      try:
        # The remote tier may go to 0 below its own MIN (not needed).
        scaler._resize(count)  # noqa: SLF001
      except ScalerError as e:
        for undo, back in done:
          try:
            undo._resize(back)  # noqa: SLF001
          except ScalerError as again:
            logging.error("Putting the %s tier back to %d failed too: %s",
                          undo.kind, back, again)
        raise ScalerError(f"the {scaler.kind} tier failed ({e}); the pool "
                          f"stays at {sum(before)}.") from e
      done.append((scaler, was))

  def start(self, n: int) -> None:
    """Makes the pool `n` workers at start, local first, and sets the remote
    tier to its share (0 when the host suffices) whatever it held before:
    a deployment an earlier run left scaled up is scaled back too.

    Raises:
      ValueError: `n` outside [MIN, MAX] (nothing changes).
      ScalerError: the remote tier's change failed (the local tier is not
        started).
    """
    self._check_count(n)
    local, remote = self.split(n)
    try:
      self.remote._resize(remote)  # noqa: SLF001 (below its MIN: 0)
    except ScalerError as e:
      raise ScalerError(f"the {self.remote.kind} tier failed at start "
                        f"({e}); no local worker was started.") from e
    self.local.resize(local)

  def give_up_unstarted(self) -> int:
    return self.local.give_up_unstarted() + self.remote.give_up_unstarted()

  def replace_lost(self) -> list[int]:
    return self.local.replace_lost() + self.remote.replace_lost()

  def close(self) -> None:
    self.remote.close()
    self.local.close()


@dataclasses.dataclass(frozen=True)
class PoolEvent:
  """One decision of a `PoolManager`: when, the size before and wanted,
  why, and the error when the resize failed."""
  time_s: float
  before: int
  size: int
  reason: str
  error: str | None = None


def describe_reading(reading: pool.PoolReading) -> str:
  """What a decision was made on, for the logs.

  Args:
    reading: the period's reading.

  Returns:
    For example "wait 40%, pace 177 rows/s, 2 serving at 104 rows/s, 1
    starting": the trainer's wait share, its pace, the serving workers'
    mean rows/s (when reported) and those still starting (when any).
  """
  parts = [f"wait {reading.wait_share:.0%}",
           f"pace {reading.consumer_rate:.0f} rows/s",
           f"{reading.workers} serving"]
  if reading.worker_rates:
    mean = sum(reading.worker_rates) / len(reading.worker_rates)
    parts[-1] += f" at {mean:.0f} rows/s"
  if reading.starting:
    parts.append(f"{reading.starting} starting")
  return ", ".join(parts)


def hold_wording(reason: str) -> str:
  """`reason` with its numbers masked: holds that differ only in figures
  ("trainer waits 2%" and "trainer waits 1%") are logged once at INFO."""
  return re.sub(r"[-+]?\d+(?:\.\d+)?", "#", reason)


class PoolManager:
  """A controller driving a scaler (module docstring).

  Args:
    controller: decides the size.
    scaler: carries it out.
  """

  def __init__(self, controller: pool.PoolController, scaler: Scaler):
    self.controller = controller
    self.scaler = scaler
    self.history: list[PoolEvent] = []
    self.failures = 0
    # The reason of the last decision, or why none was made.
    self.reason: str | None = None
    # The wording (`hold_wording`) of the last hold logged at INFO.
    self._logged_hold: str | None = None

  def report(self) -> dict[str, Any]:
    """The pool now, as the dispatcher's status file carries it (`pool`).

    Returns:
      {"kind", "min", "max", "size", "serving", "standby", "lost",
      "failures", "reason", "decisions"}: the scaler's kind ("local",
      "command", ...), its bounds, the workers asked for and serving, the
      warm standbys (`Scaler.standby_count`), those lost, the failed
      resizes so far, the last reason (`reason`) and the last
      `REPORTED_DECISIONS` (10) entries of `history` as dicts (`PoolEvent`'s
      fields).
    """
    scaler = self.scaler
    return {
        "kind": scaler.kind, "min": scaler.min_workers,
        "max": scaler.max_workers, "size": scaler.size(),
        "serving": scaler.serving(), "standby": scaler.standby_count(),
        "lost": scaler.lost,
        "failures": self.failures, "reason": self.reason,
        "decisions": [dataclasses.asdict(e)
                      for e in self.history[-REPORTED_DECISIONS:]]}

  def hold(self, reason: str) -> None:
    """Records that nothing could be decided this period, and why (no
    reading: for example no consumer report)."""
    self.reason = reason
    self._log_hold(reason)

  def _log_hold(self, reason: str) -> None:
    wording = hold_wording(reason)
    if wording != self._logged_hold:
      self._logged_hold = wording
      logging.info("Worker pool holds at %d: %s", self.scaler.size(), reason)

  def give_up_unstarted(self, now_s: float) -> int:
    """Counts as a failed change the workers the scaler gave up because
    they did not start in time (`Scaler.give_up_unstarted`), and logs it.

    Args:
      now_s: the time of the event recorded in `history`.

    Returns:
      The workers given up.
    """
    before = self.scaler.size()
    missing = self.scaler.give_up_unstarted()
    if missing:
      size = self.scaler.size()
      error = (f"{missing} of the {before} worker(s) asked for did not "
               "start serving in time; the pool counts the "
               f"{size} serving")
      self.failures += 1
      self.controller.rejected(pool.Decision(before, "workers did not start"))
      self.history.append(PoolEvent(now_s, before, size,
                                    "workers did not start", error))
      logging.error("Worker pool %d -> %d: %s.", before, size, error)
    return missing

  def step(self, reading: pool.PoolReading) -> pool.Decision:
    """Decides on `reading` and resizes on a change. A failed resize is
    logged once as an error and recorded; the pool stays as it was."""
    decision = self.controller.decide(reading)
    self.reason = decision.reason
    before = self.scaler.size()
    measured = describe_reading(reading)
    if decision.size == before:
      self._log_hold(f"{decision.reason} ({measured})")
      return decision
    self._logged_hold = None
    error = None
    try:
      self.scaler.resize(decision.size)
      logging.info("Worker pool %d -> %d: %s (%s)", before, decision.size,
                   decision.reason, measured)
    except (ScalerError, ValueError) as e:
      error = str(e)
      self.failures += 1
      self.controller.rejected(decision)
      logging.error("Worker pool %d -> %d failed: %s", before, decision.size,
                    error)
    self.history.append(PoolEvent(reading.time_s, before, decision.size,
                                  decision.reason, error))
    return decision
