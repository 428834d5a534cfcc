"""What the dispatcher and the worker processes share: the tuner's start,
the wait for a signal, the security note."""

from __future__ import annotations

import signal
import threading
from typing import Any, Callable

from intune_tf.observe import status

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
