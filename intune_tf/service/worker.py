"""The worker: TensorFlow's `WorkerServer` tuned by InTune (`intune service
worker`), cold or as a warm standby; and what the dispatcher's process
shares with it (`start_tuner`, `wait_for_signal`, `SECURITY_NOTE`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from typing import IO, Any, Callable

from absl import logging

from intune_tf import arguments
from intune_tf.observe import status
from intune_tf.service.addresses import ServiceError
from intune_tf.service.addresses import check_port_free
from intune_tf.service.addresses import parse_address

# Seconds a worker waits for its dispatcher to accept connections at start.
DEFAULT_DISPATCHER_WAIT_S = 30.0
# Seconds a worker gives a dispatcher's answer, whatever `--dispatcher-wait`.
_MIN_ANSWER_WAIT_S = 5.0
_GET_VERSION = "/tensorflow.data.DispatcherService/GetVersion"
# Logged by the dispatcher and every worker at start.
SECURITY_NOTE = (
    "tf.data service has no authentication or encryption: anyone who can "
    "reach port {port} can read the data and submit work. TensorFlow listens "
    "on all interfaces; keep it on a private network or behind a firewall.")


def start_tuner(role: str, **service: Any) -> None:
  """Loads the kernel library, starts the tuner, labels the status file."""
  # Deferred: `intune --help` lists this command without loading TensorFlow.
  import intune_tf  # noqa: PLC0415
  from intune_tf.ops import loader  # noqa: PLC0415

  loader.ops()
  intune_tf.global_tuner().start()
  writer = status.writer()
  if writer is not None:
    writer.set_info(role=role, service=service)


def wait_for_signal(tick: Callable[[], None] | None = None,
                    period_s: float = 1.0) -> str:
  """Blocks until SIGTERM or SIGINT, and returns its name; calls `tick()`
  (default None: nothing) every `period_s` (default 1)."""
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


def run_worker(dispatcher: str, port: int, host: str = "127.0.0.1",
               dispatcher_wait_s: float = DEFAULT_DISPATCHER_WAIT_S,
               heartbeat_interval_ms: int | None = None,
               ready_fd: int | None = None) -> int:
  """Runs a tf.data service worker tuned by InTune until SIGTERM/SIGINT.

  Args:
    ready_fd: a file descriptor to write "registered PORT" to (then closed)
      once the dispatcher has registered the worker. Default None.
    The others: the `intune service worker` flags of the same names (`_s`:
      in seconds), with their defaults (docs/service.md).

  Returns:
    The exit code (0).

  Raises:
    ServiceError: bad dispatcher address, port in use, no dispatcher, or
      something else at its address.
  """
  # Deferred: `intune --help` lists this command without loading TensorFlow.
  import tensorflow as tf  # noqa: PLC0415

  d_host, d_port = parse_address(dispatcher, "--dispatcher")
  dispatcher = f"{d_host}:{d_port}"
  check_port_free(port)
  _reach_dispatcher(d_host, d_port, dispatcher_wait_s)
  worker_address = f"{host}:{port}"
  start_tuner("worker", dispatcher=dispatcher, worker_address=worker_address,
               port=port)
  config = tf.data.experimental.service.WorkerConfig(
      dispatcher_address=dispatcher, worker_address=worker_address, port=port,
      heartbeat_interval_ms=heartbeat_interval_ms)
  # Returns once the dispatcher registered the worker.
  server = tf.data.experimental.service.WorkerServer(config)
  logging.info("tf.data service worker with InTune at %s registered with "
               "dispatcher %s (pid %d).", worker_address, dispatcher,
               os.getpid())
  if ready_fd is not None:
    with open(ready_fd, "w", closefd=True) as ready:
      ready.write(f"registered {port}\n")
  logging.warning(SECURITY_NOTE.format(port=port))
  name = wait_for_signal()
  logging.info("Worker stopping (%s).", name)
  server.stop()
  return 0


def _reach_dispatcher(host: str, port: int, timeout_s: float) -> None:
  """Waits until host:port accepts a TCP connection, then asks the server
  there for its tf.data service version (a `WorkerServer` retries for ever
  at anything else); raises ServiceError when either has not happened after
  `timeout_s` (for the answer, at least `_MIN_ANSWER_WAIT_S`)."""
  import grpc  # noqa: PLC0415  TensorFlow's own dependency, only needed here

  deadline = time.monotonic() + timeout_s
  while True:
    try:
      with socket.create_connection((host.strip("[]"), port), timeout=2.0):
        break
    except OSError as e:
      if time.monotonic() >= deadline:
        raise ServiceError(
            f"no dispatcher reachable at {host}:{port} after {timeout_s:g} s "
            f"({e}). Start it first with `intune service dispatcher --port "
            f"{port}`, or raise --dispatcher-wait.") from e
    time.sleep(0.25)
  answer_s = max(_MIN_ANSWER_WAIT_S, deadline - time.monotonic())
  with grpc.insecure_channel(f"{host}:{port}") as channel:
    get_version = channel.unary_unary(_GET_VERSION)
    try:
      get_version(b"", timeout=answer_s, wait_for_ready=True)
    except grpc.RpcError as e:
      what = ("a gRPC server that is not a tf.data service dispatcher"
              if e.code() == grpc.StatusCode.UNIMPLEMENTED else
              f"no tf.data service dispatcher answer ({e.code().name})")
      raise ServiceError(
          f"something accepts connections at {host}:{port} but gave "
          f"{what} within {answer_s:.3g} s: check the address (`intune "
          "service dispatcher` listens there), or raise "
          "--dispatcher-wait.") from None


def exit_with_stdin() -> None:
  """Stops this process (SIGTERM) at the end of stdin: the process that
  started it and held the other end is gone, however it died."""

  def watch():
    with contextlib.suppress(OSError, ValueError):
      while sys.stdin.buffer.read1(4096):
        pass
    logging.warning("Worker: stdin closed (whoever started it is gone); "
                    "stopping.")
    os.kill(os.getpid(), signal.SIGTERM)

  threading.Thread(target=watch, name="intune-stdin-watch",
                   daemon=True).start()


def standby_port(stream: IO[str]) -> int | None:
  """The port a standby worker is asked to serve on, one line of `stream`;
  None at its end. Raises ServiceError if the line is not a port."""
  line = stream.readline()
  if not line:
    return None
  try:
    return arguments.port(line.strip())
  except argparse.ArgumentTypeError as e:
    raise ServiceError(f"a standby worker got {line.strip()!r} on stdin, "
                       f"not a port: {e}") from e
