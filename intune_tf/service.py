"""tf.data service with InTune: launchers, per-worker budgets, worker status.

    intune service dispatcher --port 5050
    intune service worker --dispatcher 127.0.0.1:5050 --port 5051

start TensorFlow's own `DispatchServer` and `WorkerServer` in a process that
has loaded the InTune kernel library and started the tuner. A dataset with
`experimental_intune` on, distributed with
`tf.data.experimental.service.distribute` (or `register_dataset`), is then
tuned on every worker:

- TF's `distribute` registers the dataset through
  `DatasetV2._apply_debug_options`, which InTune hooks: the `IntuneRootDataset`
  root goes on top of the graph sent to the dispatcher, and the option
  travels in that graph (`IntuneOptionsDataset`). Each worker builds the
  graph and the root rewrites the pipeline there, so every iterator a worker
  creates is a tuning session of the worker process, stepped by the worker's
  tuner. The client's side of `distribute` is not under the root: set the
  option before `distribute`, not on the distributed dataset.
- Budgets are per worker: `cpu_budget` is capped by each worker's usable
  CPUs at every step; a `ram_budget` left at None is resolved by each
  worker's tuner from its own available memory when the worker makes the
  iterator (the graph carries no bytes for it), then shared among the
  worker's sessions (`tuner.default_budget_shares`).
- Each worker writes a status file (`intune_tf.observe.status`) with the
  per-stage table of its sessions. `worker_status()` and
  `intune inspect --service` read them (same host, or a status dir shared by
  all hosts).

tf.data service has no authentication and no encryption: anyone who can
reach the ports can read the data and submit work. TensorFlow's servers
listen on all network interfaces whatever `--host` says (`--host` is the
address they advertise); keep them on a private network or behind a firewall.
"""

from __future__ import annotations

import argparse
import errno
import functools
import math
import numbers
import os
import pathlib
import re
import signal
import socket
import sys
import threading
import time
from typing import IO, Any

from absl import logging

from intune_tf import arguments
from intune_tf import files
from intune_tf import host as host_lib
from intune_tf import pool
from intune_tf import scalers

# Seconds a worker waits for its dispatcher to accept connections at start.
DEFAULT_DISPATCHER_WAIT_S = 30.0
# Seconds a worker gives a dispatcher's answer, whatever `--dispatcher-wait`.
_MIN_ANSWER_WAIT_S = 5.0
_GET_VERSION = "/tensorflow.data.DispatcherService/GetVersion"
# Seconds between two decisions on a pool, and between a change taking
# effect and the next change.
DEFAULT_POOL_PERIOD_S = 10.0
DEFAULT_POOL_MIN_INTERVAL_S = 30.0
# Seconds between updates of a dispatcher's status (its worker count).
_DISPATCHER_STATUS_PERIOD_S = 2.0
_ADDRESS = re.compile(r"^(?:grpc://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):"
                      r"(\d{1,5})$")
SECURITY_NOTE = (
    "tf.data service has no authentication or encryption: anyone who can "
    "reach port {port} can read the data and submit work. TensorFlow listens "
    "on all interfaces; keep it on a private network or behind a firewall.")


class ServiceError(RuntimeError):
  """A launcher cannot start (bad address, port in use, no dispatcher)."""


def parse_address(text: str, what: str = "address") -> tuple[str, int]:
  """Splits "HOST:PORT" (optionally "grpc://HOST:PORT", "[IPv6]:PORT").

  Args:
    text: the address.
    what: what it is, for the error message. Default "address".

  Returns:
    (host, port).

  Raises:
    ServiceError: not HOST:PORT with a port in 1..65535.
  """
  match = _ADDRESS.match(text.strip()) if isinstance(text, str) else None
  port = int(match.group(2)) if match else 0
  if not match or not 1 <= port <= 65535:
    raise ServiceError(
        f"{what} must be HOST:PORT with a port in 1..65535 (for example "
        f"127.0.0.1:5050), got {text!r}.")
  return match.group(1), port


def check_port_free(port: int) -> None:
  """Raises ServiceError if something already listens on `port`.

  TensorFlow's gRPC servers bind all interfaces with SO_REUSEPORT, so a
  second server on a busy port may start without an error; this check binds
  the port without that flag first.
  """
  sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
  # Connections of a previous server still in TIME_WAIT do not count.
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind(("0.0.0.0", port))
  except OSError as e:
    if e.errno in (errno.EADDRINUSE, errno.EACCES):
      raise ServiceError(
          f"port {port} is not available ({os.strerror(e.errno)}): another "
          "process uses it; pick another --port.") from None
    raise ServiceError(f"cannot bind port {port}: {e}") from None
  finally:
    sock.close()


def wait_for_dispatcher(host: str, port: int, timeout_s: float) -> None:
  """Waits until a TCP connection to host:port succeeds.

  Raises:
    ServiceError: nothing accepted connections within `timeout_s`.
  """
  deadline = time.monotonic() + timeout_s
  last: OSError | None = None
  while True:
    try:
      with socket.create_connection((host.strip("[]"), port), timeout=2.0):
        return
    except OSError as e:
      last = e
    if time.monotonic() >= deadline:
      raise ServiceError(
          f"no dispatcher reachable at {host}:{port} after {timeout_s:g} s "
          f"({last}). Start it first with `intune service dispatcher --port "
          f"{port}`, or raise --dispatcher-wait.")
    time.sleep(0.25)


def _check_work_dir(work_dir: str) -> None:
  """Creates the dispatcher's journal folder `work_dir` if missing.

  Raises:
    ServiceError: it cannot be a folder (a file on its path, no rights).
  """
  try:
    pathlib.Path(work_dir).mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise ServiceError(
        f"--work-dir {work_dir}: cannot use it as the dispatcher's journal "
        f"folder ({e.strerror or e}); give a folder this user can "
        "write.") from None


def _start_tuner(role: str, **service: Any) -> None:
  """Loads the kernel library, starts the tuner, labels the status file."""
  # Deferred: `intune --help` lists this command without loading TensorFlow.
  import intune_tf  # noqa: PLC0415
  from intune_tf.observe import status  # noqa: PLC0415
  from intune_tf.ops import loader as _kernels  # noqa: PLC0415

  _kernels.ops()
  tuner = intune_tf.global_tuner()
  tuner.start()
  writer = status.writer()
  if writer is not None:
    writer.set_info(role=role, service=service)


def _wait_for_signal(tick=None, period_s: float = 1.0) -> str:
  """Blocks until SIGTERM or SIGINT; calls `tick()` every `period_s`."""
  stop = threading.Event()
  received = []

  def handler(signum, frame):
    del frame
    received.append(signal.Signals(signum).name)
    stop.set()

  old = {s: signal.signal(s, handler) for s in (signal.SIGTERM,
                                                 signal.SIGINT)}
  try:
    while not stop.wait(period_s):
      if tick is not None:
        tick()
  finally:
    for s, h in old.items():
      signal.signal(s, h)
  return received[0] if received else "?"


def cpu_note(low: int, high: int, cpus: int, capped: bool
             ) -> tuple[int, str] | None:
  """What a local pool of `low` to `high` workers on a host giving `cpus`
  CPUs should be told, as (absl logging level, message), or None.

  cpu_note(3, 3, 2, True) warns that MIN 3 workers start on 2 CPUs;
  cpu_note(1, 4, 2, True) says the controller grows it to 2 at most;
  cpu_note(1, 4, 2, False) (no cap: the host's tier is filled to its MAX
  before a scale command adds workers) warns to lower MAX.

  Args:
    low: MIN.
    high: MAX.
    cpus: the CPUs the host gives (`host.usable_cpus()`).
    capped: whether the controller caps the pool at `cpus`.
  """
  if cpus < low:
    return (logging.WARNING,
            f"MIN {low} is more than the {cpus} CPU(s) this host gives: "
            f"{low} local workers start and share them; pass a MIN of at "
            f"most {cpus}.")
  if cpus >= high:
    return None
  if capped:
    return (logging.INFO, f"InTune grows it to at most {cpus} worker(s), "
            "the CPUs this host gives.")
  return (logging.WARNING,
          f"the host's tier is filled to its MAX before the command adds a "
          f"worker, and this host gives {cpus} CPU(s); set MAX to the "
          "workers it can run beside the trainer.")


def run_dispatcher(port: int, host: str = "127.0.0.1",
                   work_dir: str | None = None,
                   worker_timeout_ms: int | None = None,
                   workers: tuple[int, int] | None = None,
                   pool_period_s: float = DEFAULT_POOL_PERIOD_S,
                   pool_min_interval_s: float = DEFAULT_POOL_MIN_INTERVAL_S,
                   scale_command: str | None = None,
                   scale_timeout_s: float = scalers.DEFAULT_COMMAND_TIMEOUT_S,
                   controller: str = "intune",
                   scaler: scalers.Scaler | None = None,
                   standby: int = scalers.DEFAULT_STANDBY,
                   scale_out: int | None = None) -> int:
  """Runs a tf.data service dispatcher until SIGTERM/SIGINT.

  Args:
    port: port to listen on (all interfaces: TensorFlow's choice).
    host: the address workers and clients should use, for the log. Default
      "127.0.0.1".
    work_dir: directory for the dispatcher's journal (makes it
      fault-tolerant: a restarted dispatcher resumes its jobs). Default None:
      no journal.
    worker_timeout_ms: how long a worker may miss heartbeats before the
      dispatcher logs it as lost (`Lost worker ... due to timeout`, checked
      once every job GC interval, 10 minutes in TensorFlow 2.21). It ends
      none of the worker's tasks: clients wait for them, and a
      `distributed_epoch` epoch ends only once a worker serves again at
      that address (docs/service.md). Default None: TensorFlow's default.
    workers: (MIN, MAX) of a pool of workers that the dispatcher sizes
      with `intune_tf.pool.IntuneController`, from the reports of
      `ConsumerMeter` and of the workers' tuners: local `intune service
      worker` processes it starts (one that dies is replaced on its port
      at the next period, decision or not), or, with `scale_command`,
      workers that command sets, or, with `scaler`, that scaler's. Default
      None: no pool.
    pool_period_s: seconds between two decisions on the pool. Default 10.
    pool_min_interval_s: seconds between a change taking effect and the
      next change. Default 30.
    scale_command: with `workers`, a shell command with `{n}` where the
      count goes (`scalers.CommandScaler`), run for MIN at start and at
      each change; the workers registered with the dispatcher count as
      serving. Default None: local workers.
    scale_timeout_s: seconds the scale command may run before it is killed
      and the change fails. Default `scalers.DEFAULT_COMMAND_TIMEOUT_S`
      (60).
    controller: the pool controller's name (`pool.CONTROLLERS`): "intune",
      or, to compare, "tf-formula" (TensorFlow's estimate applied as if it
      scaled) or "cachew" (Cachew's hill climb). Default "intune".
    scaler: with `workers` (MIN and MAX the same as the scaler's), the pool
      as a Python object, e.g. a `scalers.CallbackScaler` that calls your
      cluster's API (its `serving()` counts the workers serving). Default
      None: local workers or `scale_command`.
    standby: with local workers, the warm processes kept ready to join
      (`scalers.LocalWorkers`). Default `scalers.DEFAULT_STANDBY` (1).
    scale_out: with `workers` and `scale_command`: `workers` are this
      host's local workers, filled first, and the command runs for up to
      `scale_out` more beyond them (`scalers.LocalFirst`: the pool is MIN
      to MAX + `scale_out`; the command runs for 0 at start). Default
      None: the command sets the whole pool.

  Returns:
    The exit code (0).

  Raises:
    ServiceError: the port is in use.
    ValueError: `controller` is unknown, `scaler` is given without
      `workers`, with `scale_command`, or with other bounds, or
      `scale_out` without `workers` and `scale_command` or below 1.
  """
  if work_dir is not None:
    _check_work_dir(work_dir)
  # Deferred: `intune --help` lists this command without loading TensorFlow.
  import tensorflow as tf  # noqa: PLC0415

  if controller not in pool.CONTROLLERS:
    raise ValueError(f"unknown pool controller {controller!r}; known: "
                     f"{', '.join(pool.CONTROLLERS)}.")
  if scaler is not None and (
      workers is None or scale_command is not None or
      (scaler.min_workers, scaler.max_workers) != tuple(workers)):
    raise ValueError(
        "scaler= needs workers=(MIN, MAX) equal to the scaler's "
        f"({scaler.min_workers}, {scaler.max_workers}) and no "
        "scale_command.")
  if scale_out is not None and (
      workers is None or scale_command is None or scaler is not None or
      isinstance(scale_out, bool) or not isinstance(scale_out, int) or
      scale_out < 1):
    raise ValueError(
        f"scale_out= is the workers the scale command adds beyond the local "
        f"ones: it needs workers=(MIN, MAX) and scale_command, and a count "
        f"of at least 1, got {scale_out!r}.")
  check_port_free(port)
  _start_tuner("dispatcher", port=port, address=f"{host}:{port}",
               work_dir=work_dir)
  config = tf.data.experimental.service.DispatcherConfig(
      port=port, work_dir=work_dir, fault_tolerant_mode=bool(work_dir),
      worker_timeout_ms=worker_timeout_ms)
  server = tf.data.experimental.service.DispatchServer(config)
  logging.info("tf.data service dispatcher with InTune at grpc://%s:%d "
               "(pid %d).", host, port, os.getpid())
  logging.warning(SECURITY_NOTE.format(port=port))
  local = f"127.0.0.1:{port}"
  manager = None
  if workers is not None:
    low, high = workers
    if scaler is None and scale_command is None:
      scaler = scalers.LocalWorkers(local, low, high, standby=standby)
    elif scaler is None and scale_out is not None:
      on_host = scalers.LocalWorkers(local, low, high, standby=standby)
      # The dispatcher's registered workers beyond the host's own.
      scaler = scalers.LocalFirst(on_host, scalers.CommandScaler(
          scale_command, 1, scale_out, initial=0, timeout_s=scale_timeout_s,
          serving=lambda: server._num_workers() - on_host.serving()))  # noqa: SLF001
    elif scaler is None:
      # Initially 0: the command runs for MIN at start, whatever the count.
      scaler = scalers.CommandScaler(
          scale_command, low, high, initial=0, timeout_s=scale_timeout_s,
          serving=server._num_workers)  # noqa: SLF001
    kwargs = ({"min_interval_s": pool_min_interval_s}
              if controller == "intune" else {})
    capped = controller == "intune" and isinstance(scaler,
                                                    scalers.LocalWorkers)
    if capped:
      # A local worker past the host's CPUs adds no CPU, only contention.
      kwargs["cpu_cap"] = host_lib.usable_cpus
    if capped or scale_out is not None:
      note = cpu_note(low, high, host_lib.usable_cpus(), capped)
      if note is not None:
        logging.log(note[0], "Worker pool local:%d-%d: %s", low, high,
                    note[1])
    manager = scalers.PoolManager(pool.make_controller(
        controller, scaler.min_workers, scaler.max_workers, **kwargs), scaler)
    if scale_out is not None:
      scaler.start(low)
      logging.info("Worker pool local:%d-%d, then up to %d more through the "
                   "command: ran `%s`; started %d local worker(s) (logs in "
                   "%s).", low, high, scale_out, scaler.remote.command(0),
                   low, scaler.local.log_dir)
    else:
      scaler.resize(low)
      if isinstance(scaler, scalers.LocalWorkers):
        logging.info("Worker pool local:%d-%d: started %d local worker(s); "
                     "logs in %s.", low, high, low, scaler.log_dir)
      elif scale_command is None:
        logging.info("Worker pool %s:%d-%d: %d worker(s) asked for.",
                     scaler.kind, low, high, scaler.size())
      else:
        logging.info("Worker pool command:%d-%d: ran `%s`.", low, high,
                     scaler.command(low))
  # The dispatcher's address in its workers' status files: the local ones
  # use loopback, those of a scale command the advertised address.
  workers_use = local if scale_command is None else f"{host}:{port}"
  last_decision = [time.monotonic()]

  def step_pool(info: dict[str, Any]) -> None:
    scaler = manager.scaler
    now = time.monotonic()
    if now - last_decision[0] >= pool_period_s:
      last_decision[0] = now
      # A dead worker is replaced at its address without a decision: a
      # consumer whose epoch waits for it cannot go on until then.
      try:
        scaler.replace_lost()
      except scalers.ScalerError as e:
        logging.error("%s", e)
      manager.give_up_unstarted(time.time())
      size, serving = scaler.size(), scaler.serving()
      reading = pool_reading(workers_use, serving, size - serving,
                             consumer_addresses=(local, f"{host}:{port}"))
      if reading is not None:
        manager.step(reading)
      else:
        manager.hold("no consumer report (ConsumerMeter)")
    info.update(pool=manager.report())

  pool_info: dict[str, Any] = {}

  def tick():
    # Deferred: `intune --help` lists this command without loading TensorFlow.
    from intune_tf.observe import status  # noqa: PLC0415
    if manager is not None:
      step_pool(pool_info)
    writer = status.writer()
    if writer is not None:
      fields = {"workers": server._num_workers()}  # noqa: SLF001
      if manager is not None:
        fields["pool"] = pool_info["pool"]
      writer.set_info(**fields)

  try:
    name = _wait_for_signal(tick, _DISPATCHER_STATUS_PERIOD_S)
  finally:
    if manager is not None:
      manager.scaler.close()
  logging.info("Dispatcher stopping (%s).", name)
  server.stop()
  return 0


def run_worker(dispatcher: str, port: int, host: str = "127.0.0.1",
               dispatcher_wait_s: float = DEFAULT_DISPATCHER_WAIT_S,
               heartbeat_interval_ms: int | None = None,
               port_kept: bool = False,
               ready_fd: int | None = None) -> int:
  """Runs a tf.data service worker tuned by InTune until SIGTERM/SIGINT.

  Args:
    dispatcher: the dispatcher's HOST:PORT.
    port: port to listen on (all interfaces: TensorFlow's choice).
    host: the address the worker advertises to the dispatcher and clients
      (`worker_address` HOST:PORT). Default "127.0.0.1".
    dispatcher_wait_s: seconds the dispatcher has to accept connections
      and answer (at least 5 s for the answer); then the worker gives up.
      Default `DEFAULT_DISPATCHER_WAIT_S` (30).
    heartbeat_interval_ms: how often the worker reports to the dispatcher
      (keep it below the dispatcher's worker timeout). Default None:
      TensorFlow's default.
    port_kept: the port is held by a local pool's `AddressKeeper`, which
      closes once this worker registers: bind beside it rather than refuse
      a busy port. Default False.
    ready_fd: a file descriptor to write "registered PORT" to (then closed)
      once the dispatcher has registered the worker. Default None.

  Returns:
    The exit code (0).

  Raises:
    ServiceError: bad dispatcher address, port in use, no dispatcher, or
      something else at its address (no answer within `dispatcher_wait_s`,
      at least 5 s).
  """
  # Deferred: `intune --help` lists this command without loading TensorFlow.
  import tensorflow as tf  # noqa: PLC0415

  d_host, d_port = parse_address(dispatcher, "--dispatcher")
  dispatcher = f"{d_host}:{d_port}"
  if not port_kept:
    check_port_free(port)
  deadline = time.monotonic() + dispatcher_wait_s
  wait_for_dispatcher(d_host, d_port, dispatcher_wait_s)
  worker_address = f"{host}:{port}"
  _start_tuner("worker", dispatcher=dispatcher, worker_address=worker_address,
               port=port)
  config = tf.data.experimental.service.WorkerConfig(
      dispatcher_address=dispatcher, worker_address=worker_address, port=port,
      heartbeat_interval_ms=heartbeat_interval_ms)
  _check_is_dispatcher(dispatcher, max(_MIN_ANSWER_WAIT_S,
                                       deadline - time.monotonic()))
  # Returns once the dispatcher registered the worker.
  server = tf.data.experimental.service.WorkerServer(config)
  logging.info("tf.data service worker with InTune at %s registered with "
               "dispatcher %s (pid %d).", worker_address, dispatcher,
               os.getpid())
  if ready_fd is not None:
    with open(ready_fd, "w", closefd=True) as ready:
      ready.write(f"registered {port}\n")
  logging.warning(SECURITY_NOTE.format(port=port))
  name = _wait_for_signal()
  logging.info("Worker stopping (%s).", name)
  server.stop()
  return 0


def _check_is_dispatcher(dispatcher: str, timeout_s: float) -> None:
  """Asks the server at `dispatcher` for its tf.data service version (a
  `WorkerServer` would retry for ever at anything that is not a
  dispatcher, holding the interpreter).

  Raises:
    ServiceError: no dispatcher answered within `timeout_s`.
  """
  import grpc  # noqa: PLC0415  TensorFlow's own dependency, only needed here

  with grpc.insecure_channel(dispatcher) as channel:
    get_version = channel.unary_unary(_GET_VERSION)
    try:
      get_version(b"", timeout=timeout_s, wait_for_ready=True)
    except grpc.RpcError as e:
      what = ("a gRPC server that is not a tf.data service dispatcher"
              if e.code() == grpc.StatusCode.UNIMPLEMENTED else
              f"no tf.data service dispatcher answer ({e.code().name})")
      raise ServiceError(
          f"something accepts connections at {dispatcher} but gave "
          f"{what} within {timeout_s:.3g} s: check the address (`intune "
          "service dispatcher` listens there), or raise "
          "--dispatcher-wait.") from None


def _exit_with_stdin() -> None:
  """Stops this process (SIGTERM) at the end of stdin: the process that
  started it and held the other end is gone, however it died."""

  def watch():
    try:
      while sys.stdin.buffer.read1(4096):
        pass
    except (OSError, ValueError):
      pass
    logging.warning("Worker: stdin closed (whoever started it is gone); "
                    "stopping.")
    os.kill(os.getpid(), signal.SIGTERM)

  threading.Thread(target=watch, name="intune-stdin-watch",
                   daemon=True).start()


# What each processing mode promises when workers join and leave
# (docs/service.md).
VISITATION = {
    "distributed_epoch": (
        "at most once: the elements of the splits a worker held when it "
        "left (stopped or killed) are lost; TensorFlow cannot drain a "
        "worker"),
    "parallel_epochs": (
        "every worker produces the whole dataset: a worker joining adds a "
        "full pass, one leaving takes the rest of its pass; nothing per "
        "element"),
}


class EpochTally:
  """Counts the elements a consumer received in one epoch of a
  distributed dataset against the elements its source holds.

  With `distributed_epoch` (at most once) `lost` is what workers that left
  took with them; an element received twice breaks the promise and is
  counted in `extra`. An epoch that lost a worker ends (and can be
  reported) only once a worker serves again at that worker's address
  (docs/service.md).

  Args:
    expected: the elements of one epoch (e.g. the source's cardinality
      before `distribute`).
    mode: the processing mode. Default "distributed_epoch".

  Raises:
    ValueError: a negative count or an unknown mode.
  """

  def __init__(self, expected: int, mode: str = "distributed_epoch"):
    if isinstance(expected, bool) or not isinstance(expected, int) or (
        expected < 0):
      raise ValueError(f"expected must be a count of 0 or more, got "
                       f"{expected!r}.")
    if mode not in VISITATION:
      raise ValueError(f"unknown processing mode {mode!r}; known: "
                       f"{', '.join(VISITATION)}.")
    self.expected = expected
    self.mode = mode
    self.received = 0

  def add(self, elements: int = 1) -> None:
    """Counts `elements` more received."""
    self.received += elements

  @property
  def lost(self) -> int:
    return max(0, self.expected - self.received)

  @property
  def extra(self) -> int:
    return max(0, self.received - self.expected)

  def report(self) -> dict[str, Any]:
    """{"mode", "promise", "expected", "received", "lost", "extra"}; logs a
    warning when elements were lost or received more than once."""
    result = {"mode": self.mode, "promise": VISITATION[self.mode],
              "expected": self.expected, "received": self.received,
              "lost": self.lost, "extra": self.extra}
    if self.lost or self.extra:
      logging.warning(
          "tf.data service epoch (%s): %d of %d elements received, %d lost, "
          "%d extra (%s).", self.mode, self.received, self.expected,
          self.lost, self.extra, VISITATION[self.mode])
    return result


# Seconds between a consumer meter's reports, and the age beyond which the
# dispatcher ignores one.
CONSUMER_REPORT_PERIOD_S = 1.0
CONSUMER_REPORT_MAX_AGE_S = 30.0


def _pool_dir(status_dir: str | os.PathLike | None) -> pathlib.Path:
  # Deferred: `intune --help` lists this command without loading TensorFlow.
  from intune_tf.observe import status  # noqa: PLC0415
  base = pathlib.Path(status_dir) if status_dir else status.default_dir()
  return base / "pool"


class ConsumerMeter:
  """The trainer's side of pool sizing: measures how long each step waits
  for input and how long it computes, and reports them for the dispatcher
  (`<status dir>/pool/<pid>@<host>.json`, every
  `CONSUMER_REPORT_PERIOD_S`).

      meter = service.ConsumerMeter("127.0.0.1:5050")
      for batch in meter.iterate(distributed_ds):
        train_step(batch)

  While `iterate` waits for an element, a thread reports the wait so far
  each period (with the last pace measured): a trainer stuck on a worker
  that left still reads as waiting, so the dispatcher's controller takes a
  shrink back and a worker serves at that address again, which is what ends
  a `distributed_epoch` epoch (docs/service.md).

  Args:
    dispatcher: the dispatcher's HOST:PORT.
    status_dir: the status dir the dispatcher reads. Default None: the
      default status dir.
    elements_per_item: elements (as the workers count them) per item the
      iterator yields. Default 1.

  Raises:
    ServiceError: a malformed dispatcher address.
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
    self._lock = threading.Lock()
    self._wait = self._compute = 0.0  # guarded by _lock
    self._elements = 0.0  # guarded by _lock
    self._pace = 0.0  # the last period's with compute; guarded by _lock
    # When the wait under way began, or its part not yet reported; None
    # while no wait is under way. Guarded by _lock.
    self._waiting_since: float | None = None
    self._last_report = time.monotonic()  # guarded by _lock
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
    counts up to `now`, its rest in the next period."""
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
    self._write(data)
    self._wait = self._compute = 0.0
    self._elements = 0.0
    self._last_report = now
    return data

  def _write(self, data: dict[str, Any]) -> None:
    """Writes a report; a failure (a status dir that cannot be used) warns
    once, until writing works again: the training loop goes on without
    pool sizing."""
    try:
      files.write_json(self.path, data)
    except OSError as e:
      if not self._failing:
        logging.warning(
            "ConsumerMeter: cannot write its report %s (%s); the dispatcher "
            "sizes the pool without this trainer until it can (set "
            "INTUNE_STATUS_DIR or status_dir to a writable folder).",
            self.path, e)
      self._failing = True
    else:
      self._failing = False

  def _report_waits(self, stop: threading.Event) -> None:
    """Reports each period in which a wait is under way (a thread of
    `iterate`)."""
    while not stop.wait(CONSUMER_REPORT_PERIOD_S / 2):
      with self._lock:
        now = time.monotonic()
        if (self._waiting_since is not None and
            now - self._last_report >= CONSUMER_REPORT_PERIOD_S):
          self._report_locked(now)

  def iterate(self, iterable):
    """Yields from `iterable`, timing the wait in `next()` and the compute
    between two of them; a thread reports a long wait while it lasts."""
    it = iter(iterable)
    stop = threading.Event()
    reporter = threading.Thread(target=self._report_waits, args=(stop,),
                                name="intune-consumer-meter", daemon=True)
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
    try:
      self.path.unlink(missing_ok=True)
    except OSError:
      pass


# The largest consumer report read (a report is about 200 bytes).
_MAX_REPORT_BYTES = 64 << 10


@functools.lru_cache(maxsize=256)
def endpoints(address: str) -> frozenset[tuple[str, int]]:
  """The (IP, port) pairs that a HOST:PORT address names, its host name
  resolved: "localhost:5050" and "127.0.0.1:5050" share (127.0.0.1, 5050).
  A host that does not resolve stands for itself; a malformed address
  names nothing.
  """
  try:
    host, port = parse_address(address)
  except ServiceError:
    return frozenset()
  host = host.strip("[]")
  try:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
  except (OSError, UnicodeError):
    return frozenset({(host, port)})
  return frozenset((info[4][0], port) for info in infos) | {(host, port)}


def names_dispatcher(address: Any, dispatcher: frozenset[tuple[str, int]]
                     ) -> bool:
  """Whether `address` (any JSON value read from a report) is a HOST:PORT
  that shares an endpoint with `dispatcher` (`endpoints`)."""
  return isinstance(address, str) and bool(endpoints(address) & dispatcher)


def _consumer_reports(directory: pathlib.Path) -> list[dict[str, Any]]:
  """The consumer reports in `directory` that are JSON objects, each read
  with the checked reader (`status.read_json_file`: a regular file of this
  user, at most `_MAX_REPORT_BYTES`, opened without blocking); any other
  file is skipped."""
  # Deferred: `intune --help` lists this command without loading TensorFlow.
  from intune_tf.observe import status  # noqa: PLC0415
  reports = []
  for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
    try:
      data = status.read_json_file(path, max_bytes=_MAX_REPORT_BYTES)
    except (OSError, ValueError):
      continue
    if isinstance(data, dict):
      reports.append(data)
  return reports


def pool_reading(dispatcher: str, serving: int, starting: int,
                 status_dir: str | os.PathLike | None = None,
                 now: float | None = None,
                 consumer_addresses: tuple[str, ...] = ()):
  """The `intune_tf.pool.PoolReading` of a dispatcher's pool from the
  reports in the status dir: the consumers' fresh reports (their paces
  summed, the largest wait share) and the rows/s of each of the
  dispatcher's workers (the sum of its sessions' output rates). None when no
  consumer reported within `CONSUMER_REPORT_MAX_AGE_S`. Consumers that name
  the dispatcher by one of `consumer_addresses` count too, and so do
  workers (default none); addresses match once their host names are
  resolved (`endpoints`). A report that is not a small regular JSON file of
  this user with numbers where numbers go is skipped.
  """
  now = time.time() if now is None else now
  accepted = frozenset().union(
      *(endpoints(a) for a in (dispatcher, *consumer_addresses)))
  consumers = []
  for data in _consumer_reports(_pool_dir(status_dir)):
    try:
      fresh = now - float(data["time"]) <= CONSUMER_REPORT_MAX_AGE_S
      rate, wait = float(data["consumer_rate"]), float(data["wait_share"])
    except (ValueError, KeyError, TypeError):
      continue
    if (names_dispatcher(data.get("dispatcher"), accepted) and fresh and
        math.isfinite(rate) and rate >= 0 and 0 <= wait <= 1):
      consumers.append((rate, wait))
  if not consumers:
    return None
  # A pool's workers name the dispatcher by loopback or by its advertised
  # address (`LocalFirst`'s tiers: one each).
  rates = [sum(float(s.get("output_rate") or 0.0)
               for s in w.get("sessions", []))
           for w in worker_status(status_dir)
           if names_dispatcher((w.get("service") or {}).get("dispatcher"),
                               accepted)]
  return pool.PoolReading(
      time_s=now, workers=serving, starting=starting,
      wait_share=max(w for _, w in consumers),
      consumer_rate=sum(r for r, _ in consumers),
      worker_rates=tuple(rates[:serving]))


def dispatcher_pool(dispatcher: str,
                    status_dir: str | os.PathLike | None = None
                    ) -> dict[str, Any] | None:
  """The worker pool a live dispatcher started with `--workers` reports in
  its status file (`scalers.PoolManager.report`: "kind", "min", "max",
  "size", "serving", "lost", "failures", "reason", "decisions"), or None (no
  such dispatcher, or no pool).

  Args:
    dispatcher: its HOST:PORT (matched on the port).
    status_dir: the status dir. Default None: the default one.
  """
  # Deferred: `intune --help` lists this command without loading TensorFlow.
  from intune_tf.observe import status  # noqa: PLC0415

  _, port = parse_address(dispatcher, "dispatcher")
  for data in status.read_all(status_dir):
    service = data.get("service") or {}
    if data.get("role") == "dispatcher" and service.get("port") == port:
      return data.get("pool")
  return None


def pool_callback(dispatcher: str,
                  status_dir: str | os.PathLike | None = None):
  """A Keras callback that adds the dispatcher's pool to the logs at each
  epoch's end: `intune/pool_size`, `intune/pool_serving`,
  `intune/pool_lost` and `intune/pool_changes` (resizes so far), when the
  dispatcher reports a pool (`dispatcher_pool`).
  """
  # Deferred: Keras loads TensorFlow; `intune service` must not.
  import keras  # noqa: PLC0415

  class PoolCallback(keras.callbacks.Callback):
    """Logs the tf.data service worker pool (`pool_callback`)."""

    def on_epoch_end(self, epoch, logs=None):
      del epoch
      info = dispatcher_pool(dispatcher, status_dir)
      if info is None or logs is None:
        return
      logs["intune/pool_size"] = info.get("size", 0)
      logs["intune/pool_serving"] = info.get("serving", 0)
      logs["intune/pool_lost"] = info.get("lost", 0)
      logs["intune/pool_changes"] = sum(
          1 for d in info.get("decisions", []) if not d.get("error"))

  return PoolCallback()


def worker_status(status_dir: str | os.PathLike | None = None,
                  dispatcher: str | None = None) -> list[dict[str, Any]]:
  """Status of the live InTune tf.data service workers.

  Args:
    status_dir: where the workers write their status files. Default None:
      `intune_tf.observe.status.default_dir()` (`$INTUNE_STATUS_DIR` or
      ~/.cache/intune_tf/status); workers on other hosts are seen when all
      use one shared directory.
    dispatcher: only workers of this dispatcher (HOST:PORT). Default None:
      every worker.

  Returns:
    One status dict per worker process (see `intune_tf.observe.status`): "pid",
    "host", "service" ({"dispatcher", "worker_address", "port"}),
    "sessions" (each with "knobs", "initial_knobs", "steps", "changes",
    "output_rate", "stages", ...) and "ended_sessions".
  """
  # Deferred: `intune --help` lists this command without loading TensorFlow.
  from intune_tf.observe import status  # noqa: PLC0415

  wanted = None
  if dispatcher is not None:
    parse_address(dispatcher, "dispatcher")
    wanted = endpoints(dispatcher)
  result = []
  for data in status.read_all(status_dir):
    service = data.get("service") or {}
    if data.get("role") != "worker":
      continue
    if wanted is not None and not names_dispatcher(service.get("dispatcher"),
                                                   wanted):
      continue
    result.append(data)
  return result


def _fail(command: str, error: Exception) -> int:
  logging.error("intune service %s: %s", command, error)
  print(f"intune service {command}: error: {error}", flush=True)
  return 1


def pool_flags_problem(args: argparse.Namespace) -> str | None:
  """What is wrong with the pool flags of `intune service dispatcher`
  together (each flag alone is checked by its type), or None.

  Args:
    args: the parsed flags: `workers` ((KIND, MIN, MAX) or None),
      `scale_command`, `scale_timeout`, `scale_out` and `pool_standby`
      (None when not given) and `pool_controller`.
  """
  kind = args.workers[0] if args.workers else None
  example = ("--scale-command 'kubectl scale deployment/tfdata-workers "
             "--replicas={n}'")
  if kind == "command" and args.scale_command is None:
    return (f"--workers command:MIN-MAX needs --scale-command, the shell "
            f"command that sets the pool to {{n}} workers; pass for "
            f"example {example}.")
  if args.scale_out is not None:
    if kind != "local":
      given = f"--workers {kind}:MIN-MAX" if kind else "no --workers"
      return (f"--scale-out adds workers beyond those of --workers "
              f"local:MIN-MAX, not {given}; pass --workers local:MIN-MAX "
              f"or drop --scale-out.")
    if args.scale_command is None:
      return (f"--scale-out needs --scale-command, the shell command that "
              f"sets the workers beyond the host's to {{n}}; pass for "
              f"example {example}.")
  if args.pool_controller != "intune" and kind is None:
    return (f"--pool-controller {args.pool_controller} sizes a pool: pass "
            "--workers local:MIN-MAX or command:MIN-MAX, or drop "
            "--pool-controller.")
  commanded = kind == "command" or args.scale_out is not None
  for flag, value in (("--scale-command", args.scale_command),
                      ("--scale-timeout", args.scale_timeout)):
    if value is not None and not commanded:
      given = (f"--workers {kind}:MIN-MAX alone" if kind
               else "no --workers")
      return (f"{flag} is for --workers command:MIN-MAX or local:MIN-MAX "
              f"with --scale-out, not {given}; pass one of them or drop "
              f"{flag}.")
  for flag, value in (("--pool-period", args.pool_period),
                      ("--pool-min-interval", args.pool_min_interval)):
    if value is not None and kind is None:
      return (f"{flag} paces the decisions on a pool: pass --workers "
              f"local:MIN-MAX or command:MIN-MAX, or drop {flag}.")
  if args.pool_standby is not None and kind != "local":
    return ("--pool-standby keeps local workers warm: pass --workers "
            "local:MIN-MAX or drop --pool-standby.")
  return None


def _or(value: Any, default: Any) -> Any:
  return default if value is None else value


def _dispatcher_main(args: argparse.Namespace) -> int:
  problem = pool_flags_problem(args)
  if problem is not None:
    print(f"intune service dispatcher: error: {problem}", file=sys.stderr,
          flush=True)
    return 2
  _, low, high = args.workers or (None, None, None)
  timeout = _or(args.scale_timeout, scalers.DEFAULT_COMMAND_TIMEOUT_S)
  try:
    return run_dispatcher(args.port, args.host, args.work_dir,
                          args.worker_timeout_ms,
                          (low, high) if args.workers else None,
                          _or(args.pool_period, DEFAULT_POOL_PERIOD_S),
                          _or(args.pool_min_interval,
                              DEFAULT_POOL_MIN_INTERVAL_S),
                          args.scale_command, timeout, args.pool_controller,
                          standby=_or(args.pool_standby,
                                      scalers.DEFAULT_STANDBY),
                          scale_out=args.scale_out)
  except (ServiceError, scalers.ScalerError) as e:
    return _fail("dispatcher", e)


def standby_port(stream: IO[str]) -> tuple[int, bool] | None:
  """The port a standby worker is asked to serve on, from one line of
  `stream`: "PORT", or "PORT kept" when the pool's `AddressKeeper` holds it
  (the worker binds beside it). None at the end of the stream (whoever
  kept the standby no longer needs it).

  Returns:
    (port, kept), or None.

  Raises:
    ServiceError: the line is not a port (1-65535), optionally "kept".
  """
  line = stream.readline()
  if not line:
    return None
  words = line.split()
  kept = words[1:] == [scalers.KEPT]
  try:
    if len(words) != 1 + kept:
      raise argparse.ArgumentTypeError(
          f"expected PORT or PORT {scalers.KEPT}")
    return arguments.port(words[0]), kept
  except argparse.ArgumentTypeError as e:
    raise ServiceError(f"a standby worker got {line.strip()!r} on stdin, "
                       f"not a port: {e}") from e


def _warm_worker() -> None:
  """What a worker loads before it has a port: TensorFlow, InTune and its
  kernel library (most of a worker's start-up)."""
  # Deferred: `intune --help` lists this command without loading TensorFlow.
  import tensorflow as tf  # noqa: PLC0415, F401

  # Deferred with TensorFlow, which it loads.
  from intune_tf.ops import loader as _kernels  # noqa: PLC0415
  _kernels.ops()


def _worker_main(args: argparse.Namespace) -> int:
  try:
    parse_address(args.dispatcher, "--dispatcher")
    if (args.port is None) == (not args.standby):
      raise ServiceError("pass --port, or --standby to read the port from "
                         "stdin once it is needed")
  except ServiceError as e:
    print(f"intune service worker: error: {e}", flush=True)
    return 2
  try:
    port, kept = args.port, args.port_kept
    if args.standby:
      _warm_worker()
      logging.info("Standby worker ready (pid %d): waiting for a port on "
                   "stdin.", os.getpid())
      told = standby_port(sys.stdin)
      if told is None:
        logging.info("Standby worker: stdin closed; exiting unused.")
        return 0
      port, kept = told
    if args.standby or args.exit_with_stdin:
      _exit_with_stdin()
    return run_worker(args.dispatcher, port, args.host,
                      args.dispatcher_wait, args.heartbeat_interval_ms,
                      port_kept=kept, ready_fd=args.ready_fd)
  except ServiceError as e:
    return _fail("worker", e)


def add_commands(subparsers) -> None:
  """The `intune service` commands."""
  d = subparsers.add_parser(
      "dispatcher", help="Start a tf.data service dispatcher (InTune loaded).")
  d.add_argument("--port", type=arguments.port, required=True,
                 help="Port to listen on (TensorFlow listens on all "
                 "interfaces).")
  d.add_argument("--host", default="127.0.0.1",
                 help="The address workers and clients use to reach this "
                 "dispatcher (default 127.0.0.1).")
  d.add_argument("--work-dir", default=None,
                 help="Journal directory: a restarted dispatcher resumes its "
                 "jobs (default: none).")
  d.add_argument("--worker-timeout-ms", type=arguments.positive_int,
                 default=None,
                 help="Log a worker as lost after this long without a "
                 "heartbeat (checked every 10 min); its tasks are kept for "
                 "a worker at the same address (default: TensorFlow's).")
  d.add_argument("--workers", default=None, metavar="KIND:MIN-MAX",
                 type=arguments.parsed_by(scalers.parse_pool_spec, "pool"),
                 help="Size a pool of MIN to MAX workers from what the "
                 "trainer reports (service.ConsumerMeter): local:MIN-MAX "
                 "starts local `intune service worker` processes, "
                 "command:MIN-MAX runs --scale-command (default: no pool).")
  d.add_argument("--scale-command", default=None, metavar="COMMAND",
                 type=arguments.parsed_by(scalers.check_template,
                                          "scale_command"),
                 help="With --workers command:MIN-MAX: the shell command "
                 "that sets the pool to {n} workers, e.g. 'kubectl scale "
                 "deployment/tfdata-workers --replicas={n}' (required "
                 "there); with --scale-out, the workers beyond the host's.")
  d.add_argument("--scale-out", type=arguments.positive_int, default=None,
                 metavar="N",
                 help="With --workers local:MIN-MAX and --scale-command: the "
                 "host's workers first, then up to N more through the "
                 "command, which sets them to {n} (0 at start and while the "
                 "host suffices) (default: the host's workers only).")
  d.add_argument("--scale-timeout", type=arguments.duration, default=None,
                 metavar="SECONDS",
                 help="With --scale-command: seconds it may run before it is "
                 "killed and the change fails (finite, above 0; default "
                 f"{scalers.DEFAULT_COMMAND_TIMEOUT_S:g}).")
  d.add_argument("--pool-period", type=arguments.duration, default=None,
                 metavar="SECONDS",
                 help="With --workers: seconds between two decisions on "
                 f"the pool (default {DEFAULT_POOL_PERIOD_S:g}).")
  d.add_argument("--pool-min-interval", type=arguments.optional_duration,
                 default=None, metavar="SECONDS",
                 help="With --workers: seconds between a change taking "
                 "effect and the next change (default "
                 f"{DEFAULT_POOL_MIN_INTERVAL_S:g}).")
  d.add_argument("--pool-controller", default="intune",
                 choices=tuple(pool.CONTROLLERS),
                 help="With --workers: what sizes the pool: intune, or, to "
                 "compare, tf-formula (TensorFlow's estimate applied as if "
                 "it scaled) or cachew (Cachew's hill climb) (default "
                 "intune).")
  d.add_argument("--pool-standby", type=arguments.non_negative_int,
                 default=None, metavar="N",
                 help="With --workers local:MIN-MAX: worker processes kept "
                 "warm (TensorFlow loaded, not serving) so that a growth "
                 "serves at once; 0 starts every worker cold "
                 f"(default {scalers.DEFAULT_STANDBY}).")
  d.set_defaults(func=_dispatcher_main)
  w = subparsers.add_parser(
      "worker", help="Start a tf.data service worker tuned by InTune.")
  w.add_argument("--dispatcher", required=True, metavar="HOST:PORT",
                 help="The dispatcher's address.")
  w.add_argument("--port", type=arguments.port, default=None,
                 help="Port to listen on (TensorFlow listens on all "
                 "interfaces); required without --standby.")
  w.add_argument("--standby", action="store_true",
                 help="Load TensorFlow and InTune, then wait for the port as "
                 "one line on stdin and serve on it (a warm worker of a "
                 "local pool serves at once); exit at the end of "
                 "stdin.")
  # A local pool's own workers: the port is held by its AddressKeeper.
  w.add_argument("--port-kept", action="store_true", help=argparse.SUPPRESS)
  w.add_argument("--exit-with-stdin", action="store_true",
                 help="Stop at the end of stdin (for a supervisor that holds "
                 "it open: the worker ends with it, however it dies); "
                 "--standby implies it.")
  w.add_argument("--ready-fd", type=arguments.positive_int, default=None,
                 metavar="FD",
                 help="Write 'registered PORT' to this inherited file "
                 "descriptor once the dispatcher has registered the worker, "
                 "then close it (for a supervisor; default: none).")
  w.add_argument("--host", default="127.0.0.1",
                 help="The address this worker advertises to the dispatcher "
                 "and clients (default 127.0.0.1).")
  w.add_argument("--dispatcher-wait", type=arguments.optional_duration,
                 default=DEFAULT_DISPATCHER_WAIT_S, metavar="SECONDS",
                 help="Seconds the dispatcher has to accept the worker and "
                 "register it at start; then the worker exits (default "
                 f"{DEFAULT_DISPATCHER_WAIT_S:g}).")
  w.add_argument("--heartbeat-interval-ms", type=arguments.positive_int,
                 default=None,
                 help="How often to report to the dispatcher; keep it below "
                 "the dispatcher's --worker-timeout-ms (default: "
                 "TensorFlow's).")
  w.set_defaults(func=_worker_main)

