"""Addresses of the tf.data service: HOST:PORT parsed and resolved, and
the ports a server may take."""

from __future__ import annotations

import errno
import functools
import os
import re
import socket
from typing import Any

_ADDRESS = re.compile(r"^(?:grpc://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):"
                      r"(\d{1,5})$")


class ServiceError(RuntimeError):
  """A launcher cannot start (bad address, port in use, no dispatcher)."""


def parse_address(text: str, what: str = "address") -> tuple[str, int]:
  """(host, port) of "HOST:PORT" (or "grpc://HOST:PORT", "[IPv6]:PORT");
  else raises ServiceError, naming it `what` (default "address")."""
  match = _ADDRESS.match(text.strip()) if isinstance(text, str) else None
  port = int(match.group(2)) if match else 0
  if not match or not 1 <= port <= 65535:
    raise ServiceError(
        f"{what} must be HOST:PORT with a port in 1..65535 (for example "
        f"127.0.0.1:5050), got {text!r}.")
  return match.group(1), port


def check_port_free(port: int) -> None:
  """Raises ServiceError if something already listens on `port` (TF's
  servers bind with SO_REUSEPORT: a second one on a busy port may start
  without an error)."""
  error = _bind_error(port)
  if error is None:
    return
  if error.errno in (errno.EADDRINUSE, errno.EACCES):
    raise ServiceError(
        f"port {port} is not available ({os.strerror(error.errno)}): another "
        "process uses it; pick another --port.")
  raise ServiceError(f"cannot bind port {port}: {error}")


def free_port(host: str = "127.0.0.1") -> int:
  """A TCP port free on `host` now."""
  with socket.socket() as s:
    s.bind((host, 0))
    return s.getsockname()[1]


def port_is_free(port: int) -> bool:
  """Whether `port` can be bound on all interfaces now, as a worker binds
  it (connections in TIME_WAIT do not count)."""
  return _bind_error(port) is None


def _bind_error(port: int) -> OSError | None:
  """Why `port` cannot be bound without SO_REUSEPORT, or None."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      s.bind(("0.0.0.0", port))
    except OSError as e:
      return e
  return None


@functools.lru_cache(maxsize=256)
def endpoints(address: str) -> frozenset[tuple[str, int]]:
  """The (IP, port) pairs that a HOST:PORT address names, its host name
  resolved ("localhost:5050" and "127.0.0.1:5050" share (127.0.0.1, 5050)),
  or itself if it does not resolve; none if malformed."""
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
